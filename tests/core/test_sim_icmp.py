"""batman-adv ICMP across a simulated line: ping, traceroute, record route, unreachable;
and what the core does with input that is not for it or not valid."""

import pytest

from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.sim import Network
from batmand.wire import BROADCAST, IcmpMsgType, IcmpPacket, Mac, build_frame


@pytest.fixture(scope="module")
def line():
    net = Network(seed=7)
    for name in "ABCDE":
        net.add_node(name)
    for a, b in zip("ABCD", "BCDE"):
        net.link(a, b)
    net.run_for(15)
    return net


def test_ping_across_four_hops(line):
    a, e = line.nodes["A"], line.nodes["E"]
    before = len(a.icmp)
    line.ping("A", e.orig, seqno=11, uid=3)
    line.run_for(0.1)
    (reply,) = a.icmp[before:]
    assert reply.msg_type == IcmpMsgType.ECHO_REPLY and reply.orig == e.orig
    assert (reply.seqno, reply.uid) == (11, 3)
    assert reply.ttl == 50 - 3  # sent with 50, decremented by D, C and B


def test_traceroute_names_every_hop(line):
    a = line.nodes["A"]
    hops = []
    for ttl in range(1, 6):
        before = len(a.icmp)
        line.ping("A", line.nodes["E"].orig, seqno=100 + ttl, ttl=ttl)
        line.run_for(0.1)
        (answer,) = a.icmp[before:]
        hops.append((answer.msg_type, line.owner_of(answer.orig)))
        if answer.msg_type == IcmpMsgType.ECHO_REPLY:
            break
    assert hops == [(IcmpMsgType.TTL_EXCEEDED, "B"), (IcmpMsgType.TTL_EXCEEDED, "C"),
                    (IcmpMsgType.TTL_EXCEEDED, "D"), (IcmpMsgType.ECHO_REPLY, "E")]


def test_record_route(line):
    a = line.nodes["A"]
    before = len(a.icmp)
    line.ping("A", line.nodes["C"].orig, seqno=1, record_route=True)
    line.run_for(0.1)
    (reply,) = a.icmp[before:]
    # every receiving interface on the way there and back, starting with A's own
    owners = [line.owner_of(mac) for mac in reply.rr]
    assert owners == ["A", "B", "C", "B", "A"]


def test_unreachable_destination(line):
    a = line.nodes["A"]
    before = len(a.icmp)
    line.ping("A", Mac("02:99:99:99:99:99"), seqno=1)
    (result,) = a.icmp[before:]
    assert result.msg_type == IcmpMsgType.DESTINATION_UNREACHABLE


def test_garbage_is_counted_and_dropped():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:01"))
    mesh.add_interface(0.0, "eth0", Mac("02:00:00:00:00:02"))
    for data in (b"", b"\x00" * 5, bytes(14), b"\xff" * 6 + b"\x02" * 6 + b"\x43\x05\x99\x0f", b"\x01" * 100):
        assert all(not hasattr(a, "frame") for a in mesh.receive(1.0, "eth0", data))
    assert mesh.counters["drop_malformed"] == 5
    # ICMP addressed to somebody else's MAC is not ours to handle
    icmp = IcmpPacket(msg_type=IcmpMsgType.ECHO_REQUEST, dst=Mac("02:00:00:00:00:02"), orig=Mac("02:00:00:00:00:09"))
    mesh.receive(1.0, "eth0", build_frame(Mac("02:00:00:00:00:77"), Mac("02:00:00:00:00:09"), icmp))
    assert mesh.counters["drop_icmp_not_for_us"] == 1
    mesh.receive(1.0, "eth0", build_frame(BROADCAST, Mac("02:00:00:00:00:09"), icmp))
    assert mesh.counters["drop_icmp_not_for_us"] == 2
    mesh.receive(1.0, "nope", b"\x00" * 60)
    assert mesh.counters["drop_inactive_interface"] == 1
    with pytest.raises(ValueError, match="already part of the mesh"):
        mesh.add_interface(1.0, "eth0", Mac("02:00:00:00:00:03"))


def _drive(net, node_name, session, until):
    """Run a ping/traceroute session on a simulated node until it is finished."""
    from batmand.core.ping import TracerouteSession

    node = net.nodes[node_name]
    seen = 0
    while net.now < until:
        for item in session.due(net.now):
            seqno, ttl = item if isinstance(session, TracerouteSession) else (item, 50)
            net.ping(node_name, session.dst, seqno=seqno, ttl=ttl, uid=session.uid)
        net.run_for(0.05)
        for result in node.icmp[seen:]:
            session.on_result(result)
        seen = len(node.icmp)
        if getattr(session, "finished", False) or getattr(session, "done", False):
            break


def test_ping_session_counts_and_rtts(line):
    from batmand.core.ping import PingSession

    session = PingSession(dst=line.nodes["D"].orig, uid=9, count=3, interval=0.2)
    _drive(line, "A", session, line.now + 5)
    summary = session.summary()
    assert summary["transmitted"] == 3 and summary["received"] == 3 and summary["loss_percent"] == 0
    assert all(r.kind == "reply" and r.ttl == 48 and r.rtt < 0.01 for r in session.results)


def test_ping_session_times_out_when_the_far_end_is_gone(line):
    from batmand.core.ping import PingSession

    session = PingSession(dst=line.nodes["E"].orig, uid=10, count=2, interval=0.2, timeout=0.5)
    segment = line.find_segment("D", "E")
    segment.up = False
    try:
        _drive(line, "A", session, line.now + 5)
    finally:
        segment.up = True
    assert [r.kind for r in session.results] == ["timeout", "timeout"]
    assert session.summary()["loss_percent"] == 100


def test_traceroute_session(line):
    from batmand.core.ping import TracerouteSession

    session = TracerouteSession(dst=line.nodes["E"].orig, uid=11)
    _drive(line, "A", session, line.now + 10)
    assert session.done and len(session.hops) == 4
    assert [line.owner_of(hop[0].orig) for hop in session.hops] == ["B", "C", "D", "E"]
    assert all(len(hop) == 3 for hop in session.hops)
