"""The throughput meter (tp_meter.c) between two simulated cores: a test over a link with a
rate, loss and reordering completes and reports plausible numbers; the kernel's
congestion control, RTT estimator and receiver bookkeeping in worked examples; session
limits, timeouts and hostile input."""

from __future__ import annotations

import random

import pytest

from batmand.core import tp_meter as tp
from batmand.core.config import MeshConfig
from batmand.core.events import TpResult
from batmand.core.tp_meter import FIRST_SEQ, PLEN, U32, TpReason, TpReceiver, TpSender
from batmand.sim import Network
from batmand.wire import IcmpTpPacket, Mac, build_frame
from batmand.wire.constants import TpSubtype

RATE = 1.25e6  # bytes/s: a 10 Mbit/s link


def _pair(seed: int = 3, **segment) -> Network:
    net = Network(seed=seed, config=MeshConfig(orig_interval_ms=200))
    net.add_node("A")
    net.add_node("B")
    link = net.link("A", "B")
    net.run_for(3)  # routes both ways
    for key, value in segment.items():
        setattr(link, key, value)
    return net


def _start(net: Network, name: str, dst: Mac, length_ms: int) -> int:
    node = net.nodes[name]
    cookie, actions = node.mesh.tp_start(net.now, dst, length_ms)
    net._handle(node, actions)
    return cookie


def _run_test(net: Network, length_ms: int = 2000):
    a, b = net.nodes["A"], net.nodes["B"]
    cookie = _start(net, "A", b.orig, length_ms)
    sender = a.mesh.tp.senders[b.orig]
    net.run_for(length_ms / 1000 + 0.05)
    (when, result), = a.tp
    assert result.cookie == cookie and result.dst == b.orig
    return sender, result


def test_a_test_fills_the_link_and_reports_what_was_acked():
    net = _pair(rate=RATE)
    sender, result = _run_test(net)
    assert result.result == TpReason.COMPLETE and result.test_time_ms == 2000
    # the payload share of 1500-byte frames on a 10 Mbit/s link, less slow start
    assert 0.85 * RATE * 2 * PLEN / 1500 < result.total_bytes <= RATE * 2
    assert result.total_bytes % PLEN == 0 and result.total_bytes == sender.tot_sent
    assert sender.tot_sent == (sender.last_acked - FIRST_SEQ) & U32  # the u32 stream wrapped early on
    assert sender.cwnd > 3 * PLEN
    receiver, = net.nodes["B"].mesh.tp.receivers.values()
    assert not tp.seq_before(receiver.last_recv, sender.last_acked)  # it received all that was acked
    assert net.nodes["A"].mesh.tp.senders == {}
    # the receiver forgets the test once it has been idle for a second (checked every second)
    net.run_for(2.1)
    assert net.nodes["B"].mesh.tp.receivers == {}


@pytest.mark.parametrize("loss", [0.01, 0.05])
def test_loss_is_repaired_by_retransmissions(loss):
    net = _pair(rate=RATE)
    net.find_segment("A", "B").loss[("A", "B")] = loss
    sender, result = _run_test(net)
    assert result.result == TpReason.COMPLETE
    assert sender.retransmits > 0
    assert result.total_bytes > 0.4 * RATE * 2
    receiver, = net.nodes["B"].mesh.tp.receivers.values()
    # every byte the sender counts was received in order by the far end
    assert (receiver.last_recv - FIRST_SEQ) & U32 >= result.total_bytes


def test_lost_acks_and_reordering():
    shuffle = random.Random(5)
    net = _pair(rate=RATE, delay=lambda src, dst, frame: 0.004 if src == "A" and shuffle.random() < 0.05 else 0.0)
    net.find_segment("A", "B").loss[("B", "A")] = 0.02
    sender, result = _run_test(net)
    assert result.result == TpReason.COMPLETE and result.total_bytes > 0.5 * RATE * 2
    assert sender.retransmits > 0  # reordered MSGs made duplicate ACKs: fast retransmit


