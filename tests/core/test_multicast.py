"""Multicast optimisations in the core: our flags and listener entries with worked cases
(the kernel's batadv_mcast_mla_flags_get, mla_meshif_get_* and mla_bridge_get), peers'
flags, and the transmit decision in the simulator: unicast copies to the listeners,
nothing when nobody listens, a flood when there are too many or the frame cannot be
snooped."""

from __future__ import annotations

import struct

from batmand.core.config import MeshConfig
from batmand.core.multicast import (ALL_NODES6, HostGroups, listener_macs, own_flags, peer_flags, WANT_ALL_IPV4,
                                    WANT_ALL_IPV6, WANT_ALL_UNSNOOPABLES, WANT_NO_RTR4, WANT_NO_RTR6)
from batmand.sim.network import Network
from batmand.wire import Bcast, IvOgm, Mac, McastTvlv, Unicast, decode_frame

G4 = bytes([239, 1, 2, 3])
G4_MAC = Mac("01:00:5e:01:02:03")
SRC = Mac("02:cc:00:00:00:01")


def ip4(dst: bytes, proto: int = 17, payload: bytes = bytes(12)) -> bytes:
    mac = bytes([0x01, 0x00, 0x5E, dst[1] & 0x7F, dst[2], dst[3]])
    return mac + bytes(SRC) + b"\x08\x00" + struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 1, proto,
                                                         0, bytes([10, 0, 0, 1]), dst) + payload


def test_own_flags_worked_cases():
    assert own_flags(HostGroups()) == 0x18  # unbridged, no router: what every kernel node in the captures sends
    assert own_flags(HostGroups(router4=True)) == 0x10
    assert own_flags(HostGroups(bridged=True)) == 0x07  # no queriers: want all of both families
    assert own_flags(HostGroups(bridged=True, querier4=True, querier6=True)) == 0x19
    assert own_flags(HostGroups(bridged=True, querier4=True, querier6=True, shadowing6=True)) == 0x0D


def test_listener_entries_by_the_kernels_rules():
    v4 = (bytes([224, 0, 0, 1]), G4)
    v6 = (bytes.fromhex("ff020000000000000000000000000001"), bytes.fromhex("ff0200000000000000000001ff000001"),
          bytes.fromhex("ff0e0000000000000000000000000123"), bytes.fromhex("ff010000000000000000000000000001"))
    groups = HostGroups(ipv4=v4, ipv6=v6)
    # unbridged, no router: everything but the interface-local IPv6 scope, reversed (prepended)
    assert listener_macs(groups, own_flags(groups)) == [Mac("33:33:00:00:01:23"), Mac("33:33:ff:00:00:01"),
                                                        Mac("33:33:00:00:00:01"), G4_MAC, Mac("01:00:5e:00:00:01")]
    # with routers the routable groups are implied; bridged, the unsnoopables are flagged instead
    routed = HostGroups(ipv4=v4, ipv6=v6, router4=True, router6=True)
    assert listener_macs(routed, own_flags(routed)) == [Mac("33:33:ff:00:00:01"), Mac("33:33:00:00:00:01"),
                                                        Mac("01:00:5e:00:00:01")]
    bridged = HostGroups(ipv4=v4, ipv6=v6, bridged=True, querier4=True, querier6=True)
    assert listener_macs(bridged, own_flags(bridged)) == [Mac("33:33:00:00:01:23"), Mac("33:33:ff:00:00:01"), G4_MAC]
    assert listener_macs(HostGroups(ipv4=v4, bridged=True), 0x07) == []  # wanting all: no entries
    # several groups on one MAC: one entry
    assert listener_macs(HostGroups(ipv4=(G4, bytes([239, 129, 2, 3]))), 0x18) == [G4_MAC]


