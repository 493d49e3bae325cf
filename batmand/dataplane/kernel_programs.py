"""The eBPF programs of the kernel fast path (kernel_forward keeps their maps), and the
layouts of the maps they read. Each takes in the kernel exactly the frames the data
plane's rules (decision.decide_mesh, decide_host) would move without the core, from the
same tables, and leaves everything else to the daemon unchanged (TC_NEXT):

- mesh_program, on each hard interface's ingress:
  - Forward: a plain UNICAST frame (compat 15) addressed to the interface, from a
    unicast sender, for an originator we route, TTL >= 2, a TTVN not older than the
    route's, no batman-adv inside (behind one 802.1Q tag at most), for no client of ours,
    fitting the outgoing interface: outer addresses rewritten, TTL lowered, redirected.
    Not while a hard interface is Wi-Fi (the daemon then forwards by incoming interface).
  - Deliver: the same kind of frame for our originator, carrying an untagged IPv4
    (without options) or IPv6 packet for a client of ours that no slow-path rule claims,
    from a source BLA claimed when BLA watches sources (marked seen): the inner Ethernet
    header copied over the outer one, into the passage (kernel_forward.Passage).
- strip_program, on the passage's first end (kseg) ingress: the 24 bytes behind the
  (inner) Ethernet header go, and a TCP segment crosses to the second end (kgro), whose
  GRO merges a flow's segments as a NIC would; anything else goes straight into bat0.
  bpf_skb_adjust_room works on IP packets only, so the stack must have taken the frame
  for one first: hence two stages.
- send_program, on bat0's egress: a frame the host sends from a client of ours to a
  client of a routed originator, untagged IPv4 / IPv6, that no slow-path rule claims,
  fitting the outgoing interface: our 24 bytes put in front (the stack keeps its own
  headers' offsets, so GSO still finds them). TCP crosses the passage the other way:
  kseg has no TSO, so the stack cuts a GSO frame there into segments, each behind a
  copy of our header, as the kernel module's bat0 would have been handed them. Other
  frames go straight out of the hard interface; other GSO frames stay with the daemon.
  TCP goes this way only where every segment of a flow fits (the route's MTU holds
  bat0's MTU and our header), so a flow never takes both ways and overtakes itself.
- passage_program, on kgro's ingress: our segments out of the hard interface of their
  route, the rest (delivered frames, merged) into bat0 as if the host got it from the TAP.
  Packet taps run before tc, so half-made frames show only on the passage, never on bat0.

Frames and bytes are counted per CPU as the kernel module counts them."""

from __future__ import annotations

import struct
import sys

from batmand.wire.constants import COMPAT_VERSION, ETH_P_8021Q, ETH_P_BATMAN, TTL, VLAN_HAS_TAG, PacketType
from batmand.wire.fastpath import DEST_OFF, INNER_OFF, TTL_OFF, TTVN_OFF, UNICAST_PREFIX_LEN

from . import ebpf
from .ebpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10

