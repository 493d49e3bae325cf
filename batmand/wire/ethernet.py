"""Ethernet headers: the outer header of a batman-adv frame and the inner frame it carries."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._util import need
from .constants import ETH_P_8021Q
from .mac import Mac

_ETH = struct.Struct("!6s6sH")
ETH_HLEN = 14


@dataclass(slots=True)
class Ethernet:
    """struct ethhdr: the outer header on the hard interface."""

    h_dest: Mac
    h_source: Mac
    h_proto: int

    SIZE: ClassVar[int] = ETH_HLEN

    @classmethod
    def decode(cls, buf) -> "Ethernet":
        need(buf, 0, ETH_HLEN, "Ethernet header")
        dest, source, proto = _ETH.unpack_from(buf)
        return cls(Mac(dest), Mac(source), proto)

    def encode(self) -> bytes:
        return _ETH.pack(self.h_dest, self.h_source, self.h_proto)


@dataclass(slots=True, frozen=True)
class InnerFrame:
    """The Ethernet frame a UNICAST/BCAST/MCAST packet carries, as the host stack sent it.

    One 802.1Q tag is split out (`vlan_tci`); `h_proto` is then the ethertype behind it.
    `payload` runs to the end of the batman-adv packet, so Ethernet padding of a short outer
    frame stays in it, exactly as the kernel hands it to the soft interface."""

    h_dest: Mac
    h_source: Mac
    h_proto: int
    payload: bytes = b""
    vlan_tci: int | None = None
    raw: bytes | None = field(default=None, compare=False, repr=False)  # the bytes it was decoded from

    @classmethod
    def decode(cls, buf, off: int = 0) -> "InnerFrame":
        need(buf, off, ETH_HLEN, "inner Ethernet header")
        raw = bytes(buf[off:])
        dest, source, proto = _ETH.unpack_from(raw)
        start = ETH_HLEN
        tci = None
        if proto == ETH_P_8021Q:
            need(raw, start, 4, "inner 802.1Q tag")
            tci, proto = struct.unpack_from("!HH", raw, start)
            start += 4
        return cls(Mac(dest), Mac(source), proto, raw[start:], tci, raw)

    def encode(self) -> bytes:
        """The frame's bytes: those it was decoded from (delivering and forwarding never
        rebuild it), else built from the fields."""
        if self.raw is not None:
            return self.raw
        if self.vlan_tci is None:
            return _ETH.pack(self.h_dest, self.h_source, self.h_proto) + self.payload
        return (
            _ETH.pack(self.h_dest, self.h_source, ETH_P_8021Q)
            + struct.pack("!HH", self.vlan_tci, self.h_proto)
            + self.payload
        )

    @property
    def vid(self) -> int | None:
        """The 12-bit VLAN id, or None when untagged."""
        return None if self.vlan_tci is None else self.vlan_tci & 0x0FFF
