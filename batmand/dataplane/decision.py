"""The data plane's forwarding decisions, as pure functions of a frame's first bytes and
the tables the core publishes: the kernel's rules for unicast (routing.c's receive and
route, mesh-interface.c's transmit), restricted to what can be settled from those
tables alone. Whatever they cannot settle with certainty is SLOW: the core, which applies
the full rules, gets the frame. tests/dataplane/test_decision.py drives them and the core
with the same tables and frames and checks that they agree.

- decide_mesh: a UNICAST frame received on a hard interface: DELIVER (its inner frame to
  the host), Forward (out of `iface` to `next_hop`: the outer addresses become next_hop
  and that interface's MAC, the TTL drops by one) or SLOW.
- decide_host: a frame the host sent into the soft interface: Encapsulate (as UNICAST to
  `orig` via `next_hop`, the header carrying `ttvn`) or SLOW.

Each depends only on the bytes mesh_key / host_key return (the headers, and the IP
protocol while an L4 slow-path rule exists, with the port when a rule reads that
protocol's port), so the engine caches decisions by
those bytes until the tables change; it leaves frames shorter than HOST_KEY_MIN /
MESH_KEY_MIN (too short to be anything but SLOW or worse) to the core uncached."""

from __future__ import annotations

import struct
from typing import NamedTuple

from batmand.core.bitarray import seq_before8
from batmand.core.forwarding import FROM_HOST, TO_HOST, ForwardingTable, SlowPath
from batmand.wire.constants import ETH_P_BATMAN, VLAN_HAS_TAG
from batmand.wire.fastpath import (DEST_OFF, INNER_OFF, TTL_OFF, TTVN_OFF, UNICAST_PREFIX_LEN, VLAN_ETHERTYPE,
                                   unicast_inner_offset)

DELIVER, SLOW = "deliver", "slow"
# An Ethernet header's length by the first byte of its ethertype: 0x81 (802.1Q, 0x8100)
# brings a 4-byte tag; the few other 0x81xx ethertypes only make a key 4 bytes longer.
ETH_HEADER_LEN = bytes(18 if b == 0x81 else 14 for b in range(256))
HOST_KEY_MIN = 18  # an Ethernet header with a tag
MESH_KEY_MIN = INNER_OFF + HOST_KEY_MIN
_ETH_P_IP, _ETH_P_IPV6 = 0x0800, 0x86DD
# The common frame while an L4 rule exists (DAT's, on by default): untagged IPv4 without
# options. Its key, one unpack instead of eth_fields + l4_key: (the headers decide_host /
# decide_mesh read, IP protocol, the 2 bytes at offset 2 of the L4 header).
IP4_MARK = b"\x08\x00\x45"  # ethertype IPv4, version 4 and IHL 5: the bytes at ETH_HEADER_LEN - 2
HOST_IP4_KEY = struct.Struct("14s9xB12x2s")  # Ethernet header; protocol at 23; port at 36
MESH_IP4_KEY = struct.Struct(f"{INNER_OFF + 14}s9xB12x2s")  # our header + inner Ethernet header; the same
# For a protocol whose port no rule reads (SlowPath.port_protos) the engine caches by the
# key's first two fields: what host_key / mesh_key return with `ports`.


class DeliverSeen:
    """DELIVER for a frame whose source the core wants to hear of (SlowPath.to_host_sources):
    the engine counts the hits and reports the source seen."""

    __slots__ = ("client", "hits")

    def __init__(self, client: tuple) -> None:
        self.client = client
        self.hits = 0


class Forward(NamedTuple):
    """Send the frame on out of hard interface `iface` to `next_hop`."""

    iface: str
    next_hop: bytes


class Encapsulate(NamedTuple):
    """Send the host's frame as UNICAST to originator `orig` out of `iface` to `next_hop`,
    with `ttvn` in the header; `client` (mac, vid) sent it (the engine reports it seen)."""

    iface: str
    next_hop: bytes
    orig: bytes
    ttvn: int
    client: tuple