def test_cumulative_ack_across_the_u32_wrap():
    r = TpReceiver(Mac("02:00:00:00:00:01"), b"\x01\x02", 0.0)
    assert r.on_msg(FIRST_SEQ, PLEN) == FIRST_SEQ + PLEN
    second = (FIRST_SEQ + PLEN) & U32  # 0xFFFFFDEB: this MSG crosses 2^32
    third = (second + PLEN) & U32
    assert third < second  # wrapped
    fourth = (third + PLEN) & U32
    # the third and fourth arrive before the second: duplicate ACKs, two ranges merged into one
    assert r.on_msg(fourth, PLEN) == second
    assert r.on_msg(third, PLEN) == second
    assert r.unacked == [[third, 2 * PLEN]]
    # the hole is filled: the ACK jumps past both, beyond the wrap
    assert r.on_msg(second, PLEN) == (fourth + PLEN) & U32 and r.unacked == []
    # an old MSG is acked with the current position
    assert r.on_msg(FIRST_SEQ, PLEN) == (fourth + PLEN) & U32


def test_out_of_order_ranges_are_bounded():
    r = TpReceiver(Mac("02:00:00:00:00:01"), b"\x01\x02", 0.0)
    r.on_msg(FIRST_SEQ, PLEN)
    base = (FIRST_SEQ + PLEN) & U32
    for i in range(300, 0, -1):  # every other MSG, newest first: none adjacent
        r.on_msg((base + 2 * i * PLEN) & U32, PLEN)
    assert len(r.unacked) == tp.MAX_UNACKED
    starts = [(s - base) & U32 for s, _ in r.unacked]
    assert starts == sorted(starts) and starts[0] == 2 * PLEN  # the highest ranges were dropped
    # the gaps filled one by one: the ACK walks over the stored ranges
    for i in [0] + list(range(1, 2 * tp.MAX_UNACKED, 2)):
        ack = r.on_msg((base + i * PLEN) & U32, PLEN)
    assert ack == (base + (2 * tp.MAX_UNACKED + 1) * PLEN) & U32 and r.unacked == []


def test_fast_retransmit_at_the_third_duplicate_ack():
    s = TpSender(Mac("02:00:00:00:00:01"), b"\x00\x01", 7, 1000, 0.0)
    assert s.cookie == 7 << 16 | 1
    s.last_sent = (FIRST_SEQ + 10 * PLEN) & U32
    s.cwnd = 10 * PLEN
    ack = (FIRST_SEQ + 2 * PLEN) & U32
    assert s.on_ack(100, ack, 0) == (True, False)  # new data
    assert s.tot_sent == 2 * PLEN
    assert s.on_ack(100, ack, 0) == (True, False)
    assert s.on_ack(100, ack, 0) == (True, False)
    assert s.on_ack(100, ack, 0) == (True, True)  # the third duplicate: resend at ack
    assert s.fast_recovery and s.last_sent == ack and s.recover == (FIRST_SEQ + 10 * PLEN) & U32
    assert s.ss_threshold == 11 * PLEN >> 1 and s.cwnd == (11 * PLEN >> 1) + 3 * PLEN
    assert s.on_ack(100, ack, 0) == (True, False)  # a fourth: no second retransmit
    assert s.on_ack(100, (FIRST_SEQ + 5 * PLEN) & U32, 0) == (True, True)  # partial ACK: another hole
    assert s.on_ack(100, (FIRST_SEQ + 10 * PLEN) & U32, 0) == (True, False)  # all acked: recovery ends
    assert not s.fast_recovery and s.cwnd == 11 * PLEN >> 1
    assert s.on_ack(100, ack, 0) == (False, False)  # old


def test_rtt_estimator_and_rto_backoff():
    s = TpSender(Mac("02:00:00:00:00:01"), b"\x00\x01", 7, 1000, 0.0)
    assert s.rto == 1000 and s.cwnd == 3 * PLEN and s.ss_threshold == tp.AWND
    s.on_ack(1100, (FIRST_SEQ + PLEN) & U32, 1000)  # rtt 100
    assert (s.srtt, s.rttvar, s.rto) == (800, 200, 300)
    s.on_ack(1400, (FIRST_SEQ + 2 * PLEN) & U32, 1200)  # rtt 200
    assert (s.srtt, s.rttvar, s.rto) == (900, 250, 362)
    s.on_ack(1500, (FIRST_SEQ + 3 * PLEN) & U32, 0)  # no timestamp: no sample
    assert s.rto == 362
    cwnd = s.cwnd
    s.on_rto(2.0)
    assert s.rto == 724 and s.cwnd == 3 * PLEN and s.ss_threshold == max(cwnd >> 1, 2 * PLEN)
    assert s.last_sent == s.last_acked


