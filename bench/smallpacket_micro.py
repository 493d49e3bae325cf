#!/usr/bin/env python3
"""The data plane's per-frame cost for 64-byte UDP, without iperf3 or a second daemon:
one Engine in a scratch namespace, its hard interface one end of a veth pair.

  host -> mesh: batches of 64 frames (vnet header, checksum partial, as bat0 hands them
                over) written into a SOCK_SEQPACKET pair standing in for the TAP, then
                Engine.on_tap (reads them, encapsulates, TX-ring kick out of the veth);
  mesh -> host: batches of 64 UNICAST frames for our client sent into the veth's other
                end, then Engine.on_port (RX ring, decisions, UDP GRO, one write to the pair).

Prints the wall time per frame inside on_tap / on_port (best and median of --rounds
rounds), syscalls included; DAT's slow-path rule (UDP 68) is on, as by default.

    PYTHONPATH=TREE .venv/bin/python bench/smallpacket_micro.py [--rounds 15] [--batches 300]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.core.forwarding import FROM_HOST, TO_HOST, SlowPath, SlowRule
from batmand.dataplane.engine import Engine, Port
from batmand.dataplane.rings import RxRing, TxRing
from batmand.wire.fastpath import unicast_prefix
from batmand.wire.mac import Mac

OURS, NEIGHBOUR = Mac("02:00:00:00:0b:0b"), Mac("02:5e:00:00:00:01")
THEIRS, MINE = Mac("06:c1:00:00:00:01"), Mac("06:c1:00:00:00:02")
DAT = SlowPath(rules=frozenset(SlowRule(d, 0x0800, 17, 68) for d in (FROM_HOST, TO_HOST)))
BATCH = 64


def udp_frame(dst: bytes, src: bytes, size: int = 64, sport: int = 5000) -> bytes:
    """Ethernet + IPv4 + UDP with `size` bytes of payload, the UDP checksum field holding the
    pseudo-header sum (partial, as the host leaves it)."""
    payload = bytes(size)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 8 + len(payload), 1, 0x4000, 64, 17, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    return dst + src + b"\x08\x00" + ip + struct.pack("!HHHH", sport, 5201, 8 + len(payload), 0) + payload


def partial_vnet(csum_start: int) -> bytes:
    return struct.pack("=BBHHHH", 1, 0, 0, 0, csum_start, 6)  # NEEDS_CSUM, UDP checksum at +6


def in_scratch_namespace(argv: list[str]) -> int:
    """Run argv (this script again, --inner) in a new namespace with the veth pair va - vb."""
    name = f"spmicro{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (["link", "add", "va", "mtu", "1560", "type", "veth", "peer", "vb", "mtu", "1560"],
                    ["link", "set", "vb", "address", str(OURS)], ["link", "set", "va", "up"],
                    ["link", "set", "vb", "up"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True)
        return subprocess.run(["ip", "netns", "exec", name, *argv]).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batches", type=int, default=300, help="batches of 64 frames per round and direction")
    ap.add_argument("--payload", type=int, default=64, help="UDP payload bytes (1472: a full 1500-byte packet)")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.inner:
        return in_scratch_namespace([sys.executable, os.path.abspath(__file__), "--inner",
                                     "--rounds", str(args.rounds), "--batches", str(args.batches),
                                     "--payload", str(args.payload)])
    if True:
        tap, host = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for s in (tap, host):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        tap.setblocking(False)
        host.setblocking(False)
        engine = Engine(tap.fileno(), lambda f: None, lambda i, f: None)
        port = Port("vb", bytes(OURS), 1560, RxRing("vb", mtu=1560, vnet_hdr=True), TxRing("vb", mtu=1560, vnet_hdr=True))
        engine.add_port(port)
        engine.set_ports({"vb": (bytes(OURS), 1560)}, bytes(OURS), False)
        engine.apply(ForwardingUpdate(origs={NEIGHBOUR: OrigRoute(NEIGHBOUR, "vb", 1)},
                                      clients={(THEIRS, 0): ClientRoute(NEIGHBOUR)}, local_clients={(MINE, 0): True},
                                      slow_path=DAT))
        peer = TxRing("va", mtu=1560, vnet_hdr=True)
        from_host = partial_vnet(34) + udp_frame(bytes(THEIRS), bytes(MINE), args.payload)
        from_mesh = unicast_prefix(bytes(OURS), bytes(NEIGHBOUR), bytes(OURS), 1) + udp_frame(bytes(MINE), bytes(THEIRS), args.payload)
        mesh_vnet = partial_vnet(24 + 34)
        tap_ns, port_ns = [], []
        for _ in range(args.rounds):
            spent = 0
            for _ in range(args.batches):
                for _ in range(BATCH):
                    host.send(from_host)
                t = time.perf_counter_ns()
                engine.on_tap()
                spent += time.perf_counter_ns() - t
            tap_ns.append(spent / (args.batches * BATCH))
            spent = 0
            for _ in range(args.batches):
                for _ in range(BATCH):
                    peer.put((mesh_vnet, from_mesh), len(mesh_vnet) + len(from_mesh))
                peer.flush()
                t = time.perf_counter_ns()
                engine.on_port(port)
                spent += time.perf_counter_ns() - t
                while True:  # drain what bat0 would have received
                    try:
                        host.recv(70000)
                    except BlockingIOError:
                        break
            port_ns.append(spent / (args.batches * BATCH))
        c = engine.counters
        result = {"on_tap_ns_per_frame": {"best": round(min(tap_ns)), "median": round(statistics.median(tap_ns))},
                  "on_port_ns_per_frame": {"best": round(min(port_ns)), "median": round(statistics.median(port_ns))},
                  "counters": {k: c[k] for k in ("tx", "rx", "slow_host", "slow_mesh", "gro_merged", "gro_written",
                                                 "tx_ring_full", "tap_write_dropped")}}
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
