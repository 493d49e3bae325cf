"""Multicast optimisations (the kernel's multicast.c, without the MCAST packet type).

Our OGMs carry an MCAST container (type 6 v2) with flags that say what multicast our hosts
want: the groups bat0's hosts listen to go into our local TT as multicast MACs (listener
announcements), and the flags tell the rest (WANT_ALL_*: send me everything of a family;
WANT_NO_RTR*: no multicast router here). From peers' containers we know who wants what;
a peer without one wants all IPv4 and IPv6 multicast. A host's multicast frame then goes
as unicast copies to the interested originators when they are at most multicast_fanout,
is dropped when nobody is interested, and is flooded otherwise (and for what cannot be
snooped: IGMP/MLD reports, 224.0.0.0/24 and ff02::1 when some node wants those, non-IP).

What bat0's hosts listen to comes from the daemon (`HostGroups`, refreshed every 500 ms as
the kernel's batadv_mcast_mla_update). As batman-adv 2024.0 and later, we announce that we
take the MCAST packet type (HAVE_MC_PTYPE_CAPA) while all our active hard interfaces have
the IPv6 minimum MTU, and send one MCAST packet instead of unicast copies when every node
announced it (multicast_forw.py); a single node without it (any kernel before 2024.0)
keeps the whole mesh on unicast copies."""

from __future__ import annotations

from dataclasses import dataclass

from batmand.wire import InnerFrame, Mac, McastTvlv
from batmand.wire.constants import TvlvType

from .hooks import MULTICAST
from .multicast_forw import IPV6_MIN_MTU, McastForwarding, packet_len

WANT_ALL_UNSNOOPABLES, WANT_ALL_IPV4, WANT_ALL_IPV6, WANT_NO_RTR4, WANT_NO_RTR6 = 0x01, 0x02, 0x04, 0x08, 0x10
HAVE_MC_PTYPE_CAPA = 0x20
# an originator whose OGMs we have not read yet (2024.0+: counted as capable until we know)
PEER_DEFAULT = WANT_NO_RTR4 | WANT_NO_RTR6 | HAVE_MC_PTYPE_CAPA
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
IPPROTO_IGMP, IPPROTO_ICMPV6 = 2, 58
IGMP_REPORTS = {0x12, 0x16, 0x22}  # v1, v2, v3 membership reports
MLD_REPORTS = {131, 143}  # MLDv1, MLDv2 listener reports
ALL_NODES6 = bytes.fromhex("ff020000000000000000000000000001")
_FLOOD, _DROP = "flood", "drop"


@dataclass(frozen=True)
class HostGroups:
    """What the daemon knows about the multicast listeners behind bat0: the IPv4 and IPv6
    groups bat0 (or the bridge it is a port of) is a member of, and when bridged the groups
    the bridge snooped on its other ports, whether IGMP/MLD queriers exist or are shadowed
    behind other ports, and multicast routers."""

    ipv4: tuple[bytes, ...] = ()
    ipv6: tuple[bytes, ...] = ()
    # the bridge's MDB groups on ports other than bat0's (br_multicast_list_adjacent, in its
    # order): IPv4 as 4 bytes, IPv6 as 16, mixed as the kernel lists them
    bridge_groups: tuple[bytes, ...] = ()
    bridged: bool = False
    querier4: bool = False  # an IGMP querier exists (bridged only)
    querier6: bool = False
    shadowing4: bool = False  # the querier is behind another bridge port
    shadowing6: bool = False
    router4: bool = False  # a multicast router (forwarding, or a bridge router port)
    router6: bool = False


def own_flags(groups: HostGroups) -> int:
    """batadv_mcast_mla_flags_get."""
    flags = (0 if groups.router4 else WANT_NO_RTR4) | (0 if groups.router6 else WANT_NO_RTR6)
    if not groups.bridged:
        return flags
    flags |= WANT_ALL_UNSNOOPABLES
    if not groups.querier4 or groups.shadowing4:
        flags = (flags | WANT_ALL_IPV4) & ~WANT_NO_RTR4
    if not groups.querier6 or groups.shadowing6:
        flags = (flags | WANT_ALL_IPV6) & ~WANT_NO_RTR6
    return flags


def listener_macs(groups: HostGroups, flags: int) -> list[Mac]:
    """The multicast MACs we announce for our listeners (batadv_mcast_mla_meshif_get_* and
    mla_bridge_get): all groups of a family unless we want all of it; not the unsnoopable
    ones when bridged (the flag covers them); not the routable ones when we have a router;
    never the device's IPv6 groups below link-local scope (the bridge's have no such check).
    One MAC per set of groups that map to it, in the kernel's order."""
    device = list(groups.ipv4) + [g for g in groups.ipv6 if g[1] & 0x0F >= 2]
    macs = [mac for g in device + list(groups.bridge_groups) if (mac := _listener_mac(g, flags)) is not None]
    # the kernel skips a MAC it has already collected and prepends the others
    return list(reversed(dict.fromkeys(macs)))