KEY = struct.Struct("=6sH")  # a map key: a MAC address and a VID as the table keys clients (0 for originators)
# an originator's route: out ifindex, out MTU, next-hop MAC, out MAC, TTVN
ROUTE = struct.Struct("=II6s6sB3x")
_V_IFINDEX, _V_MTU, _V_NEXT_HOP, _V_OUT_MAC, _V_TTVN = 0, 4, 8, 14, 20
CLIENT = struct.Struct("=6sBx")  # a client of another originator: that originator, roaming (its TTVN - 1)
# a client of ours: its state, then when the host last sent from it (ns, CLOCK_MONOTONIC)
LOCAL = struct.Struct("=B7xQ")
LOCAL_OURS, LOCAL_LEAVING = 1, 2  # ours; deleted or roamed away (frames for it need the core's TTVN rules)
# the settings: our originator (while its interface is active), then one byte each, then
# the MTU a route needs for TCP (bat0's and our header) and the passage's ifindex (kseg)
CONFIG = struct.Struct("=6s9BxII")
C_PRIMARY = 0
C_DELIVER = 6  # delivery on
C_WATCH = 7  # BLA watches the sources of frames to the host (only those in the watched map)
C_FORWARD = 8  # forwarding on (no Wi-Fi interface)
C_SEND = 9  # sending on
C_FROM_HOST = 10  # the core watches some senders on the host (the from_host map)
C_L4 = (11, 12)  # the rules map has L4 rules toward the host, from the host
C_SLOW = (13, 14)  # bit 0: every IPv4 packet is the core's, bit 1: every IPv6 one; toward, from the host
C_TCP_MTU = 16
C_DEVICE = 20
TO_HOST_DIR, FROM_HOST_DIR = 0, 1
# a slow-path rule: ethertype, IP protocol, direction, 0 (any port) or 1 (this port), port
RULE = struct.Struct("=2sBBBx2s")
# per CPU: forwarded frames and bytes (whole frames, as the kernel's forward_bytes),
# delivered and sent frames and bytes (inner frames, as rx_bytes / tx_bytes), frames the
# passage dropped (not strippable; a segment whose route went while it was cut)
STATS = struct.Struct("=7Q")
S_FORWARD, S_DELIVER, S_SEND, S_DROPPED = 0, 16, 32, 48
# struct __sk_buff
_SKB_LEN, _SKB_VLAN_PRESENT, _SKB_DATA, _SKB_DATA_END, _SKB_GSO_SIZE = 0, 20, 76, 80, 176
_ETH_LEN = 14
_INNER_TYPE = INNER_OFF + 12  # the inner frame's ethertype, or its 802.1Q tag
_ETH_P_IP, _ETH_P_IPV6 = 0x0800, 0x86DD
_IPPROTO_TCP = 6


class Maps:
    """The kernel's copy of what the programs read (map sizes: kernel_forward)."""

    routes: ebpf.Map  # originator -> ROUTE
    local: ebpf.Map  # (mac, vid) of our clients -> LOCAL
    clients: ebpf.Map  # (mac, vid) of other originators' clients -> CLIENT
    watched: ebpf.Map  # (mac, vid) of sources BLA claimed -> when last delivered (ns)
    from_host: ebpf.Map  # (mac, vid) of senders on the host the core watches -> 1
    rules: ebpf.Map  # RULE -> 1
    config: ebpf.Map  # 0 -> CONFIG
    stats: ebpf.Map  # 0 -> STATS, per CPU


def _host16(value: int) -> int:
    """A 16-bit field in network order as the program's load sees it."""
    return int.from_bytes(value.to_bytes(2, "big"), sys.byteorder)


def _start(p: ebpf.Program, gso: bool = False) -> None:
    """r6: the skb, r7 / r8: its data and end; hardware-tagged frames go on, and GSO
    frames unless `gso`."""
    p.alu_reg(R6, "=", R1)
    p.load(R7, R6, _SKB_DATA, 4)
    p.load(R8, R6, _SKB_DATA_END, 4)
    p.load(R1, R6, _SKB_VLAN_PRESENT, 4)
    p.jump_if(R1, "!=", 0, "next")  # a tag the hardware took off: the daemon reads it from the ring
    if not gso:
        p.load(R1, R6, _SKB_GSO_SIZE, 4)
        p.jump_if(R1, "!=", 0, "next")


def _config(p: ebpf.Program, maps: Maps) -> None:
    """r9: the settings."""
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, maps.config)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R9, "=", R0)


def _next(p: ebpf.Program) -> None:
    p.label("next")
    p.alu(R0, "=", ebpf.TC_NEXT)
    p.exit()


