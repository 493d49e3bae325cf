"""Lone-packet latency through a 2-node lab (bench/profile.py's pair): ping A -> B,
100 x 10 ms and 1000 x 1 ms, p50/p99 round trip, and iperf3 TCP for the throughput that
must not drop. Prints JSON.

    .venv/bin/python bench/latency.py [--workers 0,2] [--reps 3] [--tests ping10,ping1k,tcp]
        [--trees before=/tmp/lat-base,after=.] [--set KEY=VALUE ...]

With --trees, every measurement runs once per tree, the trees' order rotated each
repetition, so that all of them see the same machine state: each runs in a child of this
script with PYTHONPATH=TREE (the daemons and their workers inherit it; the child reports
which batmand package its daemon imported)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()

TESTS = {"ping10": (100, "0.01"), "ping1k": (1000, "0.001")}


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (as bench/dataplane.py's)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(1, -(-len(s) * p // 100)) - 1]


def ping(lab, count: int, interval: str) -> dict:
    out = lab.exec("a", ["ping", "-n", "-c", str(count), "-i", interval, "-W", "1", lab.address("b")],
                   timeout=count * (float(interval) + 0.04) + 30).stdout
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]
    return {"received": len(rtts), "p50_ms": pct(rtts, 50), "p99_ms": pct(rtts, 99)}


def tcp(lab, seconds: int) -> dict:
    server = lab.spawn("b", ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = lab.exec("a", ["iperf3", "-c", lab.address("b"), "-t", str(seconds), "-J"], timeout=seconds + 30)
        end = json.loads(r.stdout)["end"]
        return {"gbps": round(end["sum_received"]["bits_per_second"] / 1e9, 3),
                "retransmits": end["sum_sent"].get("retransmits")}
    finally:
        if server.poll() is None:
            server.kill()


def child(args) -> dict:
    """One lab with this process's batmand: the tests, in order."""
    import batmand.lab  # noqa: F401  from PYTHONPATH's tree, before profile.py puts its own first
    spec = importlib.util.spec_from_file_location("bench_profile", HERE.parent / "profile.py")
    profile = importlib.util.module_from_spec(spec)  # not the standard library's profile
    spec.loader.exec_module(profile)
    pair = profile.pair

    settings = dict(kv.split("=", 1) for kv in args.set)
    res: dict = {}
    with pair(args.workers, settings) as lab:
        lab.start()
        for _ in range(100):  # the mesh is up when a ping gets through
            if lab.exec("a", ["ping", "-n", "-c1", "-W1", lab.address("b")]).returncode == 0:
                break
            time.sleep(0.2)
        lab.exec("a", ["ping", "-n", "-q", "-c", "50", "-i", "0.01", lab.address("b")])  # warm up
        environ = Path(f"/proc/{lab.pids['a']}/environ").read_bytes().split(b"\0")
        res["daemon_pythonpath"] = next((e[11:].decode() for e in environ if e.startswith(b"PYTHONPATH=")), None)
        for test in args.tests:
            if test in TESTS:
                res[test] = ping(lab, *TESTS[test])
            elif test == "tcp":
                res[test] = tcp(lab, args.tcp_time)
    import batmand
    res["batmand"] = os.path.dirname(os.path.dirname(batmand.__file__))
    return res


def run_child(tree: str | None, workers: int, args) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = tree
    argv = [sys.executable, str(HERE), "--child", "--workers", str(workers), "--tests", ",".join(args.tests),
            "--tcp-time", str(args.tcp_time)] + [x for kv in args.set for x in ("--set", kv)]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-800:]}
    return json.loads(r.stdout)


def summarize(runs: list[dict]) -> dict:
    """Median over the reps of each figure, per tree and worker count."""
    out: dict = {}
    for run in runs:
        cell = out.setdefault(f"w{run['workers']}", {}).setdefault(run["tree"], {})
        for test, figures in run["result"].items():
            if isinstance(figures, dict):
                for key, value in figures.items():
                    if isinstance(value, (int, float)):
                        cell.setdefault(f"{test}.{key}", []).append(value)
    for per_tree in out.values():
        for cell in per_tree.values():
            for key, values in cell.items():
                cell[key] = {"median": round(statistics.median(values), 4), "all": values}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="0", help="comma list of worker counts (0: inline)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tests", default="ping10,ping1k,tcp")
    ap.add_argument("--tcp-time", type=int, default=5)
    ap.add_argument("--trees", default="", help="NAME=PATH,...: batmand trees to compare, interleaved")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a batmand setting")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.tests = [t for t in args.tests.split(",") if t]
    if args.child:
        args.workers = int(args.workers)
        print(json.dumps(child(args)))
        return 0
    trees = [(name, str(Path(path).resolve())) for name, path in
             (t.split("=", 1) for t in args.trees.split(",") if t)] or [("this", None)]
    runs = []
    for rep in range(args.reps):
        for workers in (int(w) for w in args.workers.split(",")):
            k = rep % len(trees)
            for name, path in trees[k:] + trees[:k]:
                result = run_child(path, workers, args)
                runs.append({"rep": rep, "workers": workers, "tree": name, "result": result})
                print(f"rep {rep} w{workers} {name}: {json.dumps(result)}", file=sys.stderr, flush=True)
    print(json.dumps({"args": {k: v for k, v in vars(args).items() if k != "child"}, "trees": dict(trees),
                      "summary": summarize(runs), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