def _listener_mac(group: bytes, flags: int) -> Mac | None:
    """The MAC announced for one IPv4 or IPv6 group, or None when our flags cover it."""
    if len(group) == 4:
        link_local = group[:3] == b"\xe0\x00\x00"  # 224.0.0.0/24
        if flags & WANT_ALL_IPV4 or (flags & WANT_ALL_UNSNOOPABLES and link_local) \
                or (not flags & WANT_NO_RTR4 and not link_local):
            return None
        return Mac(bytes([0x01, 0x00, 0x5E, group[1] & 0x7F, group[2], group[3]]))
    if flags & WANT_ALL_IPV6 or (flags & WANT_ALL_UNSNOOPABLES and group == ALL_NODES6) \
            or (not flags & WANT_NO_RTR6 and group[1] & 0x0F > 2):
        return None
    return Mac(b"\x33\x33" + group[12:16])


def peer_flags(tvlv: McastTvlv | None) -> int:
    """batadv_mcast_tvlv_flags_get: no container means "send me all multicast"; wanting all
    of a family implies no router list for it."""
    flags = tvlv.flags if tvlv is not None else WANT_ALL_IPV4 | WANT_ALL_IPV6
    if flags & WANT_ALL_IPV4:
        flags |= WANT_NO_RTR4
    if flags & WANT_ALL_IPV6:
        flags |= WANT_NO_RTR6
    return flags


