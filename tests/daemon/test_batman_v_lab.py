"""B.A.T.M.A.N. V with real daemons: a diamond whose paths differ only in their
throughput_override; the route takes the faster one and switches when it goes down."""

import json
import time

from tests.daemon.labs import best_routes, make_lab, orig_mac, wait_for


def test_diamond_follows_throughput():
    lab = make_lab("parallel", routing_algo="BATMAN_V", orig_interval_ms=250)
    fast, slow = "100mbit", "10mbit"
    speeds = {"a": {"e-b": fast, "e-c": slow}, "b": {"e-a": fast, "e-d": fast},
              "c": {"e-a": slow, "e-d": slow}, "d": {"e-b": fast, "e-c": slow}}
    for name, node in lab.topology.nodes.items():
        node.batmand["hardif"] = {ifname: {"throughput_override": value, "elp_interval": 100}
                                  for ifname, value in speeds[name].items()}
    for link in lab.topology.links:
        link.loss_ab = link.loss_ba = 0.0
    with lab:
        lab.start()
        d = orig_mac(lab, "d")
        via_b, via_c = orig_mac(lab, "b"), orig_mac(lab, "c")
        wait_for(lambda: best_routes(lab, "a").get(d) == via_b, timeout=30)
        rows = json.loads(lab.batmanctl("a", "o", "--json", check=True).stdout)
        best = next(r for r in rows if r["orig_address"] == d and r["best"])
        assert best["throughput"] == 88200  # 100 Mbit/s after B's hop penalty: 1000*225//255 = 882
        table = lab.batmanctl("a", "o", check=True).stdout
        assert "( throughput)" in table and "88.2)" in table
        assert "BATMAN_V" in lab.batmanctl("a", "ra", check=True).stdout
        assert lab.batmanctl("a", "hardif", "e-b", "to", check=True).stdout.strip() == "100.0 MBit"
        neighbours = lab.batmanctl("a", "n", check=True).stdout
        assert "100.0" in neighbours and "10.0" in neighbours
        lab.set_loss("a", "b", 100)
        t0 = time.monotonic()
        wait_for(lambda: best_routes(lab, "a").get(d) == via_c, timeout=30)
        switched = time.monotonic() - t0
        lab.set_loss("a", "b", 0)
        t1 = time.monotonic()
        wait_for(lambda: best_routes(lab, "a").get(d) == via_b, timeout=30)
        back = time.monotonic() - t1
        print(f"BATMAN_V diamond: to the slow path after {switched:.1f} s, back after {back:.1f} s (interval 0.25 s)")
        # traffic flows again; d's own route back may still be settling for a moment after a's
        # switched (seen once in a full suite: both of two pings right after it were lost)
        wait_for(lambda: lab.exec("a", ["ping", "-c", "1", "-W", "1", lab.address("d")]).returncode == 0, timeout=10)
