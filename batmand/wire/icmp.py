"""batman-adv ICMP: echo, errors, the record-route variant and the throughput-meter packet."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar

from ._util import need, pack
from .constants import COMPAT_VERSION, RR_LEN, TTL, IcmpMsgType, PacketType
from .errors import WireError
from .mac import ZERO, Mac


@dataclass(slots=True, kw_only=True)
class IcmpPacket:
    """struct batadv_icmp_packet (20 bytes): echo request/reply and error messages."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sBBH")
    packet_type: int = PacketType.ICMP
    version: int = COMPAT_VERSION
    ttl: int = TTL
    msg_type: int
    dst: Mac
    orig: Mac
    uid: int = 0
    reserved: int = 0
    seqno: int = 0

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "ICMP packet")
        ptype, version, ttl, msg, dst, orig, uid, reserved, seqno = cls.HEADER.unpack_from(buf, off)
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, msg_type=msg, dst=Mac(dst), orig=Mac(orig),
                  uid=uid, reserved=reserved, seqno=seqno)
        return pkt, off + cls.HEADER.size

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.msg_type, self.dst, self.orig,
                    self.uid, self.reserved, self.seqno)


def _empty_rr() -> list[Mac]:
    return [ZERO] * RR_LEN


@dataclass(slots=True, kw_only=True)
class IcmpRRPacket:
    """struct batadv_icmp_packet_rr (116 bytes): echo with 16 route-record slots."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sBBH")
    SIZE: ClassVar[int] = 20 + 6 * RR_LEN
    packet_type: int = PacketType.ICMP
    version: int = COMPAT_VERSION
    ttl: int = TTL
    msg_type: int
    dst: Mac
    orig: Mac
    uid: int = 0
    rr_cur: int = 0
    seqno: int = 0
    rr: list[Mac] = field(default_factory=_empty_rr)

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.SIZE, "ICMP record-route packet")
        ptype, version, ttl, msg, dst, orig, uid, rr_cur, seqno = cls.HEADER.unpack_from(buf, off)
        base = off + cls.HEADER.size
        rr = [Mac(buf[base + 6 * i : base + 6 * i + 6]) for i in range(RR_LEN)]
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, msg_type=msg, dst=Mac(dst), orig=Mac(orig),
                  uid=uid, rr_cur=rr_cur, seqno=seqno, rr=rr)
        return pkt, off + cls.SIZE

    def encode(self) -> bytes:
        if len(self.rr) != RR_LEN:
            raise WireError(f"record route needs exactly {RR_LEN} slots, got {len(self.rr)}")
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.msg_type, self.dst, self.orig,
                    self.uid, self.rr_cur, self.seqno) + b"".join(self.rr)


@dataclass(slots=True, kw_only=True)
class IcmpTpPacket:
    """struct batadv_icmp_tp_packet (28 bytes) + payload: throughput meter MSG/ACK.

    `seqno` counts bytes of the test stream; `timestamp` is opaque (echoed in the ACK)."""

    HEADER: ClassVar[struct.Struct] = struct.Struct("!BBBB6s6sBB2sII")
    packet_type: int = PacketType.ICMP
    version: int = COMPAT_VERSION
    ttl: int = TTL
    msg_type: int = IcmpMsgType.TP
    dst: Mac
    orig: Mac
    uid: int = 0
    subtype: int = 0
    session: bytes = b"\x00\x00"
    seqno: int = 0
    timestamp: int = 0
    data: bytes = b""

    @classmethod
    def decode(cls, buf, off: int = 0):
        need(buf, off, cls.HEADER.size, "ICMP throughput-meter packet")
        (ptype, version, ttl, msg, dst, orig, uid, subtype, session, seqno,
         timestamp) = cls.HEADER.unpack_from(buf, off)
        data = bytes(buf[off + cls.HEADER.size :])
        pkt = cls(packet_type=ptype, version=version, ttl=ttl, msg_type=msg, dst=Mac(dst), orig=Mac(orig),
                  uid=uid, subtype=subtype, session=session, seqno=seqno, timestamp=timestamp, data=data)
        return pkt, len(buf)

    def encode(self) -> bytes:
        return pack(self.HEADER, self.packet_type, self.version, self.ttl, self.msg_type, self.dst, self.orig,
                    self.uid, self.subtype, bytes(self.session), self.seqno, self.timestamp) + self.data


def decode_icmp(buf, off: int = 0):
    """Pick the ICMP form as the kernel does: TP by msg_type; record route for echo
    request/reply of at least 116 bytes; the 20-byte form otherwise."""
    need(buf, off, IcmpPacket.HEADER.size, "ICMP packet")
    msg_type = buf[off + 3]
    if msg_type == IcmpMsgType.TP:
        return IcmpTpPacket.decode(buf, off)
    if msg_type in (IcmpMsgType.ECHO_REQUEST, IcmpMsgType.ECHO_REPLY) and len(buf) - off >= IcmpRRPacket.SIZE:
        return IcmpRRPacket.decode(buf, off)
    return IcmpPacket.decode(buf, off)
