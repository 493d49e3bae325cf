"""Gateway mode in the core: the algorithms' gateway selection with worked numbers (the
kernel's bat_iv_ogm.c and bat_v.c gw ops), the DHCP classifier (gateway_client.c), and
scenarios in the simulator: announcing, selecting, switching and losing gateways, the
uevents, and DHCP from the host sent the kernel's way. The expectations are computed
here from the kernel's rules, not read back from the core."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from batmand.capture import read_capture
from batmand.core import dhcp
from batmand.core.bat_iv import BatmanIV, IvNeighIfInfo
from batmand.core.bat_v import BatmanV, VNeighIfInfo
from batmand.core.config import MeshConfig, SettingError
from batmand.core.events import Uevent
from batmand.core.gateway import GatewayNode
from batmand.core.hardif import HardInterface
from batmand.core.mesh import Mesh
from batmand.core.originator import NeighNode, OrigIfInfo, OrigNode
from batmand.sim.network import Network
from batmand.sim.replay import replay
from batmand.wire import (Bcast, GatewayTvlv, InnerFrame, IvOgm, Mac, Unicast, Unicast4Addr, WireError,
                          decode_frame)
from batmand.wire.constants import TvlvType
from tests.conftest import PCAP_DIR

CLIENT = Mac("02:cc:00:00:00:01")


# --- frames ----------------------------------------------------------------------------------


def _ipv4(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, src, dst) + udp


def _bootp(op: int, chaddr: bytes, htype: int = 1, hlen: int = 6) -> bytes:
    return bytes([op, htype, hlen, 0]) + b"\x12\x34\x56\x78" + bytes(20) + chaddr + bytes(10 + 192) \
        + b"\x63\x82\x53\x63" + b"\x35\x01\x01\xff"


def dhcp_discover(client: Mac = CLIENT, vid: int | None = None) -> bytes:
    """A DHCPDISCOVER as a host broadcasts it (0.0.0.0:68 -> 255.255.255.255:67)."""
    tag = b"" if vid is None else b"\x81\x00" + vid.to_bytes(2, "big")
    return b"\xff" * 6 + bytes(client) + tag + b"\x08\x00" + _ipv4(bytes(4), b"\xff" * 4, 68, 67,
                                                                    _bootp(1, bytes(client)))


def dhcp_offer_broadcast(server_host: Mac, client: Mac) -> bytes:
    """A server's broadcast answer (udhcpd broadcasts its offers): 67 -> 68, chaddr = client."""
    return b"\xff" * 6 + bytes(server_host) + b"\x08\x00" + _ipv4(b"\x0a\x00\x00\x01", b"\xff" * 4, 67, 68,
                                                                   _bootp(2, bytes(client)))


def dhcp_unicast(src: Mac, dst: Mac, sport: int, dport: int, op: int) -> bytes:
    """A renewal (client -> server's MAC) or a release: unicast at the Ethernet layer."""
    return bytes(dst) + bytes(src) + b"\x08\x00" + _ipv4(b"\x0a\x00\x00\x07", b"\x0a\x00\x00\x01", sport, dport,
                                                         _bootp(op, bytes(src)))


def dhcpv6(src: Mac, sport: int, dport: int, xid: bytes = b"\xab\xcd\xef") -> bytes:
    """A DHCPv6 message to ff02::1:2 (All_DHCP_Relay_Agents_and_Servers)."""
    body = b"\x01" + xid + bytes(40)
    udp = struct.pack("!HHHH", sport, dport, 8 + len(body), 0) + body
    ip6 = struct.pack("!IHBB16s16s", 0x60000000, len(udp), 17, 1, b"\xfe\x80" + bytes(14),
                      b"\xff\x02" + bytes(11) + b"\x01\x00\x02")
    return bytes.fromhex("333300010002") + bytes(src) + b"\x86\xdd" + ip6 + udp


def classify(frame: bytes):
    return dhcp.recipient(InnerFrame.decode(frame))


