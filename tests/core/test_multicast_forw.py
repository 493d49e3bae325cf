"""The MCAST packet type in the simulator (the kernel's multicast_forw.c): with every node
capable, a host's multicast goes as one MCAST packet whose tracker lists the listeners;
each hop splits it per next hop and delivers it when listed; the mcast_* counters count it.
Worked cases for the tracker's order and padding, and hostile packets counted and dropped.

Topology: A - B, and B - C, B - D (C and D are behind B as seen from A)."""

from __future__ import annotations

import struct

from batmand.core.config import MeshConfig
from batmand.core.multicast import HostGroups
from batmand.core.multicast_forw import packet_len
from batmand.sim.network import Network
from batmand.wire import InnerFrame, IvOgm, Mac, Mcast, McastTrackerTvlv, Unicast, decode_frame
from batmand.wire.constants import ETH_P_BATMAN
from batmand.wire.ethernet import Ethernet
from batmand.wire.tvlv import UnknownTvlv

G4 = bytes([239, 1, 2, 3])
G4_MAC = Mac("01:00:5e:01:02:03")
SRC = Mac("02:cc:00:00:00:01")


def ip4(dst: bytes, payload: bytes = bytes(12)) -> bytes:
    mac = bytes([0x01, 0x00, 0x5E, dst[1] & 0x7F, dst[2], dst[3]])
    return mac + bytes(SRC) + b"\x08\x00" + struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 1, 17,
                                                         0, bytes([10, 0, 0, 1]), dst) + payload


def frame_of(raw: bytes) -> InnerFrame:
    return InnerFrame.decode(raw)


def _net(listeners="CD"):
    net = Network(seed=5)
    for name in "ABCD":
        net.add_node(name, MeshConfig(orig_interval_ms=200))
    net.link("A", "B")
    net.link("B", "C")
    net.link("B", "D")
    for name in "ABCD":
        groups = HostGroups(ipv4=(G4,)) if name in listeners else HostGroups()
        net.nodes[name].mesh.multicast.update(net.now, groups)
    net.run_for(8)
    return net


def _sent(net, name, run):
    return [p for p in (decode_frame(f).packet for f in net.sent_by(name, run)) if not isinstance(p, IvOgm)]


def _delivered(net, name) -> list[bytes]:
    return [f for _, f in net.nodes[name].delivered if f[:6] == G4_MAC]


def test_one_packet_split_per_next_hop():
    net = _net()
    a, b = net.nodes["A"].mesh, net.nodes["B"].mesh
    orig = {n: net.nodes[n].orig for n in "ABCD"}
    assert a.multicast.flags == 0x38 and not a.multicast.not_capable
    frame = ip4(G4)
    # A: one MCAST packet to B, listing C and D (pushed newest listener first, so reversed)
    out = _sent(net, "A", lambda: (net.host_send("A", frame)))
    assert len(out) == 1 and isinstance(out[0], Mcast) and out[0].ttl == 50
    (tracker,) = out[0].tvlvs
    assert sorted(tracker.dests) == sorted([orig["C"], orig["D"]]) and tracker.encode_value()[-2:] == b"\0\0"
    assert out[0].inner.encode() == frame
    # B: two copies, each listing the one destination behind it, TTL one less
    forwarded = _sent(net, "B", lambda: net.run_for(0.05))
    assert sorted((p.tvlvs[0].dests, p.ttl) for p in forwarded) == sorted([([orig["C"]], 49), ([orig["D"]], 49)])
    assert _delivered(net, "C") == [frame] and _delivered(net, "D") == [frame] and _delivered(net, "B") == []
    # the counters (bytes: the batman packet with its outer Ethernet header)
    two = len(Ethernet(orig["B"], orig["A"], ETH_P_BATMAN).encode()) + packet_len(len(frame), 2)
    one = 14 + packet_len(len(frame), 1)
    assert (a.counters["mcast_tx"], a.counters["mcast_tx_bytes"]) == (1, two)
    assert (a.counters["mcast_tx_local"], a.counters["mcast_tx_local_bytes"]) == (1, len(frame))
    assert a.counters["tx"] >= 1 and a.counters["tx_bytes"] >= len(frame)
    assert (b.counters["mcast_rx"], b.counters["mcast_rx_bytes"]) == (1, two)
    assert (b.counters["mcast_fwd"], b.counters["mcast_fwd_bytes"]) == (1, two)
    assert (b.counters["mcast_tx"], b.counters["mcast_tx_bytes"]) == (2, 2 * one)
    assert b.counters["mcast_rx_local"] == 0
    c = net.nodes["C"].mesh
    assert (c.counters["mcast_rx_local"], c.counters["mcast_rx_local_bytes"]) == (1, len(frame))


def test_a_listed_relay_delivers_and_forwards():
    net = _net("BC")
    frame = ip4(G4)
    out = _sent(net, "A", lambda: (net.host_send("A", frame)))
    assert sorted(out[0].tvlvs[0].dests) == sorted([net.nodes["B"].orig, net.nodes["C"].orig])
    forwarded = _sent(net, "B", lambda: net.run_for(0.05))
    assert [p.tvlvs[0].dests for p in forwarded] == [[net.nodes["C"].orig]]
    assert _delivered(net, "B") == [frame] and _delivered(net, "C") == [frame] and _delivered(net, "D") == []


