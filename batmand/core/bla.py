"""Bridge loop avoidance (the kernel's bridge_loop_avoidance.c, BLA v2).

When several mesh nodes bridge bat0 into one LAN (the backbone), each mesh client is
claimed by exactly one of them: the backbone gateway that received its traffic from the
mesh. Only that gateway passes the client's mesh multicast onto the LAN and LAN multicast
back into the mesh, so neither loops; unicast passes any gateway. The gateways tell each
other on the LAN with claim frames (bla_frames.py): CLAIM and UNCLAIM per client, ANNOUNCE
every 10 s with a CRC over a gateway's claims, REQUEST when the CRC differs (answered with
all claims again), LOOPDETECT to find loops BLA cannot break. Gateways of one LAN converge
on one group id (the highest CRC16 of their primary MACs).

Every node with BLA on (the default) takes part, bridged or not: it claims the mesh
sources it hears and holds back multicast for 20-30 s after its own entry for a VLAN
appears, as the kernel does. The broadcast duplicate list runs with BLA off too."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import Bcast, InnerFrame, Mac, Mcast, Unicast4Addr
from batmand.wire.tt_crc import crc32c

from . import bla_frames as frames
from .bla_frames import ANNOUNCE, ANNOUNCE_PREFIX, BROADCAST, CLAIM, LOOPDETECT, REQUEST, UNCLAIM, crc16
from .events import Deliver, Uevent
from .forwarding import NO_SLOW_PATH, SlowPath
from .hooks import BLA, BLA_MESH, BLA_RX
from .routing import inner_vid

PERIOD = 10.0  # BATADV_BLA_PERIOD_LENGTH
BACKBONE_TIMEOUT = 60.0
CLAIM_TIMEOUT = 100.0  # own claims only
WAIT_PERIODS = 3  # a new own entry holds multicast back this many periods
LOOPDETECT_PERIODS = 6
LOOPDETECT_TIMEOUT = 3.0
ROAM_GUARD = 0.1  # an own claim younger than this: a race, not a roaming client
DUPLIST_SIZE = 16
DUPLIST_TIMEOUT = 0.5


_PTYPES = {Bcast: "bcast", Unicast4Addr: "unicast_4addr", Mcast: "mcast"}


def print_vid(vid: int) -> int:
    """batctl's VID column: -1 untagged, else the VID."""
    return vid & 0x0FFF if vid & 0x8000 else -1


@dataclass(eq=False)
class Backbone:
    orig: Mac
    vid: int
    lasttime: float
    crc: int = 0  # XOR of crc16(client MAC) over its claims
    synced: bool = True
    wait_periods: int = 0


@dataclass(eq=False)
class Claim:
    addr: Mac
    vid: int
    backbone: Backbone
    lasttime: float


@dataclass
class _Seen:
    crc: int = 0
    orig: bytes = bytes(6)
    when: float = field(default=-DUPLIST_TIMEOUT)