# --- the classifier (batadv_gw_dhcp_recipient_get) ----------------------------------------------


def test_dhcp_classification_v4_v6_and_vlan():
    server_host = Mac("02:aa:00:00:00:01")
    assert classify(dhcp_discover()) == (dhcp.TO_SERVER, None)
    assert classify(dhcp_discover(vid=5)) == (dhcp.TO_SERVER, None)  # one 802.1Q tag is looked through
    assert classify(dhcp_offer_broadcast(server_host, CLIENT)) == (dhcp.TO_CLIENT, CLIENT)
    # a renewal (DHCPREQUEST to the server) and a release are DHCP toward the server too
    assert classify(dhcp_unicast(CLIENT, server_host, 68, 67, 1)) == (dhcp.TO_SERVER, None)
    assert classify(dhcpv6(CLIENT, 546, 547)) == (dhcp.TO_SERVER, None)
    # the kernel reads chaddr at the DHCPv4 offset for DHCPv6 too: a reply passes as DHCP only
    # when its transaction id looks like htype 1 / hlen 6
    assert classify(dhcpv6(server_host, 547, 546)) == (None, None)
    odd = dhcpv6(server_host, 547, 546, xid=b"\x01\x06\x00")
    assert classify(odd)[0] == dhcp.TO_CLIENT
    # not DHCP: other ports, TCP, ARP, a non-Ethernet chaddr, cut short, two tags
    assert classify(b"\xff" * 6 + bytes(CLIENT) + b"\x08\x00" + _ipv4(bytes(4), b"\xff" * 4, 68, 53, b"x" * 40)) \
        == (None, None)
    tcp = bytearray(dhcp_discover())
    tcp[14 + 9] = 6
    assert classify(bytes(tcp)) == (None, None)
    assert classify(b"\xff" * 6 + bytes(CLIENT) + b"\x08\x06" + bytes(28)) == (None, None)
    token_ring = b"\xff" * 6 + bytes(server_host) + b"\x08\x00" + _ipv4(bytes(4), b"\xff" * 4, 67, 68,
                                                                        _bootp(2, bytes(CLIENT), htype=6))
    assert classify(token_ring) == (None, None)
    assert classify(dhcp_discover()[:14 + 20 + 4]) == (None, None)
    assert classify(dhcp_offer_broadcast(server_host, CLIENT)[:14 + 28 + 30]) == (None, None)
    double = b"\xff" * 6 + bytes(CLIENT) + b"\x81\x00\x00\x05\x81\x00\x00\x06\x08\x00" + dhcp_discover()[14:]
    assert classify(double) == (None, None)


# --- the algorithms' gateway operations with worked numbers ----------------------------------------


