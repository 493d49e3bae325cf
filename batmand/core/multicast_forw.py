"""The MCAST packet type (the kernel's multicast_forw.c, batman-adv 2024.0 and later): one
packet carries a host's multicast frame toward several originators, listed in its
multicast tracker TVLV. Each hop sends one copy per next hop, listing in it only the
destinations behind that neighbour, and delivers the frame to its own host when it is
listed itself; so no node gets a frame twice and no duplicate check is needed.

multicast.Multicast chooses this packet only when every node announced HAVE_MC_PTYPE_CAPA
and the packet stays within the IPv6 minimum MTU. The mcast_* counters count only this
packet type, as the kernel's do."""

from __future__ import annotations

import dataclasses

from batmand.wire import InnerFrame, Mac, Mcast, McastTrackerTvlv
from batmand.wire.constants import ETH_P_BATMAN, TTL, PacketType, TvlvType
from batmand.wire.ethernet import Ethernet
from batmand.wire.tvlv import UnknownTvlv

IPV6_MIN_MTU = 1280
ETH_HLEN = 14


def packet_len(inner_len: int, num_dests: int) -> int:
    """batadv_mcast_forw_packet_hdrlen plus the frame: MCAST header (6), tracker TVLV
    header (4), num_dests (2), the destinations, and 2 bytes of padding when their number
    is even (it keeps the inner IP header 4-byte aligned)."""
    return inner_len + 12 + 6 * num_dests + (2 if num_dests % 2 == 0 else 0)


class McastForwarding:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        mesh.register_receiver(PacketType.MCAST, self.receive)

    def send_own(self, now: float, inner: InnerFrame, dests: list[Mac]) -> None:
        """batadv_mcast_forw_push + mcsend: `dests` in the kernel's push order (listeners,
        then want-all, then routers); each is pushed in front of the last, so the tracker
        lists them the other way round."""
        tracker = McastTrackerTvlv(dests=list(reversed(dests)))
        packet = Mcast(ttl=TTL, tvlvs=[tracker], inner=inner)
        self._forward(now, packet, tracker, received_len=None)

    def receive(self, now: float, iface, frame, data: bytes) -> None:
        """batadv_recv_mcast_packet."""
        mesh = self.mesh
        if not mesh.routing.check_unicast(frame, "mcast_not_for_us"):
            return
        packet = frame.packet
        if packet.ttl < 2:
            mesh.counters.drop("ttl_exceeded")
            return
        packet = dataclasses.replace(packet, ttl=packet.ttl - 1)
        tracker = next((t for t in packet.tvlvs if _is_tracker(t)), None)
        if isinstance(tracker, UnknownTvlv):  # the destinations overrun the container
            mesh.counters.drop("mcast_bad_tracker")
            return
        mesh.counters.add("mcast_rx", len(data))
        # no tracker (or one of another version) means "for you": the kernel's TVLV
        # processing then succeeds without a handler
        local = self._forward(now, packet, tracker, received_len=len(data)) if tracker is not None else True
        if local:
            mesh.counters.add("mcast_rx_local", len(packet.inner.encode()))
            mesh.deliver(now, packet.inner, None, packet)  # no orig: no temporary client for the source

    def _forward(self, now: float, packet: Mcast, tracker: McastTrackerTvlv, received_len: int | None) -> bool:
        """batadv_mcast_forw_packet: a copy per next hop with the destinations behind it;
        True when we are one of the destinations."""
        mesh = self.mesh
        slots: list[Mac | None] = list(tracker.dests)
        local = sent = False
        for i, dest in enumerate(slots):
            if dest is None or not any(dest):
                continue
            slots[i] = None
            if dest.is_multicast:  # only originator addresses are destinations
                continue
            if mesh.is_my_mac(dest):
                local = True
                continue
            router = self._router(dest)
            if router is None:
                continue
            group = [dest]
            for j in range(i + 1, len(slots)):
                other = slots[j]
                if other is None or not any(other):
                    continue
                if other.is_multicast:
                    slots[j] = None
                    continue
                other_router = self._router(other)
                if other_router is not None and other_router.addr == router.addr:
                    group.append(other)
                    slots[j] = None
            copy = dataclasses.replace(packet, tvlvs=[McastTrackerTvlv(dests=group) if t is tracker else t
                                                      for t in packet.tvlvs]).encode()
            out = router.if_incoming
            if len(copy) > out.mtu:  # never fragmented; the sender kept it within 1280 bytes
                mesh.counters.drop("mcast_too_big")
                continue
            mesh.counters.add("mcast_tx", len(copy) + ETH_HLEN)
            mesh.transmit(out, Ethernet(router.addr, out.mac, ETH_P_BATMAN).encode() + copy)
            sent = True
        if sent:
            if received_len is None:
                mesh.counters.add("mcast_tx_local", len(packet.inner.encode()))
            else:
                mesh.counters.add("mcast_fwd", received_len)
        return local

    def _router(self, orig: Mac):
        orig_node = self.mesh.originators.get(orig)
        return orig_node.router(None) if orig_node is not None else None


def _is_tracker(tvlv) -> bool:
    if isinstance(tvlv, McastTrackerTvlv):
        return True
    return isinstance(tvlv, UnknownTvlv) and tvlv.type == TvlvType.MCAST_TRACKER and tvlv.version == \
        McastTrackerTvlv.VERSION
