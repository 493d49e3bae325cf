"""Per-packet CPU, syscalls and hot spots of every daemon of a 2-node (or A - M - B) lab
while iperf3 sends 64-byte UDP (or TCP, --tcp) from a to b; the daemons run the batmand
that PYTHONPATH names (bench/smallpacket-profile.md). Run as root:

    PYTHONPATH=TREE .venv/bin/python bench/smallpacket_profile.py [--line] [--tcp] [--trace|--perf|--spy]

--trace: `perf trace -s` per daemon (/tmp/sp/trace-NODE.txt); --perf: `perf record -g`
(/tmp/sp/perf-NODE.data); --spy: py-spy self time per function."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("PYTHONPATH") or str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))
from batmand.lab import Lab, from_dict  # noqa: E402
from profile import hot_functions  # noqa: E402  (bench/profile.py)

OUT = Path("/tmp/sp")
PY_SPY = Path(sys.executable).parent / "py-spy"

ap = argparse.ArgumentParser()
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--line", action="store_true")
ap.add_argument("--tcp", action="store_true")
ap.add_argument("--seconds", type=int, default=8)
ap.add_argument("--trace", action="store_true")
ap.add_argument("--perf", action="store_true")
ap.add_argument("--spy", action="store_true")
args = ap.parse_args()
nodes = [{"name": "a"}, {"name": "b"}] + ([{"name": "m"}] if args.line else [])
links = [{"a": "a", "b": "m"}, {"a": "m", "b": "b"}] if args.line else [{"a": "a", "b": "b"}]
topo = from_dict({"lab": {"name": "sp", "mtu": 1560}, "batmand": {"orig_interval_ms": 200, "workers": args.workers},
                  "node": nodes, "link": links})
def cpu(pid):
    tot = 0
    for p in [pid] + [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]:
        f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        tot += int(f[11]) + int(f[12])
    return tot / os.sysconf("SC_CLK_TCK")
OUT.mkdir(exist_ok=True)
with Lab(topo, f"sp{os.getpid() % 10000}") as lab:
    lab.start()
    for _ in range(100):
        if lab.exec("a", ["ping", "-c", "1", "-W", "1", lab.address("b")]).returncode == 0:
            break
        time.sleep(0.3)
    server = lab.spawn("b", ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    extra = [] if args.tcp else ["-u", "-l", "64", "-b", "0"]
    client = lab.spawn("a", ["iperf3", "-c", lab.address("b"), "-t", str(args.seconds), "-J", *extra],
                       stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    names = list(lab.pids)
    c0 = {n: cpu(lab.pids[n]) for n in names}; t0 = time.monotonic()
    tr = []
    if args.trace:
        for n in names:
            tr.append(subprocess.Popen(["perf", "trace", "-s", "-p", str(lab.pids[n]), "-o", str(OUT / f"trace-{n}.txt"), "--", "sleep", "3"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if args.perf:
        for n in names:
            tr.append(subprocess.Popen(["perf", "record", "-g", "-o", str(OUT / f"perf-{n}.data"), "-p", str(lab.pids[n]), "--", "sleep", "3"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if args.spy:
        for n in names:
            tr.append(subprocess.Popen([str(PY_SPY), "record", "--nonblocking", "--format", "raw", "-o", str(OUT / f"spy-{n}.txt"), "-d", "3", "-r", "200", "-p", str(lab.pids[n])],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(4)
    c1 = {n: cpu(lab.pids[n]) for n in names}; t1 = time.monotonic()
    for p in tr: p.wait()
    rep = json.loads(client.communicate(timeout=60)[0])
    end = rep["end"]
    if args.tcp:
        rate = end["sum_received"]["bits_per_second"]/1e9; pkts = None
        print("gbps", round(rate, 3))
    else:
        s = end["sum"]; pps = (s["packets"] - s["lost_packets"]) / s["seconds"]
        print("rx pkt/s", round(pps), "lost%", round(s["lost_percent"], 1))
        for n in names:
            print(n, "cores", round((c1[n]-c0[n])/(t1-t0), 3), "us/pkt", round((c1[n]-c0[n])/(t1-t0)/pps*1e6, 2))
    server.kill()
    if args.spy:
        for n in names:
            print(n, json.dumps(hot_functions(Path(str(OUT / f"spy-{n}.txt")), 14)))
