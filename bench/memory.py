#!/usr/bin/env python3
"""Memory (issue 19): what an idle daemon holds, per process, and what one more originator
or one more global TT entry costs the core. Prints one JSON object.

- idle: a 2-node lab (`--workers 0` and `--workers 2`), after the mesh settled; for node
  a's control process and each of its workers: RSS and PSS (/proc/PID/smaps_rollup), the
  part of RSS that is packet rings (the socket mappings in /proc/PID/smaps) and the
  process's total
- core: tracemalloc around a `Mesh` fed N originators (OGMs relayed by one neighbour) each
  announcing M clients (a full-table TT response); bytes per originator and per global TT
  entry are differences between two sizes, so the fixed costs cancel

    PYTHONPATH=TREE .venv/bin/python bench/memory.py [--workers 0,2] [--skip-idle]
    .venv/bin/python bench/memory.py --trees before=/tmp/mem-base,after=.

With --trees every measurement runs once per tree (this script, that tree's batmand on
PYTHONPATH, daemons included: the lab passes the environment on) and the output holds each
tree's numbers and the ratios of the later trees to the first."""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

if not any(Path(p, "batmand").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KIB = 1024


# --- idle daemons ------------------------------------------------------------------------------


def smaps_rollup(pid: int) -> dict:
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1])
    return out


def ring_kib(pid: int) -> int:
    """RSS of the packet sockets' mappings (PACKET_MMAP rings): their vma names a socket."""
    total, in_socket = 0, False
    for line in open(f"/proc/{pid}/smaps"):
        first = line.split(maxsplit=1)[0]
        if "-" in first and ":" not in first:  # a mapping's header line
            in_socket = "socket:" in line or "[socket]" in line or line.rstrip().endswith("socket")
        elif in_socket and first == "Rss:":
            total += int(line.split()[1])
    return total


def process_memory(pid: int) -> dict:
    roll = smaps_rollup(pid)
    return {"rss_kib": roll.get("Rss", 0), "pss_kib": roll.get("Pss", 0), "rings_kib": ring_kib(pid),
            "anon_kib": roll.get("Anonymous", 0)}


def iperf(lab, seconds: int) -> dict:
    """TCP a -> b through both daemons: throughput, and the frames the rings dropped."""
    server = lab.spawn("b", ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = lab.exec("a", ["iperf3", "-c", lab.address("b"), "-t", str(seconds), "-J"], timeout=seconds + 30).stdout
        end = json.loads(out)["end"]
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
    drops = {}
    for node in ("a", "b"):
        status = json.loads(lab.batmanctl(node, "dp", "--json", check=True).stdout)
        drops[node] = status["drops"]["socket"]
    return {"gbps": round(end["sum_received"]["bits_per_second"] / 1e9, 3),
            "retransmits": end["sum_sent"].get("retransmits", 0), "ring_drops": drops}


def idle(workers: int, settle: float, iperf_seconds: int, settings: dict) -> dict:
    from batmand.lab import Lab, from_dict

    topo = from_dict({"lab": {"name": "memory", "mtu": 1560},
                      "batmand": {"orig_interval_ms": 200, "workers": workers, **settings},
                      "node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b"}]})
    # -P: not the current directory's batmand ahead of PYTHONPATH's (--trees runs each tree's)
    daemon = [sys.executable, "-P", "-c", "import sys; from batmand.daemon_main import main; sys.exit(main())"]
    with Lab(topo, f"mem{os.getpid() % 100000}", daemon=daemon) as lab:
        lab.start()
        lab.exec("a", ["ping", "-c", "2", "-i", "0.2", "-W", "2", lab.address("b")])
        time.sleep(settle)
        pid = lab.pids["a"]
        procs = {"control": pid}
        if workers:
            status = json.loads(lab.batmanctl("a", "dp", "--json", check=True).stdout)
            procs.update({f"worker{w['index']}": w["pid"] for w in status["workers"]})
        per = {name: process_memory(p) for name, p in procs.items()}
        result = {"processes": per,
                  "total_rss_kib": sum(p["rss_kib"] for p in per.values()),
                  "total_pss_kib": sum(p["pss_kib"] for p in per.values())}
        if iperf_seconds:
            result["iperf3"] = iperf(lab, iperf_seconds)
            after = [process_memory(p) for p in procs.values()]
            result["total_rss_kib_after_iperf3"] = sum(p["rss_kib"] for p in after)
            result["rings_kib_after_iperf3"] = sum(p["rings_kib"] for p in after)  # (the rings grow with a burst)
        return result


# --- the core's tables --------------------------------------------------------------------------