def mesh_program(port_mac: bytes, maps: Maps) -> bytes:
    """The ingress program of the hard interface whose MAC is `port_mac`."""
    p = ebpf.Program()
    _start(p)
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", INNER_OFF + _ETH_LEN)  # outer Ethernet, our header, the inner Ethernet header
    p.jump_if_reg(R1, ">", R8, "next")
    p.load(R1, R7, 12, 2)
    p.jump_if(R1, "!=", _host16(ETH_P_BATMAN), "next")
    p.load(R1, R7, _ETH_LEN, 2)  # packet type and version
    p.jump_if(R1, "!=", _host16(PacketType.UNICAST << 8 | COMPAT_VERSION), "next")
    p.load(R1, R7, TTL_OFF, 1)
    p.jump_if(R1, "<", 2, "next")  # the daemon drops it, counting
    p.load(R1, R7, 6, 1)
    p.jump_if(R1, "&", 1, "next")  # a multicast sender
    p.load(R1, R7, 0, 4)  # addressed to this interface
    p.load_imm64(R2, int.from_bytes(port_mac[:4], sys.byteorder))
    p.jump_if_reg(R1, "!=", R2, "next")
    p.load(R1, R7, 4, 2)
    p.jump_if(R1, "!=", int.from_bytes(port_mac[4:6], sys.byteorder), "next")
    p.load(R1, R7, _INNER_TYPE, 2)  # batman-adv inside: the daemon's (it drops it)
    p.jump_if(R1, "==", _host16(ETH_P_BATMAN), "next")
    _config(p, maps)
    p.load(R1, R9, C_DELIVER, 1)
    p.jump_if(R1, "==", 0, "route")
    for off, size in ((0, 4), (4, 2)):  # for our originator: delivered, never forwarded
        p.load(R1, R7, DEST_OFF + off, size)
        p.load(R2, R9, C_PRIMARY + off, size)
        p.jump_if_reg(R1, "!=", R2, "route")
    _deliver(p, maps)
    p.label("route")
    p.load(R1, R9, C_FORWARD, 1)
    p.jump_if(R1, "==", 0, "next")
    _forward(p, maps)
    _next(p)
    return p.assemble()


def _forward(p: ebpf.Program, maps: Maps) -> None:
    p.load(R1, R7, _INNER_TYPE, 2)
    p.alu(R3, "=", 0)  # the client's VID as the table keys it: 0 untagged
    p.jump_if(R1, "!=", _host16(ETH_P_8021Q), "untagged")
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", _INNER_TYPE + 6)
    p.jump_if_reg(R1, ">", R8, "next")
    p.load(R1, R7, _INNER_TYPE + 4, 2)
    p.jump_if(R1, "==", _host16(ETH_P_BATMAN), "next")
    p.load(R3, R7, _INNER_TYPE + 2, 2)
    p.byte_swap16(R3)
    p.alu(R3, "&", 0x0FFF)
    p.jump_if(R3, "==", 0, "untagged")
    p.alu(R3, "|", VLAN_HAS_TAG)
    p.label("untagged")
    # for a client of ours the daemon applies the TTVN rules (a roaming client is rerouted)
    _key(p, INNER_OFF, R3)
    _lookup(p, maps.local)
    p.jump_if(R0, "!=", 0, "next")
    p.alu(R3, "=", 0)
    _key(p, DEST_OFF, R3)
    _lookup(p, maps.routes)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R9, "=", R0)
    p.load(R1, R7, TTVN_OFF, 1)  # older than the route's TTVN (seq_before): the daemon's
    p.load(R2, R9, _V_TTVN, 1)
    p.alu_reg(R1, "-", R2)
    p.alu(R1, "<<", 56)
    p.alu(R1, "s>>", 56)
    p.jump_if(R1, "s<", 0, "next")
    p.load(R1, R6, _SKB_LEN, 4)  # too long for the way out: the daemon fragments it
    p.alu(R1, "-", _ETH_LEN)
    p.load(R2, R9, _V_MTU, 4)
    p.jump_if_reg(R1, ">", R2, "next")
    _to_next_hop(p)
    p.load(R1, R7, TTL_OFF, 1)
    p.alu(R1, "-", 1)
    p.store(R7, TTL_OFF, R1, 1)
    _count(p, maps.stats, S_FORWARD, 0)
    p.load(R1, R9, _V_IFINDEX, 4)
    p.alu(R2, "=", 0)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()


