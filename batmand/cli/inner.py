"""One-line summaries of the Ethernet frames batman-adv carries (ARP, IPv4, IPv6), in the
style of batctl td / tcpdump, BLA's claim frames (ARP replies to ff:43:05) as batctl names
them. Display only: nothing here feeds the protocol."""

from __future__ import annotations

import ipaddress
import struct

from batmand.core.bla_frames import ANNOUNCE, CLAIM, LOOPDETECT, REQUEST, TYPE_NAMES, UNCLAIM, parse_claim
from batmand.wire import InnerFrame

_TCP_FLAGS = "FSRPAU"


def _tcp(proto: str, src: str, dst: str, l4: bytes) -> str:
    if len(l4) < 20:
        return f"{proto} {src} > {dst}: TCP, truncated"
    sport, dport, _, _, off_flags = struct.unpack_from("!HHIIH", l4)
    flags = "".join(ch if off_flags & (1 << i) else "." for i, ch in enumerate(_TCP_FLAGS))
    length = max(0, len(l4) - ((off_flags >> 12) * 4))
    return f"{proto} {src}.{sport} > {dst}.{dport}: TCP, Flags [{flags}], length {length}"


def _udp(proto: str, src: str, dst: str, l4: bytes) -> str:
    if len(l4) < 8:
        return f"{proto} {src} > {dst}: UDP, truncated"
    sport, dport = struct.unpack_from("!HH", l4)
    if dport == 67 and len(l4) >= 8 + 34:
        client = l4[8 + 28 : 8 + 34].hex(":")
        return f"{proto} {src}.{sport} > {dst}.67: BOOTP/DHCP, Request from {client}, length {len(l4) - 8}"
    if dport == 68:
        return f"{proto} {src}.{sport} > {dst}.68: BOOTP/DHCP, Reply, length {len(l4) - 8}"
    return f"{proto} {src}.{sport} > {dst}.{dport}: UDP, length {len(l4) - 8}"


def _bla_claim(inner: InnerFrame) -> str | None:
    """batctl's line for a claim frame (bla_frames.parse_claim's), else None."""
    claim = parse_claim(inner)
    if claim is None:
        return None
    kind, group, src, dst, sha = claim.kind, claim.group, claim.eth_src, claim.eth_dst, claim.sender_hw
    if kind == CLAIM:
        return f"BLA CLAIM, backbone {sha}, client {src}, bla group {group:04x}"
    if kind == UNCLAIM:
        return f"BLA UNCLAIM, backbone {src}, client {sha}, bla group {group:04x}"
    if kind == ANNOUNCE:
        return f"BLA ANNOUNCE, backbone {src}, bla group {group:04x}, crc {bytes(sha)[4] << 8 | bytes(sha)[5]:04x}"
    if kind in (REQUEST, LOOPDETECT):
        return f"BLA {TYPE_NAMES[kind]}, src backbone {src}, dst backbone {dst}"
    return f"BLA UNKNOWN, type {kind}"


def _arp(inner: InnerFrame, data: bytes) -> str:
    if len(data) < 28:
        return "ARP, truncated"
    (op,) = struct.unpack_from("!H", data, 6)
    sha, spa, tpa = data[8:14].hex(":"), ipaddress.IPv4Address(data[14:18]), ipaddress.IPv4Address(data[24:28])
    if op == 1:
        return f"ARP, Request who-has {tpa} tell {spa} ({sha}), length {len(data)}"
    if op == 2:
        return _bla_claim(inner) or f"ARP, Reply {spa} is-at {sha}, length {len(data)}"
    return f"ARP, unknown op code: {op}"


def _ipv4(data: bytes) -> str:
    if len(data) < 20 or (data[0] & 0x0F) * 4 < 20 or (data[0] & 0x0F) * 4 > len(data):
        return "IP, truncated"
    ihl = (data[0] & 0x0F) * 4
    proto = data[9]
    src, dst = ipaddress.IPv4Address(data[12:16]), ipaddress.IPv4Address(data[16:20])
    l4 = data[ihl:]
    if proto == 1 and len(l4) >= 8:
        icmp_type, code = l4[0], l4[1]
        ident, seq = struct.unpack_from("!HH", l4, 4)
        if icmp_type in (0, 8):
            name = "echo reply" if icmp_type == 0 else "echo request"
            return f"IP {src} > {dst}: ICMP {name}, id {ident}, seq {seq}, length {len(l4)}"
        if icmp_type == 3:
            return f"IP {src} > {dst}: ICMP unreachable {code}, length {len(l4)}"
        if icmp_type == 11:
            return f"IP {src} > {dst}: ICMP time exceeded in-transit, length {len(l4)}"
        return f"IP {src} > {dst}: ICMP type {icmp_type}, length {len(l4)}"
    if proto == 6:
        return _tcp("IP", str(src), str(dst), l4)
    if proto == 17:
        return _udp("IP", str(src), str(dst), l4)
    return f"IP {src} > {dst}: unknown protocol: {proto}"


_ICMP6_NAMES = {1: "unreachable", 3: "time exceeded in-transit", 130: "multicast listener query",
                131: "multicast listener report", 133: "router solicitation", 134: "router advertisement",
                143: "multicast listener report v2"}


def _ipv6(data: bytes) -> str:
    if len(data) < 40:
        return "IP6, truncated"
    (payload_len,) = struct.unpack_from("!H", data, 4)
    nxt = data[6]
    src, dst = ipaddress.IPv6Address(data[8:24]), ipaddress.IPv6Address(data[24:40])
    l4 = data[40:]
    if nxt == 58 and len(l4) >= 4:
        icmp_type = l4[0]
        if icmp_type in (128, 129) and len(l4) >= 8:
            ident, seq = struct.unpack_from("!HH", l4, 4)
            name = "echo request" if icmp_type == 128 else "echo reply"
            return f"IP6 {src} > {dst} ICMP6 {name}, id: {ident}, seq: {seq}, length: {payload_len}"
        if icmp_type in (135, 136) and len(l4) >= 24:
            target = ipaddress.IPv6Address(l4[8:24])
            what = "neighbor solicitation, who has" if icmp_type == 135 else "neighbor advertisement, tgt is"
            return f"IP6 {src} > {dst} ICMP6 {what} {target}, length {len(data)}"
        name = _ICMP6_NAMES.get(icmp_type, f"type {icmp_type}")
        return f"IP6 {src} > {dst} ICMP6 {name}, length {len(l4)}"
    if nxt == 6:
        return _tcp("IP6", str(src), str(dst), l4)
    if nxt == 17:
        return _udp("IP6", str(src), str(dst), l4)
    if nxt == 0:
        return f"IP6 {src} > {dst} hop-by-hop options, length {payload_len}"
    return f"IP6 {src} > {dst} unknown protocol: {nxt}"


def summarize_inner(inner: InnerFrame) -> str:
    prefix = ""
    if inner.vlan_tci is not None:
        tci = inner.vlan_tci
        prefix = f"vlan {tci & 0xFFF}, p {tci >> 13}, "
    payload = bytes(inner.payload)
    if inner.h_proto == 0x0806:
        return prefix + _arp(inner, payload)
    if inner.h_proto == 0x0800:
        return prefix + _ipv4(payload)
    if inner.h_proto == 0x86DD:
        return prefix + _ipv6(payload)
    return prefix + f"{inner.h_source} > {inner.h_dest}, ethertype 0x{inner.h_proto:04x}, length {len(payload)}"
