"""OGM load for bench/control_plane.py: N kernel-like neighbours on one link, with M
originators behind them, as one batmand node would hear them in a large B.A.T.M.A.N. IV mesh.

Every second each neighbour sends its own OGM (orig = prev_sender = its MAC, TTL 50, TQ 255)
and forwards one OGM of each originator X (prev_sender a node behind it, lower TTL and TQ);
every OGM carries a TT container whose CRC matches its originator's table (one client on
the untagged VLAN). OGMs are aggregated per neighbour as the kernel does (at most 512 bytes
and 32 OGMs per frame), and the second is cut into slots so the sends are spread over it.
Like a kernel neighbour it also echoes the daemon's own OGMs (DIRECTLINK, TTL-1,
prev_sender = the daemon), so that the links are bidirectional, and answers the daemon's
TT requests for any of its nodes with the full table.

Frames are built once with the wire codec; per send only the seqnos are patched, which lets
one Python process reach tens of thousands of OGMs per second. Counters (what it sent,
when, its own CPU) go to --stats as JSON once a second and at exit. Run it inside the
generator's namespace, e.g.

    ip netns exec NS .venv/bin/python bench/ogm_load.py --iface gen0 --neighbours 3 \
        --originators 1000 --stats /tmp/s.json
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tt_tables import full_table  # noqa: E402
from batmand.wire import (BROADCAST, ETH_P_BATMAN, DatTvlv, IvOgm, Mac, McastTvlv, OgmFlags,  # noqa: E402
                          TtDataFlags, TtTvlv, TtVlan, UnicastTvlv, WireError, build_frame, decode_frame,
                          tt_vlan_crc)

MAX_AGGREGATION_BYTES = 512  # bat_iv_ogm.c: batman-adv bytes per aggregated frame
MAX_AGGREGATION_PACKETS = 32
ETH_HLEN = 14
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23  # not in Python's socket module; our own sends are not input
SEQNO = struct.Struct("!I")
OGM_SEQNO_OFF, OGM_ORIG, OGM_TVLV_LEN = 4, slice(8, 14), slice(22, 24)
HOP_PENALTY_TQ = 225  # what a kernel neighbour leaves of TQ 255 (hop_penalty 30)
# --tvlvs kernel: what a current kernel node without multicast listeners or routers adds
# (MCAST v2: WANT_NO_RTR4 | WANT_NO_RTR6 | HAVE_MC_PTYPE_CAPA; DAT v1, empty)
KERNEL_MCAST_FLAGS = 0x38

# locally administered MACs, one prefix per role, the index in the low three bytes
NEIGHBOUR, ORIGINATOR, CLIENT, BEHIND = 0x4E, 0x0F, 0xC1, 0xBE


def mac(role: int, i: int) -> Mac:
    return Mac(bytes([0x02, role, 0, (i >> 16) & 0xFF, (i >> 8) & 0xFF, i & 0xFF]))


class Node:
    """A simulated originator (neighbour or farther) and its one-client TT table."""

    __slots__ = ("orig", "client", "ttvn", "crc")

    def __init__(self, orig: Mac, client: Mac, ttvn: int = 1) -> None:
        self.orig, self.client, self.ttvn = orig, client, ttvn
        self.crc = tt_vlan_crc([(client, 0)], 0)

    def ogm_tvlvs(self, kernel: bool) -> list:
        # the kernel's TT container: OGM_DIFF, no changes once the table is settled
        tt = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=self.ttvn, vlans=[TtVlan(crc=self.crc, vid=0)])
        return [McastTvlv(KERNEL_MCAST_FLAGS), DatTvlv(), tt] if kernel else [tt]

    def full_table(self) -> TtTvlv:
        return full_table([self.client], self.ttvn)


def forward_tq(n: int, x: int, neighbours: int) -> int:
    """TQ of X's OGM as neighbour n forwards it: a different neighbour is best for different
    originators, so the daemon's routes spread over all links."""
    return 240 - (200 * ((x + n) % neighbours)) // max(neighbours, 1)


