#!/usr/bin/env python3
"""A lone frame's time through one Engine, without a second daemon or ping's scheduling:
the engine in a private network namespace (unshare), bat0 a real TAP with an address,
its hard interface vb one end of a veth pair, a packet socket on the other end (va) as
the wire. The engine runs in a loop like a worker's (epoll on the TAP and the ring).

  host -> mesh: an ICMP echo request sent by this host to the mesh (bat0, the TAP, on_tap,
                the wire): like node A sending a ping;
  mesh -> host -> mesh: an ICMP echo request sent on the wire to bat0's address (the ring,
                on_port, the TAP write, inside it the host's echo reply, on_tap, the wire):
                like node B answering one.

Each sample waits --gap ms first (the CPU and caches go cold as between pings), then
measures from just before its send to the wire's kernel receive timestamp of the frame
that comes out. Prints p50/p90 in us per tree; trees run interleaved, each round in a
fresh process, the order rotated:

    .venv/bin/python bench/lone_micro.py --trees base=/tmp/lone-base,new=. [--gaps 10,1] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

SOFT, OURS, NEIGHBOUR, THEIRS = (bytes.fromhex(m) for m in ("0200000000aa", "020000000b0b", "025e00000001",
                                                             "06c100000001"))
HOST_IP, PEER_IP = "10.9.0.2", "10.9.0.1"
SO_TIMESTAMPNS = 35


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def icmp_echo(seq: int) -> bytes:
    icmp = struct.pack("!BBHHH", 8, 0, 0, 0x4242, seq) + bytes(56)
    return icmp[:2] + struct.pack("!H", _checksum(icmp)) + icmp[4:]


def echo_request(seq: int) -> bytes:
    """Ethernet + IPv4 + ICMP echo request from the peer's client to bat0, checksums complete."""
    icmp = icmp_echo(seq)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(icmp), seq, 0x4000, 64, 1, 0,
                     socket.inet_aton(PEER_IP), socket.inet_aton(HOST_IP))
    ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    return SOFT + THEIRS + b"\x08\x00" + ip + icmp