class Bla:
    def __init__(self, mesh, now: float = 0.0) -> None:
        self.mesh = mesh
        self.group = 0
        self.backbones: dict[tuple[Mac, int], Backbone] = {}
        self.claims: dict[tuple[Mac, int], Claim] = {}
        self.num_requests = 0  # unsynced entries: multicast waits while there are any
        self.loopdetect_addr = Mac(bytes(6))
        self.loopdetect_lasttime = now
        self.loopdetect_next = LOOPDETECT_PERIODS
        self.report_pending: set[int] = set()
        self.duplist = [_Seen() for _ in range(DUPLIST_SIZE)]
        self.duplist_curr = 0
        self.next_period = now + PERIOD
        self._primary_seen: Mac | None = None
        self._published_claims: frozenset | None = None  # the claims' keys as last published
        self._slow_path_of: tuple = ((), NO_SLOW_PATH)  # (what it was built from, SlowPath)
        mesh.hooks.on_host_tx(BLA, self.host_tx)
        mesh.hooks.on_host_rx(BLA_MESH, self._from_backbone_gw)
        mesh.hooks.on_host_rx(BLA_RX, self._host_rx)
        mesh.broadcast.on_receive(self.bcast_duplicate)
        mesh.routing.on_unicast_for_us(self._last_hop_is_backbone_gw)
        mesh.publisher.need_slow_path(self._slow_path)
        mesh.tt.ignore_vlans_of(self.is_backbone_gw)
        mesh.on_setting(["bridge_loop_avoidance"], self._setting_written)
        mesh.on_purge(self.tick)

    def _primary_changed(self, now: float) -> None:
        """batadv_bla_update_orig_address, when the primary (our originator address) changes:
        the first one, or another after it, keeps our entries under the new address."""
        primary = self.primary
        if primary == self._primary_seen:
            return
        old, self._primary_seen = self._primary_seen, primary
        if primary is None:
            return  # the tables stay; nothing is sent or accepted until a primary is back
        self.group = crc16(primary)
        if old is None or not self.enabled:
            self._purge_all()
            return
        for entry in [b for b in self.backbones.values() if b.orig == old]:
            del self.backbones[(old, entry.vid)]
            entry.orig = Mac(primary)
            self.backbones[(entry.orig, entry.vid)] = entry
            self._announce(entry)

    def _setting_written(self, now: float, name: str, old) -> None:
        """Any write of the setting starts over, as the kernel's (the group from our primary;
        off forgets everything, on announces our entries again)."""
        primary = self.primary
        if primary is None:
            return
        self.group = crc16(primary)
        if not self.enabled:
            self._purge_all()
            return
        for entry in [b for b in self.backbones.values() if b.orig == primary]:
            self._announce(entry)

    def _purge_all(self) -> None:
        for entry in list(self.backbones.values()):
            self._remove_backbone(entry)

    @property
    def enabled(self) -> bool:
        return bool(self.mesh.config.bridge_loop_avoidance)

    @property
    def primary(self) -> Mac | None:
        primary = self.mesh.primary
        return primary.mac if primary is not None else None

    # --- claim frames to our host ------------------------------------------------------------

    def _send(self, kind: int, client: Mac, vid: int) -> None:
        """batadv_bla_send_claim: the frame goes to our host as if from the mesh (the bridge
        floods it onto the LAN); `client` is the claimed MAC, the CRC or the target."""
        primary = self.primary
        if primary is None:
            return
        eth_dst, eth_src, sender_hw = BROADCAST, primary, primary
        if kind == CLAIM:
            eth_src = client
        elif kind == UNCLAIM:
            sender_hw = client
        elif kind == ANNOUNCE:
            sender_hw = client  # 43:05:43:05 and the CRC
        elif kind == REQUEST:
            eth_dst = sender_hw = client
        elif kind == LOOPDETECT:
            eth_src = client
        frame = frames.claim_frame(kind, eth_dst=eth_dst, eth_src=eth_src, sender_hw=sender_hw,
                                   group=self.group, vid=vid)
        self.mesh.counters.add("rx", len(frame))
        self.mesh.emit(Deliver(frame))

    def _announce(self, backbone: Backbone) -> None:
        self._send(ANNOUNCE, Mac(ANNOUNCE_PREFIX + backbone.crc.to_bytes(2, "big")), backbone.vid)

    # --- tables ------------------------------------------------------------------------------------

    def _backbone(self, now: float, orig: Mac, vid: int, own: bool) -> Backbone | None:
        """batadv_bla_get_backbone_gw: find or make the entry; an own one announces itself
        and waits (holding multicast back) before it counts as synced."""
        key = (Mac(orig), vid)
        entry = self.backbones.get(key)
        if entry is not None:
            return entry
        if not own and orig != self.primary and len(self.backbones) >= self.mesh.config.max_bla_backbones:
            self.mesh.counters.drop("bla_backbone_table_full")
            return None
        entry = self.backbones[key] = Backbone(Mac(orig), vid, now)
        orig_node = self.mesh.originators.get(orig)
        if orig_node is not None:  # its announced clients on this VLAN are its LAN's now
            self.mesh.tt.forget_vlan(orig_node, vid)
        if own:
            self._announce(entry)
            self._unsync(entry, WAIT_PERIODS)
        return entry

    def _unsync(self, entry: Backbone, wait_periods: int = 0) -> None:
        if entry.synced:
            entry.synced = False
            entry.wait_periods = wait_periods
            self.num_requests += 1

    def _sync(self, entry: Backbone) -> None:
        if not entry.synced:
            entry.synced = True
            self.num_requests -= 1

    def _own_backbone(self, now: float, vid: int) -> None:
        """batadv_bla_update_own_backbone_gw."""
        if self.primary is not None:
            self._backbone(now, self.primary, vid, own=True).lasttime = now

    def _add_claim(self, now: float, client: Mac, vid: int, backbone: Backbone) -> None:
        key = (Mac(client), vid)
        claim = self.claims.get(key)
        if claim is None:
            if len(self.claims) >= self.mesh.config.max_bla_claims:
                self.mesh.counters.drop("bla_claim_table_full")
                return
            self._published_claims = None
            self.claims[key] = Claim(Mac(client), vid, backbone, now)
            backbone.crc ^= crc16(client)
            backbone.lasttime = now
            return
        claim.lasttime = now
        if claim.backbone is not backbone:
            self._published_claims = None
            claim.backbone.crc ^= crc16(client)
            backbone.crc ^= crc16(client)
            claim.backbone = backbone
            backbone.lasttime = now

    def _del_claim(self, client: Mac, vid: int) -> None:
        claim = self.claims.pop((Mac(client), vid), None)
        if claim is not None:
            self._published_claims = None
            claim.backbone.crc ^= crc16(client)

    def _handle_claim(self, now: float, backbone_mac: Mac, client: Mac, vid: int) -> None:
        backbone = self._backbone(now, backbone_mac, vid, own=False)
        if backbone is None:
            return
        self._add_claim(now, client, vid, backbone)
        if backbone_mac == self.primary:
            self._send(CLAIM, client, vid)

    def _handle_unclaim(self, backbone_mac: Mac, client: Mac, vid: int) -> None:
        if backbone_mac == self.primary:
            self._send(UNCLAIM, client, vid)
        self._del_claim(client, vid)  # whoever holds it (newest kernels)

    def _send_request(self, backbone: Backbone) -> None:
        """batadv_bla_send_request: forget its claims, ask for them again."""
        for key in [k for k, c in self.claims.items() if c.backbone is backbone]:
            self._del_claim(*key)
        self._send(REQUEST, backbone.orig, backbone.vid)
        self._unsync(backbone)

    def _remove_backbone(self, entry: Backbone) -> None:
        self._sync(entry)
        for key in [k for k, c in self.claims.items() if c.backbone is entry]:
            self._del_claim(*key)
        self.backbones.pop((entry.orig, entry.vid), None)

    # --- frames from the host -------------------------------------------------------------------

    def _process_claim(self, now: float, inner: InnerFrame, vid: int) -> bool:
        """batadv_bla_process_claim: True when the frame was a claim frame (consumed)."""
        claim = frames.parse_claim(inner)
        if claim is None:
            return False
        if claim.depth > 1:
            return True  # QinQ with the magic: dropped
        if claim.kind == LOOPDETECT:
            return False  # goes into the mesh: that is how loops are found
        if claim.kind == CLAIM:
            backbone = claim.sender_hw
        elif claim.kind in (UNCLAIM, ANNOUNCE, REQUEST):
            backbone = claim.eth_src
        else:
            return False
        primary = self.primary
        if backbone == primary:
            return False  # our own frame came back
        if claim.group != self.group:
            if self.mesh.originators.get(backbone) is None:
                self.mesh.debug(f"received a claim frame from another group. From: {backbone} on vid "
                                f"{print_vid(vid)}")
                return True
            if claim.group > self.group:
                self.mesh.debug(f"taking other backbones claim group: {claim.group:#06x}")
                self.group = claim.group
        self._own_backbone(now, vid)
        if claim.kind == CLAIM:
            self._handle_claim(now, claim.sender_hw, claim.eth_src, vid)
        elif claim.kind == UNCLAIM:
            self._handle_unclaim(claim.eth_src, claim.sender_hw, vid)
        elif claim.kind == ANNOUNCE:
            if claim.sender_hw[:4] != ANNOUNCE_PREFIX:
                return True
            self._handle_announce(now, claim.eth_src, int.from_bytes(claim.sender_hw[4:6], "big"), vid)
        elif claim.kind == REQUEST:
            if claim.sender_hw != claim.eth_dst:
                return True
            if claim.eth_dst == primary:
                self._answer_request(vid)
        return True

    def _handle_announce(self, now: float, orig: Mac, crc: int, vid: int) -> None:
        backbone = self._backbone(now, orig, vid, own=False)
        if backbone is None:
            return
        backbone.lasttime = now
        if crc != backbone.crc:
            self.mesh.debug(f"CRC FAILED for {orig}/{print_vid(vid)} (my = {backbone.crc:#06x}, sent = {crc:#06x})")
            self._send_request(backbone)
        else:
            self._sync(backbone)

    def _answer_request(self, vid: int) -> None:
        own = self.backbones.get((self.primary, vid))
        if own is None:
            return
        for claim in [c for c in self.claims.values() if c.backbone is own]:
            self._send(CLAIM, claim.addr, vid)
        self._announce(own)

    def host_tx(self, now: float, inner: InnerFrame, vid: int) -> bool:
        """batadv_bla_tx: True when the frame must not enter the mesh (counted tx_dropped)."""
        self._primary_changed(now)
        if self.primary is None or not self.enabled:
            return False
        dropped = self._tx_decision(now, inner, vid)
        if dropped:
            self.mesh.counters["tx_dropped"] += 1
        else:
            self._own_backbone(now, vid)
        return dropped

    def _tx_decision(self, now: float, inner: InnerFrame, vid: int) -> bool:
        if self._process_claim(now, inner, vid):
            return True
        if self.num_requests and inner.h_dest.is_multicast:
            return True  # our entries are not in sync yet: no multicast may loop
        claim = self.claims.get((inner.h_source, vid))
        if claim is None:
            return False
        if claim.backbone.orig == self.primary:
            if now - claim.lasttime > ROAM_GUARD:  # the client moved into our LAN
                self.mesh.debug(f"Roaming client {inner.h_source} detected. Unclaim it.")
                self._handle_unclaim(self.primary, inner.h_source, vid)
                return False
            self.mesh.debug(f"Race for claim {inner.h_source} detected. Drop packet.")
            return True
        return inner.h_dest.is_multicast  # another gateway put it on the LAN already

    # --- frames to the host ----------------------------------------------------------------------

    def _from_backbone_gw(self, now: float, inner: InnerFrame, vid: int, packet) -> bool:
        """batadv_recv_bcast_packet: a broadcast from a gateway of our own LAN was rebroadcast,
        but its host has it from the LAN already."""
        return isinstance(packet, Bcast) and self.is_backbone_gw(packet.orig, vid)

    def _host_rx(self, now: float, inner: InnerFrame, vid: int, packet) -> bool:
        return self.host_rx(now, inner, vid, _PTYPES.get(type(packet), "unicast"))

    def host_rx(self, now: float, inner: InnerFrame, vid: int, ptype: str) -> bool:
        """batadv_bla_rx for a frame from the mesh carried by `ptype` ("bcast", "unicast",
        "unicast_4addr", "mcast"): True drops it."""
        self._primary_changed(now)
        primary = self.primary
        if primary is None:
            return True
        if not self.enabled:
            return False
        if inner.h_source == self.loopdetect_addr:
            if now - self.loopdetect_lasttime <= LOOPDETECT_TIMEOUT:
                self._backbone(now, primary, vid, own=True)
                self._report_loop(vid)
            return True
        group_frame = inner.h_dest.is_multicast and ptype in ("bcast", "unicast")
        if self.num_requests and group_frame:
            return True
        if inner.h_dest.is_multicast and ptype == "unicast" and self._duplicate(inner.encode()[14:], None, now):
            return True
        claim = self.claims.get((inner.h_source, vid))
        if claim is None:
            self.mesh.debug(f"Unclaimed MAC {inner.h_source} found. Claim it. Local: "
                            f"{'yes' if self.mesh.tt.is_my_client(inner.h_source, vid) else 'no'}")
            self._handle_claim(now, primary, inner.h_source, vid)
        elif claim.backbone.orig == primary:
            claim.lasttime = now
        elif group_frame:
            return True  # its gateway passes it on
        else:
            self._handle_claim(now, primary, inner.h_source, vid)  # unicast through us: ours now
        self._own_backbone(now, vid)
        return False

    def _report_loop(self, vid: int) -> None:
        if vid in self.report_pending:
            return
        self.report_pending.add(vid)
        self.mesh.log(f"Possible loop on VLAN {print_vid(vid)} detected which can't be handled by BLA - "
                      "please check your network setup!")
        self.mesh.emit(Uevent("bla", "loopdetect", str(print_vid(vid))))
        self.report_pending.discard(vid)

    # --- broadcast duplicates ----------------------------------------------------------------

    def _duplicate(self, payload: bytes, orig: bytes | None, now: float) -> bool:
        """batadv_bla_check_duplist: the same payload within 500 ms from another way in (a
        sender repeating itself is caught by its seqnos, not here)."""
        crc = crc32c(payload)
        for i in range(DUPLIST_SIZE):
            entry = self.duplist[(self.duplist_curr + i) % DUPLIST_SIZE]
            if now - entry.when > DUPLIST_TIMEOUT:
                break
            if entry.crc != crc:
                continue
            if orig is not None and any(orig) and any(entry.orig) and entry.orig == orig:
                continue
            return True
        self.duplist_curr = (self.duplist_curr - 1) % DUPLIST_SIZE
        self.duplist[self.duplist_curr] = _Seen(crc, bytes(orig) if orig is not None else bytes(6), now)
        return False

    def bcast_duplicate(self, now: float, inner: InnerFrame, orig: Mac) -> bool:
        """batadv_bla_check_bcast_duplist (with BLA off too): before the rebroadcast."""
        return self._duplicate(inner.encode(), orig, now)

    # --- the periodic work and the setting ---------------------------------------------------------

    def tick(self, now: float) -> None:
        """The periodic work (batadv_bla_periodic_work), at the originator worker's pace."""
        self._primary_changed(now)
        if now < self.next_period:
            return
        self.next_period = now + PERIOD
        primary = self.primary
        if primary is None:
            return
        for claim in [c for c in self.claims.values() if c.backbone.orig == primary]:
            if now - claim.lasttime > CLAIM_TIMEOUT:
                self._handle_unclaim(primary, claim.addr, claim.vid)
        for entry in [b for b in self.backbones.values() if now - b.lasttime > BACKBONE_TIMEOUT]:
            self.mesh.debug(f"backbone gw {entry.orig} timed out")
            self._remove_backbone(entry)
        if not self.enabled:
            return
        self.loopdetect_next -= 1
        loopdetect = self.loopdetect_next == 0
        if loopdetect:
            self.loopdetect_addr = Mac(frames.LOOPDETECT_PREFIX + self.mesh.rng.randbytes(4))
            self.loopdetect_lasttime = now
            self.loopdetect_next = LOOPDETECT_PERIODS
        for entry in [b for b in self.backbones.values() if b.orig == primary]:
            entry.lasttime = now
            self._announce(entry)
            if loopdetect:
                self._send(LOOPDETECT, self.loopdetect_addr, entry.vid)
            if not entry.synced:
                entry.wait_periods = max(0, entry.wait_periods - 1)
                if not entry.wait_periods:
                    self._sync(entry)

    def _last_hop_is_backbone_gw(self, last_hop: Mac, inner: InnerFrame) -> bool:
        """routing.c: a unicast for us from a gateway of our own LAN (its address looked up
        as an originator, as the kernel does) came over the LAN already."""
        return self.mesh.originators.get(last_hop) is not None and self.is_backbone_gw(last_hop, inner_vid(inner))

    def _slow_path(self) -> SlowPath:
        """With BLA on, the core decides multicast toward the host, frames from the host sent
        by a client we claimed (it may have roamed into our LAN), frames to the host from
        any source we have not claimed (we claim it, or take it over) and unicast for us
        whose last hop is another gateway of our LAN (dropped); frames from our own claims
        are delivered fast and reported seen, which keeps the claims fresh."""
        if not self.enabled:
            return NO_SLOW_PATH
        primary = self.primary
        if self._published_claims is None:
            self._published_claims = frozenset(k for k, c in self.claims.items() if c.backbone.orig == primary)
        # asked after every batch of frames and every timer: built again only when its inputs
        # changed (the backbones' keys hold their originators)
        source = (primary, self._published_claims, tuple(self.backbones))
        if source == self._slow_path_of[0]:
            return self._slow_path_of[1]
        slow = SlowPath(multicast=True, from_host_sources=self._published_claims,
                        to_host_sources=self._published_claims,
                        from_last_hops=frozenset(bytes(b.orig) for b in self.backbones.values() if b.orig != primary))
        self._slow_path_of = (source, slow)
        return slow

    def sources_seen(self, seen: dict) -> None:
        """Sources the data plane delivered to the host without us ({(mac, vid): when}): our
        claims of them stay fresh, as every frame keeps them in the kernel."""
        primary = self.primary
        for key, when in seen.items():
            claim = self.claims.get(key)
            if claim is not None and claim.backbone.orig == primary and when > claim.lasttime:
                claim.lasttime = when

    # --- lookups for the other parts ------------------------------------------------------------

    def is_backbone_gw(self, orig: bytes, vid: int) -> bool:
        return self.enabled and bool(self.backbones) and (orig, vid) in self.backbones

    def claimed_by_other(self, client: bytes, vid: int) -> bool:
        """batadv_bla_check_claim's "no": the client is another gateway's."""
        if not self.enabled or self.primary is None:
            return False
        claim = self.claims.get((Mac(client), vid))
        return claim is not None and claim.backbone.orig != self.primary

    # --- batmanctl cl / bbt ------------------------------------------------------------------------

    def claim_rows(self) -> list[dict]:
        primary = self.primary
        return [{**({"bla_own": True} if c.backbone.orig == primary else {}), "bla_address": str(c.addr),
                 "bla_vid": print_vid(c.vid), "bla_backbone": str(c.backbone.orig), "bla_crc": c.backbone.crc}
                for c in self.claims.values()]

    def backbone_rows(self, now: float) -> list[dict]:
        primary = self.primary
        # batctl's bbj: the keys in netlink attribute order (LAST_SEEN_MSECS, BLA_OWN, BLA_VID,
        # BLA_BACKBONE, BLA_CRC), as for claims
        return [{"last_seen_msecs": max(0, int(round((now - b.lasttime) * 1000))),
                 **({"bla_own": True} if b.orig == primary else {}), "bla_vid": print_vid(b.vid),
                 "bla_backbone": str(b.orig), "bla_crc": b.crc} for b in self.backbones.values()]
