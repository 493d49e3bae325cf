"""VLANs of the soft interface, as the kernel has them: the untagged one, and those created on
bat0 (VLAN devices on it, a VLAN-filtering bridge's; here Mesh.set_vlans). A host frame on
any other VID is refused (counted, a rate-limited message), never a new TT VLAN, so a LAN
host cannot grow our OGM past the 512 bytes receivers read. Our OGM always fits."""

from __future__ import annotations

from batmand.core.config import MeshConfig
from batmand.sim.network import Network
from batmand.wire import IvOgm, Mac, decode_frame
from batmand.wire.constants import VLAN_HAS_TAG

WARMUP = 10.0


def tagged(src: Mac, vid: int, dst: str = "ff:ff:ff:ff:ff:ff") -> bytes:
    return bytes(Mac(dst)) + bytes(src) + b"\x81\x00" + vid.to_bytes(2, "big") + b"\x08\x06" + bytes(28)


def client(n: int) -> Mac:
    return Mac(bytes([0x02, 0xcc, 0, 0, n >> 8, n & 0xFF]))


def pair(**config) -> tuple[Network, list]:
    """A - B, with every frame A transmits recorded."""
    net = Network(seed=3, config=MeshConfig(orig_interval_ms=200, **config))
    net.add_node("A")
    net.add_node("B")
    net.link("A", "B")
    sent = []
    transmit = net._transmit

    def record(node, action):
        if node.name == "A":
            sent.append(action.frame)
        transmit(node, action)

    net._transmit = record
    net.run_for(WARMUP)
    return net, sent


def own_ogms(node, frames) -> list[IvOgm]:
    ogms = []
    for frame in frames:
        for packet in decode_frame(frame).packets:
            if isinstance(packet, IvOgm) and packet.orig == node.mesh.primary.mac:
                ogms.append(packet)
    return ogms


def ogm_bytes(ogm: IvOgm) -> int:
    return 24 + ogm.tvlv_len


def test_frames_on_vlans_bat0_does_not_have_are_refused():
    net, sent = pair()
    a = net.nodes["A"]
    logged = []
    a.mesh.log = logged.append
    for vid in range(1, 101):  # a LAN host on 100 VLANs
        net.host_send("A", tagged(client(vid), vid))
    net.run_for(5.0)
    assert a.mesh.tt.vlans == [0]
    assert all(key[1] == 0 for key in a.mesh.tt.local)
    assert a.mesh.counters["drop_tt_local_unknown_vlan"] == 100
    assert len(logged) == 10 and logged[0] == f"adding TT local entry {client(1)} to non-existent VLAN 1"
    assert all(ogm_bytes(o) <= 512 for o in own_ogms(a, sent))
    assert net.next_hop("B", "A") == "A"  # B still hears A


def test_a_vlan_of_bat0_carries_clients_and_removing_it_keeps_them_until_they_time_out():
    net, sent = pair(tt_local_timeout_ms=5_000, tt_work_period_ms=1_000)
    a, b = net.nodes["A"], net.nodes["B"]
    net._handle(a, a.mesh.set_vlans(net.now, {5}))
    assert a.mesh.vlans() == {5}
    net.host_send("A", tagged(client(1), 5))
    net.run_for(2.0)
    vid = VLAN_HAS_TAG | 5
    assert (client(1), vid) in b.mesh.tt.global_ and (a.mesh.soft_mac, vid) in b.mesh.tt.global_
    assert [v.vid for v in own_ogms(a, sent[-5:])[-1].tvlvs[0].vlans] == [vid, 0]  # newest first
    net._handle(a, a.mesh.set_vlans(net.now, set()))  # the VLAN device went away
    net.host_send("A", tagged(client(2), 5))  # no new client on it
    net.run_for(2.0)
    assert (a.mesh.soft_mac, vid) not in b.mesh.tt.global_
    assert (client(1), vid) in b.mesh.tt.global_ and (client(2), vid) not in b.mesh.tt.global_
    net.run_for(10.0)  # its last client timed out: the VLAN is no longer announced
    assert (client(1), vid) not in b.mesh.tt.global_
    assert a.mesh.tt.vlans == [0]
    assert all(v.vid == 0 for v in own_ogms(a, sent[-5:])[-1].tvlvs[0].vlans)


def test_our_ogm_never_grows_past_512_bytes():
    net, sent = pair()
    a = net.nodes["A"]
    net._handle(a, a.mesh.set_vlans(net.now, set(range(1, 101))))
    refused = sorted(set(range(1, 101)) - a.mesh.vlans())
    accepted = 100 - len(refused)
    assert refused == list(range(accepted + 1, 101))  # the lowest VIDs are taken first
    for vid in range(1, accepted + 1):  # a client on every VLAN, and many changes at once
        net.host_send("A", tagged(client(vid), vid))
    for n in range(200):
        net.host_send("A", tagged(client(1000 + n), 0)[:12] + b"\x08\x06" + bytes(28))
    net.run_for(5.0)
    ogms = own_ogms(a, sent)
    assert ogms and max(ogm_bytes(o) for o in ogms) <= 512
    assert len(ogms[-1].tvlvs[0].vlans) == accepted + 1  # and the untagged one
    assert a.mesh.counters["drop_tt_vlan_refused"] == len(refused)
    # the diffs that did not fit were left out: B asked for the full table and has it all
    b = net.nodes["B"]
    assert all((client(1000 + n), 0) in b.mesh.tt.global_ for n in range(200))
    assert all((client(v), VLAN_HAS_TAG | v) in b.mesh.tt.global_ for v in range(1, accepted + 1))
