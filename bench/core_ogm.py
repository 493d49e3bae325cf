#!/usr/bin/env python3
"""The protocol core alone under a large mesh's OGM load: µs of CPU per received OGM in
`Mesh.receive`/`Mesh.tick`, no sockets, no event loop (bench/control_plane.py measures the
whole daemon in namespaces). The same load model: N neighbours on one link, M originators
behind them sending one OGM a second, each heard through every neighbour, in kernel-sized
aggregates spread over the second, every OGM with a TT container whose CRC matches (TT
requests are answered with the full table), and our own OGMs echoed by every neighbour so
that the links are bidirectional. Prints one JSON object.

    .venv/bin/python bench/core_ogm.py [--cells 1000x3,2000x6] [--seconds 10] [--warmup 5]
        [--trees before=PATH,after=PATH] [--profile]

With --trees each cell runs in a child process per tree (PYTHONPATH=PATH), interleaved,
and the ratios after/before are printed beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

# the tree under test comes from PYTHONPATH (--trees); else this checkout
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.wire.constants import TtDataFlags, TvlvType  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))  # after the standard library (bench/profile.py)
from tt_tables import full_table  # noqa: E402

HERE = Path(__file__).resolve().parent
OGM_HDR = struct.Struct("!BBBBI6s6sBBH")
TT_TVLV = struct.Struct("!BBHBBHIHH")  # container header, tt data (flags ttvn num_vlan), one VLAN
AGGREGATE_BYTES = 512
AGGREGATE_OGMS = 32
SLOTS = 20  # sends spread over each second


def mac(kind: int, i: int) -> bytes:
    return bytes((0x02, kind, 0, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF))


class Load:
    """The frames the neighbours send, and the answers a kernel neighbour would give."""

    def __init__(self, origs: int, neighs: int) -> None:
        from batmand.wire import tt_vlan_crc
        self.neighs = [mac(1, i) for i in range(neighs)]
        self.origs = [mac(2, i) for i in range(origs)]
        self.clients = {o: mac(3, i) for i, o in enumerate(self.origs + self.neighs)}
        self.crc = {o: tt_vlan_crc([(c, 0)], 0) for o, c in self.clients.items()}
        self.upstream = mac(4, 0)  # who the neighbours heard the originators from
        self.seqno = 1000

    def ogm(self, orig: bytes, prev: bytes, ttl: int, tq: int, seqno: int) -> bytes:
        tvlv = TT_TVLV.pack(TvlvType.TT, 1, 12, TtDataFlags.OGM_DIFF, 1, 1, self.crc[orig], 0, 0)
        return OGM_HDR.pack(0, 15, ttl, 0, seqno, orig, prev, 0, tq, len(tvlv)) + tvlv

    def second(self, us: bytes) -> list[list[bytes]]:
        """One second of frames, in SLOTS groups; every neighbour forwards every originator."""
        self.seqno += 1
        frames = []
        for n in self.neighs:
            ogms = [self.ogm(n, n, 50, 255, self.seqno)]
            ogms += [self.ogm(o, self.upstream, 48, 230, self.seqno) for o in self.origs]
            head = b"\xff" * 6 + n + b"\x43\x05"
            batch, size = [], 0
            for ogm in ogms:
                if batch and (size + len(ogm) > AGGREGATE_BYTES or len(batch) >= AGGREGATE_OGMS):
                    frames.append(head + b"".join(batch))
                    batch, size = [], 0
                batch.append(ogm)
                size += len(ogm)
            frames.append(head + b"".join(batch))
        per_slot = -(-len(frames) // SLOTS)
        # neighbours interleaved, as their sends are independent
        order = sorted(range(len(frames)), key=lambda i: (i % per_slot, i))
        frames = [frames[i] for i in order]
        return [frames[i:i + per_slot] for i in range(0, len(frames), per_slot)]

    def answers(self, frame: bytes, us: bytes) -> list[bytes]:
        """What the neighbours send back for one of our frames: echoes of our own OGMs,
        full-table TT responses for TT requests."""
        from batmand.wire import OgmFlags, TtTvlv, UnicastTvlv, decode_frame
        from batmand.wire.constants import PacketType
        out = []
        decoded = decode_frame(frame)
        packet = decoded.packet
        if packet.packet_type == PacketType.IV_OGM:
            for ogm in decoded.packets:
                if ogm.orig != us:
                    continue
                for n in self.neighs:
                    echo = OGM_HDR.pack(0, 15, ogm.ttl - 1, OgmFlags.DIRECTLINK, ogm.seqno, us, us, 0, 240, 0)
                    out.append(b"\xff" * 6 + n + b"\x43\x05" + echo)
        elif packet.packet_type == PacketType.UNICAST_TVLV:
            for tt in packet.tvlvs:
                if isinstance(tt, TtTvlv) and tt.flags & TtDataFlags.REQUEST and packet.dst in self.clients:
                    orig = bytes(packet.dst)
                    reply = full_table([self.clients[orig]])
                    body = UnicastTvlv(dst=us, src=orig, tvlvs=[reply]).encode()
                    out.append(bytes(us) + bytes(decoded.ethernet.h_dest) + b"\x43\x05" + body)
        return out


def run_cell(origs: int, neighs: int, seconds: float, warmup: float, profile: bool, memory: bool = False) -> dict:
    """Feed the core; time only its calls (with `memory`: what the core holds, traced)."""
    if memory:
        import tracemalloc
        tracemalloc.start()
    from batmand.core.config import MeshConfig
    from batmand.core.events import Transmit
    from batmand.core.mesh import Mesh
    us = b"\x02\x00\x00\x00\x00\x01"
    config = MeshConfig(max_originators=max(1000, 2 * origs + neighs + 10))
    mesh = Mesh(config, soft_mac=b"\x02\x00\x00\x00\x00\x02", now=0.0)
    load = Load(origs, neighs)
    cpu = 0.0
    received = 0
    pending: list[bytes] = []
    now = 0.0
    mesh.add_interface(now, "eth0", us)
    profiler = None
    t_total = warmup + seconds
    sec = 0
    while sec < t_total:
        slots = load.second(us)
        measuring = sec >= warmup
        if measuring and profile and profiler is None:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        for k, frames in enumerate(slots):
            now = sec + k / len(slots)
            batch, pending = frames + pending, []
            t0 = time.process_time()
            actions = []
            while mesh.next_deadline() <= now:  # every timer at its time, as the daemon's loop runs them
                actions += mesh.tick(mesh.next_deadline())
            if hasattr(mesh, "receive_many"):  # a batch of frames publishes once (as the daemon reads them)
                actions += mesh.receive_many(now, "eth0", batch)
            else:  # older trees
                for frame in batch:
                    actions += mesh.receive(now, "eth0", frame)
            t1 = time.process_time()
            if measuring:
                cpu += t1 - t0
                received += sum((len(f) - 14) // 40 for f in frames)
            for action in actions:
                if isinstance(action, Transmit):
                    pending += load.answers(action.frame, us)
        sec += 1
    if profiler is not None:
        profiler.disable()
        import io
        import pstats
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(int(os.environ.get("BENCH_TOP", "30")))
        print(stream.getvalue(), file=sys.stderr)
    routed = sum(1 for o in mesh.originators.nodes.values() if o.router() is not None)
    held = None
    if memory:
        import gc
        import tracemalloc
        del load, pending, slots, frames, batch, actions
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    return {"core_bytes": held, "origs": origs, "neighs": neighs, "ogms_per_s": (origs + 1) * neighs,
            "us_per_ogm": round(cpu / received * 1e6, 2) if received else None,
            "cores": round(cpu / seconds, 4), "routed": routed, "tt_global": len(mesh.tt.global_),
            "counters_drop": {k: v for k, v in mesh.counters.items() if k.startswith("drop")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default="1000x3", help="ORIGSxNEIGHS,... (default 1000x3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="simulated seconds measured")
    parser.add_argument("--warmup", type=float, default=5.0, help="simulated seconds before measuring")
    parser.add_argument("--trees", default="", help="NAME=PATH,... source trees compared in one run")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell and tree, interleaved")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured part (stderr)")
    parser.add_argument("--memory", action="store_true",
                        help="trace what the core holds (slow): bytes per originator between the cells")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child mode: one cell, this interpreter's tree
    args = parser.parse_args()
    if args.one:
        origs, neighs = (int(x) for x in args.one.split("x"))
        print(json.dumps(run_cell(origs, neighs, args.seconds, args.warmup, args.profile, args.memory)))
        return
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    trees = dict(t.split("=", 1) for t in args.trees.split(",")) if args.trees else {"this": str(HERE.parent)}
    results: dict = {}
    for _ in range(args.repeat):
        for origs, neighs in cells:
            for name, path in trees.items():
                env = {**os.environ, "PYTHONPATH": str(Path(path).resolve())}
                out = subprocess.run([sys.executable, "-P", str(HERE / "core_ogm.py"), "--one", f"{origs}x{neighs}",
                                      "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
                                     + (["--profile"] if args.profile else []) + (["--memory"] if args.memory else []),
                                     env=env, check=True, text=True, stdout=subprocess.PIPE)
                results.setdefault(f"{origs}x{neighs}", {}).setdefault(name, []).append(json.loads(out.stdout))
    report = {"what": "protocol core only: CPU µs per received OGM (median of repeats)", "cells": {}}
    for cell, by_tree in results.items():
        row = {}
        for name, runs in by_tree.items():
            runs.sort(key=lambda r: r["us_per_ogm"] or 0)
            row[name] = runs[len(runs) // 2]
        names = list(row)
        if len(names) == 2 and row[names[0]]["us_per_ogm"]:
            row[f"ratio {names[1]}/{names[0]}"] = round(row[names[1]]["us_per_ogm"] / row[names[0]]["us_per_ogm"], 3)
        report["cells"][cell] = row
    if args.memory and len(cells) >= 2:  # the slope between the first two cells: fixed costs cancel
        (o1, n1), (o2, n2) = cells[:2]
        report["bytes_per_originator"] = {
            name: round((report["cells"][f"{o2}x{n2}"][name]["core_bytes"] - report["cells"][f"{o1}x{n1}"][name]["core_bytes"])
                        / (o2 - o1)) for name in trees}
        if len(trees) == 2:
            a, b = report["bytes_per_originator"].values()
            report["bytes_per_originator"]["ratio"] = round(b / a, 3)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
