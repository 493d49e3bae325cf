"""What the Linux bridge bat0 is a port of knows about multicast, as batman-adv asks it
(br_multicast_has_querier_anywhere/_adjacent, br_multicast_has_router_adjacent,
br_multicast_list_adjacent): its queriers, its multicast router ports and the groups it
snooped on its ports (its MDB).

The bridge exports these over rtnetlink: RTM_GETLINK of the bridge (IFLA_BR_MCAST_QUERIER,
IFLA_BR_MCAST_QUERY_RESPONSE_INTVL and, since Linux 5.16, IFLA_BR_MCAST_QUERIER_STATE: the
selected querier, its port and the other-querier timer) and the RTM_GETMDB dump (what
`bridge mdb show` reads: the groups per port, and the router ports). pyroute2 builds and
parses the messages; what it does not decode (the querier state, the MDB) is decoded here.

One piece of bridge state is not exported: the start-up delay after which a new querier
counts (the other-query delay_timer). `QuerierWatch` follows it from what it sees."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterator

from batmand import lazy_package

lazy_package.register("pyroute2")  # its message classes only, not every API it has

from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, nlmsg
from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_GETMDB, RTM_NEWLINK, RTM_NEWMDB
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

TIMEOUT = 1.0  # seconds: the kernel answers at once, unless something holds the rtnl lock
USER_HZ = 100  # the bridge reports its intervals and timers in clock ticks
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

IFLA_BR_MCAST_QUERIER_STATE = 47
BRIDGE_QUERIER_IP_PORT, BRIDGE_QUERIER_IP_OTHER_TIMER = 2, 3
BRIDGE_QUERIER_IPV6_PORT, BRIDGE_QUERIER_IPV6_OTHER_TIMER = 6, 7
MDBA_MDB_ENTRY, MDBA_MDB_ENTRY_INFO = 1, 1
MDBA_ROUTER_PORT = 1
MDBA_ROUTER_PATTR_INET_TIMER, MDBA_ROUTER_PATTR_INET6_TIMER = 3, 4
BR_MDB_ENTRY = struct.Struct("=IBBH16s2s2x")  # struct br_mdb_entry: ifindex, state, flags, vid, addr, proto (BE)
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
IFA_F_OPTIMISTIC, IFA_F_TENTATIVE = 0x04, 0x40


@dataclass(frozen=True)
class QuerierSeen:
    """One family's selected querier as the bridge reports it."""

    foreign_heard: bool = False  # the other-querier timer runs: a foreign querier was heard and won
    port: int | None = None  # the port it was heard on (ifindex), while it is heard


@dataclass(frozen=True)
class BridgeView:
    """One look at the bridge's multicast state."""

    index: int  # the bridge's ifindex (MDB entries joined by the bridge itself carry it)
    querier_on: bool = False  # the bridge's own querier is switched on (mcast_querier)
    has_ipv6_address: bool = False  # it can send MLD queries (BROPT_HAS_IPV6_ADDR)
    response_interval: float = 10.0  # seconds a new querier's hosts get to report
    igmp: QuerierSeen = QuerierSeen()
    mld: QuerierSeen = QuerierSeen()
    router_ports4: frozenset[int] = frozenset()
    router_ports6: frozenset[int] = frozenset()
    mdb: tuple[tuple[int, bytes], ...] = ()  # (port ifindex, group), in the dump's order

    def groups_behind(self, our_port: int) -> tuple[bytes, ...]:
        """br_multicast_list_adjacent: the groups on the ports other than ours, as the kernel
        hands them to batman-adv (it walks the ports' group lists, newest first, and builds
        its list by prepending; with one port toward the hosts the dump lists them the same
        way, so reversed). Entries of the bridge itself are its own groups, read elsewhere."""
        return tuple(group for port, group in reversed(self.mdb) if port not in (our_port, self.index))

    def routers_behind(self, our_port: int) -> tuple[bool, bool]:
        """br_multicast_has_router_adjacent for IPv4 and IPv6."""
        return bool(self.router_ports4 - {our_port}), bool(self.router_ports6 - {our_port})


