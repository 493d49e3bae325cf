"""The throughput meter (the kernel's tp_meter.c, batctl tp): a TCP-like transfer of
ICMP TP messages to another node, which acknowledges every one.

The sender keeps the kernel's congestion control: cwnd starting at 3 MSS, slow start up to
ss_threshold, congestion avoidance (+1 MSS per window, fixed point x8), fast retransmit /
NewReno fast recovery at the third duplicate ACK, and an RTO from the kernel's RTT
estimator (srtt x8, rttvar x4, no lower bound) that doubles on every expiry. After
`test_length` ms the test ends and reports the cumulatively acknowledged bytes. The
receiver acknowledges cumulatively, keeps at most MAX_UNACKED out-of-order ranges, and
forgets a session that is idle for RECV_TIMEOUT. Both roles together are limited to
MAX_SESSIONS per mesh.

Sans-I/O: the mesh feeds ICMP TP packets for us (registered with the core's ICMP receive
path) and timer ticks; the MSGs and ACKs go out through the normal unicast path toward
the originator, and a finished sender emits a TpResult."""

from __future__ import annotations

import os
import struct
from enum import IntEnum

from batmand.wire import IcmpMsgType, IcmpTpPacket, Mac
from batmand.wire.constants import COMPAT_VERSION, TTL, PacketType, TpSubtype

from .config import Range
from .events import TpResult

U32 = 0xFFFFFFFF
UNICAST_HEADER = 10  # struct batadv_unicast_packet: the kernel counts a MSG's payload without it
PLEN = 1500 - 14 - UNICAST_HEADER  # BATADV_TP_PLEN, the "MSS": 1476 bytes of stream per MSG
MSG_LEN = PLEN + UNICAST_HEADER  # a MSG on the wire: 28-byte header + 1458 bytes of payload
FIRST_SEQ = U32 - 2000  # BATADV_TP_FIRST_SEQ: forces a wrap of the byte counter early in the test
AWND = 0x20000000  # cwnd ceiling (the "advertised window")
INITIAL_RTO = 1000  # ms
MAX_RTO = 30000  # ms: an expiry at this RTO ends the test as unreachable
RECV_TIMEOUT = 1.0  # s: a receiver session without MSGs for this long is forgotten
MAX_UNACKED = 100  # out-of-order ranges a receiver keeps (kernel HEAD)
MAX_SESSIONS = 5  # BATADV_TP_MAX_NUM: senders and receivers together
DEF_TEST_LENGTH = 10000  # ms, for a requested length of 0
TEST_LENGTH = Range(0, U32, "ms")  # the netlink attribute is a u32 of ms; 0: DEF_TEST_LENGTH
BURST = 64  # MSGs per call; the rest of an open window goes out at the next tick (keeps the loop responsive)
RETRY = 0.01  # s: after a send that failed (no route), when to try again (the kernel's thread retries at once)

_PRERANDOM = os.urandom(4096)  # the kernel fills its payloads cyclically from 4096 random bytes
_PAYLOAD = MSG_LEN - IcmpTpPacket.HEADER.size
_CYCLE = _PRERANDOM * 2  # so that any payload is one slice
_SEQ_TS = struct.Struct("!II")
_PREFIX = struct.Struct("!BBBB6s6sBB2s")


class TpReason(IntEnum):
    """enum batadv_tp_meter_reason: above 127 are errors."""

    COMPLETE = 3
    CANCEL = 4
    DST_UNREACHABLE = 128
    RESEND_LIMIT = 129
    ALREADY_ONGOING = 130
    MEMORY_ERROR = 131
    CANT_SEND = 132
    TOO_MANY = 133


def seq_before(a: int, b: int) -> bool:
    """batadv_seq_before for u32: a comes before b (signed 32-bit difference below 0)."""
    return (a - b) & U32 >= 0x80000000


def cookie_of(session: bytes, uid: int) -> int:
    """The session cookie userspace sees: uid << 16 | session[0] << 8 | session[1]."""
    return uid << 16 | session[0] << 8 | session[1]


def _cwnd(base: int, increment: int, minimum: int) -> int:
    """batadv_tp_cwnd: saturating add, at most AWND, at least `minimum`."""
    return max(min(base + increment, U32, AWND), minimum)


