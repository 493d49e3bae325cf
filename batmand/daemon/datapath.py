"""The inline data path (`--workers 0`): unicast frames between the TAP and the hard
interfaces, using only the forwarding table the core publishes. Whatever it cannot handle
with certainty (broadcast, unknown clients, stale TT versions, control packets) goes to
the protocol core, the slow path, which applies the kernel's full rules."""

from __future__ import annotations

import collections

from batmand.core.bitarray import seq_before8
from batmand.core.forwarding import ForwardingTable
from batmand.wire.fastpath import UNICAST_PREFIX_LEN, unicast_prefix

_BATMAN = b"\x43\x05"
_VLAN = b"\x81\x00"


def _vid(frame, off: int) -> tuple[int, int] | None:
    """(TT vid, offset of the ethertype behind any tag) of the Ethernet header at off."""
    if frame[off + 12:off + 14] != _VLAN:
        return 0, off + 12
    if len(frame) < off + 18:
        return None
    vid = (frame[off + 14] << 8 | frame[off + 15]) & 0x0FFF
    return (0x8000 | vid if vid else 0), off + 16


class InlineDataPath:
    def __init__(self, send, deliver) -> None:
        self.fwd = ForwardingTable()
        self.send = send  # (iface name, frame) -> bool
        self.deliver = deliver  # frame -> None
        self.counters = collections.Counter()
        self.seen: dict = {}  # local clients seen sending: (mac, vid) -> time
        self.ifaces: dict[str, tuple[bytes, int]] = {}  # name -> (mac, mtu)
        self.primary: bytes | None = None
        self.wifi = False  # per-interface routing tables differ from the default one only on Wi-Fi
        self._prefixes: dict = {}

    def apply(self, update) -> None:
        self.fwd.apply(update)
        self._prefixes.clear()

    def set_interfaces(self, ifaces: dict[str, tuple[bytes, int]], primary: bytes | None) -> None:
        self.ifaces = dict(ifaces)
        self.primary = primary
        self._prefixes.clear()

    def from_host(self, now: float, frame: bytes) -> bool:
        """A frame from the TAP: encapsulate known unicast; False hands it to the slow path."""
        if len(frame) < 14 or frame[0] & 1:
            return False
        tagged = _vid(frame, 0)
        if tagged is None or frame[tagged[1]:tagged[1] + 2] == _BATMAN:
            return False
        vid = tagged[0]
        src = frame[6:12]
        if self.fwd.local_clients.get((src, vid)) is not True:
            return False  # the core learns (or refuses) this client
        hit = self.fwd.lookup(frame[0:6], vid)
        if hit is None:
            return False
        orig, next_hop, iface, ttvn = hit
        out = self.ifaces.get(iface)
        if out is None or len(frame) + UNICAST_PREFIX_LEN - 14 > out[1]:
            return False
        key = (orig, next_hop, iface, ttvn)
        prefix = self._prefixes.get(key)
        if prefix is None:
            prefix = self._prefixes[key] = unicast_prefix(next_hop, out[0], orig, ttvn)
        self.seen[(src, vid)] = now
        if not self.send(iface, prefix + frame):
            return False
        self.counters["tx"] += 1
        self.counters["tx_bytes"] += len(frame)
        return True

    def from_mesh(self, ifname: str, frame: bytes) -> bool:
        """A UNICAST frame from a hard interface: deliver or forward; False: slow path."""
        if len(frame) < UNICAST_PREFIX_LEN + 14 or frame[14] != 0x40 or frame[15] != 15 \
                or frame[12:14] != _BATMAN or frame[6] & 1:
            return False
        here = self.ifaces.get(ifname)
        if here is None or frame[0:6] != here[0]:
            return False
        tagged = _vid(frame, UNICAST_PREFIX_LEN)
        if tagged is None:
            return False
        inner_dst = frame[UNICAST_PREFIX_LEN:UNICAST_PREFIX_LEN + 6]
        client = (inner_dst, tagged[0])
        dest, ttvn = frame[18:24], frame[17]
        if dest == self.primary:
            if seq_before8(ttvn, self.fwd.own_ttvn):
                return False
            if not (inner_dst[0] & 1 or self.fwd.local_clients.get(client) is True):
                return False
            self.deliver(frame[UNICAST_PREFIX_LEN:])
            self.counters["rx_unicast"] += 1
            self.counters["rx"] += 1
            self.counters["rx_bytes"] += len(frame) - UNICAST_PREFIX_LEN
            return True
        route = self.fwd.origs.get(dest)
        if route is None or self.wifi or frame[16] < 2 or client in self.fwd.local_clients:
            return False
        if seq_before8(ttvn, route.ttvn):
            return False
        out = self.ifaces.get(route.iface)
        if out is None or len(frame) - 14 > out[1]:
            return False
        forwarded = bytearray(frame)
        forwarded[0:6] = route.next_hop
        forwarded[6:12] = out[0]
        forwarded[16] -= 1
        if not self.send(route.iface, forwarded):
            return False
        self.counters["rx_unicast"] += 1
        self.counters["forward"] += 1
        self.counters["forward_bytes"] += len(frame)
        return True

    def take_seen(self) -> dict:
        seen, self.seen = self.seen, {}
        return seen