def test_one_mac_for_groups_that_share_it_in_the_kernels_order():
    # 239.1.2.3 and 239.129.2.3 share a MAC: the kernel keeps the first it collects, and its
    # list is built by prepending, so 239.9.9.9 (collected between them) comes first
    groups = HostGroups(ipv4=(G4, bytes([239, 9, 9, 9]), bytes([239, 129, 2, 3])))
    assert listener_macs(groups, own_flags(groups)) == [Mac("01:00:5e:09:09:09"), G4_MAC]


def test_flags_with_a_multicast_router_behind_the_bridge():
    # a router port on the bridge counts as a router here (br_multicast_has_router_adjacent)
    assert own_flags(HostGroups(bridged=True, querier4=True, querier6=True, router4=True)) == 0x11
    assert own_flags(HostGroups(bridged=True, querier4=True, querier6=True, router4=True, router6=True)) == 0x01
    # without a querier the family is wanted whole, router or not
    assert own_flags(HostGroups(bridged=True, querier6=True, router6=True)) == 0x03


def test_bridge_entries_by_the_kernels_rules():
    """batadv_mcast_mla_bridge_get: the MDB groups of the bridge's other ports, by the rules
    of the device's groups but without the "IPv6 scope below link-local" skip; they come
    first in the list (collected last, prepended)."""
    mdns4, mdns6 = bytes([224, 0, 0, 251]), bytes.fromhex("ff0200000000000000000000000000fb")
    site6 = bytes.fromhex("ff050000000000000000000000010003")
    node_local6 = bytes.fromhex("ff010000000000000000000000000002")
    device = dict(ipv4=(bytes([224, 0, 0, 1]), bytes([239, 5, 5, 5])),
                  ipv6=(ALL_NODES6, bytes.fromhex("ff010000000000000000000000000001")))
    bridge = (G4, mdns4, ALL_NODES6, mdns6, site6, node_local6)
    queriers = dict(bridged=True, querier4=True, querier6=True)
    groups = HostGroups(**device, bridge_groups=bridge, **queriers)
    assert own_flags(groups) == 0x19
    # the unsnoopables (224.0.0.x, ff02::1) are flagged instead; ff01::2 from the bridge
    # stays, the device's ff01::1 does not
    assert listener_macs(groups, own_flags(groups)) == [
        Mac("33:33:00:00:00:02"), Mac("33:33:00:01:00:03"), Mac("33:33:00:00:00:fb"), G4_MAC,
        Mac("01:00:5e:05:05:05")]
    # a bridge entry on a MAC the device already announces: once, where the device's is
    same = HostGroups(ipv4=(G4,), bridge_groups=(bytes([239, 9, 9, 9]), bytes([239, 129, 2, 3])), **queriers)
    assert listener_macs(same, own_flags(same)) == [Mac("01:00:5e:09:09:09"), G4_MAC]
    # an IPv6 router: only the link-local (and narrower) IPv6 groups; a shadowed IGMP
    # querier: no IPv4 groups at all (we want all IPv4)
    routed = HostGroups(**device, bridge_groups=bridge, **queriers, router6=True, shadowing4=True)
    assert own_flags(routed) == 0x03
    assert listener_macs(routed, own_flags(routed)) == [Mac("33:33:00:00:00:02"), Mac("33:33:00:00:00:fb")]
    # no queriers: nothing from the bridge or the device
    assert listener_macs(HostGroups(**device, bridge_groups=bridge, bridged=True), 0x07) == []


def test_peer_flags():
    assert peer_flags(None) == WANT_ALL_IPV4 | WANT_ALL_IPV6 | WANT_NO_RTR4 | WANT_NO_RTR6  # 0x1e: wants all
    assert peer_flags(McastTvlv(0x18)) == 0x18
    assert peer_flags(McastTvlv(WANT_ALL_UNSNOOPABLES | WANT_ALL_IPV4)) == 0x0B
    assert peer_flags(McastTvlv.decode_value(b"")) == 0  # an empty value: flags 0 (routers for both)


def _net(names="ABCD", **config):
    net = Network(seed=9)
    for name in names:
        net.add_node(name, MeshConfig(orig_interval_ms=200, **config))
    for name in names[1:]:
        net.link("A", name)
    for name in names:  # every node's daemon reports no listeners yet: all send their container
        net.nodes[name].mesh.multicast.update(net.now, HostGroups())
    net.run_for(6)
    return net