def fed_mesh(originators: int, clients: int):
    """A core that knows `originators` originators (all behind one neighbour) with `clients`
    global TT entries each."""
    from batmand.core.config import MeshConfig
    from batmand.core.mesh import Mesh
    from batmand.wire import BROADCAST, IvOgm, Mac, UnicastTvlv, build_frame
    from tt_tables import full_table

    ours, neigh = Mac("02:00:00:00:00:01"), Mac("02:00:00:00:00:02")
    config = MeshConfig(max_originators=originators + 10, max_global_tt_entries=originators * clients + 10,
                        max_global_tt_entries_per_originator=max(clients, 1))
    mesh = Mesh(config, soft_mac=Mac("02:00:00:00:00:aa"), rng=random.Random(1))
    mesh.add_interface(0.0, "if0", ours)

    def ogm(orig, seqno, tq=255):
        return build_frame(BROADCAST, neigh, IvOgm(ttl=50, seqno=seqno, orig=orig, prev_sender=neigh, tq=tq))

    mesh.receive(1.0, "if0", ogm(neigh, 1))
    for i in range(originators):
        orig = Mac(b"\x02\x5f" + i.to_bytes(4, "big"))
        mesh.receive(1.0, "if0", ogm(orig, 1, 200))
        if clients:
            macs = [Mac(b"\x06" + i.to_bytes(3, "big") + k.to_bytes(2, "big")) for k in range(clients)]
            full = full_table(macs)
            mesh.receive(1.0, "if0", build_frame(ours, neigh, UnicastTvlv(dst=ours, src=orig, tvlvs=[full])))
    return mesh


def traced(originators: int, clients: int) -> tuple[int, int, int]:
    """(bytes held by the fed core, originators it knows, global TT entries it holds)"""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    mesh = fed_mesh(originators, clients)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    tt = mesh.tt
    entries = sum(len(v) for v in tt.by_orig.values()) if hasattr(tt, "by_orig") else None
    return held, len(mesh.originators.nodes), entries


def per_entry(small: int, large: int, clients: int) -> dict:
    fed_mesh(2, 2)  # imports and first-use caches outside the measurements
    a_bytes, a_orig, _ = traced(small, 0)
    b_bytes, b_orig, _ = traced(large, 0)
    per_orig = (b_bytes - a_bytes) / (b_orig - a_orig)
    c_bytes, _, c_tt = traced(large, clients)
    d_bytes, _, d_tt = traced(large, 2 * clients)
    # a TT entry's own cost: the originators and their TT state stay, only the entries grow
    per_tt = (d_bytes - c_bytes) / (d_tt - c_tt)
    return {"originators": [a_orig, b_orig], "clients_per_originator": [clients, 2 * clients],
            "tt_entries": [c_tt, d_tt], "bytes_per_originator": round(per_orig), "bytes_per_tt_entry": round(per_tt),
            # what announcing clients at all adds per originator (its TT records, beyond the entries)
            "bytes_per_announcing_originator": round((c_bytes - b_bytes - per_tt * c_tt) / b_orig),
            "core_bytes": {f"{small}x0": a_bytes, f"{large}x0": b_bytes,
                           f"{large}x{clients}": c_bytes, f"{large}x{2 * clients}": d_bytes}}


# --- one tree, or several --------------------------------------------------------------------------


def measure(args) -> dict:
    import batmand

    result = {"batmand": str(Path(batmand.__file__).resolve().parent.parent)}
    if not args.skip_core:
        result["core"] = per_entry(args.small, args.large, args.clients)
    if not args.skip_idle:
        settings = {key: _setting(value) for key, _, value in (kv.partition("=") for kv in args.set)}
        result["idle"] = {f"workers={w}": idle(w, args.settle, args.iperf, settings) for w in args.workers}
    return result


def _setting(text: str):
    """A --set value as the lab's topology takes it: true/false and numbers as such."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def compare(args) -> dict:
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    own, rest = [], iter(sys.argv[1:])  # our arguments but --trees, for each tree's run
    for arg in rest:
        if arg == "--trees":
            next(rest, None)
        elif not arg.startswith("--trees="):
            own.append(arg)
    results = {}
    for name, path in trees.items():
        env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
        out = subprocess.run([sys.executable, __file__, *own], env=env, check=True, stdout=subprocess.PIPE,
                             text=True).stdout
        results[name] = json.loads(out)
    names = list(trees)
    base = flatten(results[names[0]])
    ratios = {}
    for name in names[1:]:
        other = flatten(results[name])
        ratios[f"{name}/{names[0]}"] = {k: round(other[k] / v, 3) for k, v in base.items()
                                        if k in other and v and not k.startswith("core.originators")}
    return {"trees": trees, "results": results, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", help="NAME=PATH,NAME=PATH: run everything once per source tree")
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2])
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the first ping")
    parser.add_argument("--iperf", type=int, default=0, metavar="SECONDS",
                        help="then iperf3 TCP a -> b for this long: throughput and ring drops")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a batmand setting for the idle daemons (e.g. kernel_forward=false: iperf3 through the rings)")
    parser.add_argument("--skip-core", action="store_true", help="only the idle daemons")
    parser.add_argument("--skip-idle", action="store_true", help="only the core's per-entry costs")
    parser.add_argument("--small", type=int, default=200, help="originators of the smaller core")
    parser.add_argument("--large", type=int, default=1200, help="originators of the larger core")
    parser.add_argument("--clients", type=int, default=20, help="TT entries per originator")
    args = parser.parse_args()
    print(json.dumps(compare(args) if args.trees else measure(args), indent=1))


if __name__ == "__main__":
    main()
