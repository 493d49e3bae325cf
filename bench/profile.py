"""Where the data plane's time goes: a sampling profile (py-spy) of both daemons of a
2-node lab while iperf3 runs through them. Prints JSON: the throughput, and per process
(daemon, workers) the functions with the most samples, by self time.

    .venv/bin/python bench/profile.py [--workers N] [--udp] [--seconds S] [--set KEY=VALUE ...]

Installs nothing itself: `./scripts/run netbench --list` sets up py-spy (bench extras).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.lab import Lab, from_dict  # noqa: E402

PY_SPY = Path(sys.executable).parent / "py-spy"


def pair(workers: int, settings: dict) -> Lab:
    topo = from_dict({"lab": {"name": "profile", "mtu": 1560},
                      "batmand": {"orig_interval_ms": 200, "workers": workers, **settings},
                      "node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b"}]})
    return Lab(topo, f"pf{os.getpid() % 100000}")


def hot_functions(raw: Path, top: int) -> dict:
    """Self samples per function from py-spy's raw (collapsed stacks) output."""
    per_function: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        total += int(count)
        per_function[stack.split(";")[-1].split(" (")[0]] += int(count)
    return {"samples": total,
            "self_percent": {fn: round(100 * n / total, 1) for fn, n in per_function.most_common(top)} if total else {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--udp", action="store_true", help="iperf3 UDP, 64-byte datagrams, unlimited rate")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a batmand setting")
    args = ap.parse_args()
    if not PY_SPY.exists():
        print(f"{PY_SPY} missing: run ./scripts/run netbench --list once (installs the bench extras)", file=sys.stderr)
        return 2
    settings = dict(kv.split("=", 1) for kv in args.set)
    result = {"workers": args.workers, "udp": args.udp, "settings": settings, "processes": {}}
    with pair(args.workers, settings) as lab, tempfile.TemporaryDirectory() as tmp:
        lab.start()
        lab.exec("a", ["ping", "-c", "3", "-i", "0.2", lab.address("b")])
        server = lab.spawn("b", ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
        samplers = []
        try:
            time.sleep(0.5)
            extra = ["-u", "-l", "64", "-b", "0"] if args.udp else []
            client = lab.spawn("a", ["iperf3", "-c", lab.address("b"), "-t", str(args.seconds), "-J", *extra],
                               stdout=subprocess.PIPE, text=True)
            time.sleep(1.5)
            for node in ("a", "b"):
                pids = {"daemon": lab.pids[node]}
                if args.workers:
                    status = json.loads(lab.batmanctl(node, "dp", "--json", check=True).stdout)
                    pids = {f"worker{w['index']}": w["pid"] for w in status["workers"]}
                for role, pid in pids.items():
                    out = Path(tmp) / f"{node}-{role}.txt"
                    samplers.append((f"{node}:{role}", out, subprocess.Popen(
                        [str(PY_SPY), "record", "--nonblocking", "--format", "raw", "-o", str(out),
                         "-d", str(max(1, args.seconds - 3)), "-r", "200", "-p", str(pid)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
            report = json.loads(client.communicate(timeout=args.seconds + 30)[0])
            end = report["end"]
            summary = end.get("sum_received") or end.get("sum") or {}
            result["gbps"] = round(summary.get("bits_per_second", 0) / 1e9, 3)
            if args.udp:
                result["udp_lost_percent"] = end.get("sum", {}).get("lost_percent")
            for name, out, proc in samplers:
                proc.wait(timeout=60)
                result["processes"][name] = hot_functions(out, args.top) if out.exists() else {"error": "no samples"}
        finally:
            for _, _, proc in samplers:
                if proc.poll() is None:
                    proc.kill()
            if server.poll() is None:
                server.kill()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
