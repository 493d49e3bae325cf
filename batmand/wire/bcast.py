"""Flooded and multicast data: BCAST and MCAST packets."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._util import need, pack
from .constants import COMPAT_VERSION, TTL, PacketType
from .ethernet import InnerFrame
from .mac import Mac
from .tvlv import Tvlv, TvlvCarrier, decode_tvlvs, encode_tvlvs


@dataclass(slots=True, kw_only=True)
class Bcast:
    """struct batadv_bcast_packet (14 bytes) + the inner Ethernet frame.
    The originator sends TTL 49 (BATADV_TTL - 1)."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBBI6s")
    packet_type: int = PacketType.BCAST
    version: int = COMPAT_VERSION
    ttl: int = TTL - 1
    reserved: int = 0
    seqno: int
    orig: Mac
    inner: InnerFrame

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "BCAST header")
        ptype, version, ttl, reserved, seqno, orig = cls.HEADER.unpack_from(buf, off)
        inner = InnerFrame.decode(buf, off + cls.HEADER.size)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, reserved=reserved, seqno=seqno, orig=Mac(orig),
                  inner=inner)
        return pkt, len(buf)

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.reserved, self.seqno,
                    self.orig) + self.inner.encode()


@dataclass(slots=True, kw_only=True)
class Mcast(TvlvCarrier):
    """struct batadv_mcast_packet (6 bytes) + TVLVs (a multicast tracker) + the inner frame."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBBH")
    JSON_EXTRA: ClassVar[tuple] = ("tvlv_len",)
    packet_type: int = PacketType.MCAST
    version: int = COMPAT_VERSION
    ttl: int = TTL
    reserved: int = 0
    tvlvs: list[Tvlv] = field(default_factory=list)
    inner: InnerFrame

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "MCAST header")
        ptype, version, ttl, reserved, tvlv_len = cls.HEADER.unpack_from(buf, off)
        start = off + cls.HEADER.size
        need(buf, start, tvlv_len, "MCAST TVLV data")
        tvlvs = decode_tvlvs(buf, start, start + tvlv_len)
        inner = InnerFrame.decode(buf, start + tvlv_len)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, reserved=reserved, tvlvs=tvlvs, inner=inner)
        return pkt, len(buf)

    def encode(self) -> bytes:
        tvlv = encode_tvlvs(self.tvlvs)
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.reserved, len(tvlv)) + tvlv + \
            self.inner.encode()