def aggregate(src: Mac, elements: list[bytes]) -> list[tuple[bytearray, tuple[int, ...]]]:
    """Pack OGMs into broadcast frames as the kernel aggregates them; returns each frame with
    the offsets of its seqnos."""
    frames, cur, offs, size = [], [], [], 0
    for e in elements:
        if cur and (size + len(e) > MAX_AGGREGATION_BYTES or len(cur) == MAX_AGGREGATION_PACKETS):
            frames.append((cur, offs))
            cur, offs, size = [], [], 0
        offs.append(ETH_HLEN + size + OGM_SEQNO_OFF)
        cur.append(e)
        size += len(e)
    if cur:
        frames.append((cur, offs))
    head = bytes(BROADCAST) + bytes(src) + struct.pack("!H", ETH_P_BATMAN)
    return [(bytearray(head + b"".join(parts)), tuple(o)) for parts, o in frames]


class Load:
    def __init__(self, neighbours: int, originators: int, slots: int, kernel_tvlvs: bool = False) -> None:
        self.slots = slots
        self.neighbours = [Node(mac(NEIGHBOUR, n), mac(CLIENT, 0x800000 | n)) for n in range(neighbours)]
        self.origs = [Node(mac(ORIGINATOR, x), mac(CLIENT, x)) for x in range(originators)]
        self.by_mac = {bytes(nd.orig): nd for nd in self.neighbours + self.origs}
        self.neighbour_macs = {bytes(nd.orig) for nd in self.neighbours}
        # schedule[k]: the frames of slot k, each (bytes, seqno offsets, OGMs in it)
        self.schedule: list[list[tuple[bytearray, tuple[int, ...]]]] = [[] for _ in range(slots)]
        for n, nb in enumerate(self.neighbours):
            for k in range(slots):
                elems = []
                if n % slots == k:
                    elems.append(IvOgm(seqno=0, orig=nb.orig, prev_sender=nb.orig, ttl=50, tq=255,
                                       tvlvs=nb.ogm_tvlvs(kernel_tvlvs)).encode())
                for x in range(k, originators, slots):
                    o = self.origs[x]
                    elems.append(IvOgm(seqno=0, orig=o.orig, prev_sender=mac(BEHIND, x), ttl=48,
                                       tq=forward_tq(n, x, neighbours), tvlvs=o.ogm_tvlvs(kernel_tvlvs)).encode())
                self.schedule[k].extend(aggregate(nb.orig, elems))
        self.per_second = neighbours * originators + neighbours

    def frames_per_second(self) -> int:
        return sum(len(s) for s in self.schedule)


