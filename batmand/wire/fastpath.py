"""The UNICAST frame's layout for the data-plane hot path, which reads and writes frames
in place instead of decoding them (the general codec, decode_frame, is for the control
plane): named offsets, and the ready 24-byte prefix (outer Ethernet header + UNICAST
header) a forwarding-table entry keeps per destination, so that encapsulation is a
single concatenation (or a two-element iovec)."""

from __future__ import annotations

import struct

from .constants import COMPAT_VERSION, ETH_P_8021Q, ETH_P_BATMAN, TTL, PacketType

_PREFIX = struct.Struct("!6s6sHBBBB6s")
UNICAST_PREFIX_LEN = 14 + 10  # outer Ethernet + batadv_unicast_packet
UNICAST_4ADDR_PREFIX_LEN = 14 + 18
BATMAN_ETHERTYPE = ETH_P_BATMAN.to_bytes(2, "big")
VLAN_ETHERTYPE = ETH_P_8021Q.to_bytes(2, "big")

# offsets in a UNICAST frame
ETHERTYPE_OFF = 12  # of the outer Ethernet header
PACKET_TYPE_OFF = 14
VERSION_OFF = 15
TTL_OFF = 16
TTVN_OFF = 17
DEST_OFF = 18  # the destination originator, 6 bytes
INNER_OFF = UNICAST_PREFIX_LEN  # the inner Ethernet frame


def unicast_prefix(next_hop: bytes, out_mac: bytes, dest_orig: bytes, ttvn: int, ttl: int = TTL) -> bytes:
    """The 24 bytes that go in front of an inner frame sent as UNICAST to dest_orig."""
    return _PREFIX.pack(next_hop, out_mac, ETH_P_BATMAN, PacketType.UNICAST, COMPAT_VERSION, ttl, ttvn, dest_orig)


def unicast_inner_offset(frame) -> int:
    """Offset of the inner frame in a UNICAST / UNICAST_4ADDR Ethernet frame, or 0 when the
    frame is not one (wrong ethertype, type, version, or too short to hold an inner header)."""
    if len(frame) < UNICAST_PREFIX_LEN + 14 or frame[ETHERTYPE_OFF:ETHERTYPE_OFF + 2] != BATMAN_ETHERTYPE \
            or frame[VERSION_OFF] != COMPAT_VERSION:
        return 0
    ptype = frame[PACKET_TYPE_OFF]
    if ptype == PacketType.UNICAST:
        return UNICAST_PREFIX_LEN
    if ptype == PacketType.UNICAST_4ADDR and len(frame) >= UNICAST_4ADDR_PREFIX_LEN + 14:
        return UNICAST_4ADDR_PREFIX_LEN
    return 0
