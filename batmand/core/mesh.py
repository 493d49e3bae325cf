"""One mesh interface (the kernel's bat_priv): hard interfaces, the routing algorithm,
originators, the translation table, broadcast, unicast routing and ICMP, as one sans-I/O
state machine.

Callers feed it `receive(now, iface, frame)`, `soft_iface_frame(now, frame)` (from the
host) and `tick(now)` (timers; `next_deadline()` says when), and collect the actions each
call returns: Transmit, Deliver, ForwardingUpdate and IcmpResult records."""

from __future__ import annotations

import random

from batmand.wire import BROADCAST, InnerFrame, Mac, UnicastTvlv, WireError, decode_frame
from batmand.wire.ethernet import ETH_HLEN
from batmand.wire.constants import ETH_P_BATMAN, PACKET_TYPE_NAMES, TTL, UNICAST_MAX, UNICAST_MIN, VLAN_HAS_TAG

from . import bat_iv, bat_v  # noqa: F401 - the algorithms register themselves
from .algorithm import ALGORITHMS, RoutingAlgorithm
from .bla import Bla
from .bla_frames import is_loopdetect_mac
from .broadcast import Broadcast
from .config import HardifConfig, MeshConfig
from .counters import Counters
from .events import Deliver, Transmit
from . import fragmentation
from .fragmentation import Reassembly
from .dat import Dat
from .gateway import Gateway
from .multicast import Multicast
from .hardif import HardInterface
from .hooks import HostHooks
from .icmp import Icmp
from .originator import OriginatorTable, OrigNode
from .publish import Publisher
from .routes import Routes
from .routing import Routing, inner_vid
from .tp_meter import TpMeter
from .translation_table import TranslationTable
from .tvlv import TvlvRegistry

# Receivers ignore an OGM longer than 512 bytes (BATADV_MAX_AGGREGATION_BYTES, kernels before
# batman-adv 2025.1): what our OGM's TVLVs may take, after IV's header (OGMv2's is shorter)
OGM_TVLV_ROOM = 512 - 24


def _msecs(now: float, then: float) -> int:
    return max(0, int(round((now - then) * 1000)))