class Multicast:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.flags: int | None = None  # ours; None until the first update (no container yet, as the kernel)
        self.groups = HostGroups()
        self.announced: list[Mac] = []  # our listener entries in the local TT
        self.peers: dict[Mac, int] = {}  # originator -> its flags, for those whose OGMs we read
        self.announcing: set[Mac] = set()  # those whose last OGM carried the container (HAS_MCAST)
        self.not_capable: set[Mac] = set()  # those without HAVE_MC_PTYPE_CAPA (num_no_mc_ptype_capa)
        self.forwarding = McastForwarding(mesh)
        # the originators in each "wants" list, oldest first: the kernel's hlists read backwards
        # (plain dicts: an OrderedDict's entry costs twice a dict's, one per originator per list)
        self.wants: dict[str, dict] = {k: {} for k in ("unsnoopables", "ipv4", "ipv6", "rtr4", "rtr6")}
        mesh.tvlv.handle_ogm(TvlvType.MCAST, McastTvlv.VERSION, self._ogm_container, when_absent=True,
                             each_copy=False)
        mesh.tvlv.contribute(self._container, reserve=8)
        mesh.hooks.on_host_tx(MULTICAST, self._host_tx)
        mesh.on_originator_removed(lambda orig_node: self._set_peer(orig_node.orig, None))

    # --- our flags and listeners --------------------------------------------------------------

    def update(self, now: float, groups: HostGroups) -> None:
        """batadv_mcast_mla_update: our flags and listener entries from what the hosts want."""
        self.groups = groups
        self.flags = own_flags(groups)
        wanted = listener_macs(groups, self.flags)
        if all(iface.mtu >= IPV6_MIN_MTU for iface in self.mesh.active_ifaces()):
            self.flags |= HAVE_MC_PTYPE_CAPA  # an MCAST packet fits all our links
        tt = self.mesh.tt
        for mac in [m for m in self.announced if m not in wanted]:
            tt.local_remove(mac, 0, roaming=False)
            self.announced.remove(mac)
        for mac in wanted:
            if mac not in self.announced and tt.local_add(now, mac, 0):
                self.announced.insert(0, mac)

    def _container(self, now: float, room: int) -> McastTvlv | None:
        return McastTvlv(self.flags) if self.flags is not None else None

    # --- peers ------------------------------------------------------------------------------------

    def _ogm_container(self, now: float, orig_node, tvlv) -> None:
        (self.announcing.add if tvlv is not None else self.announcing.discard)(orig_node.orig)
        self._set_peer(orig_node.orig, peer_flags(tvlv))

    def _set_peer(self, orig: Mac, flags: int | None) -> None:
        """batadv_mcast_want_*_update: keep each list of interested originators current."""
        new = PEER_DEFAULT if flags is None else flags  # a removed originator leaves every list
        if flags is not None and self.peers.get(orig) == new:
            return  # its lists are as these flags put them (every OGM says the same)
        for name, wanted in (("unsnoopables", new & WANT_ALL_UNSNOOPABLES), ("ipv4", new & WANT_ALL_IPV4),
                             ("ipv6", new & WANT_ALL_IPV6), ("rtr4", not new & WANT_NO_RTR4),
                             ("rtr6", not new & WANT_NO_RTR6)):
            members = self.wants[name]
            if wanted and orig not in members:
                members[orig] = None
            elif not wanted:
                members.pop(orig, None)
        (self.not_capable.discard if new & HAVE_MC_PTYPE_CAPA else self.not_capable.add)(orig)
        if flags is None:
            self.peers.pop(orig, None)
            self.announcing.discard(orig)
        else:
            self.peers[orig] = new

    # --- frames from the host ----------------------------------------------------------------------

    def _classify(self, inner: InnerFrame):
        """batadv_mcast_forw_mode_check: _FLOOD, _DROP, or (family, unsnoopable, routable)."""
        if inner.vlan_tci is not None:
            return _FLOOD  # only untagged frames are snooped
        p = inner.payload
        if inner.h_proto == ETH_P_IP:
            if len(p) < 20:
                return _DROP
            if p[9] == IPPROTO_IGMP and len(p) >= (p[0] & 0x0F) * 4 + 1 and p[(p[0] & 0x0F) * 4] in IGMP_REPORTS:
                return _FLOOD
            unsnoopable = p[16:19] == b"\xe0\x00\x00"
            return 4, unsnoopable, not unsnoopable
        if inner.h_proto == ETH_P_IPV6:
            if len(p) < 40:
                return _DROP
            if _mld_report(p):
                return _FLOOD
            dst = p[24:40]
            scope = dst[1] & 0x0F
            if scope < 2:
                return _FLOOD
            return 6, dst == ALL_NODES6, scope > 2
        return _FLOOD

    def _host_tx(self, now: float, inner: InnerFrame, vid: int) -> bool:
        """batadv_mcast_forw_mode and its senders for a host frame to a multicast (not the
        broadcast) address: one MCAST packet, unicast copies, dropped, or flooded (not
        consumed)."""
        if not inner.h_dest.is_multicast or inner.h_dest.is_broadcast or not self.mesh.config.multicast_mode:
            return False
        kind = self._classify(inner)
        mesh = self.mesh
        if kind == _FLOOD:
            return False
        if kind == _DROP:
            mesh.counters["tx_dropped"] += 1
            return True
        family, unsnoopable, routable = kind
        entry = mesh.tt.global_.get((inner.h_dest, 0))
        listeners = list(reversed(entry.origs)) if entry is not None else []  # the newest announcer first
        want_all = list(reversed(self.wants["ipv4" if family == 4 else "ipv6"]))  # the newest first
        routers = list(reversed(self.wants["rtr4" if family == 4 else "rtr6"])) if routable else []
        unsnoop = len(self.wants["unsnoopables"]) if unsnoopable else 0
        total = len(listeners) + len(want_all) + unsnoop + len(routers)
        if total == 0:
            mesh.counters["tx_dropped"] += 1
            mesh.counters.drop("mcast_no_listener")
            return True
        if unsnoop:
            return False  # flooded as a broadcast
        frame_len = len(inner.encode())
        if not self.not_capable and self.flags is not None and self.flags & HAVE_MC_PTYPE_CAPA \
                and packet_len(frame_len, total) <= IPV6_MIN_MTU:
            dests = [o for o in listeners + want_all + routers if not mesh.bla.is_backbone_gw(o, vid)]
            self.forwarding.send_own(now, inner, dests)  # a gateway of our LAN has it from the LAN
            mesh.counters.add("tx", frame_len)
            return True
        if total > mesh.config.multicast_fanout:
            return False
        sent = False
        for orig in listeners + want_all + routers:
            if mesh.bla.is_backbone_gw(orig, vid):
                sent = True  # a gateway of our own LAN has the frame from the LAN already
                continue
            sent |= mesh.routing.send_unicast(now, inner, mesh.originators.get(orig))
        if sent:
            mesh.counters.add("tx", frame_len)
        else:
            mesh.counters["tx_dropped"] += 1
        return True

    # --- batmanctl mf -----------------------------------------------------------------------------

    def rows(self) -> list[dict]:
        """batctl mf: the originators whose OGMs we read; the flags of those that announce them."""
        return [{"orig_address": str(orig), **({"mcast_flags": flags} if orig in self.announcing else {})}
                for orig, flags in self.peers.items()]

    def state(self) -> dict:
        g = self.groups
        return {"mcast_flags": self.flags or 0, "bridged": g.bridged, "querier4": g.querier4, "querier6": g.querier6,
                "shadowing4": g.shadowing4, "shadowing6": g.shadowing6}


def _mld_report(p: bytes) -> bool:
    """An MLD report (ICMPv6 131 or 143), behind at most a hop-by-hop header (MLD's router alert)."""
    nexthdr, off = p[6], 40
    if nexthdr == 0 and len(p) >= off + 2:
        nexthdr, off = p[off], off + (p[off + 1] + 1) * 8
    return nexthdr == IPPROTO_ICMPV6 and len(p) > off and p[off] in MLD_REPORTS