class TpSender:
    """One test toward `dst`: the kernel's batadv_tp_sender without its thread. Byte
    seqnos are u32; times in ms where the kernel keeps ms."""

    def __init__(self, dst: Mac, session: bytes, uid: int, test_length_ms: int, now: float) -> None:
        self.dst = dst
        self.session = bytes(session)
        self.uid = uid
        self.cookie = cookie_of(self.session, uid)
        self.test_length = test_length_ms or DEF_TEST_LENGTH
        self.start = now
        self.finish_at = now + self.test_length / 1000.0
        self.last_sent = self.last_acked = self.recover = FIRST_SEQ
        self.dup_acks = 0
        self.fast_recovery = False
        self.cwnd = 3 * PLEN
        self.dec_cwnd = 0
        self.ss_threshold = AWND
        self.rto = INITIAL_RTO
        self.srtt = self.rttvar = 0
        self.tot_sent = 0  # bytes acknowledged
        self.rto_at = now + self.rto / 1000.0
        self.retry_at = 0.0  # no sending before this (a send failed)
        self.reason: TpReason | None = None  # the first stop reason wins
        self.retransmits = 0  # MSGs sent again (RTO, fast retransmit, partial ACKs)
        self.rto_expiries = 0
        self.sent = 0  # MSGs sent in all

    def window_left(self) -> int:
        """batadv_tp_avail: bytes the window still allows past last_sent."""
        limit = (self.last_acked + self.cwnd) & U32
        return (limit - self.last_sent) & U32 if seq_before(self.last_sent, limit) else 0

    def can_send(self, now: float) -> bool:
        return self.reason is None and now >= self.retry_at and self.window_left() >= PLEN

    def stop(self, reason: TpReason) -> None:
        if self.reason is None:
            self.reason = reason

    def arm(self, now: float) -> None:
        """batadv_tp_reset_sender_timer."""
        if self.reason is None:
            self.rto_at = now + self.rto / 1000.0

    def update_rto(self, rtt: int) -> None:
        """batadv_tp_update_rto (RFC 6298 the way tcp_rtt_estimator keeps it; u32 fields)."""
        m = rtt
        if self.srtt:
            m -= self.srtt >> 3
            self.srtt = (self.srtt + m) & U32
            m = abs(m) - (self.rttvar >> 2)
            self.rttvar = (self.rttvar + m) & U32
        else:
            self.srtt = (m << 3) & U32
            self.rttvar = (m << 1) & U32
        self.rto = ((self.srtt >> 3) + self.rttvar) & U32

    def _update_cwnd(self, mss: int) -> None:
        if self.cwnd <= self.ss_threshold:  # slow start
            self.dec_cwnd = 0
            self.cwnd = _cwnd(self.cwnd, mss, mss)
            return
        mss = min(mss, (1 << 14) - 1)
        self.dec_cwnd += max(1 << 3, ((mss * mss) << 3) // self.cwnd)
        if self.dec_cwnd < mss << 3:
            return
        self.cwnd = _cwnd(self.cwnd, mss, mss)
        self.dec_cwnd = 0

    def on_ack(self, now_ms: int, ack: int, timestamp: int) -> tuple[bool, bool]:
        """batadv_tp_recv_ack + batadv_tp_handle_ack: (counted, resend). `counted` is False
        for an old ACK (nothing changes, the timer is not re-armed); `resend`: send the MSG
        at `ack` again now (fast retransmit, or a partial ACK in fast recovery)."""
        if seq_before(ack, self.last_acked):
            return False, False
        rtt = (now_ms - timestamp) & U32
        if timestamp and rtt:
            self.update_rto(rtt)
        mss = PLEN
        if ack == self.last_acked:
            if self.dup_acks > 3:
                return True, False
            self.dup_acks += 1
            if self.dup_acks != 3 or not seq_before(self.recover, ack):
                return True, False
            self.fast_recovery = True  # RFC 6582 3.2 step 1
            self.recover = self.last_sent
            self.ss_threshold = self.cwnd >> 1
            self.cwnd = _cwnd(self.ss_threshold, 3 * mss, mss)
            self.dec_cwnd = 0
            self.last_sent = ack
            return True, True
        acked = (ack - self.last_acked) & U32
        self.tot_sent += acked
        self.dup_acks = 0
        resend = False
        if self.fast_recovery:
            if seq_before(ack, self.recover):  # partial ACK: another hole
                resend = True
                self.cwnd = _cwnd(self.cwnd, mss, mss)
            else:
                self.fast_recovery = False
                self.cwnd = _cwnd(self.ss_threshold, 0, mss)
        elif acked >= mss:
            self._update_cwnd(mss)
        self.last_acked = ack
        return True, resend

    def on_rto(self, now: float) -> None:
        """batadv_tp_sender_timeout: back off, restart from slow start, resend all unacked."""
        if self.rto >= MAX_RTO:
            self.stop(TpReason.DST_UNREACHABLE)
            return
        self.rto_expiries += 1
        self.rto = (self.rto * 2) & U32
        self.ss_threshold = max(self.cwnd >> 1, 2 * PLEN)
        self.cwnd = 3 * PLEN
        self.retransmits += ((self.last_sent - self.last_acked) & U32) // PLEN
        self.last_sent = self.last_acked
        self.arm(now)

    def result(self, now: float) -> TpResult:
        """batadv_tp_batctl_notify: not an error (complete or cancelled) reports COMPLETE
        with the time and the acked bytes so far; an error reports only itself."""
        reason = self.reason if self.reason is not None else TpReason.COMPLETE
        if reason > 127:
            return TpResult(self.cookie, self.dst, int(reason), 0, 0)
        elapsed = max(0, int((now - self.start) * 1000))
        return TpResult(self.cookie, self.dst, int(TpReason.COMPLETE), elapsed, self.tot_sent)


class TpReceiver:
    """The far end of one test (kernel HEAD's batadv_tp_receiver): the next byte expected
    and the out-of-order ranges [seqno, len], ascending, at most MAX_UNACKED."""

    def __init__(self, other_end: Mac, session: bytes, now: float) -> None:
        self.other_end = other_end
        self.session = bytes(session)
        self.last_recv = FIRST_SEQ
        self.last_recv_time = now
        self.check_at = now + RECV_TIMEOUT  # the kernel's shutdown timer
        self.unacked: list[list[int]] = []

    def on_msg(self, seqno: int, length: int) -> int:
        """batadv_tp_recv_msg: the cumulative ACK to send for this MSG."""
        end = (seqno + length) & U32
        if seq_before(end, self.last_recv):
            return self.last_recv  # a duplicate: its ACK may have been lost
        if seq_before(self.last_recv, seqno):
            self._out_of_order(seqno, length)
            return self.last_recv  # a duplicate ACK (three make the sender retransmit)
        self.last_recv = end
        self._ack_unordered()
        return self.last_recv

    def _out_of_order(self, seqno: int, length: int) -> None:
        """batadv_tp_handle_out_of_order: merge into or insert among the stored ranges
        (searching from the end: most MSGs are newer than all stored), then swallow the
        ranges the new one now reaches, and drop the highest beyond MAX_UNACKED."""
        ranges = self.unacked
        end = (seqno + length) & U32
        new = None
        pos = 0
        for i in range(len(ranges) - 1, -1, -1):
            start, size = ranges[i]
            if seq_before(seqno, start):
                continue
            if not seq_before((start + size) & U32, seqno):  # overlapping or adjacent
                if not seq_before(end, (start + size) & U32):
                    ranges[i][1] = (end - start) & U32
                new = i
            else:
                pos = i + 1
            break
        if new is None:
            ranges.insert(pos, [seqno, length])
            new = pos
        first = ranges[new][0]
        while new + 1 < len(ranges):
            start, size = ranges[new + 1]
            if seq_before(end, start):
                break
            if seq_before(end, (start + size) & U32):
                end = (start + size) & U32
                ranges[new][1] = (end - first) & U32
            del ranges[new + 1]
        if len(ranges) > MAX_UNACKED:
            ranges.pop()

    def _ack_unordered(self) -> None:
        """batadv_tp_ack_unordered: stored ranges the stream now reaches are acked too."""
        ranges = self.unacked
        while ranges:
            start, size = ranges[0]
            if seq_before(self.last_recv, start):
                break
            end = (start + size) & U32
            if seq_before(self.last_recv, end):
                self.last_recv = end
            del ranges[0]


class TpMeter:
    """The mesh's throughput-meter sessions, both roles."""

    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.senders: dict[Mac, TpSender] = {}  # by destination (one test per peer)
        self.receivers: dict[tuple[Mac, bytes], TpReceiver] = {}  # by (sender, session)
        self._offset = 0  # into the prerandom payload bytes
        mesh.icmp.register(IcmpMsgType.TP, self.receive)

    @property
    def sessions(self) -> int:
        return len(self.senders) + len(self.receivers)

    # --- the sender ---------------------------------------------------------------------------

    def start(self, now: float, dst: Mac, test_length_ms: int = 0) -> int:
        """batadv_tp_start: a test toward `dst`; the cookie it reports under. An error
        (unreachable, already ongoing, too many) is reported as a TpResult at once."""
        mesh = self.mesh
        if not TEST_LENGTH.lo <= test_length_ms <= TEST_LENGTH.hi:
            raise ValueError(f"test length {test_length_ms} ms is out of range ({TEST_LENGTH.describe()})")
        dst = Mac(dst)
        session, uid = bytes(mesh.rng.getrandbits(8) for _ in range(2)), mesh.rng.getrandbits(8)
        sender = TpSender(dst, session, uid, test_length_ms, now)
        if mesh.primary is None:
            return self._fail(sender, TpReason.DST_UNREACHABLE)
        if dst in self.senders or any(r.other_end == dst for r in self.receivers.values()):
            return self._fail(sender, TpReason.ALREADY_ONGOING)
        if self.sessions >= MAX_SESSIONS:
            return self._fail(sender, TpReason.TOO_MANY)
        if mesh.originators.get(dst) is None:
            return self._fail(sender, TpReason.DST_UNREACHABLE)
        self.senders[dst] = sender
        self._pump(now, sender)
        return sender.cookie

    def _fail(self, sender: TpSender, reason: TpReason) -> int:
        sender.stop(reason)
        self.mesh.emit(sender.result(sender.start))
        return sender.cookie

    def cancel(self, now: float, dst: Mac) -> bool:
        """batadv_tp_stop: end the test toward `dst` now; it reports what it measured so
        far (as COMPLETE, like the kernel). As there, only while `dst` is an originator."""
        sender = self.senders.get(Mac(dst))
        if sender is None or self.mesh.originators.get(sender.dst) is None:
            return False
        sender.stop(TpReason.CANCEL)
        self._end(now, sender)
        return True

    def _end(self, now: float, sender: TpSender) -> None:
        if self.senders.get(sender.dst) is sender:
            del self.senders[sender.dst]
            self.mesh.emit(sender.result(now))

    def _send_msg(self, now: float, sender: TpSender, orig_node, prefix: bytes, seqno: int) -> bool:
        """batadv_tp_send_msg: one MSG at `seqno`, stamped with our clock in ms."""
        off = self._offset
        self._offset = (off + _PAYLOAD) % len(_PRERANDOM)
        packet = prefix + _SEQ_TS.pack(seqno, int(now * 1000) & U32) + _CYCLE[off:off + _PAYLOAD]
        if not self.mesh.routing.send_to_orig(now, packet, orig_node, None):
            return False
        sender.sent += 1
        return True

    def _prefix(self, sender: TpSender, orig: Mac) -> bytes:
        return _PREFIX.pack(PacketType.ICMP, COMPAT_VERSION, TTL, IcmpMsgType.TP, sender.dst, orig, sender.uid,
                            TpSubtype.MSG, sender.session)

    def _pump(self, now: float, sender: TpSender) -> None:
        """The kernel's send loop, one burst: MSGs while the window has room. A send that
        fails (no route now) does not advance last_sent and is tried again shortly."""
        mesh = self.mesh
        orig_node = mesh.originators.get(sender.dst)
        if orig_node is None or mesh.primary is None:
            sender.retry_at = now + RETRY
            return
        prefix = self._prefix(sender, mesh.primary.mac)
        for _ in range(BURST):
            if not sender.can_send(now):
                return
            if not self._send_msg(now, sender, orig_node, prefix, sender.last_sent):
                sender.retry_at = now + RETRY
                return
            sender.last_sent = (sender.last_sent + PLEN) & U32

    def _on_ack(self, now: float, packet: IcmpTpPacket) -> None:
        mesh = self.mesh
        sender = self.senders.get(packet.orig)
        if sender is None or sender.session != bytes(packet.session) or sender.reason is not None:
            mesh.counters.drop("tp_ack_unknown_session")
            return
        orig_node = mesh.originators.get(packet.orig)
        if orig_node is None or mesh.primary is None:
            return
        counted, resend = sender.on_ack(int(now * 1000) & U32, packet.seqno, packet.timestamp)
        if not counted:
            mesh.counters.drop("tp_ack_old")
            return
        sender.arm(now)
        if resend:
            sender.retransmits += 1
            self._send_msg(now, sender, orig_node, self._prefix(sender, mesh.primary.mac), packet.seqno)
        self._pump(now, sender)

    # --- the receiver -------------------------------------------------------------------------

    def _on_msg(self, now: float, packet: IcmpTpPacket) -> None:
        mesh = self.mesh
        key = (packet.orig, bytes(packet.session))
        receiver = self.receivers.get(key)
        if receiver is None:
            # only the first MSG of a test opens a session (if it is lost, the sender's
            # retransmission after its RTO does)
            if packet.seqno != FIRST_SEQ:
                mesh.counters.drop("tp_msg_unknown_session")
                return
            if self.sessions >= MAX_SESSIONS:
                mesh.counters.drop("tp_too_many_sessions")
                return
            receiver = self.receivers[key] = TpReceiver(Mac(packet.orig), key[1], now)
        receiver.last_recv_time = now
        # what the kernel counts: the ICMP packet as received, minus a unicast header
        length = IcmpTpPacket.HEADER.size + len(packet.data) - UNICAST_HEADER
        self._send_ack(now, packet, receiver.on_msg(packet.seqno, length))

    def _send_ack(self, now: float, msg: IcmpTpPacket, seqno: int) -> None:
        """batadv_tp_send_ack: 28 bytes, echoing the MSG's uid, session and timestamp."""
        mesh = self.mesh
        orig_node = mesh.originators.get(msg.orig)
        if orig_node is None or mesh.primary is None:
            mesh.counters.drop("tp_ack_no_route")
            return
        ack = IcmpTpPacket(dst=orig_node.orig, orig=mesh.primary.mac, uid=msg.uid, subtype=TpSubtype.ACK,
                           session=bytes(msg.session), seqno=seqno, timestamp=msg.timestamp)
        mesh.routing.send_to_orig(now, ack.encode(), orig_node, None)

    # --- the core's entry points -----------------------------------------------------------------

    def receive(self, now: float, packet, padding: bytes) -> None:
        """batadv_tp_meter_recv: an ICMP TP packet addressed to us."""
        if packet.subtype == TpSubtype.MSG:
            self._on_msg(now, packet)
        elif packet.subtype == TpSubtype.ACK:
            self._on_ack(now, packet)
        else:
            self.mesh.counters.drop("tp_unknown_subtype")

    def tick(self, now: float) -> None:
        for sender in list(self.senders.values()):
            if now >= sender.finish_at:
                sender.stop(TpReason.COMPLETE)
            elif now >= sender.rto_at:
                sender.on_rto(now)
            if sender.reason is not None:
                self._end(now, sender)
            else:
                self._pump(now, sender)
        for key, receiver in list(self.receivers.items()):
            if now >= receiver.check_at:
                if now - receiver.last_recv_time > RECV_TIMEOUT:
                    del self.receivers[key]
                else:
                    receiver.check_at = now + RECV_TIMEOUT

    def next_deadline(self) -> float:
        if not (self.senders or self.receivers):
            return float("inf")  # (asked after every batch of frames)
        times = [r.check_at for r in self.receivers.values()]
        for s in self.senders.values():
            times += (s.finish_at, s.rto_at)
            if s.window_left() >= PLEN:  # more to send: now, or when the failed send may be retried
                times.append(s.retry_at)
        return min(times, default=float("inf"))

    def rows(self, now: float) -> list[dict]:
        """What runs now (for the daemon's status)."""
        out = [{"role": "sender", "peer": str(s.dst), "cookie": s.cookie, "cwnd": s.cwnd, "rto_ms": s.rto,
                "acked_bytes": s.tot_sent, "retransmits": s.retransmits} for s in self.senders.values()]
        out += [{"role": "receiver", "peer": str(r.other_end), "session": r.session.hex(),
                 "next_seqno": r.last_recv, "out_of_order": len(r.unacked)} for r in self.receivers.values()]
        return out
