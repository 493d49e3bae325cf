#!/usr/bin/env python3
"""What route changes cost the data plane's host -> mesh path: one Engine in a scratch
namespace (its hard interface one end of a veth pair, a SOCK_SEQPACKET pair standing in
for the TAP, as in smallpacket_micro.py), --origs originators with four clients each,
--flows flows from our host to clients of distinct originators, and a router switch of a
random originator every --every frames (a 1000-node mesh with equal links switches some
50 routers a second; at 50k frames a second that is one switch per 1000 frames).

Two ways of taking a change, alternating round by round in one run:
  all:       every cached decision is forgotten (what the engine did before);
  selective: only the decisions that read the changed routes (Engine._forget_routes).
Prints the wall time per frame inside Engine.on_tap + Engine.apply for each (best and
median of --rounds rounds) and their ratio.

    PYTHONPATH=TREE .venv/bin/python bench/route_flaps.py [--flows 256] [--every 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import time

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.dataplane.engine import Engine, Port
from batmand.dataplane.rings import RxRing, TxRing
from batmand.wire.mac import Mac

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smallpacket_micro import DAT, OURS, in_scratch_namespace, partial_vnet, udp_frame  # noqa: E402

HOPS = [Mac("02:5e:00:00:00:01"), Mac("02:5e:00:00:00:02")]
MINE = Mac("06:c1:00:00:00:02")
BATCH = 64


def orig(i: int) -> Mac:
    return Mac(b"\x02\x6f" + i.to_bytes(4, "big"))


def client(i: int, j: int) -> Mac:
    return Mac(b"\x06\x6f" + (4 * i + j).to_bytes(4, "big"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--origs", type=int, default=1000)
    ap.add_argument("--flows", type=int, default=256)
    ap.add_argument("--every", type=int, default=1000, help="frames between two router switches")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--frames", type=int, default=20000, help="frames per round")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.inner:
        return in_scratch_namespace([sys.executable, os.path.abspath(__file__), "--inner", "--origs", str(args.origs),
                                     "--flows", str(args.flows), "--every", str(args.every),
                                     "--rounds", str(args.rounds), "--frames", str(args.frames)])
    if args.flows > args.origs:
        ap.error("--flows: at most one per originator")
    tap, host = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (tap, host):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.setblocking(False)
    engine = Engine(tap.fileno(), lambda f: None, lambda i, f: None)
    port = Port("vb", bytes(OURS), 1560, RxRing("vb", mtu=1560, vnet_hdr=True), TxRing("vb", mtu=1560, vnet_hdr=True))
    engine.add_port(port)
    engine.set_ports({"vb": (bytes(OURS), 1560)}, bytes(OURS), False)
    routes = {orig(i): OrigRoute(HOPS[i % 2], "vb", 1) for i in range(args.origs)}
    engine.apply(ForwardingUpdate(origs=dict(routes),
                                  clients={(client(i, j), 0): ClientRoute(orig(i)) for i in range(args.origs)
                                           for j in range(4)},
                                  local_clients={(MINE, 0): True}, slow_path=DAT))
    flows = [partial_vnet(34) + udp_frame(bytes(client(i, 0)), bytes(MINE), 64) for i in range(args.flows)]
    selective = engine._forget_routes

    def forget_all(origs, clients) -> None:
        engine._forget_decisions()

    rng = random.Random(19)
    per_frame = {"all": [], "selective": []}
    for r in range(2 * args.rounds):
        mode = ("all", "selective")[r % 2]
        engine._forget_routes = selective if mode == "selective" else forget_all
        spent, sent, next_flap = 0, 0, args.every
        while sent < args.frames:
            for k in range(BATCH):
                host.send(flows[(sent + k) % len(flows)])
            t = time.perf_counter_ns()
            engine.on_tap()
            sent += BATCH
            if sent >= next_flap:
                next_flap += args.every
                o = orig(rng.randrange(args.origs))
                route = routes[o] = OrigRoute(HOPS[HOPS.index(routes[o].next_hop) ^ 1], "vb", 1)
                engine.apply(ForwardingUpdate(origs={o: route}, clients={}, local_clients={}))
            spent += time.perf_counter_ns() - t
        per_frame[mode].append(spent / sent)
    result = {"benchmark": "route_flaps", "origs": args.origs, "flows": args.flows, "frames_per_switch": args.every,
              "ns_per_frame": {m: {"best": round(min(v)), "median": round(statistics.median(v))}
                               for m, v in per_frame.items()},
              "ratio_selective_to_all": round(statistics.median(per_frame["selective"])
                                              / statistics.median(per_frame["all"]), 3),
              "counters": {k: engine.counters[k] for k in ("tx", "slow_host", "tx_ring_full")}}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