def _data(net, name, frame):
    sent = net.sent_by(name, lambda: (net.host_send(name, frame), net.run_for(0.05)))
    return [p for p in map(lambda f: decode_frame(f).packet, sent) if not isinstance(p, IvOgm)]


def _without_mcast_packets(net, name):
    """Take `name`'s MTU below 1280 bytes: it no longer announces HAVE_MC_PTYPE_CAPA, and
    the others fall back from MCAST packets to unicast copies."""
    mesh = net.nodes[name].mesh
    mesh.set_mtu(mesh.ifaces[0].name, 1200)
    mesh.multicast.update(net.now, mesh.multicast.groups)
    net.run_for(1)


def test_multicast_goes_to_its_listeners_only():
    net = _net()
    a = net.nodes["A"].mesh
    # unbridged, no routers, MTUs of 1500: 0x38 (0x18 and the MCAST packet capability)
    assert a.multicast.peers and all(f == 0x38 for f in a.multicast.peers.values())
    _without_mcast_packets(net, "D")
    assert a.multicast.peers[net.nodes["D"].orig] == 0x18 and a.multicast.not_capable == {net.nodes["D"].orig}
    # nobody listens: dropped, as the kernel does
    dropped = a.counters["tx_dropped"]
    assert _data(net, "A", ip4(G4)) == [] and a.counters["tx_dropped"] == dropped + 1
    # B's host joins: its listener entry reaches A's TT; A sends one unicast copy, to B
    net.nodes["B"].mesh.multicast.update(net.now, HostGroups(ipv4=(G4,)))
    net.run_for(2)
    assert a.tt.best_orig(G4_MAC, 0) == net.nodes["B"].orig
    sent = _data(net, "A", ip4(G4))
    assert [(type(p), p.dest) for p in sent] == [(Unicast, net.nodes["B"].orig)] and sent[0].inner.encode() == ip4(G4)
    assert [f for _, f in net.nodes["B"].delivered][-1] == ip4(G4)
    # C joins too; with a fanout of 1 that is a flood
    net.nodes["C"].mesh.multicast.update(net.now, HostGroups(ipv4=(G4,)))
    net.run_for(2)
    assert sorted(p.dest for p in _data(net, "A", ip4(G4))) == sorted([net.nodes["B"].orig, net.nodes["C"].orig])
    net.set_option("A", "multicast_fanout", 1)
    assert {type(p) for p in _data(net, "A", ip4(G4))} == {Bcast}
    # B leaves: its entry goes, the frames stop
    net.set_option("A", "multicast_fanout", 16)
    net.nodes["B"].mesh.multicast.update(net.now, HostGroups())
    net.run_for(2)
    assert [p.dest for p in _data(net, "A", ip4(G4))] == [net.nodes["C"].orig]


def test_what_is_flooded_anyway():
    net = _net("ABC")
    # an IGMP report, multicast mode off, and a peer that says nothing (it wants all)
    report = ip4(bytes([224, 0, 0, 22]), proto=2, payload=b"\x22" + bytes(15))
    assert {type(p) for p in _data(net, "A", report)} == {Bcast}
    net.set_option("A", "multicast_mode", False)
    assert {type(p) for p in _data(net, "A", ip4(G4))} == {Bcast}
    net.set_option("A", "multicast_mode", True)
    net.nodes["C"].mesh.multicast.flags = None  # C's OGMs lose their container: a node without the feature
    net.run_for(2)
    assert net.nodes["A"].mesh.multicast.peers[net.nodes["C"].orig] == 0x1E
    assert [p.dest for p in _data(net, "A", ip4(G4))] == [net.nodes["C"].orig]
    # a frame too short for its IP header is dropped
    assert _data(net, "A", G4_MAC + bytes(SRC) + b"\x08\x00" + bytes(10)) == []
