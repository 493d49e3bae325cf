"""B.A.T.M.A.N. V: the kernel's formulas with worked numbers, and routing in the simulator."""

import pytest

from batmand.core.bat_v import THROUGHPUT_DEFAULT, VHardifNeigh, VIface, estimate_throughput, forward_penalty
from batmand.core.config import HardifConfig, MeshConfig
from batmand.core.hardif import HardInterface, LinkFacts, WifiStation
from batmand.sim import Network
from batmand.wire import Mac

N = Mac("02:00:00:00:00:09")


def _iface(wifi=False, throughput_override_kbit=0, **link):
    return HardInterface(name="eth0", mac=Mac("02:00:00:00:00:01"), wifi=wifi,
                         settings=HardifConfig(throughput_override=throughput_override_kbit), link=LinkFacts(**link))




def test_ewma_as_linux_average_h():
    """DECLARE_EWMA(throughput, 10, 8): first sample taken as is, then 7/8 old + 1/8 new,
    kept with 10 fractional bits: 1000 then 200 -> (1000*1024*7 + 200*1024) / 8 = 900 (exact),
    then 200 -> 812.5 -> reads 812."""
    neigh = VHardifNeigh()
    assert neigh.throughput == 0
    neigh.throughput_add(1000)
    assert neigh.throughput == 1000
    neigh.throughput_add(200)
    assert neigh.throughput == 900
    neigh.throughput_add(200)
    assert neigh.throughput == 812
    for _ in range(100):
        neigh.throughput_add(200)
    assert neigh.throughput in (200, 201)  # converges (integer truncation)


def test_throughput_sources():
    assert estimate_throughput(_iface(throughput_override_kbit=100_000), N) == 1000  # override wins
    assert estimate_throughput(_iface(speed_mbit=10000), N) == 100000  # veth: 10 Gbit/s
    warnings = []
    iface = _iface()
    iface.algo = VIface(elp_seqno=0)  # as B.A.T.M.A.N. V enabled it
    assert estimate_throughput(iface, N, warnings.append) == THROUGHPUT_DEFAULT == 10  # 1 Mbit/s
    estimate_throughput(iface, N, warnings.append)
    assert len(warnings) == 1 and "defaulting to hardcoded throughput values of 1.0 Mbps" in warnings[0]
    wifi = _iface(wifi=True, stations={N: WifiStation(expected_throughput_kbps=54_000)})
    assert estimate_throughput(wifi, N) == 540  # expected throughput (kbit/s) / 100
    wifi.link.stations[N] = WifiStation(tx_bitrate_100kbps=1300)  # 130 Mbit/s PHY rate
    assert estimate_throughput(wifi, N) == 433  # a third of the bitrate
    assert estimate_throughput(wifi, Mac("02:00:00:00:00:77")) == 0  # not associated


@pytest.mark.parametrize("throughput,same_iface,full_duplex,expected", [
    (1000, False, True, 882),   # 1000 * 225 // 255 (hop penalty 30)
    (1000, True, False, 500),   # same half-duplex (Wi-Fi) interface: halved instead
    (1000, True, True, 882),    # same interface but full duplex: hop penalty
    (10, True, False, 8),       # 1 Mbit/s or less is never halved
])
def test_forward_penalty(throughput, same_iface, full_duplex, expected):
    rx = _iface(full_duplex=full_duplex)
    out = rx if same_iface else HardInterface(name="eth1", mac=Mac("02:00:00:00:00:02"))
    assert forward_penalty(throughput, rx, out, 30) == expected
    assert forward_penalty(throughput, rx, None, 30) == throughput  # default table: none


