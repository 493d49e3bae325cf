"""Routing announcements: B.A.T.M.A.N. IV OGM, B.A.T.M.A.N. V OGMv2 and ELP."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._util import need, pack
from .constants import COMPAT_VERSION, TTL, PacketType
from .mac import Mac
from .tvlv import Tvlv, TvlvCarrier, decode_tvlvs, encode_tvlvs


def _element_size(cls, buf, off: int) -> int | None:
    """Size of the aggregate element at `off` if its header and TVLVs fit and its
    tvlv_len is even (the kernel's aggregate walk), else None."""
    if len(buf) - off < cls.HEADER.size:
        return None
    (tvlv_len,) = struct.unpack_from("!H", buf, off + cls.TVLV_LEN_OFFSET)
    size = cls.HEADER.size + tvlv_len
    return size if size <= len(buf) - off and tvlv_len % 2 == 0 else None


@dataclass(slots=True, kw_only=True)
class IvOgm(TvlvCarrier):
    """struct batadv_ogm_packet (24 bytes) followed by its TVLV containers."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBBI6s6sBBH")
    JSON_EXTRA: ClassVar[tuple] = ("tvlv_len",)
    packet_type: int = PacketType.IV_OGM
    version: int = COMPAT_VERSION
    ttl: int = TTL
    flags: int = 0
    seqno: int
    orig: Mac
    prev_sender: Mac
    reserved: int = 0
    tq: int = 255
    tvlvs: list[Tvlv] = field(default_factory=list)

    TVLV_LEN_OFFSET: ClassVar[int] = 22

    @classmethod
    def peek_size(cls, buf, off: int) -> int | None:
        return _element_size(cls, buf, off)

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "IV OGM header")
        ptype, version, ttl, flags, seqno, orig, prev, reserved, tq, tvlv_len = cls.HEADER.unpack_from(buf, off)
        start = off + cls.HEADER.size
        need(buf, start, tvlv_len, "IV OGM TVLV data")
        tvlvs = decode_tvlvs(buf, start, start + tvlv_len)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, flags=flags, seqno=seqno, orig=Mac(orig),
                  prev_sender=Mac(prev), reserved=reserved, tq=tq, tvlvs=tvlvs)
        return pkt, start + tvlv_len

    def encode(self) -> bytes:
        tvlv = encode_tvlvs(self.tvlvs)
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.flags, self.seqno, self.orig,
                    self.prev_sender, self.reserved, self.tq, len(tvlv)) + tvlv


@dataclass(slots=True, kw_only=True)
class Ogm2(TvlvCarrier):
    """struct batadv_ogm2_packet (20 bytes) followed by its TVLV containers.

    `throughput` is the path throughput in units of 100 kbit/s (originator: 0xffffffff)."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBBI6sHI")
    JSON_EXTRA: ClassVar[tuple] = ("tvlv_len",)
    packet_type: int = PacketType.OGM2
    version: int = COMPAT_VERSION
    ttl: int = TTL
    flags: int = 0
    seqno: int
    orig: Mac
    throughput: int = 0xFFFFFFFF
    tvlvs: list[Tvlv] = field(default_factory=list)

    TVLV_LEN_OFFSET: ClassVar[int] = 14

    @classmethod
    def peek_size(cls, buf, off: int) -> int | None:
        return _element_size(cls, buf, off)

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "OGMv2 header")
        ptype, version, ttl, flags, seqno, orig, tvlv_len, throughput = cls.HEADER.unpack_from(buf, off)
        start = off + cls.HEADER.size
        need(buf, start, tvlv_len, "OGMv2 TVLV data")
        tvlvs = decode_tvlvs(buf, start, start + tvlv_len)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, flags=flags, seqno=seqno, orig=Mac(orig),
                  throughput=throughput, tvlvs=tvlvs)
        return pkt, start + tvlv_len

    def encode(self) -> bytes:
        tvlv = encode_tvlvs(self.tvlvs)
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.flags, self.seqno, self.orig,
                    len(tvlv), self.throughput) + tvlv


@dataclass(slots=True, kw_only=True)
class Elp:
    """struct batadv_elp_packet (16 bytes; no ttl byte).

    The kernel appends 4 zero bytes of TVLV padding (ELP_TVLV_PADDING) that receivers
    ignore; a decoded frame keeps whatever follows the 16 bytes as Frame.padding."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BB6sII")
    packet_type: int = PacketType.ELP
    version: int = COMPAT_VERSION
    orig: Mac
    seqno: int
    elp_interval: int = 500

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "ELP header")
        ptype, version, orig, seqno, interval = cls.HEADER.unpack_from(buf, off)
        pkt = cls(packet_type=ptype, version=version, orig=Mac(orig), seqno=seqno, elp_interval=interval)
        return pkt, off + cls.HEADER.size

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.orig, self.seqno, self.elp_interval)


ELP_TVLV_PADDING = bytes(4)
