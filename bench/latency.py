"""Lone-packet latency through a 2-node lab: ping A -> B, 100 x 10 ms and 1000 x 1 ms,
p50/p99 round trip, and iperf3 TCP for the throughput that must not drop. Prints JSON.

    .venv/bin/python bench/latency.py [--workers 0,2] [--reps 3] [--tests ping10,ping1k,tcp]
        [--trees before=/tmp/lat-base,after=.] [--set KEY=VALUE ...]

With --trees, one lab per tree runs at the same time (its daemons with PYTHONPATH=TREE;
their workers import the daemon's package), and each test runs on every lab in turn, the
order rotated each repetition: all trees see the same machine state, test by test. The
labs that are not measured meanwhile are idle. Without --trees: the batmand this Python
imports."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.lab import Lab, from_dict  # noqa: E402

TESTS = {"ping10": (100, "0.01"), "ping1k": (1000, "0.001")}


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (as bench/dataplane.py's)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(1, -(-len(s) * p // 100)) - 1]


def lab_for(tree: str | None, index: int, workers: int, settings: dict) -> Lab:
    """Two nodes on one link (bench/profile.py's pair), their daemons from `tree`."""
    topo = from_dict({"lab": {"name": "latency", "mtu": 1560},
                      "batmand": {"orig_interval_ms": 200, "workers": workers, **settings},
                      "node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b"}]})
    batmand = str(Path(sys.executable).parent / "batmand")
    daemon = ["env", f"PYTHONPATH={tree}", batmand] if tree else None
    return Lab(topo, f"lat{os.getpid() % 10000}t{index}", daemon=daemon)


def ping(lab: Lab, count: int, interval: str) -> dict:
    out = lab.exec("a", ["ping", "-n", "-c", str(count), "-i", interval, "-W", "1", lab.address("b")],
                   timeout=count * (float(interval) + 0.04) + 30).stdout
    rtts = [float(x) for x in re.findall(r"time=([\d.]+) ms", out)]
    return {"received": len(rtts), "p50_ms": pct(rtts, 50), "p99_ms": pct(rtts, 99)}


def tcp(lab: Lab, seconds: int) -> dict:
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


def ready(lab: Lab) -> str | None:
    """Wait for the mesh; warm up; the PYTHONPATH the daemon runs with."""
    for _ in range(100):
        if lab.exec("a", ["ping", "-n", "-c1", "-W1", lab.address("b")]).returncode == 0:
            break
        time.sleep(0.2)
    lab.exec("a", ["ping", "-n", "-q", "-c", "50", "-i", "0.01", lab.address("b")])
    environ = Path(f"/proc/{lab.pids['a']}/environ").read_bytes().split(b"\0")
    return next((e[11:].decode() for e in environ if e.startswith(b"PYTHONPATH=")), None)


def measure(trees: list[tuple[str, str | None]], workers: int, args, runs: list[dict]) -> None:
    settings = dict(kv.split("=", 1) for kv in args.set)
    with contextlib.ExitStack() as stack:
        labs = {}
        for index, (name, path) in enumerate(trees):
            lab = stack.enter_context(lab_for(path, index, workers, settings))
            lab.start()
            labs[name] = lab
        pythonpath = {name: ready(lab) for name, lab in labs.items()}
        for rep in range(args.reps):
            k = rep % len(trees)
            order = [name for name, _ in trees[k:] + trees[:k]]
            for test in args.tests:
                for name in order:
                    if test in TESTS:
                        result = ping(labs[name], *TESTS[test])
                    elif test == "tcp":
                        result = tcp(labs[name], args.tcp_time)
                    else:
                        raise SystemExit(f"unknown test {test}")
                    runs.append({"rep": rep, "workers": workers, "tree": name, "test": test, **result,
                                 "daemon_pythonpath": pythonpath[name]})
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)


def summarize(runs: list[dict]) -> dict:
    """Median over the reps of each figure: workers -> tree -> test.figure."""
    cells: dict = {}
    for run in runs:
        cell = cells.setdefault(f"w{run['workers']}", {}).setdefault(run["tree"], {})
        for key in ("p50_ms", "p99_ms", "gbps"):
            if isinstance(run.get(key), (int, float)):
                cell.setdefault(f"{run['test']}.{key}", []).append(run[key])
    return {w: {tree: {key: round(statistics.median(values), 4) for key, values in cell.items()}
                for tree, cell in per_tree.items()} for w, per_tree in cells.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="0", help="comma list of worker counts (0: inline)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tests", default="ping10,ping1k,tcp")
    ap.add_argument("--tcp-time", type=int, default=5)
    ap.add_argument("--trees", default="", help="NAME=PATH,...: batmand trees to compare, interleaved")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a batmand setting")
    args = ap.parse_args()
    args.tests = [t for t in args.tests.split(",") if t]
    trees = [(name, str(Path(path).resolve())) for name, path in
             (t.split("=", 1) for t in args.trees.split(",") if t)] or [("this", None)]
    runs: list[dict] = []
    for workers in (int(w) for w in args.workers.split(",")):
        measure(trees, workers, args, runs)
    print(json.dumps({"args": vars(args), "trees": dict(trees), "summary": summarize(runs), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