def test_congestion_avoidance_grows_one_mss_per_window():
    s = TpSender(Mac("02:00:00:00:00:01"), b"\x00\x01", 7, 1000, 0.0)
    s.cwnd = s.ss_threshold = 10 * PLEN
    s.cwnd += 1  # just above the threshold: avoidance
    ack = FIRST_SEQ
    # each ACK adds (1476^2 * 8) // cwnd = 1180 of the 11808 (MSS x 8) that make one MSS:
    # the window has grown by one after 11 ACKs (integer steps), not 10
    for step in range(11):
        assert s.cwnd == 10 * PLEN + 1
        ack = (ack + PLEN) & U32
        s.last_sent = (ack + 20 * PLEN) & U32
        s.on_ack(0, ack, 0)
    assert s.cwnd == 11 * PLEN + 1 and s.dec_cwnd == 0


def test_silent_peer_completes_with_nothing_then_long_tests_end_unreachable():
    net = _pair()
    a, b = net.nodes["A"], net.nodes["B"]
    net.stop("B")
    _start(net, "A", b.orig, 5000)
    net.run_for(5.1)
    (_, result), = a.tp
    assert (result.result, result.total_bytes, result.test_time_ms) == (TpReason.COMPLETE, 0, 5000)
    net.start("B")
    net.run_for(3)
    net.stop("B")
    _start(net, "A", b.orig, 120000)
    # RTO 1 s, doubling: expiries at 1, 3, 7, 15, 31 s; at 63 s it is 32 s >= 30 s: unreachable
    net.run_for(62.5)
    assert len(a.tp) == 1
    net.run_for(1)
    assert a.tp[1][1].result == TpReason.DST_UNREACHABLE and a.tp[1][1].test_time_ms == 0


def test_errors_are_reported_with_the_kernels_reasons():
    net = _pair(rate=RATE)
    a, b = net.nodes["A"], net.nodes["B"]
    _start(net, "A", Mac("02:99:00:00:00:01"), 1000)
    assert a.tp[-1][1].result == TpReason.DST_UNREACHABLE
    _start(net, "A", b.orig, 1000)
    cookie = _start(net, "A", b.orig, 1000)
    assert a.tp[-1][1] == TpResult(cookie, b.orig, TpReason.ALREADY_ONGOING, 0, 0)
    net.run_for(0.3)
    # B already receives from A: B cannot test toward A either
    _start(net, "B", a.orig, 1000)
    assert b.tp[-1][1].result == TpReason.ALREADY_ONGOING
    # cancelled: reported as complete with what was measured so far
    net._handle(a, a.mesh.tp_cancel(net.now, b.orig))
    result = a.tp[-1][1]
    assert result.result == TpReason.COMPLETE and 250 <= result.test_time_ms <= 350 and result.total_bytes > 0
    with pytest.raises(ValueError, match="test length"):
        a.mesh.tp_start(net.now, b.orig, -1)


def _msg(net: Network, src: str, dst: str, session: bytes, seqno: int, *, subtype=TpSubtype.MSG,
         data: bytes = bytes(1458)) -> bytes:
    s, d = net.nodes[src], net.nodes[dst]
    packet = IcmpTpPacket(dst=d.orig, orig=s.orig, uid=1, subtype=subtype, session=session, seqno=seqno,
                          timestamp=5, data=data)
    return build_frame(d.orig, s.orig, packet)


def _inject(net: Network, dst: str, frame: bytes) -> list:
    node = net.nodes[dst]
    actions = node.mesh.receive(net.now, "if0", frame)
    net._handle(node, actions)
    return [x for x in actions if hasattr(x, "frame")]


