"""B.A.T.M.A.N. V (the kernel's bat_v.c, bat_v_elp.c, bat_v_ogm.c): ELP neighbour discovery
with a throughput estimate per link, and OGMv2 carrying the path throughput.

ELP: every elp_interval (+-20 ms) per hard interface, a broadcast ELP; on that same tick
every neighbour's link throughput EWMA takes a new estimate (so a dead neighbour's metric
is still refreshed). OGMv2: one per node per orig_interval on every interface that has
neighbours, aggregated per interface (flushed every 50-150 ms). An OGMv2 from a neighbour
is only accepted once its ELP was heard."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from batmand.wire import BROADCAST, ELP_TVLV_PADDING, Elp, Mac, Ogm2, build_frame
from batmand.wire.constants import TTL, PacketType

from .algorithm import algo_state, jittered, register, routed_metric
from .bitarray import seq_diff32, window_protected
from .hardif import HardInterface, HardifNeigh
from .originator import NeighIfInfo, NeighNode, OrigIfInfo, OrigNode

THROUGHPUT_DEFAULT = 10  # 1 Mbit/s, when nothing better is known
THROUGHPUT_MAX = 0xFFFFFFFF
ELP_MAX_AGE = 64
OGM_MAX_AGE = 64
OGM_MAX_ORIGDIFF = 5
MAX_AGGREGATION_BYTES = 512
ELP_PROBES_PER_NODE = 2
ELP_MIN_PROBE_SIZE = 200
ELP_PROBE_MAX_TX_DIFF = 0.1


@dataclass(eq=False)
class AggregationQueue:
    """OGMv2 packets waiting on one interface (batadv_v_ogm_queue_on_if)."""

    packets: list[bytes] = field(default_factory=list)
    size: int = 0
    flush_at: float = float("inf")


# --- B.A.T.M.A.N. V's own state on the shared records (the kernel's bat_v sub-structs) ------


@dataclass(eq=False)
class VIface:
    """hard_iface->bat_v: the ELP seqno and timer, the OGMv2 aggregation queue."""

    elp_seqno: int
    enabled: bool = False  # sends ELP and OGMv2 (not while down)
    next_elp: float = float("inf")
    queue: AggregationQueue = field(default_factory=AggregationQueue)
    default_throughput_warned: bool = False


@dataclass(eq=False)
class VHardifNeigh:
    """hardif_neigh->bat_v: the neighbour's last ELP and the link throughput estimate (an
    EWMA, 100 kbit/s units)."""

    elp_latest_seqno: int = 0
    elp_interval: int = 0
    throughput_internal: int = 0  # linux/average.h EWMA, 10 fractional bits
    last_unicast_tx: float = float("-inf")

    def throughput_add(self, value: int) -> None:
        """ewma_throughput_add: weight 1/8, 10 fractional bits (DECLARE_EWMA(throughput, 10, 8))."""
        internal = self.throughput_internal
        self.throughput_internal = ((internal << 3) - internal + (value << 10)) >> 3 if internal else value << 10

    @property
    def throughput(self) -> int:
        return self.throughput_internal >> 10


@dataclass(eq=False, slots=True)
class VNeighIfInfo(NeighIfInfo):
    """neigh_ifinfo with bat_v's fields: the path throughput through this neighbour
    (100 kbit/s) and the seqno of its last OGMv2."""

    throughput: int = 0
    last_seqno: int = 0


@dataclass(eq=False, slots=True)
class VOrigIfInfo(OrigIfInfo):
    """orig_ifinfo with bat_v's field: the last seqno forwarded on this interface."""

    last_seqno_forwarded: int | None = None


def hardif_neigh_v(neigh: HardifNeigh) -> VHardifNeigh:
    return algo_state(neigh, VHardifNeigh)


def _throughput(info: VNeighIfInfo | None) -> int:
    return info.throughput if info is not None else 0


def estimate_throughput(iface: HardInterface, neigh_addr: Mac, log=None) -> int:
    """batadv_v_elp_get_throughput (100 kbit/s units): the override, else Wi-Fi station
    data, else the Ethernet link speed, else the 1 Mbit/s default (with a warning once)."""
    if iface.settings.throughput_override:
        return iface.settings.throughput_override // 100  # kbit/s in the settings
    link = iface.link
    if iface.wifi:
        station = link.stations.get(neigh_addr)
        if station is None and link.stations:
            return 0  # not associated any more
        if station is not None:
            if station.expected_throughput_kbps is not None:
                return station.expected_throughput_kbps // 100
            if station.tx_bitrate_100kbps is not None:
                return station.tx_bitrate_100kbps // 3
    elif link.speed_mbit:
        return link.speed_mbit * 10
    state = iface.algo
    if log is not None and not (state is not None and state.default_throughput_warned):
        log(f"WiFi driver or ethtool info does not provide information about link speeds on interface "
            f"{iface.name}, therefore defaulting to hardcoded throughput values of 1.0 Mbps. Consider "
            f"overriding the throughput manually or checking your driver.")
    if state is not None:
        state.default_throughput_warned = True
    return THROUGHPUT_DEFAULT


