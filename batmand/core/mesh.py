"""One mesh interface (the kernel's bat_priv): hard interfaces, the routing algorithm,
originators, the translation table, broadcast, unicast routing and ICMP, as one sans-I/O
state machine.

Callers feed it `receive(now, iface, frame)`, `soft_iface_frame(now, frame)` (from the
host) and `tick(now)` (timers; `next_deadline()` says when), and collect the actions each
call returns: Transmit, Deliver, ForwardingUpdate and IcmpResult records."""

from __future__ import annotations

import random

from batmand.wire import (Bcast, Elp, IcmpPacket, IcmpRRPacket, IcmpTpPacket, InnerFrame, IvOgm, Mac, Ogm2, RoamTvlv,
                          TtTvlv, Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, UnknownUnicast, WireError,
                          build_frame, decode_frame, DatTvlv, GatewayTvlv, McastTvlv)
from batmand.wire.constants import ETH_P_BATMAN, PACKET_TYPE_NAMES, TTL, VLAN_HAS_TAG

from .bat_iv import BatmanIV
from .bat_v import BatmanV
from .broadcast import Broadcast
from .config import MeshConfig
from .counters import Counters
from .events import ClientRoute, Deliver, ForwardingUpdate, OrigRoute, Transmit
from .fragmentation import Reassembly
from .hardif import HardInterface
from .icmp import Icmp
from .originator import OriginatorTable, OrigNode
from .routing import Routing, inner_vid
from .translation_table import TranslationTable

ALGORITHMS = {"BATMAN_IV": BatmanIV, "BATMAN_V": BatmanV}
# Receivers ignore an OGM longer than 512 bytes (BATADV_MAX_AGGREGATION_BYTES, kernels before
# batman-adv 2025.1): what our OGM's TVLVs may take, after IV's header (OGMv2's is shorter)
OGM_TVLV_ROOM = 512 - 24
FRAG_MAX_FRAG_SIZE = 1280
FRAG_HEADER = 20
FRAG_MAX_FRAGMENTS = 16


