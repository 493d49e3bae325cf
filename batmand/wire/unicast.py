"""Unicast-class packets (0x40..0x7f): UNICAST, UNICAST_4ADDR, UNICAST_FRAG, UNICAST_TVLV and
unicast types this codec does not know (the kernel still routes those by their dest)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._util import need, pack
from .constants import COMPAT_VERSION, TTL, PacketType
from .errors import WireError
from .ethernet import InnerFrame
from .mac import Mac
from .tvlv import Tvlv, TvlvCarrier, decode_tvlvs, encode_tvlvs


@dataclass(slots=True, kw_only=True)
class Unicast:
    """struct batadv_unicast_packet (10 bytes) + the inner Ethernet frame.

    `ttvn` is the sender's view of the destination originator's TT version."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s")
    packet_type: int = PacketType.UNICAST
    version: int = COMPAT_VERSION
    ttl: int = TTL
    ttvn: int
    dest: Mac
    inner: InnerFrame

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "UNICAST header")
        ptype, version, ttl, ttvn, dest = cls.HEADER.unpack_from(buf, off)
        inner = InnerFrame.decode(buf, off + cls.HEADER.size)
        return cls(packet_type=ptype, version=version, ttl=ttl, ttvn=ttvn, dest=Mac(dest), inner=inner), len(buf)

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.ttvn, self.dest) + self.inner.encode()


@dataclass(slots=True, kw_only=True)
class Unicast4Addr:
    """struct batadv_unicast_4addr_packet (18 bytes) + the inner Ethernet frame.

    `src` is the sending originator; `subtype` one of Unicast4AddrSubtype."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sBB")
    packet_type: int = PacketType.UNICAST_4ADDR
    version: int = COMPAT_VERSION
    ttl: int = TTL
    ttvn: int
    dest: Mac
    src: Mac
    subtype: int
    reserved: int = 0
    inner: InnerFrame

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "UNICAST_4ADDR header")
        ptype, version, ttl, ttvn, dest, src, subtype, reserved = cls.HEADER.unpack_from(buf, off)
        inner = InnerFrame.decode(buf, off + cls.HEADER.size)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, ttvn=ttvn, dest=Mac(dest), src=Mac(src),
                  subtype=subtype, reserved=reserved, inner=inner)
        return pkt, len(buf)

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.ttvn, self.dest, self.src,
                    self.subtype, self.reserved) + self.inner.encode()


@dataclass(slots=True, kw_only=True)
class UnicastFrag:
    """struct batadv_frag_packet (20 bytes) + fragment data.

    Byte 3 holds `no` (high nibble), `priority` (bits 3..1) and one reserved bit (bit 0),
    which is the same wire byte for the kernel's big- and little-endian bitfield layouts.
    Fragment `no` 0 carries the tail of the packet; the highest `no` carries its head."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sHH")
    packet_type: int = PacketType.UNICAST_FRAG
    version: int = COMPAT_VERSION
    ttl: int = TTL
    no: int = 0
    priority: int = 0
    reserved: int = 0
    dest: Mac
    orig: Mac
    seqno: int
    total_size: int
    data: bytes = b""

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "UNICAST_FRAG header")
        ptype, version, ttl, bits, dest, orig, seqno, total = cls.HEADER.unpack_from(buf, off)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, no=bits >> 4, priority=(bits >> 1) & 0x7,
                  reserved=bits & 1, dest=Mac(dest), orig=Mac(orig), seqno=seqno, total_size=total,
                  data=bytes(buf[off + cls.HEADER.size :]))
        return pkt, len(buf)

    def encode(self) -> bytes:
        if not (0 <= self.no <= 15 and 0 <= self.priority <= 7 and self.reserved in (0, 1)):
            raise WireError(f"fragment bitfield out of range: no={self.no} priority={self.priority}")
        bits = (self.no << 4) | (self.priority << 1) | self.reserved
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, bits, self.dest, self.orig,
                    self.seqno, self.total_size) + self.data


@dataclass(slots=True, kw_only=True)
class UnicastTvlv(TvlvCarrier):
    """struct batadv_unicast_tvlv_packet (20 bytes) + TVLVs: TT request/response, roaming."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sHH")
    JSON_EXTRA: ClassVar[tuple] = ("tvlv_len",)
    packet_type: int = PacketType.UNICAST_TVLV
    version: int = COMPAT_VERSION
    ttl: int = TTL
    reserved: int = 0
    dst: Mac
    src: Mac
    align: int = 0
    tvlvs: list[Tvlv] = field(default_factory=list)

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "UNICAST_TVLV header")
        ptype, version, ttl, reserved, dst, src, tvlv_len, align = cls.HEADER.unpack_from(buf, off)
        start = off + cls.HEADER.size
        need(buf, start, tvlv_len, "UNICAST_TVLV TVLV data")
        tvlvs = decode_tvlvs(buf, start, start + tvlv_len)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, reserved=reserved, dst=Mac(dst), src=Mac(src),
                  align=align, tvlvs=tvlvs)
        return pkt, start + tvlv_len

    def encode(self) -> bytes:
        tvlv = encode_tvlvs(self.tvlvs)
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.reserved, self.dst, self.src,
                    len(tvlv), self.align) + tvlv


@dataclass(slots=True, kw_only=True)
class UnknownUnicast:
    """A unicast-class type (0x40..0x7f) this codec does not know. Only the common head
    is interpreted: the kernel routes such packets toward `dest` when they are not for it."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s")
    packet_type: int
    version: int = COMPAT_VERSION
    ttl: int = TTL
    reserved: int = 0
    dest: Mac
    body: bytes = b""

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "unicast-class header")
        ptype, version, ttl, reserved, dest = cls.HEADER.unpack_from(buf, off)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, reserved=reserved, dest=Mac(dest),
                  body=bytes(buf[off + cls.HEADER.size :]))
        return pkt, len(buf)

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.reserved, self.dest) + self.body
