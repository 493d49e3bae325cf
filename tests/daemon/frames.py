"""What the links carry, frame by frame, for the distributed ARP table's lab tests: a
capture (tests/daemon/dhcp.py's BatmanCapture: an ETH_P_ALL socket per interface with a
batman-adv-only filter) that keeps each frame's bytes and decoding, and the questions the
tests ask of it (the DAT frames an originator sent, the ARP it broadcast, its OGMs'
containers), plus an ARP request written straight into a node's bat0."""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

from batmand.wire import Bcast, DatTvlv, IvOgm, Mac, Unicast, Unicast4Addr, WireError, decode_frame
from tests.daemon.dhcp import PACKET_OUTGOING, BatmanCapture
from tests.netns import entered

ETH_P_ARP = 0x0806
SO_TIMESTAMPNS = 35
SUBTYPE_NAMES = {1: "DATA", 2: "DHT_GET", 3: "DHT_PUT", 4: "CACHE_REPLY"}


@dataclass(frozen=True)
class Seen:
    ifname: str
    outgoing: bool
    raw: bytes
    frame: object | None  # batmand.wire.Frame, None when it did not decode
    t: float = 0.0  # when the interface saw it (the kernel's timestamp, wall clock)

    @property
    def packet(self):
        return self.frame.packet if self.frame is not None and self.frame.packets else None

    def describe(self) -> str:
        p = self.packet
        where = f"{self.t % 100:9.6f} {self.ifname} {'out' if self.outgoing else 'in '}"
        if isinstance(p, Unicast4Addr):
            return (f"{where} 4ADDR {SUBTYPE_NAMES.get(p.subtype, p.subtype)} src {p.src} dest {p.dest} ttl {p.ttl} "
                    f"ttvn {p.ttvn} inner {arp_text(p.inner)}: {self.raw.hex()}")
        if isinstance(p, Unicast):
            return f"{where} UNICAST dest {p.dest} ttl {p.ttl} inner {arp_text(p.inner)}"
        if isinstance(p, Bcast):
            return f"{where} BCAST orig {p.orig} seqno {p.seqno} inner {arp_text(p.inner)}"
        return f"{where} {type(p).__name__}"


def arp_fields(inner) -> tuple[int, str, str, str, str] | None:
    """(op, sender MAC, sender IP, target MAC, target IP) of an inner ARP frame, else None."""
    if inner is None or inner.h_proto != ETH_P_ARP or len(inner.payload) < 28:
        return None
    p = inner.payload
    ip = lambda b: socket.inet_ntoa(bytes(b))  # noqa: E731
    return (p[6] << 8 | p[7], str(Mac(p[8:14])), ip(p[14:18]), str(Mac(p[18:24])), ip(p[24:28]))


def arp_text(inner) -> str:
    fields = arp_fields(inner)
    if fields is None:
        return f"ethertype 0x{inner.h_proto:04x}" if inner is not None else "-"
    op, sha, spa, tha, tpa = fields
    return f"who-has {tpa} tell {spa} ({sha})" if op == 1 else f"{spa} is-at {sha} (to {tha}/{tpa})"


class FrameCapture(BatmanCapture):
    """BatmanCapture keeping every frame (bytes, decoding, direction) in `seen`."""

    def __init__(self, ns: str, ifnames: list[str]) -> None:
        super().__init__(ns, ifnames)
        self.seen: list[Seen] = []

    def start(self) -> "FrameCapture":
        super().start()
        for sock in self._socks:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return self

    def _drain(self, sock) -> None:
        while True:
            try:
                raw, ancdata, _, addr = sock.recvmsg(65535, 64)
            except (BlockingIOError, OSError):
                return
            t = time.time()
            for level, kind, data in ancdata:
                if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS) and len(data) >= 16:
                    sec, nsec = struct.unpack("qq", data[:16])
                    t = sec + nsec / 1e9
            try:
                frame = decode_frame(raw)
            except WireError:
                frame = None
            with self._lock:
                self.seen.append(Seen(self._socks[sock], addr[2] == PACKET_OUTGOING, raw, frame, t))

    def seen_frames(self, outgoing: bool | None = None) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if outgoing is None or s.outgoing == outgoing]

    def dat(self, *, outgoing: bool | None = None, src: str | None = None, subtype: int | None = None) -> list[Seen]:
        """UNICAST_4ADDR frames of the DAT subtypes (2, 3, 4), from originator `src` if given."""
        return [s for s in self.seen_frames(outgoing)
                if isinstance(s.packet, Unicast4Addr) and s.packet.subtype in (2, 3, 4)
                and (src is None or str(s.packet.src) == src) and (subtype is None or s.packet.subtype == subtype)]

    def arp_broadcasts(self, *, orig: str, outgoing: bool | None = None) -> list[Seen]:
        """BCAST frames of originator `orig` carrying an ARP frame."""
        return [s for s in self.seen_frames(outgoing) if isinstance(s.packet, Bcast) and str(s.packet.orig) == orig
                and s.packet.inner.h_proto == ETH_P_ARP]

    def own_ogms(self, orig: str) -> list[IvOgm]:
        """The IV OGMs of originator `orig` sent out of these interfaces."""
        return [p for s in self.seen_frames(outgoing=True) if s.frame is not None for p in s.frame.packets
                if isinstance(p, IvOgm) and str(p.orig) == orig]

    def summary(self, outgoing: bool | None = None) -> str:
        """One line per frame that is not an OGM, for assertion messages."""
        frames = sorted(self.seen_frames(outgoing), key=lambda s: s.t)
        lines = [s.describe() for s in frames if not isinstance(s.packet, IvOgm)]
        return "\n".join(lines) or "(none but OGMs)"


def has_dat_container(ogm: IvOgm) -> bool:
    return any(isinstance(t, DatTvlv) for t in ogm.tvlvs)


def arp_request(sha: str, spa: str, tpa: str) -> bytes:
    """A broadcast ARP request (who-has tpa tell spa) as a host writes it to bat0."""
    mac = bytes(Mac(sha))
    body = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, mac, socket.inet_aton(spa), bytes(6),
                       socket.inet_aton(tpa))
    return b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP) + body


def host_sends(ns: str, frame: bytes, ifname: str = "bat0") -> None:
    """One frame from the node's host into its bat0 (a packet socket on the TAP)."""
    with entered(ns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        sock.bind((ifname, 0))
        sock.send(frame)