def _ip_rules(p: ebpf.Program, maps: Maps, l3: int, direction: int) -> None:
    """r1: the ethertype at l3 - 2. On only for an untagged IPv4 (without options) or IPv6
    packet, whole to its L4 header's first 4 bytes, that no slow-path rule in `direction`
    claims (the rules as decision.slow_by_rule reads them); then r4: its L4 protocol.
    Labels: this direction's."""
    d = f"_{direction}"
    p.jump_if(R1, "==", _host16(_ETH_P_IP), "ip4" + d)
    p.jump_if(R1, "!=", _host16(_ETH_P_IPV6), "next")
    p.load(R2, R9, C_SLOW[direction], 1)
    p.jump_if(R2, "&", 2, "next")
    p.alu_reg(R2, "=", R7)
    p.alu(R2, "+", l3 + 44)  # the IPv6 header and the L4 header's first 4 bytes
    p.jump_if_reg(R2, ">", R8, "next")
    p.load(R4, R7, l3 + 6, 1)  # next header
    p.load(R5, R7, l3 + 42, 2)  # the destination port
    p.jump("l4" + d)
    p.label("ip4" + d)
    p.load(R2, R9, C_SLOW[direction], 1)
    p.jump_if(R2, "&", 1, "next")
    p.alu_reg(R2, "=", R7)
    p.alu(R2, "+", l3 + 24)
    p.jump_if_reg(R2, ">", R8, "next")
    p.load(R2, R7, l3, 1)
    p.jump_if(R2, "!=", 0x45, "next")  # IP options: the daemon's
    p.load(R4, R7, l3 + 9, 1)
    p.load(R5, R7, l3 + 22, 2)
    p.label("l4" + d)
    p.load(R2, R9, C_L4[direction], 1)
    p.jump_if(R2, "==", 0, "ruled" + d)
    # (ethertype, protocol, direction, any port) at r10-16, (..., this port) at r10-24
    for off, port in ((-16, None), (-24, R5)):
        p.store(R10, off, R1, 2)
        p.store(R10, off + 2, R4, 1)
        p.store_imm(R10, off + 3, direction, 1)
        p.store_imm(R10, off + 4, 0 if port is None else 1, 1)
        p.store_imm(R10, off + 5, 0, 1)
        if port is None:
            p.store_imm(R10, off + 6, 0, 2)
        else:
            p.store(R10, off + 6, port, 2)
    for off in (-16, -24):
        _lookup(p, maps.rules, off)
        p.jump_if(R0, "!=", 0, "next")
    p.load(R4, R10, -14, 1)  # (the protocol again: the calls took the registers)
    p.label("ruled" + d)


def _deliver(p: ebpf.Program, maps: Maps) -> None:
    """A frame for our originator (r9: the settings): into the passage, or on to
    the daemon."""
    p.load(R1, R7, INNER_OFF, 1)
    p.jump_if(R1, "&", 1, "next")  # multicast inside (our table has groups too): the core's rules
    p.load(R1, R7, _INNER_TYPE, 2)
    _ip_rules(p, maps, INNER_OFF + _ETH_LEN, TO_HOST_DIR)
    p.alu(R3, "=", 0)
    _key(p, INNER_OFF, R3)  # only for a client of ours (state ours: not roamed away)
    _lookup(p, maps.local)
    p.jump_if(R0, "==", 0, "next")
    p.load(R1, R0, 0, 1)
    p.jump_if(R1, "!=", LOCAL_OURS, "next")
    p.load(R1, R9, C_WATCH, 1)
    p.jump_if(R1, "==", 0, "deliver")
    p.alu(R3, "=", 0)
    _key(p, INNER_OFF + 6, R3)  # BLA: only from sources we claimed, marked seen
    _lookup(p, maps.watched)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R8, "=", R0)  # (the packet's bounds are checked: its end is no longer needed)
    p.call(ebpf.HELPER_KTIME_GET_NS)
    p.store(R8, 0, R0, 8)
    p.label("deliver")
    _count(p, maps.stats, S_DELIVER, -UNICAST_PREFIX_LEN)
    for off, size in ((0, 4), (4, 4), (8, 4), (12, 2)):  # the inner Ethernet header over the outer
        p.load(R1, R7, INNER_OFF + off, size)
        p.store(R7, off, R1, size)
    p.load(R1, R9, C_DEVICE, 4)
    p.alu(R2, "=", ebpf.REDIRECT_INGRESS)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()


