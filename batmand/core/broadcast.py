"""Broadcast flooding (routing.c batadv_recv_bcast_packet, send.c): own BCAST seqnos,
the duplicate window per originator, and the rebroadcast rules per interface."""

from __future__ import annotations

from batmand.wire import BROADCAST, Bcast, InnerFrame, build_frame
from batmand.wire.constants import TTL, PacketType

from .bitarray import bit_get_packet, seq_diff32, bit_is_set, window_protected

NUM_BCASTS_WIRED = 1
NUM_BCASTS_WIRELESS = 3
BCAST_RESEND_DELAY = 0.005


class Broadcast:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        mesh.register_receiver(PacketType.BCAST, self.receive)
        self.seqno = 1  # the first broadcast we send carries seqno 2, as the kernel's
        self.pending: list[tuple[float, str, bytes]] = []  # Wi-Fi repeats: (when, iface, frame)
        self.delayed: list[tuple[float, Bcast, object]] = []  # own broadcasts held back: (when, packet, keep)
        self._receive_checks: list = []  # check(now, inner, orig) -> True: neither rebroadcast nor delivered

    def on_receive(self, check) -> None:
        """For the features: check(now, inner frame, orig) of each new broadcast before it is
        rebroadcast; True drops it (BLA's duplicate list)."""
        self._receive_checks.append(check)

    def send_own(self, now: float, inner: bytes, *, delay: float = 0.0, keep=None) -> None:
        """Flood the host's frame. With `delay` it waits that long and goes out only if
        keep(now) still says so then (the kernel's own delayed broadcasts: DAT holds an ARP
        request back, and drops it when the answer came in meanwhile); its seqno is taken
        now either way, as the kernel's."""
        mesh = self.mesh
        self.seqno = (self.seqno + 1) & 0xFFFFFFFF
        packet = Bcast(ttl=TTL - 1, seqno=self.seqno, orig=mesh.primary.mac, inner=InnerFrame.decode(inner))
        if delay <= 0:
            self._flood(now, packet, own=True, from_orig=None)
        elif len(self.delayed) >= mesh.config.max_bcast_queue:
            mesh.counters.drop("bcast_queue_full")
        else:
            self.delayed.append((now + delay, packet, keep))

    def _flood(self, now: float, packet: Bcast, *, own: bool, from_orig) -> None:
        mesh = self.mesh
        for iface in mesh.active_ifaces():
            if iface.no_broadcast(packet.orig, from_orig):
                continue
            frame = build_frame(BROADCAST, iface.mac, packet)
            mesh.transmit(iface, frame)
            repeats = (NUM_BCASTS_WIRELESS if iface.wifi else NUM_BCASTS_WIRED) - 1
            for i in range(repeats):
                if len(self.pending) >= mesh.config.max_bcast_queue:
                    mesh.counters.drop("bcast_queue_full")
                    break
                self.pending.append((now + BCAST_RESEND_DELAY * (i + 1), iface.name, frame))

    def next_deadline(self) -> float:
        if not (self.pending or self.delayed):
            return float("inf")  # (asked after every batch of frames)
        return min((t for t, _, _ in self.pending + self.delayed), default=float("inf"))

    def tick(self, now: float) -> None:
        if not (self.pending or self.delayed):
            return
        held = [d for d in self.delayed if d[0] <= now]
        self.delayed = [d for d in self.delayed if d[0] > now]
        for _, packet, keep in held:
            if keep is None or keep(now):
                self._flood(now, packet, own=True, from_orig=None)
        due = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _, name, frame in due:
            iface = self.mesh.iface(name)
            if iface is not None and iface.active:
                self.mesh.transmit(iface, frame)

    def receive(self, now: float, iface, frame, data: bytes) -> None:
        mesh = self.mesh
        eth, packet = frame.ethernet, frame.packet
        if not eth.h_dest.is_broadcast or eth.h_source.is_multicast or mesh.is_my_mac(eth.h_source):
            mesh.counters.drop("bcast_bad_address")
            return
        if mesh.is_my_mac(packet.orig):
            mesh.counters.drop("bcast_own")  # our own broadcast came back
            return
        if packet.ttl < 2:
            mesh.counters.drop("bcast_ttl")
            return
        orig_node = mesh.originators.get(packet.orig)
        if orig_node is None:
            mesh.counters.drop("bcast_unknown_originator")
            return
        if bit_is_set(orig_node.bcast_bits, orig_node.last_bcast_seqno, packet.seqno):
            mesh.counters.drop("bcast_duplicate")
            return
        diff = seq_diff32(packet.seqno, orig_node.last_bcast_seqno)
        drop, orig_node.bcast_seqno_reset, _ = window_protected(
            diff, now, orig_node.bcast_seqno_reset, mesh.config.reset_protection_ms / 1000.0)
        if drop:
            mesh.counters.drop("bcast_seqno_protected")
            return
        orig_node.bcast_bits, moved = bit_get_packet(orig_node.bcast_bits, diff, True)
        if moved:
            orig_node.last_bcast_seqno = packet.seqno
        if any(check(now, packet.inner, packet.orig) for check in self._receive_checks):
            mesh.counters.drop("bcast_duplicate_frame")  # BLA's duplicate list: it came another way
            return
        forward = Bcast(ttl=packet.ttl - 1, reserved=packet.reserved, seqno=packet.seqno, orig=packet.orig,
                        inner=packet.inner, version=packet.version)
        neigh = iface.neighbours.get(eth.h_source)
        self._flood(now, forward, own=False, from_orig=neigh.orig if neigh else None)
        mesh.deliver(now, packet.inner, orig_node, packet)