def inner(args) -> dict:
    from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
    from batmand.core.forwarding import FROM_HOST, TO_HOST, SlowPath, SlowRule
    from batmand.daemon.softif import SoftInterface
    from batmand.dataplane import bpf
    from batmand.dataplane.engine import Engine, Port
    from batmand.dataplane.rings import RxRing, TxRing
    from batmand.wire.fastpath import unicast_prefix
    from batmand.wire.mac import Mac

    def ip(*cmd):
        subprocess.run(["ip", *cmd], check=True)

    subprocess.run(["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                   check=True)
    ip("link", "set", "lo", "up")
    ip("link", "add", "va", "mtu", "1560", "type", "veth", "peer", "vb", "mtu", "1560")
    ip("link", "set", "va", "address", NEIGHBOUR.hex(":"), "up")
    ip("link", "set", "vb", "address", OURS.hex(":"), "up")
    soft = SoftInterface("bat0", mac=SOFT)
    soft.set_offload(True, False)
    soft.up()
    ip("addr", "add", HOST_IP + "/24", "dev", "bat0")
    ip("neigh", "add", PEER_IP, "lladdr", THEIRS.hex(":"), "dev", "bat0", "nud", "permanent")
    dat = SlowPath(rules=frozenset(SlowRule(d, 0x0800, 17, 68) for d in (FROM_HOST, TO_HOST)))  # as by default
    engine = Engine(soft.fd, lambda f: None, lambda i, f: None)
    port = Port("vb", OURS, 1500, RxRing("vb", mtu=1560, vnet_hdr=True, program=bpf.UNICAST_ONLY),
                TxRing("vb", mtu=1560, vnet_hdr=True))
    engine.add_port(port)
    engine.set_ports({"vb": (OURS, 1500)}, OURS, False)
    engine.apply(ForwardingUpdate(origs={Mac(NEIGHBOUR): OrigRoute(Mac(NEIGHBOUR), "vb", 1)},
                                  clients={(Mac(THEIRS), 0): ClientRoute(Mac(NEIGHBOUR))},
                                  local_clients={(Mac(SOFT), 0): True}, slow_path=dat))
    wire = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x4305))
    wire.bind(("va", 0x4305))
    wire.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    wire.setblocking(False)
    ping = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    prefix = unicast_prefix(OURS, NEIGHBOUR, OURS, 1)
    ep = select.epoll()
    tap_fd, ring_fd, wire_fd = soft.fd, port.rx.fileno(), wire.fileno()
    for fd in (tap_fd, ring_fd, wire_fd):
        ep.register(fd, select.EPOLLIN)

    def serve() -> int:
        """The worker's loop until a frame reaches the wire: its kernel arrival time (ns)."""
        while True:
            events = ep.poll(1.0)
            if not events:
                raise SystemExit("nothing reached the wire within 1 s")
            for fd, _events in events:
                if fd == tap_fd:
                    engine.on_tap()
                elif fd == ring_fd:
                    engine.on_port(port)
                elif fd == wire_fd:
                    _data, anc, _flags, _addr = wire.recvmsg(2048, 64)
                    sec, nsec = struct.unpack("qq", anc[0][2][:16])
                    while True:
                        try:
                            wire.recv(2048)
                        except BlockingIOError:
                            break
                    return sec * 1_000_000_000 + nsec

    out = {}
    for gap in args.gaps:
        tap_us, port_us = [], []
        for seq in range(args.warmup + args.samples):
            time.sleep(gap / 1000)
            t = time.time_ns()
            ping.sendto(icmp_echo(seq), (PEER_IP, 0))
            got = serve()
            if seq >= args.warmup:
                tap_us.append((got - t) / 1000)
            time.sleep(gap / 1000)
            frame = prefix + echo_request(seq)
            t = time.time_ns()
            wire.send(frame)
            got = serve()
            if seq >= args.warmup:
                port_us.append((got - t) / 1000)
        out[f"{gap}ms"] = {"host_to_mesh_us": tap_us, "mesh_to_host_to_mesh_us": port_us}
    c = engine.counters
    out["counters"] = {k: c[k] for k in ("tx", "rx", "slow_host", "slow_mesh", "tx_ring_full", "tap_write_dropped")}
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(1, -(-len(s) * p // 100)) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default="this=.", help="NAME=PATH,...")
    ap.add_argument("--gaps", default="10,1", help="ms of idle before each sample")
    ap.add_argument("--rounds", type=int, default=6, help="fresh processes per tree, interleaved")
    ap.add_argument("--samples", type=int, default=100, help="per round, gap and direction")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.gaps = [float(g) for g in args.gaps.split(",")]
    if args.inner:
        print(json.dumps(inner(args)))
        return 0
    trees = [(name, str(Path(path).resolve())) for name, path in (t.split("=", 1) for t in args.trees.split(","))]
    samples: dict = {}
    for r in range(args.rounds):
        k = r % len(trees)
        for name, path in trees[k:] + trees[:k]:
            cmd = ["unshare", "--net", sys.executable, os.path.abspath(__file__), "--inner",
                   "--gaps", ",".join(str(g) for g in args.gaps), "--samples", str(args.samples),
                   "--warmup", str(args.warmup)]
            res = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(res.stderr)
            got = json.loads(res.stdout)
            print(name, r, got.pop("counters"), file=sys.stderr)
            for gap, series in got.items():
                for key, values in series.items():
                    samples.setdefault(f"{gap} {key}", {}).setdefault(name, []).append(values)
    summary = {}
    for key, per_tree in samples.items():
        summary[key] = {name: {"p50": round(statistics.median(pct(v, 50) for v in runs), 1),
                               "p90": round(statistics.median(pct(v, 90) for v in runs), 1),
                               "p50_per_round": [round(pct(v, 50), 1) for v in runs]}
                        for name, runs in per_tree.items()}
    print(json.dumps({"trees": dict(trees), "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