def _not_from(p: ebpf.Program, own: bytes) -> None:
    """r6: the skb. What the host itself sends into the passage (IPv6 neighbour discovery,
    a DHCP client: anything from the passage's own address) is dropped."""
    p.load(R7, R6, _SKB_DATA, 4)
    p.load(R8, R6, _SKB_DATA_END, 4)
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", _ETH_LEN)
    p.jump_if_reg(R1, ">", R8, "shot")
    p.load(R1, R7, 6, 4)
    p.load_imm64(R2, int.from_bytes(own[:4], sys.byteorder))
    p.jump_if_reg(R1, "!=", R2, "theirs")
    p.load(R1, R7, 10, 2)
    p.jump_if(R1, "==", int.from_bytes(own[4:6], sys.byteorder), "shot")
    p.label("theirs")


def _to_next_hop(p: ebpf.Program) -> None:
    """The frame's (r7) Ethernet addresses: to the next hop, from the out interface of the
    route at r9."""
    for off, size in ((0, 4), (4, 2), (6, 2), (8, 4)):
        p.load(R1, R9, _V_NEXT_HOP + off, size)
        p.store(R7, off, R1, size)


def _redirect(p: ebpf.Program, ifindex: int, flags: int = 0) -> None:
    """Out of the interface `ifindex` (REDIRECT_INGRESS: into it); the program ends."""
    p.alu(R1, "=", ifindex)
    p.alu(R2, "=", flags)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()


def _shot(p: ebpf.Program) -> None:
    p.label("shot")
    p.alu(R0, "=", ebpf.TC_SHOT)
    p.exit()


def strip_program(passage_ifindex: int, soft_ifindex: int, own: bytes, gro: bool, stats: ebpf.Map) -> bytes:
    """The ingress program of the passage's first end (see the module's docstring); `own`:
    the passage's MAC address (both ends have it); `gro`: TCP crosses to kgro for GRO
    (everything else, and TCP without it, goes straight into bat0: one hop less)."""
    p = ebpf.Program()
    p.alu_reg(R6, "=", R1)
    _not_from(p, own)
    p.alu_reg(R1, "=", R6)
    p.alu(R2, "=", -UNICAST_PREFIX_LEN)
    p.alu(R3, "=", ebpf.ADJ_ROOM_MAC)
    p.alu(R4, "=", 0)
    p.call(ebpf.HELPER_SKB_ADJUST_ROOM)
    p.jump_if(R0, "!=", 0, "drop")
    if gro:
        p.load(R7, R6, _SKB_DATA, 4)
        p.load(R8, R6, _SKB_DATA_END, 4)
        p.alu_reg(R1, "=", R7)
        p.alu(R1, "+", _ETH_LEN + 10)
        p.jump_if_reg(R1, ">", R8, "host")
        p.load(R1, R7, 12, 2)  # (the first stage took only IPv4 without options and IPv6)
        p.load(R2, R7, _ETH_LEN + 9, 1)  # IPv4's protocol
        p.jump_if(R1, "==", _host16(_ETH_P_IP), "protocol")
        p.load(R2, R7, _ETH_LEN + 6, 1)  # IPv6's next header
        p.label("protocol")
        p.jump_if(R2, "!=", _IPPROTO_TCP, "host")
        _redirect(p, passage_ifindex)  # out of it: into its other end's GRO
    _host_and_drops(p, soft_ifindex, stats)
    return p.assemble()


def passage_program(soft_ifindex: int, own: bytes, maps: Maps) -> bytes:
    """The ingress program of the passage's second end (see the module's docstring)."""
    p = ebpf.Program()
    p.alu_reg(R6, "=", R1)
    _not_from(p, own)
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", DEST_OFF + 6)
    p.jump_if_reg(R1, ">", R8, "host")
    p.load(R1, R7, 12, 2)
    p.jump_if(R1, "!=", _host16(ETH_P_BATMAN), "host")
    p.alu(R3, "=", 0)  # a segment of ours: out by its route as it is now
    _key(p, DEST_OFF, R3)
    _lookup(p, maps.routes)
    p.jump_if(R0, "==", 0, "drop")
    p.alu_reg(R9, "=", R0)
    _to_next_hop(p)
    _count(p, maps.stats, S_SEND, -UNICAST_PREFIX_LEN)
    p.load(R1, R9, _V_IFINDEX, 4)
    p.alu(R2, "=", 0)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()
    _host_and_drops(p, soft_ifindex, maps.stats)
    return p.assemble()