class QuerierWatch:
    """One family's querier as batman-adv asks the bridge: it exists when the bridge's own
    querier is on (for MLD only with an IPv6 address to send from) or a foreign one is heard,
    but not before a start-up delay: when a querier appears (the bridge's own switched on
    while no foreign one is heard, or a foreign one heard first) the bridge waits one query
    response interval for the hosts' reports. It does not export that timer, so we start
    it when we see the querier appear, also at our first look (one delay too many, never a
    listener missed). A foreign query's own response time is not exported either; the
    bridge's setting (10 s by default, as a default query's) stands in for it. It shadows
    when the selected foreign querier is behind a port other than ours."""

    def __init__(self) -> None:
        self._querier_on = False
        self._foreign_heard = False
        self._delay_until = 0.0

    def update(self, now: float, view: BridgeView, seen: QuerierSeen, own_usable: bool,
               our_port: int) -> tuple[bool, bool]:
        """(exists, shadowing) now."""
        if (view.querier_on and not self._querier_on and not seen.foreign_heard) \
                or (seen.foreign_heard and not self._foreign_heard):
            self._delay_until = now + view.response_interval
        self._querier_on, self._foreign_heard = view.querier_on, seen.foreign_heard
        exists = now >= self._delay_until and (own_usable or seen.foreign_heard)
        return exists, seen.foreign_heard and seen.port != our_port


# --- decoding what pyroute2 does not ------------------------------------------------------


def attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The netlink attributes packed in `data`: (type, payload)."""
    offset = 0
    while offset + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            return
        yield kind & NLA_TYPE_MASK, data[offset + 4:offset + length]
        offset += (length + 3) & ~3


def _u32(payload: bytes | None) -> int | None:
    return struct.unpack_from("=I", payload)[0] if payload is not None and len(payload) >= 4 else None


def decode_querier_state(payload: bytes) -> tuple[QuerierSeen, QuerierSeen]:
    """IFLA_BR_MCAST_QUERIER_STATE for IGMP and MLD: the other-querier timer is there while
    a foreign querier is heard, and with it the port it is heard on."""
    attrs = dict(attributes(payload))
    return (QuerierSeen(BRIDGE_QUERIER_IP_OTHER_TIMER in attrs, _u32(attrs.get(BRIDGE_QUERIER_IP_PORT))),
            QuerierSeen(BRIDGE_QUERIER_IPV6_OTHER_TIMER in attrs, _u32(attrs.get(BRIDGE_QUERIER_IPV6_PORT))))


def decode_mdb(payload: bytes) -> list[tuple[int, bytes]]:
    """MDBA_MDB: (port ifindex, group address) per entry; each MDBA_MDB_ENTRY_INFO is a struct
    br_mdb_entry followed by attributes (timer, sources) we do not need. Entries that are
    not IP groups (layer 2 ones) are left out."""
    entries = []
    for kind, entry in attributes(payload):
        if kind != MDBA_MDB_ENTRY:
            continue
        for info_kind, info in attributes(entry):
            if info_kind != MDBA_MDB_ENTRY_INFO or len(info) < BR_MDB_ENTRY.size:
                continue
            port, _state, _flags, _vid, addr, proto = BR_MDB_ENTRY.unpack_from(info)
            proto = int.from_bytes(proto, "big")
            if proto == ETH_P_IP:
                entries.append((port, addr[:4]))
            elif proto == ETH_P_IPV6:
                entries.append((port, addr))
    return entries


def decode_router_ports(payload: bytes) -> tuple[set[int], set[int]]:
    """MDBA_ROUTER: the multicast router ports for IPv4 and IPv6. Each MDBA_ROUTER_PORT is
    the port's ifindex followed by attributes; a per-family timer says which family
    (Linux 5.15 and later; before, a router port counts for both)."""
    ports4, ports6 = set(), set()
    for kind, entry in attributes(payload):
        if kind != MDBA_ROUTER_PORT or len(entry) < 4:
            continue
        port, attrs = _u32(entry), dict(attributes(entry[4:]))
        per_family = MDBA_ROUTER_PATTR_INET_TIMER in attrs or MDBA_ROUTER_PATTR_INET6_TIMER in attrs
        if MDBA_ROUTER_PATTR_INET_TIMER in attrs or not per_family:
            ports4.add(port)
        if MDBA_ROUTER_PATTR_INET6_TIMER in attrs or not per_family:
            ports6.add(port)
    return ports4, ports6


def raw_attribute(nla, kind: int) -> bytes | None:
    """The payload of the attribute of type `kind` as the kernel sent it. pyroute2 0.9 does
    not know IFLA_BR_MCAST_QUERIER_STATE (it names it UNKNOWN); reading the bytes by type
    works whether or not a later pyroute2 decodes it."""
    for slot in nla["attrs"]:
        raw = slot.nla
        length, raw_kind = struct.unpack_from("=HH", raw.data, raw.offset)
        if raw_kind & NLA_TYPE_MASK == kind:
            return bytes(raw.data[raw.offset + 4:raw.offset + length])
    return None


# --- asking the kernel ----------------------------------------------------------------------


class br_port_msg(nlmsg):
    """RTM_GETMDB/RTM_NEWMDB (struct br_port_msg); the attributes are decoded above."""

    fields = (("family", "B"), ("__pad", "3x"), ("ifindex", "I"))
    nla_map = (("MDBA_UNSPEC", "none"), ("MDBA_MDB", "cdata"), ("MDBA_ROUTER", "cdata"))


class _Marshal(MarshalRtnl):
    msg_map = {**MarshalRtnl.msg_map, RTM_NEWMDB: br_port_msg, RTM_GETMDB: br_port_msg}


def _ask(request: nlmsg, msg_type: int, flags: int, answer_types: tuple[int, ...]) -> list:
    """Send one request on a socket of its own; the answers of `answer_types` (all parts of
    a dump). OSError when the kernel refuses or does not answer in time."""
    request["header"]["type"] = msg_type
    request["header"]["flags"] = flags
    request["header"]["sequence_number"] = 1
    request.encode()
    marshal, answers = _Marshal(), []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(TIMEOUT)
        sock.send(request.data)
        while True:
            for msg in marshal.parse(sock.recv(1 << 16)):
                kind = msg["header"]["type"]
                if kind == NLMSG_ERROR:
                    code = msg.get("error") or 0
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return answers
                if kind == NLMSG_DONE:
                    return answers
                if kind in answer_types:
                    answers.append(msg)
                    if not flags & NLM_F_DUMP:
                        return answers


def _has_ipv6_address(bridge: str, path: str = "/proc/net/if_inet6") -> bool:
    """An IPv6 address the bridge can send MLD queries from (not one still in DAD)."""
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5] == bridge:
                    flags = int(parts[4], 16)
                    if not flags & IFA_F_TENTATIVE or flags & IFA_F_OPTIMISTIC:
                        return True
    except (OSError, ValueError):
        pass
    return False


def read_bridge(bridge: str) -> BridgeView:
    """The multicast state of `bridge` now. OSError when it cannot be asked (gone meanwhile)."""
    index = socket.if_nametoindex(bridge)
    link = ifinfmsg()
    link["family"], link["index"] = socket.AF_UNSPEC, index
    links = _ask(link, RTM_GETLINK, NLM_F_REQUEST, (RTM_NEWLINK,))
    info = links[0].get_attr("IFLA_LINKINFO") if links else None
    data = info.get_attr("IFLA_INFO_DATA") if info is not None else None
    if data is None or not hasattr(data, "get_attr"):
        raise OSError(f"{bridge} reports no bridge attributes")
    state = raw_attribute(data, IFLA_BR_MCAST_QUERIER_STATE)  # absent while snooping is off
    igmp, mld = decode_querier_state(state) if state is not None else (QuerierSeen(), QuerierSeen())
    mdb, ports4, ports6 = [], set(), set()
    dump = br_port_msg()
    dump["family"] = socket.AF_BRIDGE
    # the kernel's dump answers as RTM_GETMDB (notifications are RTM_NEWMDB)
    for msg in _ask(dump, RTM_GETMDB, NLM_F_REQUEST | NLM_F_DUMP, (RTM_GETMDB, RTM_NEWMDB)):
        if msg["ifindex"] != index:
            continue  # another bridge's
        mdb += decode_mdb(msg.get_attr("MDBA_MDB") or b"")
        # (the bridge leaves its router ports out while its own mcast_router is 0, disabled)
        routers4, routers6 = decode_router_ports(msg.get_attr("MDBA_ROUTER") or b"")
        ports4 |= routers4
        ports6 |= routers6
    response_interval = data.get_attr("IFLA_BR_MCAST_QUERY_RESPONSE_INTVL")
    return BridgeView(index=index, querier_on=bool(data.get_attr("IFLA_BR_MCAST_QUERIER")),
                      has_ipv6_address=_has_ipv6_address(bridge),
                      response_interval=(1000 if response_interval is None else response_interval) / USER_HZ,
                      igmp=igmp, mld=mld, router_ports4=frozenset(ports4), router_ports6=frozenset(ports6),
                      mdb=tuple(mdb))
