"""B.A.T.M.A.N. IV (the kernel's bat_iv_ogm.c): own OGMs, the receive pipeline with the
bidirectional link check, route ranking, forwarding and OGM aggregation.

State that belongs to originators lives in originator.py; the mesh (mesh.py) provides the
hard interfaces, the TVLVs, route updates and transmission."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import BROADCAST, ETH_P_BATMAN, IvOgm, OgmFlags
from batmand.wire.constants import TTL, PacketType
from batmand.wire.ogm_walk import FLAGS_OFFSET, TTL_OFFSET, IvOgmFields, TvlvCache, patched, walk_iv_ogms, with_flags

from .algorithm import jittered, register, routed_metric
from .bitarray import EXPECTED_SEQNO_RANGE, WINDOW_SIZE, bit_get_packet, seq_diff32, window_protected
from .hardif import HardInterface
from .originator import NeighIfInfo, NeighNode, OrigIfInfo, OrigNode

TQ_MAX = 255
MAX_AGGREGATION_BYTES = 512
MAX_AGGREGATION_PACKETS = 32
MAX_AGGREGATION_MS = 100
BIDIRECT_SEND_MINIMUM = 1
BIDIRECT_RECV_MINIMUM = 1
TOTAL_BIDIRECT_LIMIT = 1

TQ_GLOBAL_WINDOW_SIZE = 5

NO_DUP, ORIG_DUP, NEIGH_DUP, PROTECTED = range(4)
# the flags as plain ints: IntFlag arithmetic costs a Python call per OGM
_DIRECTLINK, _NOT_BEST_NEXT_HOP = int(OgmFlags.DIRECTLINK), int(OgmFlags.NOT_BEST_NEXT_HOP)
_WINDOW_CUBE = WINDOW_SIZE ** 3
_TQ_MAX_CUBE = TQ_MAX ** 3
_WINDOW_MASK = (1 << WINDOW_SIZE) - 1
_ETH_P_BATMAN_BYTES = ETH_P_BATMAN.to_bytes(2, "big")


# --- B.A.T.M.A.N. IV's own state on the shared records (the kernel's bat_iv sub-structs) -----


@dataclass(eq=False, slots=True)
class IvIface:
    """hard_iface->bat_iv: the next own OGM seqno (always "last scheduled + 1")."""

    ogm_seqno: int


# the TQ ring's int: TQ i in bits 8i..8i+7, above them the count of its non-zero TQs, the
# next index and the sum of the TQs (57 bits: one int object per record, and no more slots)
_TQ_COUNT_SHIFT = 8 * TQ_GLOBAL_WINDOW_SIZE
_TQ_INDEX_SHIFT = _TQ_COUNT_SHIFT + 3
_TQ_SUM_SHIFT = _TQ_INDEX_SHIFT + 3
# per ring index: what a change of its TQ by 1 adds (to the TQ and to the sum), and the move
# to the next index (push_tq: tables, as it runs a few times per OGM and pass)
_TQ_VALUE_STEP = tuple((1 << 8 * i) + (1 << _TQ_SUM_SHIFT) for i in range(TQ_GLOBAL_WINDOW_SIZE))
_TQ_INDEX_STEP = tuple((1 if i < TQ_GLOBAL_WINDOW_SIZE - 1 else 1 - TQ_GLOBAL_WINDOW_SIZE) << _TQ_INDEX_SHIFT
                       for i in range(TQ_GLOBAL_WINDOW_SIZE))


@dataclass(eq=False, slots=True)
class IvNeighIfInfo(NeighIfInfo):
    """neigh_ifinfo with bat_iv's fields: the window of the originator's OGMs received
    through this neighbour, and its TQ ring with the sum and count of its non-zero values,
    kept as it turns. There is one per neighbour, originator and outgoing interface: few
    slots, few int objects.

    The kernel slides every neighbour's window when a newer seqno arrives. Every window
    slides alike, so here a window is kept as it was at `window_pos` (the originator
    table's window position then) and slid when it is next read (`_synced`)."""

    real_bits: int = 0
    window_pos: int = 0
    tq_ring: int = 0  # the ring, its count, index and sum (_TQ_*_SHIFT)

    @property
    def tq_recv(self) -> list[int]:
        return [self.tq_ring >> 8 * i & 0xFF for i in range(TQ_GLOBAL_WINDOW_SIZE)]

    @property
    def tq_index(self) -> int:
        return self.tq_ring >> _TQ_INDEX_SHIFT & 7

    @property
    def tq_avg(self) -> int:
        """batadv_ring_buffer_avg: the mean of the non-zero TQs."""
        ring = self.tq_ring
        count = ring >> _TQ_COUNT_SHIFT & 7
        return (ring >> _TQ_SUM_SHIFT) // count if count else 0

    def push_tq(self, value: int) -> None:
        """batadv_ring_buffer_set (the average is read from the sum and count)."""
        ring = self.tq_ring
        index = ring >> _TQ_INDEX_SHIFT & 7
        old = ring >> 8 * index & 0xFF
        # each field changes by its difference (none borrows from or carries into the
        # next): the TQ and the sum by value - old, the count by the change in non-zero
        self.tq_ring = (ring + (value - old) * _TQ_VALUE_STEP[index]
                        + ((value > 0) - (old > 0) << _TQ_COUNT_SHIFT) + _TQ_INDEX_STEP[index])


@dataclass(eq=False, slots=True)
class IvOrigIfInfo(OrigIfInfo):
    """orig_ifinfo with bat_iv's fields: which of our last 64 OGMs on this interface the
    originator echoed back; and for this outgoing table, how far its neighbours' receive
    windows have slid in all (`window_pos`: +diff for a newer seqno, +64 when they start
    over) and the union of those windows (what any neighbour sent), valid for the
    neighbour set it was made from."""

    bcast_own: int = 0
    window_pos: int = 0
    union: int = 0
    union_generation: int = -1  # the originator's neighbour generation it is of

    @property
    def bcast_own_sum(self) -> int:
        return self.bcast_own.bit_count()


def _synced(ninfo: IvNeighIfInfo, pos: int) -> int:
    """The neighbour's window slid to the originator table's position `pos` (kept so)."""
    shift = pos - ninfo.window_pos
    if shift:  # (< 0: a record from before its table was made anew; nothing of it is current)
        ninfo.real_bits = ninfo.real_bits << shift & _WINDOW_MASK if 0 < shift < WINDOW_SIZE else 0
        ninfo.window_pos = pos
    return ninfo.real_bits


def receive_window(orig_node: OrigNode, neigh: NeighNode, outif) -> int:
    """Which of the originator's last 64 OGMs (bit k: its last seqno - k) arrived through
    `neigh`, for the table of `outif` (0: none known). Only reads."""
    info, ninfo = orig_node.ifinfo_get(outif), neigh.ifinfo_get(outif)
    if ninfo is None:
        return 0
    shift = (info.window_pos if info is not None else 0) - ninfo.window_pos
    return ninfo.real_bits << shift & _WINDOW_MASK if 0 <= shift < WINDOW_SIZE else 0


# The hot path reads a record as (x.if_default if outif is None else x.if_info if outif is
# x.if_key else x.ifinfo_get(outif)): PerOutif.ifinfo_get inlined for the default table and
# the one interface, as it is asked some twenty times per OGM.


def _tq(info: IvNeighIfInfo | None) -> int:
    """tq_avg, 0 without a record (inline: it is asked per OGM)."""
    if info is None:
        return 0
    ring = info.tq_ring
    count = ring >> _TQ_COUNT_SHIFT & 7
    return (ring >> _TQ_SUM_SHIFT) // count if count else 0


def _echoes(info: IvOrigIfInfo | None) -> int:
    """The echo bits of our OGMs (0: none, or nothing known)."""
    return info.bcast_own if info is not None else 0


def _echo_count(info: IvOrigIfInfo | None) -> int:
    """How many of our last 64 OGMs were echoed."""
    return info.bcast_own.bit_count() if info is not None else 0


@dataclass(eq=False)
class ForwPacket:
    """An OGM aggregate waiting for its send time on one outgoing interface: each OGM as
    the bytes it will be sent as (DIRECTLINK aside, which depends on the interface)."""

    send_time: float
    if_incoming: HardInterface
    if_outgoing: HardInterface
    own: bool
    ogms: list[bytes] = field(default_factory=list)
    direct_link: list[bool] = field(default_factory=list)
    size: int = 0


def hop_penalty(tq: int, penalty: int) -> int:
    return tq * (TQ_MAX - penalty) // TQ_MAX


@register
class BatmanIV:
    name = "BATMAN_IV"
    receives = (PacketType.IV_OGM,)
    metric_key = "tq"
    estimates_links = False
    neigh_ifinfo = IvNeighIfInfo
    orig_ifinfo = IvOrigIfInfo

    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.queue: list[ForwPacket] = []  # changed through _set_queue and _queue_add only
        self._earliest = float("inf")  # the queue's first send time
        self._forwarding = 0  # how many of its aggregates are not our own
        self.silent = False
        self._saved_seqnos: dict[str, int] = {}  # interface MAC -> OGM seqno to continue from
        self.tvlv_cache = TvlvCache()  # originators repeat their containers every second

    def receivers(self) -> dict:
        return {PacketType.IV_OGM: self.receive}

    def parsers(self) -> dict:
        """OGM aggregates are read in place (wire.ogm_walk), not through decode_frame."""
        return {PacketType.IV_OGM: self.parse}

    def parse(self, data) -> list[IvOgmFields]:
        return walk_iv_ogms(data, self.tvlv_cache)

    # --- metric used by the generic parts (purge, TT best originator, gateways) -----------

    @staticmethod
    def metric(neigh: NeighNode, outif=None) -> int:
        return _tq(neigh.ifinfo_get(outif))

    @staticmethod
    def originator_metric(neigh: NeighNode, outif=None) -> int:
        return _tq(neigh.ifinfo_get(outif))

    @staticmethod
    def neighbour_metric(hardif_neigh) -> None:
        return None  # IV's neighbour listing has no metric

    # --- gateway selection (the kernel's algo_ops.gw for IV) ---------------------------------

    gw_sel_class_default = 20  # switch to a gateway 20 TQ points better (late switch)
    gw_sel_class_max = TQ_MAX

    def gw_metric(self, orig_node: OrigNode) -> int | None:
        """The TQ toward a gateway's originator, None without a route (gwl leaves it out)."""
        return routed_metric(self, orig_node)

    def gw_best(self, gateways: list, sel_class: int):
        """batadv_iv_gw_get_best_gw_node: class 1 maximises tq² · bandwidth down (ties to
        the better TQ), the others take the best TQ; the first of equals wins."""
        best, max_tq, max_factor = None, 0, 0
        for gw in gateways:
            tq = self.gw_metric(gw.orig_node)
            if tq is None:
                continue
            factor = 0
            if sel_class == 1:
                factor = (tq * tq * gw.bandwidth_down * 100 * 100) >> 18
                if factor > max_factor or (factor == max_factor and tq > max_tq):
                    best = gw
            elif tq > max_tq:
                best = gw
            max_tq, max_factor = max(max_tq, tq), max(max_factor, factor)
        return best

    def gw_is_eligible(self, current, candidate, sel_class: int) -> bool:
        """batadv_iv_gw_is_eligible: whether `candidate` (a gateway that just announced
        itself) should make us choose again. Classes 1 and 2 never switch on their own; 3
        switches to any gateway as good; from 4 on it must be sel_class TQ points better."""
        if sel_class <= 2:
            return False
        current_tq = self.gw_metric(current.orig_node) if current is not None else None
        if current_tq is None:
            return True
        candidate_tq = self.gw_metric(candidate.orig_node)
        if candidate_tq is None or candidate_tq < current_tq:
            return False
        return not (sel_class > 3 and candidate_tq - current_tq < sel_class)

    # --- evidence that an entry is real (which entries a full table keeps) ------------------

    @staticmethod
    def orig_has_evidence(orig_node: OrigNode) -> bool:
        """It echoes our OGMs (a bidirectional link) or we have a route to it; a spoofed
        originator that never echoes has neither."""
        default = orig_node.if_default
        if default is not None and default.router is not None:
            return True  # (the purge asks this of every originator every second)
        return any(info.bcast_own or info.router is not None for info in orig_node.ifinfo_values())

    def neigh_has_evidence(self, iface: HardInterface, neigh) -> bool:
        """The neighbour echoes our OGMs on this interface."""
        orig_neigh = self.mesh.originators.get(neigh.addr)
        return bool(orig_neigh is not None and _echoes(orig_neigh.ifinfo_get(iface)))

    # --- sequence numbers across restarts ---------------------------------------------------

    def seqno_state(self) -> dict:
        return {"ogm_seqno": {str(i.mac): i.algo.ogm_seqno for i in self.mesh.ifaces if i.algo is not None}}

    def restore_seqnos(self, state: dict, ahead: int) -> None:
        """Per interface MAC, taken by the interface when it is enabled (once)."""
        for mac, seqno in (state.get("ogm_seqno") or {}).items():
            self._saved_seqnos[mac] = (seqno + ahead) & 0xFFFFFFFF

    # --- own OGMs ---------------------------------------------------------------------------

    def iface_enabled(self, now: float, iface: HardInterface) -> None:
        if iface.algo is None:
            saved = self._saved_seqnos.pop(str(iface.mac), None)
            iface.algo = IvIface(saved if saved is not None else self.mesh.rng.getrandbits(32))
        if not any(p.own and p.if_incoming is iface and p.if_outgoing is iface for p in self.queue):
            self.schedule_own(now, iface)  # else: active again, its OGM timer never stopped

    def iface_disabled(self, iface: HardInterface) -> None:
        self._set_queue([p for p in self.queue if p.if_incoming is not iface and p.if_outgoing is not iface])

    def iface_deactivated(self, iface: HardInterface) -> None:
        """Set down: nothing of it or for it is sent, but its OGM timer runs on, as the
        kernel's does (seqnos counting on, each OGM dropped), so that once it is up again
        its next OGM goes out in its old rhythm, not a whole interval later."""
        self._set_queue([p for p in self.queue if (p.if_incoming is not iface and p.if_outgoing is not iface)
                         or (p.own and p.if_incoming is iface and p.if_outgoing is iface)])

    def schedule_own(self, now: float, iface: HardInterface) -> None:
        """batadv_iv_ogm_schedule_buff: consume a seqno, slide the echo windows, queue.
        An interface that is down only keeps its timer going (its OGM is dropped when due,
        and no TT changes are committed into it)."""
        if self.silent or iface not in self.mesh.ifaces:
            return
        primary = self.mesh.primary
        is_primary = iface is primary
        tvlvs = self.mesh.ogm_tvlvs(now) if is_primary and iface.active else []
        ogm = IvOgm(ttl=TTL if is_primary else 2, flags=0, seqno=iface.algo.ogm_seqno, orig=iface.mac,
                    prev_sender=iface.mac, tq=TQ_MAX, tvlvs=tvlvs).encode()
        iface.algo.ogm_seqno = (iface.algo.ogm_seqno + 1) & 0xFFFFFFFF
        self._slide_own_window(iface)
        send_time = jittered(self.mesh, now, self.mesh.config.orig_interval_ms)
        targets = self.mesh.active_ifaces() if is_primary and iface.active else [iface]
        for out in targets:
            self._queue_add(ogm, iface, out, own=True, send_time=send_time)

    def silence(self) -> None:
        """Send no OGMs of our own (replaying a capture of another node)."""
        self.silent = True
        self._set_queue([p for p in self.queue if not p.own])

    def own_ogm_sent(self, iface: HardInterface, seqno: int) -> None:
        """Replaying a capture of a kernel node: it just sent its own OGM `seqno` and has
        scheduled the next one (counter = seqno + 2, echo windows slid once)."""
        iface.algo.ogm_seqno = (seqno + 2) & 0xFFFFFFFF
        self._slide_own_window(iface)

    def _slide_own_window(self, iface: HardInterface) -> None:
        for orig_node in self.mesh.originators.nodes.values():
            info = orig_node.ifinfo_get(iface)
            if info is not None and info.bcast_own:
                info.bcast_own, _ = bit_get_packet(info.bcast_own, 1, False)

    # --- aggregation queue ------------------------------------------------------------------

    def _can_aggregate(self, ttl: int, size: int, send_time: float, direct_link: bool,
                       if_incoming: HardInterface, if_outgoing: HardInterface, packet: ForwPacket) -> bool:
        """batadv_iv_ogm_can_aggregate."""
        if not (send_time < packet.send_time <= send_time + MAX_AGGREGATION_MS / 1000.0):
            return False
        if packet.size + size > min(MAX_AGGREGATION_BYTES, if_outgoing.mtu):
            return False
        if len(packet.ogms) >= MAX_AGGREGATION_PACKETS or packet.if_outgoing is not if_outgoing:
            return False
        primary = self.mesh.primary
        first = packet.ogms[0]
        first_direct = first[FLAGS_OFFSET] & _DIRECTLINK
        # both "global" OGMs (no direct link, TTL > 1), and not an own secondary-iface OGM
        if (not direct_link and not first_direct and first[TTL_OFFSET] != 1
                and (not packet.own or packet.if_incoming is primary)):
            return True
        # a direct-link OGM that only goes out here, joining direct-link / own secondary OGMs
        return (direct_link and ttl == 1 and packet.if_incoming is if_incoming
                and (bool(first_direct) or (packet.own and packet.if_incoming is not primary)))

    def _queue_add(self, ogm: bytes, if_incoming: HardInterface, if_outgoing: HardInterface, *,
                   own: bool, send_time: float) -> None:
        """batadv_iv_ogm_queue_add: join a pending aggregate or start one."""
        direct_link = bool(ogm[FLAGS_OFFSET] & _DIRECTLINK)
        size = len(ogm)
        aggregating = self.mesh.config.aggregation
        if aggregating and not own:
            ttl = ogm[TTL_OFFSET]
            # newest first, as the kernel walks its list (new aggregates go to its head):
            # the newest one is nearly always the one that takes it
            for packet in reversed(self.queue):
                if self._can_aggregate(ttl, size, send_time, direct_link, if_incoming, if_outgoing, packet):
                    packet.ogms.append(ogm)
                    packet.direct_link.append(direct_link)
                    packet.size += size
                    return
        if not own:
            if self._forwarding >= self.mesh.config.max_forward_queue:
                self.mesh.counters.drop("ogm_forward_queue_full")
                return
            if aggregating:  # hold it back so that others can join
                send_time += MAX_AGGREGATION_MS / 1000.0
        self.queue.append(ForwPacket(send_time, if_incoming, if_outgoing, own, [ogm], [direct_link], size))
        self._earliest = min(self._earliest, send_time)
        self._forwarding += not own

    def _set_queue(self, packets: list[ForwPacket]) -> None:
        self.queue = packets
        self._earliest = min((p.send_time for p in packets), default=float("inf"))
        self._forwarding = sum(1 for p in packets if not p.own)

    def next_deadline(self) -> float:
        return self._earliest

    def tick(self, now: float) -> None:
        due = [p for p in self.queue if p.send_time <= now]
        if not due:
            return
        self._set_queue([p for p in self.queue if p.send_time > now])
        for packet in sorted(due, key=lambda p: p.send_time):
            self._emit(now, packet)

    def _emit(self, now: float, packet: ForwPacket) -> None:
        """batadv_iv_ogm_send_to_if: DIRECTLINK survives only on the interface the OGM came in."""
        out = packet.if_outgoing
        if packet.if_incoming.active and out.active and self.mesh.primary is not None:
            parts = [BROADCAST + bytes(out.mac) + _ETH_P_BATMAN_BYTES]
            here = packet.if_incoming is out
            for ogm, direct in zip(packet.ogms, packet.direct_link):
                flags = ogm[FLAGS_OFFSET]
                parts.append(with_flags(ogm, flags | _DIRECTLINK if direct and here
                                        else flags & ~_DIRECTLINK))
            self.mesh.transmit(out, b"".join(parts), mgmt=True)
        if packet.own and packet.if_incoming is packet.if_outgoing:
            self.schedule_own(now, packet.if_incoming)

    # --- receive ----------------------------------------------------------------------------

    def receive(self, now: float, iface: HardInterface, ogms: list[IvOgmFields], data: bytes) -> None:
        """batadv_iv_ogm_receive: every element of the aggregate, within the kernel's walk."""
        offset = 0
        eth_src = bytes(data[6:12])
        for ogm in ogms:
            offset += len(ogm.raw)
            if offset > MAX_AGGREGATION_BYTES:  # the kernel's receive walk stops here
                self.mesh.counters.drop("ogm_beyond_aggregation_limit")
                break
            self._process(now, iface, eth_src, ogm)

    def _process(self, now: float, if_incoming: HardInterface, eth_src: bytes, ogm: IvOgmFields) -> None:
        """batadv_iv_ogm_process."""
        mesh = self.mesh
        mine = mesh.my_macs
        if eth_src in mine:
            mesh.counters.drop("ogm_from_myself")
            return
        if ogm.orig in mine:
            self._count_echo(if_incoming, eth_src, ogm)
            return
        if ogm.prev_sender in mine:
            mesh.counters.drop("ogm_my_rebroadcast")
            return
        if ogm.flags & _NOT_BEST_NEXT_HOP:
            mesh.counters.drop("ogm_not_best_next_hop")
            return
        orig_node = mesh.originators.get_or_create(ogm.orig, now)
        if orig_node is None:
            return
        # The kernel looks these up in each pass; here once: the sender's neighbour entry
        # (None until a pass made it) and the sender's originator (once a pass looked it
        # up). Nothing between the passes removes either or touches another originator.
        key = (eth_src, if_incoming)
        sender = orig_node.neighbours.get(key)
        orig_neigh = self._process_per_outif(now, if_incoming, eth_src, ogm, orig_node, None, sender, None)
        for out in mesh.active:
            if sender is None:
                sender = orig_node.neighbours.get(key)
            orig_neigh = self._process_per_outif(now, if_incoming, eth_src, ogm, orig_node, out, sender, orig_neigh)

    def _count_echo(self, if_incoming: HardInterface, eth_src: bytes, ogm: IvOgmFields) -> None:
        """A neighbour re-broadcast our own OGM: count it in bcast_own for the link check."""
        orig_neigh = self.mesh.originators.get(eth_src)
        if orig_neigh is None:
            return
        if not ogm.flags & _DIRECTLINK or ogm.orig != if_incoming.mac:
            return
        info = orig_neigh.ifinfo_get(if_incoming)
        if info is None:
            return
        bit = seq_diff32((if_incoming.algo.ogm_seqno - 2) & 0xFFFFFFFF, ogm.seqno)
        if 0 <= bit < WINDOW_SIZE:
            info.bcast_own |= 1 << bit

    def _update_seqnos(self, now: float, ogm: IvOgmFields, orig_node: OrigNode, sender: NeighNode | None,
                       outif) -> int:
        """batadv_iv_ogm_update_seqnos: duplicate status and the receive windows. The kernel
        walks every neighbour; here only the sender's window is touched (the others slide
        when read, see IvNeighIfInfo) and the union of all windows answers whether another
        neighbour sent this seqno already. `sender`: the entry the OGM came through, None
        if there is none yet."""
        info = (orig_node.if_default if outif is None else orig_node.if_info if outif is orig_node.if_key
                else orig_node.ifinfo_get(outif)) or orig_node.ifinfo_new(outif, IvOrigIfInfo)
        diff = ((ogm.seqno - info.last_real_seqno + 0x80000000) & 0xFFFFFFFF) - 0x80000000  # seq_diff32
        neighbours = orig_node.neighbours
        if neighbours and not -WINDOW_SIZE < diff < EXPECTED_SEQNO_RANGE:  # a jump: a restart?
            drop, info.seqno_reset, _ = window_protected(diff, now, info.seqno_reset,
                                                         self.mesh.config.reset_protection_ms / 1000.0)
            if drop:
                return PROTECTED
        if info.union_generation != orig_node.neigh_generation:
            self._rebuild_union(info, neighbours, outif, orig_node.neigh_generation)
        ninfo = None if sender is None else (
            (sender.if_default if outif is None else sender.if_info if outif is sender.if_key
             else sender.ifinfo_get(outif)) or sender.ifinfo_new(outif, IvNeighIfInfo))
        if -WINDOW_SIZE < diff <= 0:  # inside the window, which stays where it is
            bit = 1 << -diff
            if ninfo is None:
                return ORIG_DUP if info.union & bit else NO_DUP
            bits = _synced(ninfo, info.window_pos)
            if bits & bit:
                return NEIGH_DUP
            ninfo.real_bits = bits | bit
            status = ORIG_DUP if info.union & bit else NO_DUP
            info.union |= bit
            return status
        if not neighbours:
            return NO_DUP  # (the kernel's walk has no window to slide: the seqno stays)
        # a newer seqno slides every window by diff; a much newer or much older one (a
        # restart) starts every window over: nobody has sent it
        if 0 < diff < WINDOW_SIZE:
            info.window_pos += diff
            info.union = info.union << diff & _WINDOW_MASK
        else:
            info.window_pos += WINDOW_SIZE
            info.union = 0
        info.last_real_seqno = ogm.seqno
        if ninfo is not None:
            ninfo.real_bits = _synced(ninfo, info.window_pos) | 1
            info.union |= 1
        return NO_DUP

    @staticmethod
    def _rebuild_union(info: IvOrigIfInfo, neighbours: dict, outif, generation: int) -> None:
        """The union of the windows, after neighbours came or went."""
        union = 0
        for neigh in neighbours.values():
            ninfo = (neigh.if_default if outif is None else neigh.if_info if outif is neigh.if_key
                     else neigh.ifinfo_get(outif)) or neigh.ifinfo_new(outif, IvNeighIfInfo)
            union |= _synced(ninfo, info.window_pos)
        info.union, info.union_generation = union, generation

    def _process_per_outif(self, now: float, if_incoming: HardInterface, eth_src: bytes, ogm: IvOgmFields,
                           orig_node: OrigNode, outif, sender: NeighNode | None,
                           orig_neigh: OrigNode | None) -> OrigNode | None:
        """batadv_iv_ogm_process_per_outif. The kernel works on a private copy because the
        TQ gets rewritten; here the rewritten TQ is a local value and the OGM stays as is.
        `sender`: orig_node's neighbour entry the OGM came through (None: none yet);
        `orig_neigh`: the sender's originator if an earlier pass for this OGM looked it up
        (None: not yet); returns it as known after this pass."""
        mesh = self.mesh
        dup = self._update_seqnos(now, ogm, orig_node, sender, outif)
        single_hop = eth_src == ogm.orig
        if dup == PROTECTED:
            mesh.counters.drop("ogm_seqno_protected")
            return orig_neigh
        if ogm.tq == 0:
            return orig_neigh
        if single_hop:
            neigh = if_incoming.neighbours.get(eth_src)
            if neigh is not None:
                neigh.last_seen = now
        info = (orig_node.if_default if outif is None else orig_node.if_info if outif is orig_node.if_key
                else orig_node.ifinfo_get(outif))  # _update_seqnos made it
        router = info.router
        from_best = False
        if router is not None:
            if router.addr == eth_src:
                rinfo = (router.if_default if outif is None else router.if_info if outif is router.if_key
                         else router.ifinfo_get(outif))
                from_best = rinfo is not None and _tq(rinfo) != 0
            if router.addr == ogm.prev_sender and ogm.orig != ogm.prev_sender:
                router_router = router.orig_node.router(outif)
                if router_router is not None and router.addr == router_router.addr:
                    return orig_neigh  # avoid temporary routing loops
        if outif is None and ogm.tvlvs:  # batadv_tvlv_ogm_receive: an OGM without TVLVs runs no handler
            mesh.ogm_tvlvs_received(now, orig_node, ogm.tvlvs, ogm.seqno)
        if single_hop:
            orig_neigh = orig_node
        else:
            if orig_neigh is None:
                orig_neigh = mesh.originators.get_or_create(eth_src, now)
                if orig_neigh is None:
                    return None
            neigh_info = (orig_neigh.if_default if outif is None else orig_neigh.if_info if outif is orig_neigh.if_key
                          else orig_neigh.ifinfo_get(outif))
            if neigh_info is None or neigh_info.router is None:
                return orig_neigh  # OGM via unknown neighbour
        tq = self._calc_tq(now, orig_node, orig_neigh, ogm, if_incoming, outif)
        bidirect = tq >= TOTAL_BIDIRECT_LIMIT
        same_seq = info.last_real_seqno == ogm.seqno
        similar_ttl = info.last_ttl - 3 <= ogm.ttl
        if bidirect and (dup == NO_DUP or (same_seq and similar_ttl)):
            self._orig_update(now, orig_node, info, eth_src, ogm, tq, if_incoming, outif, dup, sender)
        if outif is None:
            return orig_neigh  # no forwarding from the default table
        if single_hop:
            if ogm.ttl > 2 or if_incoming is outif:  # secondary-interface OGMs are only echoed where they came in
                self._forward(now, eth_src, ogm, tq, True, from_best, if_incoming, outif)
        elif bidirect and dup != NEIGH_DUP and from_best:  # only the best next hop's copy is forwarded
            self._forward(now, eth_src, ogm, tq, False, from_best, if_incoming, outif)
        return orig_neigh

    def _calc_tq(self, now: float, orig_node: OrigNode, orig_neigh: OrigNode, ogm: IvOgmFields,
                 if_incoming: HardInterface, outif) -> int:
        """batadv_iv_ogm_calc_tq: the OGM's TQ times the link quality toward the sender
        (>= 1 means bidirectional). Integer arithmetic in the kernel's order, so the TQs
        come out identical."""
        mesh = self.mesh
        neigh = orig_neigh.neighbours.get((orig_neigh.orig, if_incoming))
        if neigh is None:
            neigh = mesh.originators.neigh_get_or_create(orig_neigh, if_incoming, orig_neigh.orig, orig_neigh, now)
            if neigh is None:
                return 0
        if orig_node is orig_neigh:
            neigh.last_seen = now
        orig_node.last_seen = now
        echo_info = (orig_neigh.if_info if if_incoming is orig_neigh.if_key
                     else orig_neigh.ifinfo_get(if_incoming))
        echo_count = echo_info.bcast_own.bit_count() if echo_info is not None else 0
        ninfo = (neigh.if_default if outif is None else neigh.if_info if outif is neigh.if_key
                 else neigh.ifinfo_get(outif)) or neigh.ifinfo_new(outif, IvNeighIfInfo)
        oinfo = (orig_neigh.if_default if outif is None else orig_neigh.if_info if outif is orig_neigh.if_key
                 else orig_neigh.ifinfo_get(outif))
        pos = oinfo.window_pos if oinfo is not None else 0
        # (the link's window moves with the neighbour's own OGMs, once a second: mostly
        # it is where the table is, and _synced need not be called)
        rq_count = (ninfo.real_bits if ninfo.window_pos == pos else _synced(ninfo, pos)).bit_count()
        total = echo_count if echo_count < rq_count else rq_count
        if total < BIDIRECT_SEND_MINIMUM or rq_count < BIDIRECT_RECV_MINIMUM:
            tq_own = 0
        else:
            tq_own = TQ_MAX * total // rq_count
        inv = WINDOW_SIZE - rq_count
        tq_asym = TQ_MAX - TQ_MAX * inv * inv * inv // _WINDOW_CUBE
        tq_iface = TQ_MAX - if_incoming.settings.hop_penalty
        if outif is not None and if_incoming is outif and if_incoming.wifi:
            tq_iface = hop_penalty(tq_iface, mesh.config.hop_penalty)  # half duplex
        return ogm.tq * tq_own * tq_asym * tq_iface // _TQ_MAX_CUBE

    def _orig_update(self, now: float, orig_node: OrigNode, info, eth_src: bytes, ogm: IvOgmFields, tq: int,
                     if_incoming: HardInterface, outif, dup: int, neigh: NeighNode | None) -> None:
        """batadv_iv_ogm_orig_update: TQ rings, then maybe a new router. `neigh`: the
        sender's entry as the pass began (None: _calc_tq may have made it since)."""
        mesh = self.mesh
        if neigh is None:
            neigh = orig_node.neighbours.get((eth_src, if_incoming))
        if dup == NO_DUP:  # a new seqno: the neighbours that did not send it score a zero
            for candidate in orig_node.neighbours.values():
                if candidate is not neigh:
                    cinfo = (candidate.if_default if outif is None else candidate.if_info if outif is candidate.if_key
                             else candidate.ifinfo_get(outif))
                    if cinfo is not None:
                        cinfo.push_tq(0)
        if neigh is None:
            orig_tmp = mesh.originators.get_or_create(eth_src, now)
            if orig_tmp is None:
                return
            neigh = mesh.originators.neigh_get_or_create(orig_node, if_incoming, eth_src, orig_tmp, now)
            if neigh is None:
                return
        ninfo = (neigh.if_default if outif is None else neigh.if_info if outif is neigh.if_key
                 else neigh.ifinfo_get(outif)) or neigh.ifinfo_new(outif, IvNeighIfInfo)
        neigh.last_seen = now
        ninfo.push_tq(tq)
        if dup == NO_DUP:
            info.last_ttl = ogm.ttl
        router = info.router
        if router is neigh:
            return
        if router is not None:
            rinfo = (router.if_default if outif is None else router.if_info if outif is router.if_key
                     else router.ifinfo_get(outif))
            if rinfo is None:
                return
            router_tq, neigh_tq = _tq(rinfo), _tq(ninfo)
            if router_tq > neigh_tq:
                return
            if router_tq == neigh_tq and self._bcast_own_sum(router) >= self._bcast_own_sum(neigh):
                return
        mesh.update_route(orig_node, outif, neigh, now)

    @staticmethod
    def _bcast_own_sum(neigh: NeighNode) -> int:
        orig_neigh, iface = neigh.orig_node, neigh.if_incoming
        return _echo_count(orig_neigh.if_info if iface is orig_neigh.if_key else orig_neigh.ifinfo_get(iface))

    def _forward(self, now: float, eth_src: bytes, ogm: IvOgmFields, tq: int, single_hop: bool,
                 from_best: bool, if_incoming: HardInterface, outif: HardInterface) -> None:
        """batadv_iv_ogm_forward: the received bytes with the header fields rewritten."""
        if ogm.ttl <= 1:
            return
        flags = ogm.flags
        if not from_best:
            if not single_hop:
                return
            flags |= _NOT_BEST_NEXT_HOP  # still echo it: the neighbour counts it
        flags = flags | _DIRECTLINK if single_hop else flags & ~_DIRECTLINK
        fwd = patched(ogm.raw, ttl=ogm.ttl - 1, flags=flags, prev_sender=eth_src,
                      tq=hop_penalty(tq, self.mesh.config.hop_penalty))
        # random() is a C call; randrange() costs a microsecond in Python code
        send_time = now + int(self.mesh.rng.random() * (self.mesh.config.jitter_ms // 2)) / 1000.0
        self._queue_add(fwd, if_incoming, outif, own=False, send_time=send_time)