class Generator:
    def __init__(self, iface: str, load: Load, stats_path: str) -> None:
        self.load, self.stats_path = load, stats_path
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.tx.bind((iface, 0))
        self.tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_BATMAN))
        self.rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.rx.bind((iface, ETH_P_BATMAN))
        self.rx.setblocking(False)
        self.daemon_mac: bytes | None = None
        self.c = dict(ogms=0, frames=0, echoes=0, send_errors=0, late_slots=0, max_lag_ms=0.0, rx_frames=0,
                      daemon_ogms=0, tt_requests=0, tt_responses=0, tt_unknown=0, other_rx=0)
        self.stop = False

    def send(self, frame) -> bool:
        try:
            self.tx.send(frame)
            return True
        except OSError:  # ENOBUFS: the frame is lost, as on a congested link
            self.c["send_errors"] += 1
            return False

    # ---- what the daemon sends us
    def drain(self) -> None:
        while True:
            try:
                data = self.rx.recv(4096)
            except BlockingIOError:
                return
            self.c["rx_frames"] += 1
            if len(data) < ETH_HLEN + 2:
                continue
            if data[ETH_HLEN] == 0x00:
                self.on_ogms(data)
            elif data[ETH_HLEN] == 0x44:
                self.on_unicast_tvlv(data)
            else:
                self.c["other_rx"] += 1

    def on_ogms(self, data: bytes) -> None:
        """Walk the aggregate; the daemon's own OGM (orig = its source MAC) is echoed."""
        src = data[6:12]
        self.daemon_mac = src
        off = ETH_HLEN
        while off + IvOgm.HEADER.size <= len(data) and data[off] == 0x00:
            size = IvOgm.HEADER.size + int.from_bytes(data[off + 22:off + 24], "big")
            if data[off + 8:off + 14] == src:
                self.c["daemon_ogms"] += 1
                self.echo(data[off:off + size], src)
            off += size

    def echo(self, own: bytes, daemon: bytes) -> None:
        """batadv_iv_ogm_forward of a single-hop neighbour's OGM, from each neighbour."""
        ogm = bytearray(own)
        ogm[2] = max(ogm[2] - 1, 0)
        ogm[3] |= OgmFlags.DIRECTLINK
        ogm[14:20] = daemon
        ogm[21] = HOP_PENALTY_TQ
        tail = struct.pack("!H", ETH_P_BATMAN) + ogm
        for nb in self.load.neighbours:
            if self.send(bytes(BROADCAST) + bytes(nb.orig) + tail):
                self.c["echoes"] += 1

    def on_unicast_tvlv(self, data: bytes) -> None:
        """A TT request for one of our nodes: the node answers with its full table, via the
        neighbour the request was sent to."""
        try:
            frame = decode_frame(data)
        except WireError:
            self.c["other_rx"] += 1
            return
        pkt = frame.packet
        if not isinstance(pkt, UnicastTvlv):
            return
        for tvlv in pkt.tvlvs:
            if not isinstance(tvlv, TtTvlv) or tvlv.flags & 0x0F != TtDataFlags.REQUEST:
                continue
            self.c["tt_requests"] += 1
            node = self.load.by_mac.get(bytes(pkt.dst))
            via = bytes(frame.ethernet.h_dest)
            if node is None or via not in self.load.neighbour_macs:
                self.c["tt_unknown"] += 1
                continue
            hops = 0 if node.orig == via else 2
            reply = UnicastTvlv(ttl=50 - hops, dst=pkt.src, src=node.orig, tvlvs=[node.full_table()])
            if self.send(build_frame(frame.ethernet.h_source, Mac(via), reply)):
                self.c["tt_responses"] += 1

    # ---- the schedule
    def write_stats(self, t: float, cpu0: float) -> None:
        ts = os.times()
        out = dict(self.c, t=t, cpu_s=ts.user + ts.system - cpu0, target_per_s=self.load.per_second,
                   frames_per_s_target=self.load.frames_per_second(),
                   daemon_mac=self.daemon_mac.hex(":") if self.daemon_mac else None)
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, self.stats_path)

    def run(self) -> None:
        slots = self.load.slots
        slot_len = 1.0 / slots
        ts = os.times()
        cpu0 = ts.user + ts.system
        seq0 = int.from_bytes(os.urandom(2), "big")
        start = time.monotonic()
        i = 0
        while not self.stop:
            due = start + i * slot_len
            while True:
                now = time.monotonic()
                if now >= due:
                    break
                if select.select([self.rx], [], [], due - now)[0]:
                    self.drain()
            lag = now - due
            if lag > slot_len:
                self.c["late_slots"] += 1
            self.c["max_lag_ms"] = max(self.c["max_lag_ms"], round(lag * 1000, 2))
            second, k = divmod(i, slots)
            if k == 0:
                self.write_stats(now, cpu0)
            seqno = (seq0 + second) & 0xFFFFFFFF
            pack = SEQNO.pack_into
            for frame, offs in self.load.schedule[k]:
                for off in offs:
                    pack(frame, off, seqno)
                if self.send(frame):
                    self.c["frames"] += 1
                    self.c["ogms"] += len(offs)
            self.drain()
            i += 1
        self.write_stats(time.monotonic(), cpu0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iface", required=True)
    ap.add_argument("--neighbours", type=int, default=3)
    ap.add_argument("--originators", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=25, help="send slots per second")
    ap.add_argument("--tvlvs", choices=("tt", "kernel"), default="tt",
                    help="containers per OGM: TT only, or MCAST + DAT + TT as a current kernel sends")
    ap.add_argument("--stats", required=True, help="JSON counters, rewritten every second")
    args = ap.parse_args()
    load = Load(args.neighbours, args.originators, args.slots, kernel_tvlvs=args.tvlvs == "kernel")
    gen = Generator(args.iface, load, args.stats)

    def stop(*_):
        gen.stop = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    gen.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