def test_chain_metric_worked_example():
    """A - B - C - D, all links 100 Mbit/s (1000 in 100 kbit/s units), hop penalty 30.
    A's path throughput to B = 1000; to C: B forwards C's OGM with 1000*225//255 = 882;
    to D: D's OGM at C is 1000, C forwards 882, at B min(1000, 882) = 882, B forwards
    882*225//255 = 778, at A min(1000, 778) = 778."""
    net = Network(seed=2, config=MeshConfig(routing_algo="BATMAN_V"))
    for name in "ABCD":
        net.add_node(name)
    for a, b in zip("ABC", "BCD"):
        net.link(a, b)
    for node in net.nodes.values():
        for iface in node.mesh.ifaces:
            node.mesh.set_hardif(iface.name, HardifConfig(throughput_override=100_000))  # 100 Mbit/s
    net.run_for(30)
    paths = {b: net.nodes["A"].mesh.algo.metric(net._router("A", b)) for b in "BCD"}
    assert paths == {"B": 1000, "C": 882, "D": 778}


def test_diamond_prefers_the_faster_path_and_switches():
    """A-B-D and A-C-D; B's links 100 Mbit/s, C's 50 Mbit/s: the route takes B (path
    882 vs 500*225//255 = 441). Cut A-B: V keeps the router until a neighbour's OGM is
    OGM_MAX_ORIGDIFF (5) seqnos newer, so the switch to C takes about 5 OGM intervals."""
    net = Network(seed=4, config=MeshConfig(routing_algo="BATMAN_V"))
    for name in "ABCD":
        net.add_node(name)
    speeds = {("A", "B"): 1000, ("B", "D"): 1000, ("A", "C"): 500, ("C", "D"): 500}
    for (a, b), speed in speeds.items():
        net.link(a, b)
        for node in (a, b):
            mesh = net.nodes[node].mesh
            mesh.set_hardif(mesh.ifaces[-1].name, HardifConfig(throughput_override=speed * 100))
    net.run_for(30)
    a_metric = net.nodes["A"].mesh.algo.metric
    assert net.next_hop("A", "D") == "B"
    assert a_metric(net._router("A", "D")) == 882
    net.find_segment("A", "B").up = False
    start = net.now
    while net.next_hop("A", "D") != "C":
        net.run_for(0.1)
        assert net.now - start < 8
    switched = net.now - start
    assert 4.0 <= switched <= 7.0, switched
    assert a_metric(net._router("A", "D")) == 441


def test_ogm2_ignored_until_elp_heard():
    net = Network(seed=6, config=MeshConfig(routing_algo="BATMAN_V", orig_interval_ms=300))
    a, b = net.add_node("A"), net.add_node("B")
    net.link("A", "B")
    for iface in b.mesh.ifaces:
        iface.algo.next_elp = 1e9  # B never sends ELP
    net.run_for(20)
    assert a.mesh.counters["drop_ogm2_before_elp"] > 0
    assert net.next_hop("A", "B") is None


def test_iv_and_v_do_not_mix():
    net = Network(seed=8)
    net.add_node("A")
    net.add_node("B", MeshConfig(routing_algo="BATMAN_V"))
    net.link("A", "B")
    net.run_for(10)
    assert net.next_hop("A", "B") is None and net.next_hop("B", "A") is None
    assert net.nodes["A"].mesh.counters["drop_other_routing_algorithm"] > 0


def test_nl80211_station_info_conversion():
    """The daemon's nl80211 reading (batmand/daemon/wifi.py): expected throughput in kbit/s,
    TX bitrate in 100 kbit/s units (the 32-bit attribute preferred)."""
    from batmand.daemon.wifi import station_from_info

    info = {"NL80211_STA_INFO_EXPECTED_THROUGHPUT": 54_000,
            "NL80211_STA_INFO_TX_BITRATE": {"NL80211_RATE_INFO_BITRATE32": 1300, "NL80211_RATE_INFO_BITRATE": 1300}}
    station = station_from_info(info)
    assert (station.expected_throughput_kbps, station.tx_bitrate_100kbps) == (54_000, 1300)
    iface = _iface(wifi=True, stations={N: station_from_info({"NL80211_STA_INFO_TX_BITRATE":
                                                              {"NL80211_RATE_INFO_BITRATE": 540}})})
    assert estimate_throughput(iface, N) == 180  # 54 Mbit/s PHY rate / 3
