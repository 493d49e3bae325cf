"""BLA's claim frames (the kernel's batadv_bla_send_claim and batadv_bla_process_claim's
parsing): ARP replies whose target hardware address is ff:43:05, the claim type and the
group id; the other addresses say who claims what. They travel on the LAN only: a node
hands its own to its host (the bridge floods them onto the backbone) and reads the others'
from what its host sends into bat0."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from batmand.wire import InnerFrame, Mac

CLAIM, UNCLAIM, ANNOUNCE, REQUEST, LOOPDETECT = range(5)
TYPE_NAMES = {CLAIM: "CLAIM", UNCLAIM: "UNCLAIM", ANNOUNCE: "ANNOUNCE", REQUEST: "REQUEST", LOOPDETECT: "LOOPDETECT"}
MAGIC = b"\xff\x43\x05"
ANNOUNCE_PREFIX = b"\x43\x05\x43\x05"
LOOPDETECT_PREFIX = b"\xba\xbe"
ETH_P_ARP, ETH_P_8021Q = 0x0806, 0x8100
BROADCAST = Mac("ff:ff:ff:ff:ff:ff")
# ARP: Ethernet hardware, IPv4, 6 and 4 byte addresses, a reply
_ARP = struct.Struct("!HHBBH6s4s6s4s")


def crc16(data: bytes) -> int:
    """CRC-16/ARC (the kernel's crc16: reflected 0x8005, initial 0): the group id of a
    primary MAC, and each claim's share of a backbone gateway's CRC."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def is_loopdetect_mac(mac: bytes) -> bool:
    return mac[:2] == LOOPDETECT_PREFIX


def claim_frame(kind: int, *, eth_dst: bytes, eth_src: bytes, sender_hw: bytes, group: int, vid: int) -> bytes:
    """The 42-byte frame (46 with an 802.1Q tag when `vid` is tagged: 0x8000 | VID)."""
    target_hw = MAGIC + bytes([kind]) + struct.pack("!H", group)
    arp = _ARP.pack(1, 0x0800, 6, 4, 2, bytes(sender_hw), bytes(4), target_hw, bytes(4))
    tag = struct.pack("!HH", ETH_P_8021Q, vid & 0x0FFF) if vid else b""
    return bytes(eth_dst) + bytes(eth_src) + tag + struct.pack("!H", ETH_P_ARP) + arp


@dataclass(frozen=True)
class ClaimFrame:
    kind: int
    group: int
    eth_src: Mac
    eth_dst: Mac
    sender_hw: Mac
    depth: int  # VLAN tags in front of the ARP header


def parse_claim(inner: InnerFrame) -> ClaimFrame | None:
    """The claim frame in a frame from the host, or None when it is none (the kernel's
    checks: ARP over Ethernet/IPv4 6/4, any opcode, the magic; the group is judged later)."""
    data = inner.encode()
    off, depth = 12, 0
    ethertype = struct.unpack_from("!H", data, off)[0]
    if inner.vlan_tci is not None and inner.vid:  # a priority tag counts as untagged (newest kernels)
        while ethertype == ETH_P_8021Q and len(data) >= off + 6:
            depth += 1
            off += 4
            ethertype = struct.unpack_from("!H", data, off)[0]
    if ethertype != ETH_P_ARP or len(data) < off + 2 + _ARP.size:
        return None
    htype, ptype, hlen, plen, _op, sha, _spa, tha, _tpa = _ARP.unpack_from(data, off + 2)
    if (htype, ptype, hlen, plen) != (1, 0x0800, 6, 4) or tha[:3] != MAGIC:
        return None
    return ClaimFrame(kind=tha[3], group=struct.unpack("!H", tha[4:6])[0], eth_src=Mac(data[6:12]),
                      eth_dst=Mac(data[0:6]), sender_hw=Mac(sha), depth=depth)