def eth_fields(frame, off: int) -> tuple[bytes, bytes, int, int, int] | None:
    """(destination, source, TT vid, ethertype, L3 offset) of the Ethernet header at `off`,
    the ethertype being the one behind a single 802.1Q tag; None when it is cut short.
    The vid is as the translation table keys clients: 0 untagged (and VID 0), else
    VLAN_HAS_TAG | vid."""
    if len(frame) < off + 14:
        return None
    dst, src = bytes(frame[off:off + 6]), bytes(frame[off + 6:off + 12])
    if frame[off + 12:off + 14] != VLAN_ETHERTYPE:
        return dst, src, 0, frame[off + 12] << 8 | frame[off + 13], off + 14
    if len(frame) < off + 18:
        return None
    vid = (frame[off + 14] << 8 | frame[off + 15]) & 0x0FFF
    return dst, src, VLAN_HAS_TAG | vid if vid else 0, frame[off + 16] << 8 | frame[off + 17], off + 18


def l4_key(frame, l3: int, ethertype: int, ports: frozenset | None = None) -> bytes:
    """What an L4 rule reads of the IP packet at `l3`: its protocol (IPv4 protocol, IPv6
    next header) and the two bytes at offset 2 of the L4 header (the destination port);
    the protocol alone when the frame ends before them or (`ports` given) no rule reads
    this protocol's port; b"" when the packet is not IPv4 or IPv6 or its IP header is cut
    short."""
    if ethertype == _ETH_P_IP and len(frame) >= l3 + 20:
        proto, l4 = frame[l3 + 9], l3 + (frame[l3] & 0x0F) * 4
    elif ethertype == _ETH_P_IPV6 and len(frame) >= l3 + 40:
        proto, l4 = frame[l3 + 6], l3 + 40
    else:
        return b""
    if len(frame) < l4 + 4 or (ports is not None and proto not in ports):
        return bytes((proto,))
    return bytes((proto,)) + bytes(frame[l4 + 2:l4 + 4])


def host_key(frame, l4: bool, ports: frozenset | None = None) -> bytes:
    """The bytes decide_host reads of a host frame: its Ethernet header (18 bytes with an
    802.1Q tag, else 14), and when `l4` (the table has FROM_HOST rules on the IP protocol)
    the IP protocol and port (the port only for `ports`, SlowPath.port_protos, if given)."""
    key = bytes(frame[:ETH_HEADER_LEN[frame[12]] if len(frame) > 12 else 14])
    if l4:
        fields = eth_fields(frame, 0)
        key += l4_key(frame, fields[4], fields[3], ports) if fields else b""
    return key


def mesh_key(frame, l4: bool, ports: frozenset | None = None) -> bytes:
    """The bytes decide_mesh reads of a received frame (l4: the table has TO_HOST rules
    on the IP protocol; `ports` as for host_key): our header and the inner Ethernet header
    with a tag (untagged, 4 bytes more: a fixed length costs the engine less than looking
    for the tag)."""
    key = bytes(frame[:MESH_KEY_MIN])
    if l4:
        fields = eth_fields(frame, INNER_OFF)
        key += l4_key(frame, fields[4], fields[3], ports) if fields else b""
    return key


def host_key_ip4(frame) -> tuple | None:
    """host_key(frame, True)'s information as the engine's fast key (HOST_IP4_KEY) for an
    untagged IPv4 frame without options long enough to hold the port; None for others."""
    if frame[12:15] != IP4_MARK or len(frame) < HOST_IP4_KEY.size:
        return None
    return HOST_IP4_KEY.unpack_from(frame)


def mesh_key_ip4(frame) -> tuple | None:
    """mesh_key's counterpart of host_key_ip4 (MESH_IP4_KEY): our header and the inner
    Ethernet header (not the IP header's first 4 bytes: decide_mesh reads none of them
    but the version and IHL, which IP4_MARK fixes), the protocol and the port."""
    if frame[INNER_OFF + 12:INNER_OFF + 15] != IP4_MARK or len(frame) < MESH_IP4_KEY.size:
        return None
    return MESH_IP4_KEY.unpack_from(frame)