def test_one_node_without_the_capability_means_unicast_copies():
    net = _net()
    d = net.nodes["D"].mesh
    d.set_mtu(d.ifaces[0].name, 1200)  # an MCAST packet may not fit D's link
    d.multicast.update(net.now, d.multicast.groups)
    net.run_for(1)
    assert d.multicast.flags == 0x18
    out = _sent(net, "A", lambda: (net.host_send("A", ip4(G4)), net.run_for(0.001)))
    assert sorted((type(p), p.dest) for p in out) == sorted([(Unicast, net.nodes["C"].orig),
                                                              (Unicast, net.nodes["D"].orig)])


def test_a_frame_too_big_for_one_packet_goes_as_unicast_copies():
    net = _net()
    big = ip4(G4, bytes(1281 - packet_len(34, 2)))  # one byte over with two destinations
    assert packet_len(len(big), 2) == 1281
    out = _sent(net, "A", lambda: (net.host_send("A", big), net.run_for(0.001)))
    assert [type(p) for p in out] == [Unicast, Unicast]
    fits = big[:-1]
    fits = fits[:16] + struct.pack("!H", len(fits) - 14) + fits[18:]
    out = _sent(net, "A", lambda: (net.host_send("A", fits), net.run_for(0.001)))
    assert [type(p) for p in out] == [Mcast]


def _inject(net, to: str, packet: Mcast):
    """An MCAST packet from A's interface toward `to`'s (a hostile or odd neighbour)."""
    node = net.nodes[to]
    ifname, mac = next(iter(node.macs.items()))
    frame = Ethernet(mac, net.nodes["A"].orig, ETH_P_BATMAN).encode() + packet.encode()
    net._handle(node, node.mesh.receive(net.now, ifname, frame))


def test_odd_and_hostile_packets():
    net = _net()
    b = net.nodes["B"].mesh
    orig = {n: net.nodes[n].orig for n in "ABCD"}
    frame = ip4(G4)
    # no tracker at all: it is for us
    _inject(net, "B", Mcast(tvlvs=[], inner=frame_of(frame)))
    assert _delivered(net, "B") == [frame] and b.counters["mcast_rx_local"] == 1
    # destinations overrunning their container: dropped without counting it received
    bad = UnknownTvlv(7, 1, struct.pack("!H", 5) + bytes(orig["C"]))
    rx = b.counters["mcast_rx"]
    _inject(net, "B", Mcast(tvlvs=[bad], inner=frame_of(frame)))
    assert b.counters["mcast_rx"] == rx and b.counters["drop_mcast_bad_tracker"] == 1
    # TTL 1: dropped even if it lists us
    _inject(net, "B", Mcast(ttl=1, tvlvs=[McastTrackerTvlv([orig["B"]])], inner=frame_of(frame)))
    assert len(_delivered(net, "B")) == 1
    # multicast, zero and unknown addresses in the list are skipped, C still gets its copy
    junk = [Mac("01:00:5e:00:00:01"), Mac(bytes(6)), Mac("02:00:de:ad:00:01"), orig["C"]]
    out = _sent(net, "B", lambda: (_inject(net, "B", Mcast(tvlvs=[McastTrackerTvlv(junk)], inner=frame_of(frame))),
                                   net.run_for(0.05)))
    assert [p.tvlvs[0].dests for p in out if isinstance(p, Mcast)] == [[orig["C"]]]
    # a packet for another node's interface is not ours to forward
    fwd = b.counters["mcast_fwd"]
    node = net.nodes["B"]
    ifname = next(iter(node.macs))
    raw = Ethernet(Mac("02:00:00:00:99:99"), orig["A"], ETH_P_BATMAN).encode() + \
        Mcast(tvlvs=[McastTrackerTvlv([orig["C"]])], inner=frame_of(frame)).encode()
    net._handle(node, node.mesh.receive(net.now, ifname, raw))
    assert b.counters["mcast_fwd"] == fwd and b.counters["drop_mcast_not_for_us"] == 1


def test_tracker_wire_layout():
    # 2 destinations: 2 bytes of padding; 1 destination: none (the kernel's alignment rule)
    two = Mcast(tvlvs=[McastTrackerTvlv([Mac("02:00:00:00:00:01"), Mac("02:00:00:00:00:02")])],
                inner=frame_of(ip4(G4))).encode()
    assert two[:6] == bytes([0x05, 15, 50, 0]) + struct.pack("!H", 4 + 2 + 12 + 2)
    assert two[6:12] == bytes([7, 1]) + struct.pack("!HH", 2 + 12 + 2, 2) and two[24:26] == b"\0\0"
    assert len(two) == packet_len(len(ip4(G4)), 2)
    one = Mcast(tvlvs=[McastTrackerTvlv([Mac("02:00:00:00:00:01")])], inner=frame_of(ip4(G4))).encode()
    assert len(one) == packet_len(len(ip4(G4)), 1) and one[18:20] == ip4(G4)[:2]
