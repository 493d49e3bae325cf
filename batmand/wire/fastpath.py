"""Buffer helpers for the data-plane hot path: unicast encapsulation and decapsulation
without building objects. The general codec (decode_frame) is for the control plane.

A forwarding-table entry keeps a ready 24-byte prefix (outer Ethernet header + UNICAST
header) per destination, so encapsulation is a single concatenation (or a two-element
iovec for sendmsg)."""

from __future__ import annotations

import struct

from .constants import COMPAT_VERSION, TTL

_PREFIX = struct.Struct("!6s6sHBBBB6s")
UNICAST_PREFIX_LEN = 14 + 10  # outer Ethernet + batadv_unicast_packet
UNICAST_4ADDR_PREFIX_LEN = 14 + 18
_BATMAN_ETHERTYPE = b"\x43\x05"
_UNICAST = 0x40
_UNICAST_4ADDR = 0x42


def unicast_prefix(next_hop: bytes, out_mac: bytes, dest_orig: bytes, ttvn: int, ttl: int = TTL) -> bytes:
    """The 24 bytes that go in front of an inner frame sent as UNICAST to dest_orig."""
    return _PREFIX.pack(next_hop, out_mac, 0x4305, _UNICAST, COMPAT_VERSION, ttl, ttvn, dest_orig)


def encap_unicast(prefix: bytes, inner) -> bytes:
    return prefix + inner


def unicast_inner_offset(frame) -> int:
    """Offset of the inner frame in a UNICAST / UNICAST_4ADDR Ethernet frame, or 0 when the
    frame is not one (wrong ethertype, type, version, or too short to hold an inner header)."""
    if len(frame) < UNICAST_PREFIX_LEN + 14 or frame[12:14] != _BATMAN_ETHERTYPE or frame[15] != COMPAT_VERSION:
        return 0
    ptype = frame[14]
    if ptype == _UNICAST:
        return UNICAST_PREFIX_LEN
    if ptype == _UNICAST_4ADDR and len(frame) >= UNICAST_4ADDR_PREFIX_LEN + 14:
        return UNICAST_4ADDR_PREFIX_LEN
    return 0


def decap_unicast(frame) -> memoryview | None:
    """The inner frame of a UNICAST / UNICAST_4ADDR frame as a zero-copy view, else None."""
    off = unicast_inner_offset(frame)
    return memoryview(frame)[off:] if off else None


def unicast_dest(frame) -> bytes:
    """Destination originator of a unicast-class frame (offset 4 of the batman header)."""
    return bytes(frame[18:24])


def unicast_ttvn(frame) -> int:
    return frame[17]


def rewrite_for_forwarding(frame: bytearray, next_hop: bytes, out_mac: bytes) -> bool:
    """Prepare a received unicast-class frame for the next hop in place: new outer
    addresses, TTL - 1. Returns False (frame must be dropped) when the TTL is below 2."""
    if frame[16] < 2:
        return False
    frame[0:6] = next_hop
    frame[6:12] = out_mac
    frame[16] -= 1
    return True