def slow_by_rule(slow: SlowPath, direction: str, frame, fields: tuple) -> bool:
    """Whether the core's slow-path rules claim this frame (Ethernet `fields` as
    eth_fields returns them) in `direction`."""
    dst, src, vid, ethertype, l3 = fields
    if slow.clients and ((dst, vid) in slow.clients or (src, vid) in slow.clients):
        return True
    if slow.multicast and direction == TO_HOST and dst[0] & 1:
        return True
    if direction == FROM_HOST and slow.from_host_sources and (src, vid) in slow.from_host_sources:
        return True
    l4 = None
    for rule in slow.rules:
        if rule.direction != direction or rule.ethertype != ethertype:
            continue
        if rule.ip_proto is None:
            return True
        if l4 is None:
            l4 = l4_key(frame, l3, ethertype)
        if not l4:
            return True  # the IP header is cut short: what cannot be told counts as matching
        if l4[0] == rule.ip_proto and (rule.dst_port is None or len(l4) < 3 or l4[1] << 8 | l4[2] == rule.dst_port):
            return True
    return False


def decide_mesh(frame, port_mac: bytes, primary: bytes | None, table: ForwardingTable, wifi: bool):
    """DELIVER, Forward or SLOW for a frame received on the hard interface with MAC
    `port_mac`. `primary`: our originator address while its interface is active (else
    None: the kernel then delivers nothing addressed to it); `wifi`: some hard interface
    is Wi-Fi (forwarding then depends on the incoming interface: the core decides).
    Batman-in-batman goes to the core, which drops it (as the kernel does, to prevent
    loops)."""
    if unicast_inner_offset(frame) != UNICAST_PREFIX_LEN or frame[0:6] != port_mac or frame[6] & 1:
        return SLOW  # not a plain UNICAST frame for this interface from a unicast sender
    fields = eth_fields(frame, INNER_OFF)
    if fields is None or fields[3] == ETH_P_BATMAN:
        return SLOW
    dst, _src, vid, _ethertype, _l3 = fields
    client = (dst, vid)
    dest, ttvn = bytes(frame[DEST_OFF:DEST_OFF + 6]), frame[TTVN_OFF]
    if dest == primary:
        # A stale TTVN does not matter here: the core reroutes a frame for our own client
        # to us (and multicast is not checked), as the kernel does.
        if slow_by_rule(table.slow_path, TO_HOST, frame, fields) or (
                table.slow_path.from_last_hops and bytes(frame[6:12]) in table.slow_path.from_last_hops):
            return SLOW
        if not (dst[0] & 1 or table.local_clients.get(client) is True):
            return SLOW
        watched = table.slow_path.to_host_sources
        if watched is None:
            return DELIVER
        source = (fields[1], vid)
        return DeliverSeen(source) if source in watched else SLOW
    route = table.origs.get(dest)
    if route is None or wifi or frame[TTL_OFF] < 2 or seq_before8(ttvn, route.ttvn) or client in table.local_clients:
        return SLOW
    return Forward(route.iface, route.next_hop)


def decide_host(frame, table: ForwardingTable):
    """Encapsulate or SLOW for a frame the host sent into the soft interface: only to a
    known client of a routed originator, from one of our clients (the core learns or
    refuses the others), never multicast (the core floods it) nor batman-adv (the core
    drops it)."""
    fields = eth_fields(frame, 0)
    if fields is None or fields[0][0] & 1 or fields[3] == ETH_P_BATMAN:
        return SLOW
    dst, src, vid, _ethertype, _l3 = fields
    client = (src, vid)
    if table.local_clients.get(client) is not True or slow_by_rule(table.slow_path, FROM_HOST, frame, fields):
        return SLOW
    hit = table.lookup(dst, vid)
    if hit is None:
        return SLOW
    orig, next_hop, iface, ttvn = hit
    return Encapsulate(iface, next_hop, orig, ttvn, client)