def _host_and_drops(p: ebpf.Program, soft_ifindex: int, stats: ebpf.Map) -> None:
    """Label "host": the frame into bat0 as the host's; label "drop": dropped and counted
    (r6: the skb); label "shot": dropped."""
    p.label("host")
    _redirect(p, soft_ifindex, ebpf.REDIRECT_INGRESS)
    p.label("drop")  # the passage drops the frame, counting it
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, stats)
    p.jump_if(R0, "==", 0, "shot")
    p.load(R1, R0, S_DROPPED, 8)
    p.alu(R1, "+", 1)
    p.store(R0, S_DROPPED, R1, 8)
    _shot(p)  # (then dropped uncounted: the host's own frames)


def send_program(maps: Maps, passage_ifindex: int | None) -> bytes:
    """bat0's egress program (see the module's docstring); `passage_ifindex`: kseg's
    (None: no passage, TCP stays with the daemon)."""
    p = ebpf.Program()
    _start(p, gso=True)
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", _ETH_LEN)
    p.jump_if_reg(R1, ">", R8, "next")
    _config(p, maps)
    p.load(R1, R9, C_SEND, 1)
    p.jump_if(R1, "==", 0, "next")
    p.load(R1, R7, 0, 1)
    p.jump_if(R1, "&", 1, "next")  # multicast (the table has groups too): the core floods it or sends it
    p.load(R1, R7, 12, 2)
    _ip_rules(p, maps, _ETH_LEN, FROM_HOST_DIR)
    p.jump_if(R4, "==", _IPPROTO_TCP, "next" if passage_ifindex is None else "tcp")
    p.load(R1, R6, _SKB_GSO_SIZE, 4)  # UDP GSO and the like: the daemon cuts it
    p.jump_if(R1, "!=", 0, "next")
    p.alu(R1, "=", 0)  # (at r10-32: 0, or for TCP the MTU every segment of the flow needs)
    if passage_ifindex is not None:
        p.jump("whole")
        p.label("tcp")
        p.load(R1, R9, C_TCP_MTU, 4)
        p.jump_if(R1, "==", 0, "next")
        p.label("whole")
    p.store(R10, -32, R1, 4)
    p.alu(R3, "=", 0)
    _key(p, 6, R3)  # from a client of ours (the core learns the others), marked seen
    _lookup(p, maps.local)
    p.jump_if(R0, "==", 0, "next")
    p.load(R1, R0, 0, 1)
    p.jump_if(R1, "!=", LOCAL_OURS, "next")
    p.alu_reg(R8, "=", R0)  # (the packet's bounds are checked)
    p.call(ebpf.HELPER_KTIME_GET_NS)
    p.store(R8, 8, R0, 8)
    p.load(R1, R9, C_FROM_HOST, 1)
    p.jump_if(R1, "==", 0, "sender")
    p.alu(R3, "=", 0)
    _key(p, 6, R3)
    _lookup(p, maps.from_host)
    p.jump_if(R0, "!=", 0, "next")
    p.label("sender")
    p.alu(R3, "=", 0)
    _key(p, 0, R3)  # to a client of an originator we route
    _lookup(p, maps.clients)
    p.jump_if(R0, "==", 0, "next")
    p.load(R1, R0, 0, 4)  # the originator, at r10-24, then whether the client roams
    p.store(R10, -24, R1, 4)
    p.load(R1, R0, 4, 2)
    p.store(R10, -20, R1, 2)
    p.load(R1, R0, 6, 1)
    p.store(R10, -18, R1, 1)
    for off, size in ((0, 4), (4, 2)):
        p.load(R1, R10, -24 + off, size)
        p.store(R10, -8 + off, R1, size)
    p.store_imm(R10, -2, 0, 2)
    _lookup(p, maps.routes)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R9, "=", R0)
    p.load(R2, R9, _V_MTU, 4)
    p.load(R1, R10, -32, 4)
    p.jump_if(R1, "==", 0, "frame")
    p.jump_if_reg(R1, ">", R2, "next")  # TCP: a full segment would not fit (the daemon fragments the flow)
    p.jump("fits")
    p.label("frame")
    p.load(R1, R6, _SKB_LEN, 4)  # too long for the way out: the daemon fragments it
    p.alu(R1, "+", UNICAST_PREFIX_LEN - _ETH_LEN)
    p.jump_if_reg(R1, ">", R2, "next")
    p.label("fits")
    p.load(R1, R9, _V_TTVN, 1)  # a roaming client's frames carry the TTVN before its move
    p.load(R2, R10, -18, 1)
    p.alu_reg(R1, "-", R2)
    p.store(R10, -17, R1, 1)
    p.alu_reg(R1, "=", R6)
    p.alu(R2, "=", UNICAST_PREFIX_LEN)
    p.alu(R3, "=", 0)
    p.call(ebpf.HELPER_SKB_CHANGE_HEAD)
    p.jump_if(R0, "!=", 0, "next")  # (unchanged: the daemon sends it)
    p.load(R7, R6, _SKB_DATA, 4)
    p.load(R8, R6, _SKB_DATA_END, 4)
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", UNICAST_PREFIX_LEN)
    p.jump_if_reg(R1, ">", R8, "shot")  # (cannot be: the room was just made)
    _to_next_hop(p)
    p.alu(R1, "=", _host16(ETH_P_BATMAN))
    p.store(R7, 12, R1, 2)
    p.alu(R1, "=", _host16(PacketType.UNICAST << 8 | COMPAT_VERSION))
    p.store(R7, _ETH_LEN, R1, 2)
    p.alu(R1, "=", TTL)
    p.store(R7, TTL_OFF, R1, 1)
    p.load(R1, R10, -17, 1)
    p.store(R7, TTVN_OFF, R1, 1)
    for off, size in ((0, 4), (4, 2)):
        p.load(R1, R10, -24 + off, size)
        p.store(R7, DEST_OFF + off, R1, size)
    p.load(R1, R10, -32, 4)
    if passage_ifindex is not None:
        p.jump_if(R1, "!=", 0, "passage")
    _count(p, maps.stats, S_SEND, -UNICAST_PREFIX_LEN)
    p.load(R1, R9, _V_IFINDEX, 4)
    p.alu(R2, "=", 0)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()
    if passage_ifindex is not None:
        p.label("passage")  # (counted there, per segment)
        _redirect(p, passage_ifindex)
    _shot(p)
    _next(p)
    return p.assemble()