def _gateway(record, metric: int | None, down: int, n: int) -> GatewayNode:
    """A gateway whose originator is routed with `metric` (None: no route)."""
    orig = OrigNode(Mac(f"02:00:00:00:0{n}:00"), 0.0)
    if metric is not None:
        neigh = NeighNode(orig.orig, HardInterface("eth0", Mac("02:00:00:00:00:01")), orig, 0.0)
        neigh.ifinfo_new(None, lambda: record(metric))
        orig.ifinfo_new(None, OrigIfInfo).router = neigh
    return GatewayNode(orig, down, down // 5)


def _iv_record(tq: int) -> IvNeighIfInfo:
    info = IvNeighIfInfo()
    info.push_tq(tq)  # the only TQ in the ring: its average
    return info


def iv_gw(tq, down, n):
    return _gateway(_iv_record, tq, down, n)


def v_gw(throughput, down, n):
    return _gateway(lambda m: VNeighIfInfo(throughput=m), throughput, down, n)


def test_iv_selection_classes_worked_numbers():
    iv = BatmanIV.__new__(BatmanIV)
    a, b, c = iv_gw(200, 100, 1), iv_gw(150, 500, 2), iv_gw(220, 20, 3)
    gws = [a, b, c]
    # class 1: tq² · down · 100² >> 18 — a: 40000·100·10⁴ >> 18 = 152587, b: 22500·500·10⁴ >> 18
    # = 429153, c: 48400·20·10⁴ >> 18 = 36926
    assert [(g.orig_node.router().ifinfo_get(None).tq_avg ** 2 * g.bandwidth_down * 10000) >> 18
            for g in gws] == [152587, 429153, 36926]
    assert iv.gw_best(gws, 1) is b
    for sel_class in (2, 3, 20, 255):
        assert iv.gw_best(gws, sel_class) is c  # the best TQ
    # equals: the first in the list (the newest) wins; class 1 breaks a factor tie by TQ
    d = iv_gw(220, 20, 4)
    assert iv.gw_best([d, c], 20) is d and iv.gw_best([c, d], 20) is c
    e, f = iv_gw(100, 400, 5), iv_gw(200, 100, 6)  # 100²·400 == 200²·100
    assert iv.gw_best([e, f], 1) is f and iv.gw_best([f, e], 1) is f
    # no route: never chosen; none at all: None
    assert iv.gw_best([iv_gw(None, 1000, 7), a], 20) is a
    assert iv.gw_best([iv_gw(None, 1000, 7)], 1) is None


def test_iv_reelection_by_class_worked_numbers():
    iv = BatmanIV.__new__(BatmanIV)
    current, better_by_10, better_by_20, worse = iv_gw(180, 100, 1), iv_gw(190, 100, 2), iv_gw(200, 100, 3), \
        iv_gw(170, 100, 4)
    for sel_class in (1, 2):  # never switch on their own
        assert not iv.gw_is_eligible(current, better_by_20, sel_class)
    assert iv.gw_is_eligible(current, better_by_10, 3) and iv.gw_is_eligible(current, iv_gw(180, 1, 5), 3)
    assert not iv.gw_is_eligible(current, worse, 3)
    assert not iv.gw_is_eligible(current, better_by_10, 20)  # late switch: 10 < 20
    assert iv.gw_is_eligible(current, better_by_20, 20)
    assert not iv.gw_is_eligible(current, better_by_20, 21)
    assert iv.gw_is_eligible(iv_gw(None, 100, 6), worse, 20)  # the current one lost its route
    assert not iv.gw_is_eligible(current, iv_gw(None, 100, 7), 3)


def test_v_selection_and_reelection_worked_numbers():
    v = BatmanV.__new__(BatmanV)
    # a: path 30 Mbit/s, announces 10 -> 100; b: path 8, announces 50 -> 80; c: path 9, 9 -> 90
    a, b, c = v_gw(300, 100, 1), v_gw(80, 500, 2), v_gw(90, 90, 3)
    assert v.gw_best([b, c, a], 50) is a
    assert v.gw_best([v_gw(100, 300, 4), a], 50).orig_node.orig == Mac("02:00:00:00:04:00")  # tie: the first
    assert v.gw_best([v_gw(None, 1000, 5)], 50) is None
    # re-election: at least sel_class (100 kbit/s units) more than the current gateway gives
    current = v_gw(60, 100, 6)  # 6 Mbit/s
    assert not v.gw_is_eligible(current, a, 50)  # 100 - 60 = 40 < 50
    assert v.gw_is_eligible(current, a, 40)
    assert v.gw_is_eligible(current, v_gw(200, 110, 7), 50)  # 110 - 60 = 50
    assert not v.gw_is_eligible(current, v_gw(None, 1000, 8), 1)
    assert v.gw_is_eligible(v_gw(None, 100, 9), b, 50)  # the current one has no route
    gone = dataclasses.replace(current, listed=False)
    assert v.gw_is_eligible(gone, b, 5000)  # the current one left the list


def test_sel_class_defaults_and_range_by_algorithm():
    assert Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:01")).config.gw_sel_class == 20
    assert Mesh(MeshConfig(routing_algo="BATMAN_V"), soft_mac=Mac("02:00:00:00:00:01")).config.gw_sel_class == 50
    with pytest.raises(SettingError, match="gw_sel_class: 256 is out of range .1..255 for BATMAN_IV"):
        Mesh(MeshConfig(gw_sel_class=256), soft_mac=Mac("02:00:00:00:00:01"))
    assert Mesh(MeshConfig(routing_algo="BATMAN_V", gw_sel_class=5000),
                soft_mac=Mac("02:00:00:00:00:01")).config.gw_sel_class == 5000


# --- scenarios in the simulator ------------------------------------------------------------------

FAST = dict(orig_interval_ms=200, purge_timeout_ms=4_000)


def _mesh(seed: int = 3, algo: str = "BATMAN_IV", **per_node) -> Network:
    """Gateways G1 and G2, client C between them, a node O that is not a gateway; each node
    with its own config (per_node: name -> settings)."""
    net = Network(seed=seed, config=MeshConfig(routing_algo=algo, **FAST))
    for name in ("C", "G1", "G2", "O"):
        net.add_node(name, MeshConfig(routing_algo=algo, **FAST, **per_node.get(name, {})))
    return net


def _gw_orig(net, name) -> str:
    return str(net.nodes[name].orig)


def _selected(net, name="C"):
    gw = net.nodes[name].mesh.gateway.selected
    return net.owner_of(gw.orig_node.orig) if gw else None


def _sent_by(net, name, run):
    """The packets `name` transmits while `run()` runs."""
    return [decode_frame(f).packet for f in net.sent_by(name, run)]


SERVERS = dict(G1=dict(gw_mode="server", gw_bandwidth_down=50_000, gw_bandwidth_up=10_000),
               G2=dict(gw_mode="server", gw_bandwidth_down=10_000, gw_bandwidth_up=2_000))


def test_servers_announce_and_the_client_selects_the_best_tq_and_sends_dhcp_there_only():
    net = _mesh(C=dict(gw_mode="client"), **SERVERS)
    net.link("C", "G1", loss=0.25)  # G1 announces more bandwidth, but its link is worse
    net.link("C", "G2")
    net.link("C", "O")
    net.run_for(15)
    c = net.nodes["C"].mesh
    # the GW container as the kernel builds it: 100 kbit/s units, after TT
    tvlvs = net.nodes["G1"].mesh.ogm_tvlvs(net.now)
    assert [t.TYPE for t in tvlvs][:2] == [TvlvType.TT, TvlvType.GW]
    assert (tvlvs[1].bandwidth_down, tvlvs[1].bandwidth_up) == (500, 100)
    assert not any(isinstance(t, GatewayTvlv) for t in net.nodes["O"].mesh.ogm_tvlvs(net.now))
    rows = {r["orig_address"]: r for r in c.gateway.rows()}
    assert set(rows) == {_gw_orig(net, "G1"), _gw_orig(net, "G2")}  # O announces nothing
    assert (rows[_gw_orig(net, "G1")]["bandwidth_down"], rows[_gw_orig(net, "G1")]["bandwidth_up"]) == (500, 100)
    tq1, tq2 = net.tq("C", "G1"), net.tq("C", "G2")
    assert tq2 > tq1 + 20  # class 20 prefers the better TQ; the bandwidth does not count
    assert _selected(net) == "G2" and rows[_gw_orig(net, "G2")]["best"] and not rows[_gw_orig(net, "G1")]["best"]
    assert [e for _, e in net.nodes["C"].uevents] == [Uevent("gw", "add", _gw_orig(net, "G2"))]
    # the host's DHCPDISCOVER goes to G2 as UNICAST_4ADDR DATA from our originator, not flooded
    for n in net.nodes.values():
        n.delivered.clear()
    sent = _sent_by(net, "C", lambda: (net.host_send("C", dhcp_discover()), net.run_for(0.05)))
    data = [p for p in sent if not isinstance(p, IvOgm)]
    assert len(data) == 1 and isinstance(data[0], Unicast4Addr)
    assert (data[0].dest, data[0].src, data[0].subtype) == (net.nodes["G2"].orig, c.primary.mac, 1)
    assert data[0].inner.encode() == dhcp_discover()
    assert [f for _, f in net.nodes["G2"].delivered] == [dhcp_discover()]
    assert not net.nodes["G1"].delivered and not net.nodes["O"].delivered
    # G2 learnt the host as a (temporary) client of C, so its unicast answer finds the way back
    assert net.nodes["G2"].mesh.tt.best_orig(CLIENT, 0) == net.nodes["C"].orig
    # so do DHCPv6 requests (to ff02::1:2) and requests on a VLAN of bat0
    net.nodes["C"].mesh.set_vlans(net.now, {5})
    for request in (dhcpv6(CLIENT, 546, 547), dhcp_discover(vid=5)):
        sent = [p for p in _sent_by(net, "C", lambda: (net.host_send("C", request), net.run_for(0.05)))
                if not isinstance(p, IvOgm)]
        assert [(type(p), p.dest, p.inner.encode()) for p in sent] == [(Unicast4Addr, net.nodes["G2"].orig, request)]
    # anything else the host broadcasts is still flooded
    arp = b"\xff" * 6 + bytes(CLIENT) + b"\x08\x06" + bytes(28)
    assert any(isinstance(p, Bcast) for p in _sent_by(net, "C", lambda: (net.host_send("C", arp),
                                                                         net.run_for(0.05))))


def test_class_1_weighs_bandwidth_and_a_v_client_takes_the_most_throughput():
    net = _mesh(C=dict(gw_mode="client", gw_sel_class=1), **SERVERS)
    net.link("C", "G1", loss=0.1)
    net.link("C", "G2")
    net.run_for(15)
    tq1, tq2 = net.tq("C", "G1"), net.tq("C", "G2")
    factor = {n: (tq * tq * down * 10000) >> 18 for n, tq, down in (("G1", tq1, 500), ("G2", tq2, 100))}
    assert _selected(net) == max(factor, key=factor.get) == "G1"

    net = _mesh(algo="BATMAN_V", C=dict(gw_mode="client"), **SERVERS)
    net.link("C", "G1")
    net.link("C", "G2")
    for name in ("C", "G1", "G2"):  # equal links of 100 Mbit/s: the announced bandwidth decides
        for iface in net.nodes[name].mesh.ifaces:
            iface.settings = dataclasses.replace(iface.settings, throughput_override=100_000)
    net.run_for(15)
    rows = {r["orig_address"]: r for r in net.nodes["C"].mesh.gateway.rows()}
    assert rows[_gw_orig(net, "G1")]["throughput"] == rows[_gw_orig(net, "G2")]["throughput"] == 1000
    assert _selected(net) == "G1"  # min(1000, 500) > min(1000, 100)


def test_hysteresis_switching_and_losing_the_gateway():
    net = _mesh(C=dict(gw_mode="client"), **SERVERS)
    g1 = net.link("C", "G1", loss=0.2)
    g2 = net.link("C", "G2")
    net.run_for(15)
    assert _selected(net) == "G2"
    # G1's link heals: as good as G2's (less than 20 TQ points better), so C stays with G2
    g1.loss = {k: 0.0 for k in g1.loss}
    for _ in range(40):
        net.run_for(0.5)
        assert net.tq("C", "G1") - net.tq("C", "G2") < 20
    assert net.tq("C", "G1") > 240
    assert _selected(net) == "G2" and len(net.nodes["C"].uevents) == 1
    # G2's link degrades: G1 is 20 points better, the next OGM from G1 asks for an election
    g2.loss = {k: 0.4 for k in g2.loss}
    net.run_for(20)
    assert net.tq("C", "G1") - net.tq("C", "G2") >= 20
    assert _selected(net) == "G1"
    assert net.nodes["C"].uevents[-1][1] == Uevent("gw", "change", _gw_orig(net, "G1"))
    # G1 goes away: once its neighbour times out (no route), G2's next OGM makes C choose again
    net.stop("G1")
    stopped = net.now
    net.run_for(10)
    assert _selected(net) == "G2"
    when, event = net.nodes["C"].uevents[-1]
    assert event == Uevent("gw", "change", _gw_orig(net, "G2"))
    assert 4 <= when - stopped <= 4 + 2  # the neighbour timeout, then at most a worker run
    # and the last one too: del once G2's originator is gone
    net.stop("G2")
    net.run_for(12)
    assert _selected(net) is None and net.nodes["C"].uevents[-1][1] == Uevent("gw", "del")
    assert not net.nodes["C"].mesh.gateway.gateways  # both originators timed out


def test_settings_change_mode_class_and_the_announcement():
    net = _mesh(C=dict(gw_mode="client"), **SERVERS)
    net.link("C", "G1")
    net.link("C", "G2", loss=0.3)
    net.run_for(15)
    assert _selected(net) == "G1"
    uevents = net.nodes["C"].uevents
    # writing client mode again deselects (del) and the next worker run selects again (add)
    net.set_option("C", "gw_mode", "client")
    net.run_for(2)
    assert [e.action for _, e in uevents] == ["add", "del", "add"]
    # off: deselected, nothing elected any more
    net.set_option("C", "gw_mode", "off")
    net.run_for(3)
    assert [e.action for _, e in uevents][-1] == "del" and _selected(net) is None
    # G1 stops serving: its OGMs lose the container, C drops it from the list
    net.set_option("G1", "gw_mode", "off")
    net.run_for(2)
    assert not any(isinstance(t, GatewayTvlv) for t in net.nodes["G1"].mesh.ogm_tvlvs(net.now))
    assert [r["orig_address"] for r in net.nodes["C"].mesh.gateway.rows()] == [_gw_orig(net, "G2")]
    # new bandwidths go out with the next OGM
    net.set_option("G2", "gw_bandwidth_down", 20_000)
    net.run_for(2)
    assert net.nodes["C"].mesh.gateway.rows()[0]["bandwidth_down"] == 200
    # a class change asks for an election
    net.set_option("C", "gw_mode", "client")
    net.run_for(2)
    assert _selected(net) == "G2"
    net.set_option("C", "gw_sel_class", 3)
    assert net.nodes["C"].mesh.gateway.reselect


def test_dhcp_without_gateway_and_in_server_mode():
    net = _mesh(C=dict(gw_mode="client"), G1=dict(gw_mode="server"))
    net.link("C", "G1")
    net.run_for(0.01)  # before any OGM from G1: no gateway selected, a request is dropped
    c = net.nodes["C"].mesh
    dropped = c.counters["tx_dropped"]
    sent = _sent_by(net, "C", lambda: net.host_send("C", dhcp_discover()))
    assert not [p for p in sent if not isinstance(p, IvOgm)] and c.counters["tx_dropped"] == dropped + 1
    net.run_for(10)
    # the server's own host broadcasting a request: dropped (gateways keep to their servers)
    g1 = net.nodes["G1"].mesh
    sent = _sent_by(net, "G1", lambda: net.host_send("G1", dhcp_discover(Mac("02:aa:00:00:00:09"))))
    assert not [p for p in sent if not isinstance(p, IvOgm)]
    assert g1.counters["drop_gw_dhcp_request_at_server"] == 1
    # C's host asks (4addr to G1, which learns the client); G1's broadcast offer goes back as
    # UNICAST to the originator of chaddr, untouched
    net.host_send("C", dhcp_discover())
    net.run_for(0.1)
    offer = dhcp_offer_broadcast(Mac("02:aa:00:00:00:09"), CLIENT)
    sent = [p for p in _sent_by(net, "G1", lambda: (net.host_send("G1", offer), net.run_for(0.05)))
            if not isinstance(p, IvOgm)]
    assert len(sent) == 1 and type(sent[0]) is Unicast and sent[0].dest == net.nodes["C"].orig
    assert net.nodes["C"].delivered[-1][1] == offer
    # unicast DHCP (a renewal to the server's MAC) is not the gateway feature's: it goes by TT
    net.run_for(2)  # the server's host is announced in G1's TT by now
    renewal = dhcp_unicast(CLIENT, Mac("02:aa:00:00:00:09"), 68, 67, 1)
    sent = [p for p in _sent_by(net, "C", lambda: (net.host_send("C", renewal), net.run_for(0.05)))
            if not isinstance(p, IvOgm)]
    assert len(sent) == 1 and type(sent[0]) is Unicast and sent[0].dest == net.nodes["G1"].orig
    # in gateway mode off, a DHCP broadcast is flooded like any other
    net.set_option("C", "gw_mode", "off")
    sent = _sent_by(net, "C", lambda: (net.host_send("C", dhcp_discover()), net.run_for(0.05)))
    assert any(isinstance(p, Bcast) for p in sent)


def test_gw_containers_of_any_size_as_the_kernel_reads_them():
    """Shorter than 8 bytes or a zero bandwidth: not a gateway; longer: its first 8 bytes."""
    net = _mesh(C=dict(gw_mode="client"), G1=dict(gw_mode="server"))
    net.link("C", "G1")
    net.run_for(10)
    c = net.nodes["C"].mesh
    orig = c.originators.get(net.nodes["G1"].orig)
    handler = c.gateway._ogm_container
    handler(net.now, orig, GatewayTvlv(300, 0))
    assert not c.gateway.rows()
    handler(net.now, orig, GatewayTvlv.decode_value(struct.pack("!II", 300, 60) + b"\x00\x07"))
    assert [(r["bandwidth_down"], r["bandwidth_up"]) for r in c.gateway.rows()] == [(300, 60)]
    handler(net.now, orig, None)  # an OGM without the container (or with a malformed one)
    assert not c.gateway.rows()


# --- against the kernel's bytes -------------------------------------------------------------------

GW_PCAP = "batman_iv-2node-gateway-dhcp"
A_MAC, B_MAC, B_SOFT = Mac("02:00:00:bb:01:01"), Mac("02:00:00:bb:02:01"), Mac("02:00:00:bb:02:00")


def _decoded(data: bytes):
    try:
        return decode_frame(data).packet
    except WireError:
        return None


def test_a_gateway_client_sends_the_kernels_dhcp_frames():
    """Replaying the kernel client's capture (A: `batctl gw server 50mbit/10mbit`, B: `batctl
    gw client`, udhcpc on B, udhcpd on A): the frames our core makes of B's host frames are
    byte for byte the kernel's (4addr DATA to A, with A's TTVN), and B's gateway list is
    what batctl gwl showed."""
    frames = [(cf.timestamp, cf.data) for cf in read_capture(str(PCAP_DIR / f"{GW_PCAP}.pcapng"))]
    kernel = [data for _, data in frames if data[6:12] == B_MAC and isinstance(_decoded(data), Unicast4Addr)
              and _decoded(data).subtype == 1]
    assert len(kernel) == 3  # two discovers and the request
    # (the kernel node's BLA was past its start-up hold of broadcasts when the capture began)
    result = replay(frames, iface="eth0", mac=B_MAC, soft_mac=B_SOFT, host_frames=True,
                    config=MeshConfig(gw_mode="client", bridge_loop_avoidance=False))
    ours = [data for _, data in result.transmitted if isinstance(_decoded(data), Unicast4Addr)]
    # the header's TTVN (byte 17) is A's TT version as B knows it: the kernel B learnt it
    # before the capture began, our core (starting within it) asks for A's table and gets no
    # answer, so it still has 0 there; every other byte is the kernel's
    ttvn = 14 + 3
    assert [k[ttvn] for k in kernel] == [1, 1, 1]
    assert [o[:ttvn] + o[ttvn + 1:] for o in ours] == [k[:ttvn] + k[ttvn + 1:] for k in kernel]
    assert [o[ttvn] for o in ours] == [result.mesh.originators.get(A_MAC).last_ttvn] * 3
    # no DHCP went out as a broadcast; A's `batctl gw off` at the end emptied the list
    packets = [_decoded(d) for _, d in result.transmitted]
    assert not any(isinstance(p, Bcast) and p.inner.h_proto == 0x0800 for p in packets)
    assert result.mesh.gateway.rows() == []


def test_a_node_full_of_vlans_still_fits_its_ogm_when_it_becomes_a_gateway():
    """The GW container's 12 bytes stay reserved while the node is no gateway, so that the
    VLANs TT took on meanwhile never push the OGM past the 512 bytes older kernels read."""
    net = _mesh()
    net.link("C", "G1")
    net.run_for(1)
    g1 = net.nodes["G1"].mesh
    g1.set_vlans(net.now, set(range(1, 101)))
    net.run_for(1)
    accepted = len(g1.vlans())
    assert 40 < accepted < 100
    net.set_option("G1", "gw_mode", "server")
    for _ in range(8):  # the VLANs' own entries are announced over the next OGMs
        net.run_for(0.2)
        size = 24 + sum(4 + len(t.encode_value()) for t in g1.ogm_tvlvs(net.now))
        assert size <= 512
    assert any(isinstance(t, GatewayTvlv) for t in g1.ogm_tvlvs(net.now))
    # one more VLAN (beside the untagged one) would not have fitted: OGM header, TT header and
    # data, a VLAN entry each, and the room the fixed containers keep (GW's 12 bytes among them)
    assert g1.tvlv.fixed_bytes >= 12 and 24 + 8 + (accepted + 2) * 8 + g1.tvlv.fixed_bytes > 512


def test_a_client_checks_the_election_at_every_copy_of_a_gateways_ogm_and_only_then():
    """Every neighbour forwards each OGM, and each copy may change the TQ toward its
    originator: a client checks its election at each copy of a gateway's OGM, as the
    kernel's handler runs for every copy. The other handlers' work (and the gateway's
    for an originator that is no gateway, or for a node that is no client) is done at
    the first copy."""
    net = _mesh(C=dict(gw_mode="client"), **SERVERS)
    for x, y in (("C", "G1"), ("C", "O"), ("G1", "O"), ("C", "G2")):
        net.link(x, y)
    gateway = net.nodes["C"].mesh.gateway
    checks, updates = [], []
    check, update = gateway._check_election, gateway._node_update
    gateway._check_election = lambda orig_node: (checks.append(orig_node.tvlvs_seen[0]), check(orig_node))
    gateway._node_update = lambda orig_node, *a: (updates.append((net.owner_of(orig_node.orig),
                                                                   orig_node.tvlvs_seen[0])), update(orig_node, *a))
    net.run_for(10)
    g1 = [seqno for name, seqno in updates if name == "G1"]
    assert len(g1) > len(set(g1)) + 10  # G1's OGMs come straight and through O: every copy
    assert len(checks) == len(g1) + len([1 for name, _ in updates if name == "G2"])
    o = [seqno for name, seqno in updates if name == "O"]
    assert len(o) == len(set(o)) > 10  # O (no gateway) heard once per OGM, although twice
    checks_before = len(checks)
    # a node that is no client: once per OGM, gateways too
    net.set_option("C", "gw_mode", "off")
    net.run_for(2)  # (the OGMs whose first copy came while C was a client)
    updates.clear()
    net.run_for(10)
    g1 = [seqno for name, seqno in updates if name == "G1"]
    assert len(g1) == len(set(g1)) > 10 and len(checks) == checks_before