class Mesh:
    def __init__(self, config: MeshConfig | None = None, *, soft_mac: Mac, rng: random.Random | None = None,
                 now: float = 0.0) -> None:
        self.config = config or MeshConfig()
        self.soft_mac = Mac(soft_mac)
        self.rng = rng or random.Random()
        self.counters = Counters()
        self.ifaces: list[HardInterface] = []
        self.primary: HardInterface | None = None
        self.active: tuple[HardInterface, ...] = ()  # the active ifaces, kept by _ifaces_changed
        self.my_macs: frozenset = frozenset()  # and their MACs (what is_my_mac asks, per OGM)
        self.log = lambda message: None  # the daemon routes this to its logger
        self.debug = lambda message: None  # the kernel's debug-log lines (batadv_dbg)
        self._setting_watchers: dict[str, list] = {}  # setting -> [callback(now, name, old value)]
        self._setting_checks: dict[str, list] = {}  # setting -> [check(name, new value)]
        self._orig_removed: list = []  # [callback(orig_node)]: an originator leaves the table
        self._after_purge: list = []  # [callback(now)]: the end of each originator worker run
        if self.config.routing_algo not in ALGORITHMS:
            raise ValueError(f"routing algorithm {self.config.routing_algo} is not available "
                             f"(choose {', '.join(ALGORITHMS)})")
        self.algo: RoutingAlgorithm = ALGORITHMS[self.config.routing_algo](self)
        self.routes = Routes(self)
        self.publisher = Publisher(self)
        self.originators = OriginatorTable(self.config, self.counters, evidence=self.algo.orig_has_evidence,
                                           neigh_evidence=self.algo.neigh_has_evidence,
                                           forget=self.routes.forget_originator)
        self.tvlv = TvlvRegistry()
        self.hooks = HostHooks()
        self.receivers: dict[int, object] = {}  # packet type -> handler(now, iface, frame, raw)
        self.parsers: dict[int, object] = {}  # packet type -> parse(raw) for those not read by decode_frame
        self._register_receivers()
        self.tt = TranslationTable(self)
        self.broadcast = Broadcast(self)
        self.routing = Routing(self)
        self.icmp = Icmp(self)
        self.tp = TpMeter(self)
        self.gateway = Gateway(self)
        self.multicast = Multicast(self)  # its container before DAT's, the kernel's order
        self.bla = Bla(self, now)
        self.dat = Dat(self)
        self.reassembly = Reassembly(self.counters, self.config)
        self.frag_seqno = self.rng.getrandbits(16)
        self._actions: list = []
        self._next_purge = now + self.config.orig_work_period_ms / 1000.0
        self._next_tt_purge = now + self.config.tt_work_period_ms / 1000.0
        self.tt.add_vlan(now, 0)

    # --- hard interfaces ----------------------------------------------------------------------

    def add_interface(self, now: float, name: str, mac: Mac, mtu: int = 1500, wifi: bool = False,
                      settings: HardifConfig | None = None) -> list:
        """Attach a hard interface; its own seqnos start random, or where restore_seqnos()
        said this MAC stopped (so that its peers accept it at once)."""
        if self.iface(name) is not None:
            raise ValueError(f"{name} is already part of the mesh")
        iface = HardInterface(name=name, mac=Mac(mac), mtu=mtu, wifi=wifi, settings=settings or HardifConfig())
        self.ifaces.append(iface)
        if self.primary is None:
            self.primary = iface
        self._ifaces_changed()
        self.algo.iface_enabled(now, iface)
        return self._take()

    def remove_interface(self, now: float, name: str) -> list:
        iface = self.iface(name)
        if iface is None:
            raise ValueError(f"{name} is not part of the mesh")
        was_active = iface.active
        iface.active = False
        self.ifaces.remove(iface)
        self._ifaces_changed()
        if was_active:
            self.algo.iface_disabled(iface)
        if self.primary is iface:
            self.primary = next((i for i in self.ifaces if i.active), self.ifaces[0] if self.ifaces else None)
        self.routes.forget_via(iface)
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
        self._ifaces_changed()
        self.algo.iface_deactivated(iface)
        self.routes.forget_via(iface)
        iface.neighbours.clear()
        return self._take()

    def activate_interface(self, now: float, name: str) -> list:
        """batadv_hardif_activate_interface: the interface is up again; its own seqnos
        continue where they were, so its neighbours accept it at once."""
        iface = self.iface(name)
        if iface is None or iface.active:
            return self._take()
        iface.active = True
        self._ifaces_changed()
        self.algo.iface_enabled(now, iface)
        return self._take()

    def _ifaces_changed(self) -> None:
        self.active = tuple(i for i in self.ifaces if i.active)
        self.my_macs = frozenset(i.mac for i in self.active)

    def set_hardif(self, name: str, settings: HardifConfig) -> None:
        """An interface's settings (batctl hardif IFACE et|to|hp): used from the next OGM,
        ELP or link estimate on, as in the kernel."""
        self._iface_or_error(name).settings = settings

    def set_link_facts(self, name: str, *, speed_mbit: int | None = None, full_duplex: bool = False,
                       stations: dict | None = None) -> None:
        """What the daemon measured about a link (for algorithms that estimate links):
        ethtool's speed and duplex, and (None: unchanged) nl80211's stations."""
        link = self._iface_or_error(name).link
        link.speed_mbit, link.full_duplex = speed_mbit, full_duplex
        if stations is not None:
            link.stations = stations

    def set_option(self, now: float, name: str, value) -> list:
        """A mesh setting changed (checked against the schema already): the features that
        watch it check it first (SettingError: nothing changes), then react, as the
        kernel's netlink set does (gw_mode elects again...)."""
        self.check_option(name, value)
        old = getattr(self.config, name)
        setattr(self.config, name, value)
        for watcher in self._setting_watchers.get(name, ()):
            watcher(now, name, old)
        return self._take()

    def check_option(self, name: str, value) -> None:
        """SettingError when a feature cannot take this value of one of its settings (the
        schema's range was checked already)."""
        for check in self._setting_checks.get(name, ()):
            check(name, value)

    def on_setting(self, names, watcher, check=None) -> None:
        """For the features: watcher(now, name, old value) after one of these settings is
        set; check(name, value) before, raising SettingError for a value it cannot take."""
        for name in names:
            self._setting_watchers.setdefault(name, []).append(watcher)
            if check is not None:
                self._setting_checks.setdefault(name, []).append(check)

    def on_originator_removed(self, callback) -> None:
        """For the features: callback(orig_node) when an originator leaves the table."""
        self._orig_removed.append(callback)

    def on_purge(self, callback) -> None:
        """For the features: callback(now) at the end of each originator worker run."""
        self._after_purge.append(callback)

    def tell_originator_removed(self, orig_node: OrigNode) -> None:
        for callback in self._orig_removed:
            callback(orig_node)

    def tell_purged(self, now: float) -> None:
        for callback in self._after_purge:
            callback(now)

    def set_host_groups(self, now: float, groups) -> list:
        """What multicast bat0's hosts listen to (multicast.HostGroups), every 500 ms."""
        self.multicast.update(now, groups)
        return self._take()

    def set_mtu(self, name: str, mtu: int) -> None:
        """The interface's MTU changed: fragment to the new size from now on."""
        self._iface_or_error(name).mtu = mtu

    def status(self) -> dict:
        """What the daemon reports to systemd: interfaces up, originators routed, clients."""
        routed = sum(1 for o in self.originators.nodes.values() if o.router() is not None)
        return {"algo": self.algo.name, "interfaces": len(self.active_ifaces()), "originators": routed,
                "global_clients": len(self.tt.global_)}

    def local_clients_seen(self, seen: dict) -> None:
        """Local clients the data plane saw sending and the mesh sources it delivered that
        BLA watches ({(mac, vid): when}), keeping them alive."""
        self.tt.refresh_local(seen)
        self.bla.sources_seen(seen)

    def set_stations(self, name: str, stations: dict) -> None:
        self._iface_or_error(name).link.stations = stations

    def _iface_or_error(self, name: str) -> HardInterface:
        iface = self.iface(name)
        if iface is None:
            raise ValueError(f"{name} is not part of the mesh")
        return iface

    # --- sequence numbers across restarts ---------------------------------------------------------

    def seqno_state(self) -> dict:
        """What a restarted node needs to continue its sequences (kept by the daemon): the
        algorithm's own, the broadcast and the fragment seqno."""
        return {**self.algo.seqno_state(), "bcast_seqno": self.broadcast.seqno, "frag_seqno": self.frag_seqno}

    def restore_seqnos(self, state: dict, ahead: int) -> None:
        """Continue from a saved seqno_state(), `ahead` seqnos further (what may have been
        sent after it was saved). Per-interface seqnos wait for their interface's MAC."""
        self.algo.restore_seqnos(state, ahead)
        if isinstance(state.get("bcast_seqno"), int):
            self.broadcast.seqno = (state["bcast_seqno"] + ahead + 1000) & 0xFFFFFFFF
        if isinstance(state.get("frag_seqno"), int):
            self.frag_seqno = (state["frag_seqno"] + 100) & 0xFFFF

    # --- what batmanctl shows --------------------------------------------------------------------

    def translate(self, target: Mac) -> Mac | None:
        """batctl translate: the originator a MAC belongs to (an originator itself, the one
        announcing that client, or us), or None."""
        if self.is_my_mac(target) or self.originators.get(target) is not None:
            return Mac(target)
        best = self.tt.owner(target)
        if best is not None:
            return best
        if self.tt.is_my_client(target, 0) and self.primary is not None:
            return self.primary.mac
        return None

    def originator_rows(self, now: float, outif=None) -> list[dict]:
        """batctl o: one row per originator and neighbour (batctl's JSON keys); with `outif`
        (batctl o -i IFACE) the routes for what goes out on that interface."""
        rows = []
        for orig_node in self.originators.nodes.values():
            best = orig_node.router(outif)
            for neigh in orig_node.neighbours.values():
                if neigh.ifinfo_get(outif) is None:
                    continue
                rows.append({"orig_address": str(orig_node.orig), "neigh_address": str(neigh.addr),
                             "hard_ifname": neigh.if_incoming.name, "last_seen_msecs": _msecs(now, orig_node.last_seen),
                             self.algo.metric_key: self.algo.originator_metric(neigh, outif), "best": neigh is best})
        return rows

    def neighbour_rows(self, now: float) -> list[dict]:
        """batctl n: the neighbours heard on each hard interface."""
        rows = []
        for iface in self.ifaces:
            for n in iface.neighbours.values():
                row = {"neigh_address": str(n.addr), "hard_ifname": iface.name,
                       "last_seen_msecs": _msecs(now, n.last_seen)}
                metric = self.algo.neighbour_metric(n)
                if metric is not None:
                    row[self.algo.metric_key] = metric
                rows.append(row)
        return rows

    def interface_rows(self) -> list[dict]:
        return [{"hard_ifname": i.name, "active": i.active, "mac": str(i.mac), "mtu": i.mtu} for i in self.ifaces]

    def iface(self, name: str) -> HardInterface | None:
        return next((i for i in self.ifaces if i.name == name), None)

    def active_ifaces(self) -> list[HardInterface]:
        return list(self.active)

    def is_my_mac(self, mac: bytes) -> bool:
        return mac in self.my_macs

    @property
    def packet_size_max(self) -> int:
        """Largest batman packet we may send (fragmentation lets it exceed the MTU)."""
        mtus = [i.mtu for i in self.active_ifaces()] or [1500]
        if self.config.fragmentation:
            return (min(min(mtus), fragmentation.MAX_FRAG_SIZE) - fragmentation.HEADER) * fragmentation.MAX_FRAGMENTS
        return min(mtus)

    # --- actions --------------------------------------------------------------------------------

    def transmit(self, iface: HardInterface, frame: bytes, *, mgmt: bool = False) -> None:
        if mgmt:
            self.counters.add("mgmt_tx", len(frame))
        self._actions.append(Transmit(iface.name, frame))

    def deliver(self, now: float, inner: InnerFrame, orig_node: OrigNode | None = None, packet=None) -> None:
        """batadv_interface_rx: hand a frame from the mesh to the host; `orig_node` (broadcasts,
        4addr DATA) learns the sender as a temporary client; `packet` carried it (the features'
        rx hooks see it). Batman-in-batman is dropped, as the kernel does, to prevent loops (a
        bat0 bridged into another mesh's hard interface)."""
        if inner.h_proto == ETH_P_BATMAN:  # InnerFrame.h_proto is the ethertype behind one 802.1Q tag
            self.counters.drop("batman_in_batman")
            return
        vid = inner_vid(inner)
        if self.hooks.host_rx(now, inner, vid, packet):
            return  # a feature took it (the distributed ARP table answered it, ...)
        frame = inner.encode()
        self.counters.add("rx", len(frame))
        if self.hooks.host_rx(now, inner, vid, packet, counted=True):
            return  # received, but not for the host (BLA: another gateway's client)
        if orig_node is not None and not inner.h_source.is_multicast and not is_loopdetect_mac(inner.h_source):
            self.tt.add_temporary(now, orig_node, inner.h_source, vid)
        self._actions.append(Deliver(frame))

    def emit(self, action) -> None:
        self._actions.append(action)

    def _take(self) -> list:
        update = self.publisher.take()
        if update is not None:
            self._actions.append(update)
        actions, self._actions = self._actions, []
        return actions

    # --- entry points ---------------------------------------------------------------------------

    def receive(self, now: float, iface_name: str, data: bytes) -> list:
        """A frame arrived on a hard interface."""
        self.receive_frame(now, iface_name, data)
        return self._take()

    def receive_many(self, now: float, iface_name: str, frames) -> list:
        """Frames that arrived together on one hard interface: their actions in order, the
        forwarding table's changes published once after them."""
        for data in frames:
            self.receive_frame(now, iface_name, data)
        return self._take()

    def receive_frame(self, now: float, iface_name: str, data: bytes) -> None:
        """receive() without collecting the actions (also for reassembled packets)."""
        iface = self.iface(iface_name)
        if iface is None or not iface.active:
            self.counters.drop("inactive_interface")
            return
        parse = self.parsers.get(data[ETH_HLEN]) if len(data) > ETH_HLEN else None
        try:
            if parse is not None:  # read in place: a list of the packets, as their handler takes them
                frame = parse(data)
                ptype, count = data[ETH_HLEN], len(frame)
            else:
                frame = decode_frame(data)
                ptype, count = frame.packet.packet_type, len(frame.packets)
        except WireError:
            self.counters.drop("malformed")
            return
        self.counters["rx_" + PACKET_TYPE_NAMES.get(ptype, "unknown_unicast")] += count
        handler = self.receivers.get(ptype)
        if handler is None:
            self.counters.drop("unhandled_packet_type")
            return
        handler(now, iface, frame, data)

    def _register_receivers(self) -> None:
        """batadv_recv_handler_init: one handler per packet type. Unicast-class types we do
        not know are still routed on; the announcements of the routing algorithms that do
        not run here are dropped (IV and V do not mix)."""
        for ptype in range(UNICAST_MIN, UNICAST_MAX + 1):
            self.receivers[ptype] = self._receive_unknown_unicast
        for algo in ALGORITHMS.values():
            for ptype in algo.receives:
                self.receivers[ptype] = self._other_algorithm
        for ptype, receive in self.algo.receivers().items():
            self.receivers[ptype] = self._announcement(receive)
        self.parsers.update(getattr(self.algo, "parsers", dict)())

    def register_receiver(self, ptype: int, handler) -> None:
        """A feature's handler for a packet type: handler(now, iface, frame, raw)."""
        self.receivers[ptype] = handler

    def _announcement(self, receive):
        def handle(now: float, iface: HardInterface, frame, data: bytes) -> None:
            if self._check_management(data):
                self.counters.add("mgmt_rx", len(data))
                receive(now, iface, frame, data)
        return handle

    def _other_algorithm(self, now: float, iface: HardInterface, frame, data: bytes) -> None:
        self.counters.drop("other_routing_algorithm")

    def _receive_unknown_unicast(self, now: float, iface: HardInterface, frame, data: bytes) -> None:
        self.routing.receive_unknown_unicast(now, iface, frame)

    def soft_iface_frame(self, now: float, data: bytes) -> list:
        """A frame the host sent into the soft interface (the inline data path)."""
        self.routing.send_from_host(now, data)
        return self._take()

    def tick(self, now: float) -> list:
        self.algo.tick(now)
        self.broadcast.tick(now)
        self.tp.tick(now)
        if now >= self._next_purge:
            self._next_purge = now + self.config.orig_work_period_ms / 1000.0
            self.routes.purge(now)
        if now >= self._next_tt_purge:
            self._next_tt_purge = now + self.config.tt_work_period_ms / 1000.0
            self.tt.purge(now)
        return self._take()

    def next_deadline(self) -> float:
        return min(self.algo.next_deadline(), self.broadcast.next_deadline(), self.tp.next_deadline(),
                   self._next_purge, self._next_tt_purge)

    def ping(self, now: float, dst: Mac, *, seqno: int, uid: int = 0, ttl: int = TTL,
             record_route: bool = False) -> list:
        self.icmp.send_echo(now, Mac(dst), seqno=seqno, uid=uid, ttl=ttl, record_route=record_route)
        return self._take()

    def tp_start(self, now: float, dst: Mac, test_length_ms: int = 0) -> tuple[int, list]:
        """batctl tp: a throughput test toward `dst` (0 ms: the kernel's 10 s); its cookie,
        and the actions. The test ends with a TpResult action carrying that cookie."""
        cookie = self.tp.start(now, Mac(dst), test_length_ms)
        return cookie, self._take()

    def tp_cancel(self, now: float, dst: Mac) -> list:
        """Stop the test toward `dst`; it reports what it measured so far."""
        self.tp.cancel(now, Mac(dst))
        return self._take()

    # --- helpers for the algorithm and the other parts --------------------------------------------

    @staticmethod
    def _check_management(data: bytes) -> bool:
        """batadv_check_management_packet: broadcast destination, a valid unicast source."""
        return data[:6] == BROADCAST and not data[6] & 0x01 and any(data[6:12])

    def ogm_tvlv_room(self) -> int:
        """Bytes the TVLVs of our OGM may take; TT gets what the other containers leave."""
        return OGM_TVLV_ROOM - self.tvlv.fixed_bytes

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
        """The containers of our own (primary) OGM, from the features that contribute one
        (TT, GW, MCAST, DAT)."""
        return self.tvlv.ogm_containers(now, OGM_TVLV_ROOM)

    def ogm_tvlvs_received(self, now: float, orig_node: OrigNode, tvlvs, seqno: int | None = None) -> None:
        """batadv_tvlv_ogm_receive: each container to the feature that handles it (with the
        OGM's seqno, the further copies of one OGM only to the handlers that want each)."""
        self.tvlv.ogm_received(now, orig_node, tvlvs, seqno)

    def send_unicast_tvlv(self, now: float, src: Mac, dst: Mac, tvlvs: list) -> bool:
        orig_node = self.originators.get(dst)
        if orig_node is None:
            return False
        packet = UnicastTvlv(dst=dst, src=src, tvlvs=tvlvs)
        return self.routing.send_to_orig(now, packet.encode(), orig_node, None)

    def route_changed(self, orig_node: OrigNode) -> None:
        """Something the forwarding table publishes about this originator changed (its
        router, or its TT version): publish it with the next actions."""
        self.publisher.dirty_origs.add(orig_node.orig)

    def update_route(self, orig_node: OrigNode, outif, neigh, now: float | None = None) -> None:
        """For the algorithms: `neigh` is now the router toward the originator (routes.py)."""
        self.routes.update(orig_node, outif, neigh, now)