def _count(p: ebpf.Program, stats: ebpf.Map, off: int, adjust: int) -> None:
    """Counts a frame and its bytes (the skb's length + `adjust`) at `off` of the per-CPU
    counters (no atomics needed)."""
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, stats)
    p.jump_if(R0, "==", 0, f"counted{off}")
    p.load(R1, R0, off, 8)
    p.alu(R1, "+", 1)
    p.store(R0, off, R1, 8)
    p.load(R1, R6, _SKB_LEN, 4)
    if adjust:
        p.alu(R1, "+", adjust)
    p.load(R2, R0, off + 8, 8)
    p.alu_reg(R2, "+", R1)
    p.store(R0, off + 8, R2, 8)
    p.label(f"counted{off}")


def _key(p: ebpf.Program, off: int, vid: int) -> None:
    """The 6-byte address at packet offset `off` and register `vid` as a map key at r10-8."""
    p.load(R1, R7, off, 4)
    p.store(R10, -8, R1, 4)
    p.load(R1, R7, off + 4, 2)
    p.store(R10, -4, R1, 2)
    p.store(R10, -2, vid, 2)


def _lookup(p: ebpf.Program, table: ebpf.Map, key: int = -8) -> None:
    """r0 = the value at the key at r10 + `key`, or 0."""
    p.load_imm64(R1, table.fd, map_fd=True)
    p.alu_reg(R2, "=", R10)
    p.alu(R2, "+", key)
    p.call(ebpf.HELPER_MAP_LOOKUP)