def forward_penalty(throughput: int, if_incoming: HardInterface, outif, hop_penalty: int) -> int:
    """batadv_v_forward_penalty: per-interface penalty always; on the default table nothing
    more; halved when forwarded on the same half-duplex interface; else the hop penalty.
    (u32 arithmetic as in the kernel.)"""
    throughput = ((throughput * (255 - if_incoming.settings.hop_penalty)) & 0xFFFFFFFF) // 255
    if outif is None:
        return throughput
    if throughput > 10 and if_incoming is outif and not if_incoming.link.full_duplex:
        return throughput // 2
    return ((throughput * (255 - hop_penalty)) & 0xFFFFFFFF) // 255


@register
class BatmanV:
    name = "BATMAN_V"
    receives = (PacketType.ELP, PacketType.OGM2)
    metric_key = "throughput"
    estimates_links = True
    neigh_ifinfo = VNeighIfInfo
    orig_ifinfo = VOrigIfInfo

    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.ogm_seqno = mesh.rng.getrandbits(32)
        self.next_ogm = float("inf")
        self._saved_elp: dict[str, int] = {}  # interface MAC -> ELP seqno to continue from

    def receivers(self) -> dict:
        return {PacketType.ELP: self.receive_elp, PacketType.OGM2: self.receive}

    def _enabled(self) -> list[HardInterface]:
        return [i for i in self.mesh.ifaces if i.algo is not None and i.algo.enabled]

    # --- metric ---------------------------------------------------------------------------------

    @staticmethod
    def metric(neigh: NeighNode, outif=None) -> int:
        return _throughput(neigh.ifinfo_get(outif))

    @staticmethod
    def originator_metric(neigh: NeighNode, outif=None) -> int:
        return _throughput(neigh.ifinfo_get(outif)) * 100  # kbit/s, as the kernel reports it

    @staticmethod
    def neighbour_metric(hardif_neigh: HardifNeigh) -> int:
        return hardif_neigh_v(hardif_neigh).throughput * 100  # kbit/s

    # --- sequence numbers across restarts -------------------------------------------------------

    def seqno_state(self) -> dict:
        return {"ogm2_seqno": self.ogm_seqno,
                "elp_seqno": {str(i.mac): i.algo.elp_seqno for i in self.mesh.ifaces if i.algo is not None}}

    def restore_seqnos(self, state: dict, ahead: int) -> None:
        """The node-wide OGMv2 seqno at once; ELP seqnos per interface MAC, taken by the
        interface when it is enabled (once). ELPs go out twice as often as OGMs."""
        if isinstance(state.get("ogm2_seqno"), int):
            self.ogm_seqno = (state["ogm2_seqno"] + ahead) & 0xFFFFFFFF
        for mac, seqno in (state.get("elp_seqno") or {}).items():
            self._saved_elp[mac] = (seqno + 2 * ahead) & 0xFFFFFFFF

    # --- gateway selection (the kernel's algo_ops.gw for V) ------------------------------------

    gw_sel_class_default = 50  # switch to a gateway 5 Mbit/s better
    gw_sel_class_max = THROUGHPUT_MAX

    def gw_metric(self, orig_node: OrigNode) -> int | None:
        """The path throughput toward a gateway's originator (100 kbit/s), None without a route."""
        return routed_metric(self, orig_node)

    def _gw_throughput(self, gw) -> int | None:
        """batadv_v_gw_throughput_get: what a client can expect through this gateway, the
        smaller of the path throughput and its announced download bandwidth."""
        path = self.gw_metric(gw.orig_node)
        return None if path is None else min(path, gw.bandwidth_down)

    def gw_best(self, gateways: list, sel_class: int):
        """batadv_v_gw_get_best_gw_node: the most throughput; the first of equals wins."""
        best, max_bw = None, 0
        for gw in gateways:
            bw = self._gw_throughput(gw)
            if bw is None or (best is not None and bw <= max_bw):
                continue
            best, max_bw = gw, bw
        return best

    def gw_is_eligible(self, current, candidate, sel_class: int) -> bool:
        """batadv_v_gw_is_eligible: switch when the candidate gives at least sel_class
        (100 kbit/s) more than the current gateway, or the current one has no route or has
        left the gateway list."""
        current_bw = self._gw_throughput(current) if current is not None and current.listed else None
        if current_bw is None:
            return True
        candidate_bw = self._gw_throughput(candidate)
        return candidate_bw is not None and candidate_bw - current_bw >= sel_class

    # --- evidence that an entry is real (which entries a full table keeps) ---------------------

    @staticmethod
    def orig_has_evidence(orig_node: OrigNode) -> bool:
        """We have a route to it. V has no echo: an ELP proves nothing about the way back
        and our throughput estimate exists for any MAC that sent one, so an ELP flood from
        spoofed MACs stays evictable; an OGMv2 only counts once it has made a route."""
        return any(info.router is not None for info in orig_node.ifinfo_values())

    def neigh_has_evidence(self, iface: HardInterface, neigh: HardifNeigh) -> bool:
        """A route to the originator it announced goes through it on this interface (an ELP
        claiming a real originator from a spoofed MAC does not count)."""
        orig_node = self.mesh.originators.get(neigh.orig)
        if orig_node is None:
            return False
        return any(info.router is not None and info.router.addr == neigh.addr and info.router.if_incoming is iface
                   for info in orig_node.ifinfo_values())

    # --- interfaces -----------------------------------------------------------------------------

    def iface_enabled(self, now: float, iface: HardInterface) -> None:
        if iface.algo is None:
            saved = self._saved_elp.pop(str(iface.mac), None)
            iface.algo = VIface(saved if saved is not None else self.mesh.rng.getrandbits(32))
        iface.algo.enabled = True
        iface.algo.next_elp = jittered(self.mesh, now, iface.settings.elp_interval)
        iface.algo.queue = AggregationQueue()
        if self.next_ogm == float("inf"):
            self.next_ogm = jittered(self.mesh, now, self.mesh.config.orig_interval_ms)

    def iface_disabled(self, iface: HardInterface) -> None:
        if iface.algo is not None:
            iface.algo.enabled = False
            iface.algo.next_elp = float("inf")
            iface.algo.queue = AggregationQueue()

    def iface_deactivated(self, iface: HardInterface) -> None:
        self.iface_disabled(iface)  # batadv_v_iface_activate starts it afresh

    def next_deadline(self) -> float:
        times = [self.next_ogm]
        for iface in self._enabled():
            times += (iface.algo.next_elp, iface.algo.queue.flush_at)
        return min(times)

    def tick(self, now: float) -> None:
        for iface in self._enabled():
            if iface.algo.next_elp <= now:
                self._send_elp(now, iface)
        if self.next_ogm <= now:
            self._send_own_ogm(now)
        for iface in self._enabled():
            if iface.algo.queue.flush_at <= now:
                self._flush(iface, iface.algo.queue)

    # --- ELP ------------------------------------------------------------------------------------

    def _send_elp(self, now: float, iface: HardInterface) -> None:
        """batadv_v_elp_periodic_work."""
        mesh, state = self.mesh, iface.algo
        state.next_elp = jittered(self.mesh, now, iface.settings.elp_interval)
        if not iface.active or mesh.primary is None:
            return
        elp = Elp(orig=mesh.primary.mac, seqno=state.elp_seqno, elp_interval=iface.settings.elp_interval)
        mesh.transmit(iface, build_frame(BROADCAST, iface.mac, elp, padding=ELP_TVLV_PADDING), mgmt=True)
        state.elp_seqno = (state.elp_seqno + 1) & 0xFFFFFFFF
        for neigh in iface.neighbours.values():
            if iface.wifi and now - hardif_neigh_v(neigh).last_unicast_tx > ELP_PROBE_MAX_TX_DIFF:
                self._probe(now, iface, neigh, elp)
        self.own_elp_sent(iface)

    def own_elp_sent(self, iface: HardInterface) -> None:
        """After each own ELP: every neighbour's link estimate takes a new sample (also
        used when replaying a kernel node's capture, whose ELPs are in the capture)."""
        for neigh in iface.neighbours.values():
            hardif_neigh_v(neigh).throughput_add(estimate_throughput(iface, neigh.addr, self.mesh.log))

    def silence(self) -> None:
        """Send nothing of our own (replaying a capture of another node)."""
        self.next_ogm = float("inf")
        for iface in self.mesh.ifaces:
            if iface.algo is not None:
                iface.algo.next_elp = float("inf")

    def _probe(self, now: float, iface: HardInterface, neigh: HardifNeigh, elp: Elp) -> None:
        """Unicast ELP copies padded to 200 bytes so the Wi-Fi rate control samples the link."""
        raw = build_frame(neigh.addr, iface.mac, elp, padding=ELP_TVLV_PADDING)
        raw += bytes(max(0, ELP_MIN_PROBE_SIZE - (len(raw) - 14)))
        for _ in range(ELP_PROBES_PER_NODE):
            self.mesh.transmit(iface, raw)
        hardif_neigh_v(neigh).last_unicast_tx = now

    def receive_elp(self, now: float, iface: HardInterface, frame, data: bytes = b"") -> None:
        """batadv_v_elp_packet_recv / batadv_v_elp_neigh_update."""
        mesh = self.mesh
        eth, elp = frame.ethernet, frame.packet
        if mesh.is_my_mac(eth.h_source) or mesh.primary is None:
            return
        orig_neigh = mesh.originators.get_or_create(elp.orig, now)
        if orig_neigh is None:
            return
        neigh = mesh.originators.neigh_get_or_create(orig_neigh, iface, eth.h_source, orig_neigh, now)
        if neigh is None:
            return
        hardif_neigh = iface.neighbours.get(eth.h_source)
        if hardif_neigh is None:
            return
        state = hardif_neigh_v(hardif_neigh)
        diff = seq_diff32(elp.seqno, state.elp_latest_seqno)
        if -ELP_MAX_AGE < diff < 1:
            return  # known or older (but a restarted neighbour is adopted)
        neigh.last_seen = now
        hardif_neigh.last_seen = now
        state.elp_latest_seqno = elp.seqno
        state.elp_interval = elp.elp_interval

    # --- own OGMv2 --------------------------------------------------------------------------------

    def _send_own_ogm(self, now: float) -> None:
        """batadv_v_ogm_send_meshif: commit TT, stamp the node-wide seqno, queue everywhere."""
        mesh = self.mesh
        self.next_ogm = jittered(self.mesh, now, mesh.config.orig_interval_ms)
        if mesh.primary is None:
            return
        ogm = Ogm2(ttl=TTL, seqno=self.ogm_seqno, orig=mesh.primary.mac, throughput=THROUGHPUT_MAX,
                   tvlvs=mesh.ogm_tvlvs(now))
        self.ogm_seqno = (self.ogm_seqno + 1) & 0xFFFFFFFF
        raw = ogm.encode()
        for iface in mesh.active_ifaces():
            if iface.no_broadcast(None, None):
                continue
            self._queue(now, iface, raw)

    def _queue(self, now: float, iface: HardInterface, raw: bytes) -> None:
        if iface.algo is None or not iface.algo.enabled:
            return  # not enabled (or down)
        queue = iface.algo.queue
        if not self.mesh.config.aggregation:
            self.mesh.transmit(iface, build_frame(BROADCAST, iface.mac) + raw, mgmt=True)
            return
        if queue.size + len(raw) > min(MAX_AGGREGATION_BYTES, iface.mtu):
            self._flush(iface, queue)
        queue.packets.append(raw)
        queue.size += len(raw)
        if queue.flush_at == float("inf"):  # 0.5 to 1.5 times the aggregation interval
            queue.flush_at = now + (50 + self.mesh.rng.randrange(100)) / 1000.0

    def _flush(self, iface: HardInterface, queue: AggregationQueue) -> None:
        if queue.packets and iface.active:
            self.mesh.transmit(iface, build_frame(BROADCAST, iface.mac) + b"".join(queue.packets), mgmt=True)
        queue.packets.clear()
        queue.size = 0
        queue.flush_at = float("inf")

    # --- OGMv2 reception ----------------------------------------------------------------------------

    def receive(self, now: float, iface: HardInterface, frame, data: bytes) -> None:
        """batadv_v_ogm_packet_recv: each element within the kernel's 512-byte walk."""
        mesh = self.mesh
        if mesh.is_my_mac(frame.ethernet.h_source) or mesh.is_my_mac(frame.packet.orig):
            return
        offset = 0
        for ogm, size in zip(frame.packets, frame.sizes):
            offset += size
            if offset > MAX_AGGREGATION_BYTES:
                mesh.counters.drop("ogm_beyond_aggregation_limit")
                break
            self._process(now, iface, frame.ethernet.h_source, ogm)

    def _process(self, now: float, if_incoming: HardInterface, eth_src: Mac, ogm: Ogm2) -> None:
        """batadv_v_ogm_process."""
        mesh = self.mesh
        if ogm.packet_type != 0x04 or ogm.throughput == 0:
            return
        hardif_neigh = if_incoming.neighbours.get(eth_src)
        if hardif_neigh is None:
            mesh.counters.drop("ogm2_before_elp")
            return
        orig_node = mesh.originators.get_or_create(ogm.orig, now)
        if orig_node is None:
            return
        neigh = mesh.originators.neigh_get_or_create(orig_node, if_incoming, eth_src, orig_node, now)
        if neigh is None:
            return
        path = min(hardif_neigh_v(hardif_neigh).throughput, ogm.throughput)
        self._per_outif(now, if_incoming, eth_src, ogm, path, orig_node, neigh, None)
        for out in mesh.active_ifaces():
            if out.no_broadcast(ogm.orig, hardif_neigh.orig):
                continue
            self._per_outif(now, if_incoming, eth_src, ogm, path, orig_node, neigh, out)

    def _per_outif(self, now: float, if_incoming: HardInterface, eth_src: Mac, ogm: Ogm2, path: int,
                   orig_node: OrigNode, neigh: NeighNode, outif) -> None:
        age = self._metric_update(now, ogm, path, orig_node, neigh, if_incoming, outif)
        if age < 0:
            return
        if age > 0 and outif is None:
            self.mesh.ogm_tvlvs_received(now, orig_node, ogm.tvlvs)
        if self._route_update(now, eth_src, orig_node, neigh, outif):
            self._forward(now, ogm, orig_node, neigh, outif)

    def _metric_update(self, now: float, ogm: Ogm2, path: int, orig_node: OrigNode, neigh: NeighNode,
                       if_incoming: HardInterface, outif) -> int:
        """batadv_v_ogm_metric_update: 1 new seqno, 0 same, -1 old (dropped)."""
        info = orig_node.ifinfo_new(outif, VOrigIfInfo)
        diff = seq_diff32(ogm.seqno, info.last_real_seqno)
        started = False
        if orig_node.neighbours:
            drop, info.seqno_reset, started = window_protected(diff, now, info.seqno_reset,
                                                               self.mesh.config.reset_protection_ms / 1000.0)
            if drop:
                self.mesh.counters.drop("ogm_seqno_protected")
                return -1
        if diff < 0 and not started:
            return -1
        neigh.last_seen = now
        orig_node.last_seen = now
        info.last_real_seqno = ogm.seqno
        info.last_ttl = ogm.ttl
        ninfo = neigh.ifinfo_new(outif, VNeighIfInfo)
        ninfo.throughput = forward_penalty(path, if_incoming, outif, self.mesh.config.hop_penalty)
        ninfo.last_seqno = ogm.seqno
        return 1 if diff > 0 or started else 0

    def _route_update(self, now: float, eth_src: Mac, orig_node: OrigNode, neigh: NeighNode, outif) -> bool:
        """batadv_v_ogm_route_update: keep the router unless the new neighbour is better or
        the router is OGM_MAX_ORIGDIFF seqnos behind. True: consider forwarding."""
        mesh = self.mesh
        orig_neigh = mesh.originators.get_or_create(eth_src, now)
        if orig_neigh is None:
            return False
        router = orig_node.router(outif)
        if router is not None and router.orig_node is not orig_node and orig_neigh.router(outif) is None:
            return False  # OGM via unknown neighbour
        if router is neigh:
            return True
        if router is not None:
            rinfo, ninfo = router.ifinfo_get(outif), neigh.ifinfo_get(outif)
            if rinfo is None or ninfo is None:
                return True
            if seq_diff32(ninfo.last_seqno, rinfo.last_seqno) < OGM_MAX_ORIGDIFF and \
                    rinfo.throughput >= ninfo.throughput:
                return True
        mesh.update_route(orig_node, outif, neigh, now)
        return True

    def _forward(self, now: float, ogm: Ogm2, orig_node: OrigNode, neigh: NeighNode, outif) -> None:
        """batadv_v_ogm_forward: only from the best next hop, once per seqno and interface."""
        if outif is None:
            return
        info = orig_node.ifinfo_new(outif, VOrigIfInfo)
        if orig_node.router(outif) is not neigh or info.last_seqno_forwarded == ogm.seqno:
            return
        info.last_seqno_forwarded = ogm.seqno
        if ogm.ttl <= 1:
            return
        ninfo = neigh.ifinfo_get(outif)
        if ninfo is None:
            return
        forwarded = dataclasses.replace(ogm, ttl=ogm.ttl - 1, throughput=ninfo.throughput)
        self._queue(now, outif, forwarded.encode())
