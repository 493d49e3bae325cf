"""batman-adv ICMP (routing.c batadv_recv_icmp_packet): echo replies, TTL exceeded for
traceroute, record route, and our own pings and traceroute probes. ICMP addressed to us
goes to the handler registered for its msg_type (the throughput meter registers BATADV_TP)."""

from __future__ import annotations

import dataclasses

from batmand.wire import IcmpMsgType, IcmpPacket, IcmpRRPacket, Mac
from batmand.wire.constants import RR_LEN, TTL

from .events import IcmpResult
from .ratelimit import RateLimit


class Icmp:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self._replies = RateLimit(1.0)  # icmp_replies_per_second
        self._handlers: dict[int, object] = {}  # msg_type -> handler(now, packet, padding), for ICMP to us
        self.register(IcmpMsgType.ECHO_REQUEST, self._echo_request)
        for msg_type in (IcmpMsgType.ECHO_REPLY, IcmpMsgType.DESTINATION_UNREACHABLE, IcmpMsgType.TTL_EXCEEDED):
            self.register(msg_type, self._answered)

    def register(self, msg_type: int, handler) -> None:
        """A feature's handler for ICMP of this msg_type addressed to us."""
        self._handlers[msg_type] = handler

    def _may_reply(self, now: float) -> bool:
        if not self._replies.allow(now, self.mesh.config.icmp_replies_per_second):
            self.mesh.counters.drop("icmp_reply_rate")
            return False
        return True

    def send_echo(self, now: float, dst: Mac, *, seqno: int, uid: int, ttl: int, record_route: bool) -> None:
        mesh = self.mesh
        orig_node = mesh.originators.get(dst)
        router = orig_node.router() if orig_node else None
        if mesh.primary is None or router is None:
            mesh.emit(IcmpResult(IcmpMsgType.DESTINATION_UNREACHABLE, dst, seqno, uid, 0, now))
            return
        common = dict(ttl=ttl, msg_type=IcmpMsgType.ECHO_REQUEST, dst=dst, orig=mesh.primary.mac, uid=uid,
                      seqno=seqno)
        if record_route:
            rr = [Mac(router.if_incoming.mac)] + [Mac(bytes(6))] * (RR_LEN - 1)
            packet = IcmpRRPacket(rr_cur=1, rr=rr, **common)
        else:
            packet = IcmpPacket(**common)
        mesh.routing.send_to_orig(now, packet.encode(), orig_node, None)

    def receive(self, now: float, iface, frame) -> None:
        mesh = self.mesh
        packet = dataclasses.replace(frame.packet)
        padding = frame.padding
        if isinstance(packet, IcmpRRPacket):
            if packet.rr_cur >= RR_LEN:
                mesh.counters.drop("icmp_rr_full")
                return
            packet.rr = list(packet.rr)
            packet.rr[packet.rr_cur] = Mac(frame.ethernet.h_dest)
            packet.rr_cur += 1
        if mesh.is_my_mac(packet.dst):
            self._for_me(now, packet, padding)
            return
        if packet.ttl < 2:
            self._ttl_exceeded(now, packet, padding)
            return
        orig_node = mesh.originators.get(packet.dst)
        if orig_node is None:
            mesh.counters.drop("icmp_unknown_destination")
            return
        packet.ttl -= 1
        mesh.routing.send_to_orig(now, packet.encode() + padding, orig_node, iface)

    def _answer(self, now: float, packet, padding: bytes, msg_type: int) -> None:
        mesh = self.mesh
        orig_node = mesh.originators.get(packet.orig)
        if orig_node is None or mesh.primary is None or not self._may_reply(now):
            return
        packet.dst, packet.orig = packet.orig, mesh.primary.mac
        packet.msg_type, packet.ttl = msg_type, TTL
        mesh.routing.send_to_orig(now, packet.encode() + padding, orig_node, None)

    def _for_me(self, now: float, packet, padding: bytes) -> None:
        handler = self._handlers.get(packet.msg_type)
        if handler is None:
            self.mesh.counters.drop("icmp_unknown_msg_type")
            return
        handler(now, packet, padding)

    def _echo_request(self, now: float, packet, padding: bytes) -> None:
        self._answer(now, packet, padding, IcmpMsgType.ECHO_REPLY)

    def _answered(self, now: float, packet, padding: bytes) -> None:
        """An answer to one of our pings or traceroute probes."""
        rr = tuple(packet.rr[: packet.rr_cur]) if isinstance(packet, IcmpRRPacket) else ()
        self.mesh.emit(IcmpResult(packet.msg_type, packet.orig, packet.seqno, packet.uid, packet.ttl, now, rr))

    def _ttl_exceeded(self, now: float, packet, padding: bytes) -> None:
        if packet.msg_type != IcmpMsgType.ECHO_REQUEST:
            self.mesh.counters.drop("icmp_ttl_exceeded")
            return
        self._answer(now, packet, padding, IcmpMsgType.TTL_EXCEEDED)