def test_session_limit_counts_senders_and_receivers():
    net = _pair()
    b = net.nodes["B"]
    for i in range(tp.MAX_SESSIONS):
        (ack,) = _inject(net, "B", _msg(net, "A", "B", bytes([0, i]), FIRST_SEQ))
        reply = IcmpTpPacket.decode(ack.frame, 14)[0]
        assert (reply.subtype, reply.seqno, reply.session, reply.timestamp) == (1, FIRST_SEQ + PLEN, bytes([0, i]), 5)
    assert b.mesh.tp.sessions == tp.MAX_SESSIONS
    assert _inject(net, "B", _msg(net, "A", "B", b"\x00\x09", FIRST_SEQ)) == []  # no ACK, no session
    assert b.mesh.counters["drop_tp_too_many_sessions"] == 1
    net.nodes["A"].mesh.tp.senders.clear()
    _start(net, "B", net.nodes["A"].orig, 1000)
    assert b.tp[-1][1].result in (TpReason.TOO_MANY, TpReason.ALREADY_ONGOING)


def test_receiver_idle_timeout():
    net = _pair()
    b = net.nodes["B"]
    _inject(net, "B", _msg(net, "A", "B", b"\x00\x01", FIRST_SEQ))
    net.run_for(0.9)
    _inject(net, "B", _msg(net, "A", "B", b"\x00\x01", FIRST_SEQ + PLEN))
    net.run_for(0.5)  # the check at 1 s saw a MSG 0.1 s before
    assert len(b.mesh.tp.receivers) == 1
    net.run_for(1.0)  # the check at 2 s: idle for 1.1 s
    assert b.mesh.tp.receivers == {}
    # a MSG of a forgotten session opens nothing
    assert _inject(net, "B", _msg(net, "A", "B", b"\x00\x01", (FIRST_SEQ + 2 * PLEN) & U32)) == []
    assert b.mesh.counters["drop_tp_msg_unknown_session"] == 1


def test_hostile_input_is_counted_and_dropped():
    net = _pair()
    a, b = net.nodes["A"], net.nodes["B"]
    # an ACK no test of ours is waiting for
    assert _inject(net, "A", _msg(net, "B", "A", b"\x07\x07", FIRST_SEQ, subtype=TpSubtype.ACK, data=b"")) == []
    assert a.mesh.counters["drop_tp_ack_unknown_session"] == 1
    # an unknown subtype
    _inject(net, "B", _msg(net, "A", "B", b"\x00\x01", FIRST_SEQ, subtype=7))
    assert b.mesh.counters["drop_tp_unknown_subtype"] == 1
    # truncated below the 28-byte TP header: malformed
    frame = _msg(net, "A", "B", b"\x00\x01", FIRST_SEQ, data=b"")
    before = b.mesh.counters["drop_malformed"]
    _inject(net, "B", frame[:14 + 24])
    assert b.mesh.counters["drop_malformed"] == before + 1
    assert b.mesh.tp.receivers == {}
    # an out-of-order flood keeps at most MAX_UNACKED ranges
    _inject(net, "B", _msg(net, "A", "B", b"\x00\x02", FIRST_SEQ))
    for i in range(400):
        _inject(net, "B", _msg(net, "A", "B", b"\x00\x02", (FIRST_SEQ + (3 + 2 * i) * PLEN) & U32))
    receiver, = b.mesh.tp.receivers.values()
    assert len(receiver.unacked) == tp.MAX_UNACKED
    assert b.mesh.counters["drop_icmp_unknown_msg_type"] == 0


def test_a_test_across_a_relay():
    net = Network(seed=4, config=MeshConfig(orig_interval_ms=200))
    for name in "ABC":
        net.add_node(name)
    net.link("A", "B").rate = RATE
    net.link("B", "C").rate = RATE
    net.run_for(4)
    c = net.nodes["C"]
    _start(net, "A", c.orig, 1000)
    net.run_for(1.05)
    (_, result), = net.nodes["A"].tp
    assert result.result == TpReason.COMPLETE and result.total_bytes > 0.7 * RATE
    assert net.nodes["B"].mesh.tp.sessions == 0 and net.nodes["B"].mesh.counters["rx_icmp"] > 500
