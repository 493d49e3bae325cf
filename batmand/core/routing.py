"""Unicast: sending toward an originator, receiving, forwarding, the TTVN consistency check
(the kernel's routing.c and send.c), and the host's frames entering the mesh
(mesh-interface.c's transmit path) for the inline data path."""

from __future__ import annotations

import dataclasses

from batmand.wire import InnerFrame, Mac, Unicast, Unicast4Addr, Unicast4AddrSubtype, UnicastTvlv, WireError
from batmand.wire.constants import ETH_P_BATMAN, VLAN_HAS_TAG, PacketType, TtClientFlags as F
from batmand.wire.ethernet import Ethernet

from .bla_frames import is_loopdetect_mac
from .fragmentation import fragment, priority_of

_STP = Mac("01:80:c2:00:00:00")
_ECTP = Mac("cf:00:00:00:00:00")


def inner_vid(inner: InnerFrame) -> int:
    """The VID as the TT keys it: 0 untagged (and priority-tagged VID 0), else 0x8000 | vid."""
    vid = inner.vid
    return VLAN_HAS_TAG | vid if vid else 0


class Routing:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        mesh.register_receiver(PacketType.UNICAST, self.receive_unicast)
        mesh.register_receiver(PacketType.UNICAST_4ADDR, self.receive_unicast)
        mesh.register_receiver(PacketType.ICMP, self.receive_icmp)
        mesh.register_receiver(PacketType.UNICAST_TVLV, self.receive_unicast_tvlv)
        mesh.register_receiver(PacketType.UNICAST_FRAG, self.receive_fragment)
        self._for_us_checks: list = []  # check(last hop, inner frame) -> True: not delivered

    def on_unicast_for_us(self, check) -> None:
        """For the features: check(the last hop's MAC, inner frame) of a unicast for us,
        after the TTVN check; True drops it (BLA: it came from a gateway of our own LAN)."""
        self._for_us_checks.append(check)

    # --- sending ---------------------------------------------------------------------------------

    def send_to_orig(self, now: float, packet: bytes, orig_node, recv_if, priority: int = 0) -> bool:
        """batadv_send_skb_to_orig: to the router of `recv_if`'s table (None: our own),
        fragmented when it does not fit that interface's MTU."""
        mesh = self.mesh
        router = orig_node.router(recv_if)
        if router is None:
            mesh.counters.drop("no_route")
            return False
        out = router.if_incoming
        header = Ethernet(router.addr, out.mac, ETH_P_BATMAN).encode()
        if len(packet) <= out.mtu:
            mesh.transmit(out, header + packet)
            return True
        if not mesh.config.fragmentation or mesh.primary is None:
            mesh.counters.drop("too_big_for_mtu")
            return False
        mesh.frag_seqno = (mesh.frag_seqno + 1) & 0xFFFF
        fragments = fragment(packet, out.mtu, seqno=mesh.frag_seqno, orig=mesh.primary.mac, dest=orig_node.orig,
                             priority=priority)
        if fragments is None:
            mesh.counters.drop("too_many_fragments")
            return False
        for part in fragments:
            mesh.counters.add("frag_tx", len(part) + 14)
            mesh.transmit(out, header + part)
        return True

    def send_from_host(self, now: float, data: bytes) -> None:
        """batadv_interface_tx, inline: learn the source, then BCAST or UNICAST."""
        mesh = self.mesh
        try:
            inner = InnerFrame.decode(data)
        except WireError:
            mesh.counters.drop("tx_malformed")
            return
        if inner.h_proto == ETH_P_BATMAN:
            mesh.counters.drop("tx_batman_in_batman")
            return
        vid = inner_vid(inner)  # a VLAN the soft interface does not have refuses the client
        if mesh.hooks.host_tx(now, inner, vid, learnt=False):
            return  # a feature took it before its sender is learnt (BLA)
        if not inner.h_source.is_multicast and not is_loopdetect_mac(inner.h_source) \
                and not mesh.tt.local_add(now, inner.h_source, vid):
            mesh.counters["tx_dropped"] += 1
            return
        if inner.h_dest in (_STP, _ECTP):
            mesh.counters.drop("tx_stp")
            return
        if mesh.primary is None:
            mesh.counters["tx_dropped"] += 1
            return
        if mesh.hooks.host_tx(now, inner, vid):
            return  # a feature took it (answered it, or sends it its own way)
        if inner.h_dest.is_multicast:
            mesh.broadcast.send_own(now, data)
            mesh.counters.add("tx", len(data))
            return
        orig = mesh.tt.best_orig(inner.h_dest, vid)
        orig_node = mesh.originators.get(orig) if orig is not None else None
        if orig_node is None:
            mesh.counters.drop("tx_unknown_unicast")  # the kernel never floods unknown unicast
        self.send_unicast_from_host(now, inner, orig_node)

    def send_unicast_from_host(self, now: float, inner: InnerFrame, orig_node, *, four_addr: bool = False) -> bool:
        """A host frame to `orig_node` (None: there is none, the frame is dropped), counted as
        the host's traffic (tx, or tx_dropped)."""
        subtype = Unicast4AddrSubtype.DATA if four_addr else None
        if self.send_unicast(now, inner, orig_node, subtype):
            self.mesh.counters.add("tx", len(inner.encode()))
            return True
        self.mesh.counters["tx_dropped"] += 1
        return False

    def send_unicast(self, now: float, inner: InnerFrame, orig_node, subtype: int | None = None) -> bool:
        """batadv_send_skb_unicast: `inner` as UNICAST, or as UNICAST_4ADDR with `subtype`
        from our primary address, to `orig_node` (None: dropped)."""
        mesh = self.mesh
        if orig_node is None or mesh.primary is None:
            return False
        ttvn = orig_node.last_ttvn
        if mesh.tt.is_roaming(inner.h_dest, inner_vid(inner)):
            ttvn = (ttvn - 1) & 0xFF  # makes the destination re-check the client's owner
        if subtype is not None:
            packet = Unicast4Addr(ttvn=ttvn, dest=orig_node.orig, src=mesh.primary.mac, subtype=subtype,
                                  inner=inner).encode()
        else:
            packet = Unicast(ttvn=ttvn, dest=orig_node.orig, inner=inner).encode()
        return self.send_to_orig(now, packet, orig_node, None, priority_of(inner.encode()))

    # --- receiving -------------------------------------------------------------------------------

    def check_unicast(self, frame, reason: str = "unicast_not_for_us") -> bool:
        """batadv_check_unicast_packet: to one of our MACs, from a unicast sender (else the
        drop is counted under `reason`)."""
        eth = frame.ethernet
        if eth.h_dest.is_multicast or eth.h_source.is_multicast or not self.mesh.is_my_mac(eth.h_dest):
            self.mesh.counters.drop(reason)
            return False
        return True

    def _check_ttvn(self, now: float, packet) -> bool:
        """batadv_check_unicast_ttvn: reroute when the sender's TT view was stale."""
        mesh, tt = self.mesh, self.mesh.tt
        inner = packet.inner
        if inner.h_dest.is_multicast:
            return True
        vid = inner_vid(inner)
        local = tt.local.get((inner.h_dest, vid))
        if local is not None and local.flags & F.ROAM:
            self._reroute(packet, inner.h_dest, vid)  # after the client; untouched if unknown
            return True
        if mesh.is_my_mac(packet.dest):
            current = tt.ttvn
        else:
            dest_node = mesh.originators.get(packet.dest)
            if dest_node is None:
                return False
            current = dest_node.last_ttvn
        if not tt.seq_before(packet.ttvn, current):
            return True
        if self._reroute(packet, inner.h_dest, vid):
            return True
        if not self.mesh.tt.is_my_client(inner.h_dest, vid):
            return False
        packet.dest = Mac(mesh.primary.mac)
        packet.ttvn = current
        return True

    def _reroute(self, packet, client: Mac, vid: int) -> bool:
        """batadv_reroute_unicast_packet: point the header at the client's current owner."""
        mesh, tt = self.mesh, self.mesh.tt
        if self.mesh.tt.is_my_client(client, vid):
            new_dest, new_ttvn = mesh.primary.mac, tt.ttvn
        else:
            orig = tt.best_orig(client, vid)
            node = mesh.originators.get(orig) if orig is not None else None
            if node is None or node.orig == packet.dest:
                return False
            new_dest, new_ttvn = node.orig, node.last_ttvn
        packet.dest, packet.ttvn = Mac(new_dest), new_ttvn
        return True

    def receive_unicast(self, now: float, iface, frame, data: bytes) -> None:
        mesh = self.mesh
        if not self.check_unicast(frame):
            return
        packet = dataclasses.replace(frame.packet)
        if not self._check_ttvn(now, packet):
            mesh.counters.drop("unicast_ttvn")
            return
        if mesh.is_my_mac(packet.dest):
            if any(check(frame.ethernet.h_source, packet.inner) for check in self._for_us_checks):
                mesh.counters.drop("unicast_from_backbone_gw")
                return
            src_orig = None
            if getattr(packet, "subtype", None) == Unicast4AddrSubtype.DATA:
                src_orig = mesh.originators.get(packet.src)
            mesh.deliver(now, packet.inner, src_orig, packet)
            return
        self._route(now, iface, packet)

    def _route(self, now: float, iface, packet, *, count: bool = True) -> None:
        """batadv_route_unicast_packet: TTL, then the next hop of the incoming table."""
        mesh = self.mesh
        if packet.ttl < 2:
            mesh.counters.drop("ttl_exceeded")
            return
        # UNICAST_TVLV calls it dst, the others dest; both sit at offset 4
        orig_node = mesh.originators.get(packet.dst if isinstance(packet, UnicastTvlv) else packet.dest)
        if orig_node is None:
            mesh.counters.drop("unknown_destination")
            return
        packet.ttl -= 1
        encoded = packet.encode()
        inner = getattr(packet, "inner", None)
        priority = priority_of(inner.encode()[:18]) if inner is not None else 0
        if self.send_to_orig(now, encoded, orig_node, iface, priority) and count:
            mesh.counters.add("forward", len(encoded) + 14)

    def receive_fragment(self, now: float, iface, frame, data: bytes) -> None:
        """batadv_recv_frag_packet: forward it whole when the packet would not fit the next
        link anyway, else buffer it; a complete packet re-enters the receive path."""
        mesh = self.mesh
        if not self.check_unicast(frame):
            return
        frag = frame.packet
        if mesh.originators.get(frag.orig) is None:
            mesh.counters.drop("fragment_unknown_originator")
            return
        if not mesh.is_my_mac(frag.dest):
            dest_node = mesh.originators.get(frag.dest)
            router = dest_node.router(iface) if dest_node else None
            if router is not None and frag.total_size > router.if_incoming.mtu:
                if frag.ttl < 2:
                    mesh.counters.drop("ttl_exceeded")
                    return
                forwarded = dataclasses.replace(frag, ttl=frag.ttl - 1).encode()
                mesh.counters.add("frag_fwd", len(forwarded) + 14)
                out = router.if_incoming
                mesh.transmit(out, Ethernet(router.addr, out.mac, ETH_P_BATMAN).encode() + forwarded)
                return
        mesh.counters.add("frag_rx", len(data) - 14)
        merged = mesh.reassembly.add(now, frag)
        if merged is None:
            return
        if merged[:1] == b"\x41":
            mesh.counters.drop("fragment_in_fragment")
            return
        mesh.receive_frame(now, iface.name, bytes(data[:14]) + merged)

    def receive_unknown_unicast(self, now: float, iface, frame) -> None:
        """Unicast-class types we do not know are routed on, unless they are for us."""
        if not self.check_unicast(frame):
            return
        packet = dataclasses.replace(frame.packet)
        if self.mesh.is_my_mac(packet.dest):
            self.mesh.counters.drop("unknown_unicast_type")
            return
        self._route(now, iface, packet)

    def receive_unicast_tvlv(self, now: float, iface, frame, data: bytes) -> None:
        """batadv_recv_unicast_tvlv: every node on the path sees the TVLVs (and may answer
        a TT request on the destination's behalf); unhandled ones are routed on."""
        mesh = self.mesh
        if not self.check_unicast(frame):
            return
        packet = dataclasses.replace(frame.packet)
        if not mesh.tvlv.unicast_received(now, packet.src, packet.dst, packet.tvlvs):
            self._route(now, iface, packet, count=False)

    def receive_icmp(self, now: float, iface, frame, data: bytes) -> None:
        mesh = self.mesh
        if not self.check_unicast(frame, "icmp_not_for_us"):
            return
        mesh.icmp.receive(now, iface, frame)