class Mesh:
    def __init__(self, config: MeshConfig | None = None, *, soft_mac: Mac, rng: random.Random | None = None,
                 now: float = 0.0) -> None:
        self.config = config or MeshConfig()
        self.soft_mac = Mac(soft_mac)
        self.rng = rng or random.Random()
        self.counters = Counters()
        self.ifaces: list[HardInterface] = []
        self.primary: HardInterface | None = None
        self.originators = OriginatorTable(self.config, self.counters, evidence=self._orig_has_evidence,
                                           neigh_evidence=self._neigh_has_evidence, forget=self._forget_originator)
        self.log = lambda message: None  # the daemon routes this to its logger
        if self.config.routing_algo not in ALGORITHMS:
            raise ValueError(f"routing algorithm {self.config.routing_algo} is not available "
                             f"(choose {', '.join(ALGORITHMS)})")
        self.algo = ALGORITHMS[self.config.routing_algo](self)
        self.tt = TranslationTable(self)
        self.broadcast = Broadcast(self)
        self.routing = Routing(self)
        self.icmp = Icmp(self)
        self.reassembly = Reassembly(self.counters, self.config)
        self.frag_seqno = self.rng.getrandbits(16)
        self._actions: list = []
        self._published_origs: dict[Mac, OrigRoute] = {}
        self._published_clients: dict = {}
        self._published_ttvn = 0
        self._dirty_origs: set[Mac] = set()
        self._next_purge = now + self.config.orig_work_period_ms / 1000.0
        self._next_tt_purge = now + self.config.tt_work_period_ms / 1000.0
        self.tt.add_vlan(now, 0)

    # --- hard interfaces ----------------------------------------------------------------------

    def add_interface(self, now: float, name: str, mac: Mac, mtu: int = 1500, wifi: bool = False, *,
                      ogm_seqno: int | None = None, elp_seqno: int | None = None) -> list:
        """Attach a hard interface; its own seqnos start random unless given (a restarted
        node continues where it stopped, so peers accept it at once)."""
        if self.iface(name) is not None:
            raise ValueError(f"{name} is already part of the mesh")
        iface = HardInterface(name=name, mac=Mac(mac), mtu=mtu, wifi=wifi, ogm_seqno=ogm_seqno, elp_seqno=elp_seqno)
        self.ifaces.append(iface)
        if self.primary is None:
            self.primary = iface
        self.algo.iface_enabled(now, iface)
        return self._take()

    def remove_interface(self, now: float, name: str) -> list:
        iface = self.iface(name)
        if iface is None:
            raise ValueError(f"{name} is not part of the mesh")
        was_active = iface.active
        iface.active = False
        self.ifaces.remove(iface)
        if was_active:
            self.algo.iface_disabled(iface)
        if self.primary is iface:
            self.primary = next((i for i in self.ifaces if i.active), self.ifaces[0] if self.ifaces else None)
        self._forget_routes_via(iface)
        return self._take()

    def deactivate_interface(self, now: float, name: str) -> list:
        """batadv_hardif_deactivate_interface: the interface was set down. It stays part of
        the mesh, but nothing is sent or accepted on it and what was learnt through it goes.
        The primary stays the primary, as in the kernel: the originator address is kept,
        and while it is down only the other interfaces' own OGMs go out."""
        iface = self.iface(name)
        if iface is None or not iface.active:
            return self._take()
        iface.active = False
        self.algo.iface_deactivated(iface)
        self._forget_routes_via(iface)
        iface.neighbours.clear()
        return self._take()

    def activate_interface(self, now: float, name: str) -> list:
        """batadv_hardif_activate_interface: the interface is up again; its own seqnos
        continue where they were, so its neighbours accept it at once."""
        iface = self.iface(name)
        if iface is None or iface.active:
            return self._take()
        iface.active = True
        self.algo.iface_enabled(now, iface)
        return self._take()

    def _forget_routes_via(self, iface: HardInterface) -> None:
        for orig_node in list(self.originators.nodes.values()):
            for key in [k for k in orig_node.neighbours if k[1] is iface]:
                del orig_node.neighbours[key]
            orig_node.ifinfo.pop(iface, None)
            for neigh in orig_node.neighbours.values():
                neigh.ifinfo.pop(iface, None)
            self._reselect_routes(orig_node)

    def iface(self, name: str) -> HardInterface | None:
        return next((i for i in self.ifaces if i.name == name), None)

    def active_ifaces(self) -> list[HardInterface]:
        return [i for i in self.ifaces if i.active]

    def is_my_mac(self, mac: bytes) -> bool:
        return any(i.mac == mac for i in self.ifaces if i.active)

    @property
    def packet_size_max(self) -> int:
        """Largest batman packet we may send (fragmentation lets it exceed the MTU)."""
        mtus = [i.mtu for i in self.active_ifaces()] or [1500]
        if self.config.fragmentation:
            return (min(min(mtus), FRAG_MAX_FRAG_SIZE) - FRAG_HEADER) * FRAG_MAX_FRAGMENTS
        return min(mtus)

    # --- actions --------------------------------------------------------------------------------

    def transmit(self, iface: HardInterface, frame: bytes, *, mgmt: bool = False) -> None:
        if mgmt:
            self.counters.add("mgmt_tx", len(frame))
        self._actions.append(Transmit(iface.name, frame))

    def deliver(self, now: float, inner: InnerFrame, orig_node: OrigNode | None = None) -> None:
        """batadv_interface_rx: hand a frame from the mesh to the host; `orig_node` (broadcasts,
        4addr DATA) learns the sender as a temporary client. Batman-in-batman is dropped, as the
        kernel does, to prevent loops (a bat0 bridged into another mesh's hard interface)."""
        if inner.h_proto == ETH_P_BATMAN:  # InnerFrame.h_proto is the ethertype behind one 802.1Q tag
            self.counters.drop("batman_in_batman")
            return
        frame = inner.encode()
        self.counters.add("rx", len(frame))
        self._actions.append(Deliver(frame))
        if orig_node is not None and not inner.h_source.is_multicast:
            self.tt.add_temporary(now, orig_node, inner.h_source, inner_vid(inner))

    def emit(self, action) -> None:
        self._actions.append(action)

    def _take(self) -> list:
        self._publish()
        actions, self._actions = self._actions, []
        return actions

    # --- entry points ---------------------------------------------------------------------------

    def receive(self, now: float, iface_name: str, data: bytes) -> list:
        """A frame arrived on a hard interface."""
        self.receive_frame(now, iface_name, data)
        return self._take()

    def receive_frame(self, now: float, iface_name: str, data: bytes) -> None:
        """receive() without collecting the actions (also for reassembled packets)."""
        iface = self.iface(iface_name)
        if iface is None or not iface.active:
            self.counters.drop("inactive_interface")
            return
        try:
            frame = decode_frame(data)
        except WireError:
            self.counters.drop("malformed")
            return
        packet = frame.packet
        self.counters["rx_" + PACKET_TYPE_NAMES.get(packet.packet_type, "unknown_unicast")] += len(frame.packets)
        if isinstance(packet, (IvOgm, Ogm2, Elp)):
            # each algorithm only takes its own announcements (IV and V do not mix)
            ours = isinstance(packet, IvOgm) == isinstance(self.algo, BatmanIV)
            if not ours:
                self.counters.drop("other_routing_algorithm")
            elif self._check_management(frame, iface):
                self.counters.add("mgmt_rx", len(data))
                if isinstance(packet, Elp):
                    self.algo.receive_elp(now, iface, frame)
                else:
                    self.algo.receive(now, iface, frame, data)
        elif isinstance(packet, Bcast):
            self.broadcast.receive(now, iface, frame, data)
        elif isinstance(packet, (Unicast, Unicast4Addr)):
            self.routing.receive_unicast(now, iface, frame, data)
        elif isinstance(packet, (IcmpPacket, IcmpRRPacket, IcmpTpPacket)):
            self.routing.receive_icmp(now, iface, frame)
        elif isinstance(packet, UnicastTvlv):
            self.routing.receive_unicast_tvlv(now, iface, frame)
        elif isinstance(packet, UnicastFrag):
            self.routing.receive_fragment(now, iface, frame, data)
        elif isinstance(packet, UnknownUnicast):
            self.routing.receive_unknown_unicast(now, iface, frame)
        else:
            self.counters.drop("unhandled_packet_type")

    def soft_iface_frame(self, now: float, data: bytes) -> list:
        """A frame the host sent into the soft interface (the inline data path)."""
        self.routing.send_from_host(now, data)
        return self._take()

    def tick(self, now: float) -> list:
        self.algo.tick(now)
        self.broadcast.tick(now)
        if now >= self._next_purge:
            self._next_purge = now + self.config.orig_work_period_ms / 1000.0
            self.purge(now)
        if now >= self._next_tt_purge:
            self._next_tt_purge = now + self.config.tt_work_period_ms / 1000.0
            self.tt.purge(now)
        return self._take()

    def next_deadline(self) -> float:
        return min(self.algo.next_deadline(), self.broadcast.next_deadline(), self._next_purge, self._next_tt_purge)

    def ping(self, now: float, dst: Mac, *, seqno: int, uid: int = 0, ttl: int = TTL,
             record_route: bool = False) -> list:
        self.icmp.send_echo(now, Mac(dst), seqno=seqno, uid=uid, ttl=ttl, record_route=record_route)
        return self._take()

    # --- helpers for the algorithm and the other parts --------------------------------------------

    @staticmethod
    def _check_management(frame, iface: HardInterface) -> bool:
        """batadv_check_management_packet: broadcast destination, a valid unicast source."""
        src = frame.ethernet.h_source
        return frame.ethernet.h_dest.is_broadcast and not src.is_multicast and any(src)

    def ogm_tvlv_room(self) -> int:
        """Bytes the TVLVs of our OGM may take; TT gets what the other containers leave."""
        return OGM_TVLV_ROOM

    def set_vlans(self, now: float, vids: set[int]) -> list:
        """The 802.1Q VLANs of the soft interface (VLAN devices on bat0, configured ones);
        the untagged VLAN always exists. Those our OGM has no room for are refused
        (vlans() tells which were taken)."""
        wanted = {VLAN_HAS_TAG | vid for vid in vids if 0 < vid < 4095}
        for vid in sorted(self.tt.registered - wanted - {0}):
            self.tt.remove_vlan(now, vid)
        for vid in sorted(wanted - self.tt.registered):
            self.tt.add_vlan(now, vid)
        return self._take()

    def vlans(self) -> set[int]:
        """The 802.1Q VLANs of the soft interface that hosts may send on (untagged aside)."""
        return {vid & 0x0FFF for vid in self.tt.registered if vid}

    def ogm_tvlvs(self, now: float) -> list:
        """The TVLVs of our own (primary) OGM. No DAT or MCAST container until those
        features exist: their absence tells kernel nodes exactly that (CIFNOTFND)."""
        return [self.tt.commit(now)]

    def ogm_tvlvs_received(self, now: float, orig_node: OrigNode, tvlvs: list) -> None:
        """batadv_tvlv_ogm_receive, including the 'handler runs when absent' containers."""
        gw = dat = mcast = None
        for tvlv in tvlvs:
            if isinstance(tvlv, TtTvlv):
                self.tt.ogm_received(now, orig_node, tvlv)
                self._dirty_origs.add(orig_node.orig)
            elif isinstance(tvlv, GatewayTvlv):
                gw = tvlv
            elif isinstance(tvlv, DatTvlv):
                dat = tvlv
            elif isinstance(tvlv, McastTvlv):
                mcast = tvlv
        orig_node.gw_bandwidth = (gw.bandwidth_down, gw.bandwidth_up) if gw and gw.bandwidth_down and \
            gw.bandwidth_up else None
        orig_node.dat_capable = dat is not None
        orig_node.mcast_flags = mcast.flags if mcast else None

    def send_unicast_tvlv(self, now: float, src: Mac, dst: Mac, tvlvs: list) -> bool:
        orig_node = self.originators.get(dst)
        if orig_node is None:
            return False
        packet = UnicastTvlv(dst=dst, src=src, tvlvs=tvlvs)
        return self.routing.send_to_orig(now, packet.encode(), orig_node, None)

    def update_route(self, orig_node: OrigNode, outif, neigh, now: float | None = None) -> None:
        """batadv_update_route: a route lost makes us forget what the originator announced;
        a new one lets a TT request that had no route go out."""
        info = orig_node.ifinfo_new(outif)
        old = info.router
        info.router = neigh
        if old is not None and neigh is None:
            self.tt.global_del_orig(orig_node)
        if outif is None:
            self._dirty_origs.add(orig_node.orig)
            if old is None and neigh is not None and now is not None:
                self.tt.route_appeared(now, orig_node)

    def _reselect_routes(self, orig_node: OrigNode) -> None:
        for outif in [None] + self.active_ifaces():
            best = None
            for neigh in orig_node.neighbours.values():
                if best is None or self.algo.metric(neigh, outif) > self.algo.metric(best, outif):
                    best = neigh
            if orig_node.router(outif) is not best:
                self.update_route(orig_node, outif, best)

    def purge(self, now: float) -> None:
        """The originator worker (every second): time out neighbours and originators, and
        list the entries without evidence (again) as the ones a full table may evict."""
        neigh_timeout = self.config.purge_timeout
        originators = self.originators
        self.reassembly.purge(now)
        for addr, orig_node in list(originators.nodes.items()):
            if now - orig_node.last_seen > 2 * neigh_timeout:
                originators.remove(orig_node)
                continue
            stale = [k for k, n in orig_node.neighbours.items()
                     if now - n.last_seen > neigh_timeout or not n.if_incoming.active]
            for key in stale:
                del orig_node.neighbours[key]
            if stale:
                self._reselect_routes(orig_node)
            originators.review(orig_node)
        originators.candidates.prune(originators.nodes)
        for iface in self.ifaces:
            for addr in [a for a, n in iface.neighbours.items() if now - n.last_seen > neigh_timeout]:
                del iface.neighbours[addr]
            for addr, neigh in iface.neighbours.items():
                if not self._neigh_has_evidence(iface, neigh):
                    iface.eviction.keep(addr)
            iface.eviction.prune(iface.neighbours)

    def _forget_originator(self, orig_node: OrigNode) -> None:
        """An originator leaves the table (timed out or evicted): its routes, clients and
        fragments go with it."""
        self.reassembly.forget(orig_node.orig)
        for outif in [None] + self.active_ifaces():
            if orig_node.router(outif) is not None:
                self.update_route(orig_node, outif, None)
        self.tt.global_del_orig(orig_node)
        self._dirty_origs.add(orig_node.orig)

    def _orig_has_evidence(self, orig_node: OrigNode) -> bool:
        return self.algo.orig_has_evidence(orig_node)

    def _neigh_has_evidence(self, iface: HardInterface, neigh) -> bool:
        return self.algo.neigh_has_evidence(iface, neigh)

    # --- publishing the forwarding table -----------------------------------------------------------

    def orig_route(self, orig: Mac) -> OrigRoute | None:
        node = self.originators.get(orig)
        router = node.router() if node else None
        if router is None:
            return None
        return OrigRoute(router.addr, router.if_incoming.name, node.last_ttvn)

    def _publish(self) -> None:
        origs = {}
        for orig in self._dirty_origs:
            route = self.orig_route(orig)
            if self._published_origs.get(orig) != route:
                origs[orig] = route
                self.tt.dirty_clients.update(self.tt.by_orig.get(orig, ()))
        self._dirty_origs.clear()
        clients = {}
        for key in self.tt.dirty_clients:
            best = self.tt.best_orig(*key)
            route = ClientRoute(best, self.tt.is_roaming(*key)) if best is not None else None
            if self._published_clients.get(key) != route:
                clients[key] = route
        self.tt.dirty_clients.clear()
        local = {key: (self.tt.is_my_client(*key) if key in self.tt.local else None) for key in self.tt.dirty_local}
        self.tt.dirty_local.clear()
        ttvn = self.tt.ttvn if self.tt.ttvn != self._published_ttvn else None
        self._published_ttvn = self.tt.ttvn
        if not (origs or clients or local or ttvn is not None):
            return
        for table, changes in ((self._published_origs, origs), (self._published_clients, clients)):
            for key, value in changes.items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
        self._actions.append(ForwardingUpdate(origs, clients, local, ttvn))
