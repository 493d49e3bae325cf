"""The per-outgoing-interface records: an algorithm names its record classes (subclasses of
the core's), the originator table holds them without a dict per owner for one interface,
and IV's TQ ring packed in one int behaves as the kernel's ring buffer."""

from __future__ import annotations

import random

import pytest

from batmand.core.algorithm import ALGORITHMS, register
from batmand.core.bat_iv import TQ_GLOBAL_WINDOW_SIZE, IvNeighIfInfo, IvOrigIfInfo
from batmand.core.bat_v import VNeighIfInfo, VOrigIfInfo
from batmand.core.config import MeshConfig
from batmand.core.hardif import HardInterface
from batmand.core.originator import NeighIfInfo, OrigIfInfo, OrigNode
from batmand.sim.network import Network
from batmand.wire import Mac


def test_algorithms_name_their_records_and_register_checks_them():
    assert (ALGORITHMS["BATMAN_IV"].neigh_ifinfo, ALGORITHMS["BATMAN_IV"].orig_ifinfo) == (IvNeighIfInfo, IvOrigIfInfo)
    assert (ALGORITHMS["BATMAN_V"].neigh_ifinfo, ALGORITHMS["BATMAN_V"].orig_ifinfo) == (VNeighIfInfo, VOrigIfInfo)
    saved = dict(ALGORITHMS)
    try:
        @register
        class Plain:  # no records of its own: the core's
            name = "TEST_PLAIN"
        assert (Plain.neigh_ifinfo, Plain.orig_ifinfo) == (NeighIfInfo, OrigIfInfo)
        with pytest.raises(TypeError):
            @register
            class Wrong:  # a record that the core could not use as its own
                name = "TEST_WRONG"
                orig_ifinfo = IvNeighIfInfo
        assert "TEST_WRONG" not in ALGORITHMS
    finally:
        ALGORITHMS.clear()
        ALGORITHMS.update(saved)


@pytest.mark.parametrize("algo", ["BATMAN_IV", "BATMAN_V"])
def test_a_mesh_holds_its_algorithms_records_one_object_each(algo):
    net = Network(seed=3, config=MeshConfig(orig_interval_ms=200, routing_algo=algo))
    for name in "ABC":
        net.add_node(name)
    net.link("A", "B")
    net.link("B", "C")
    net.run_for(8)
    mesh = net.nodes["A"].mesh
    records = ALGORITHMS[algo]
    c = mesh.originators.get(net.nodes["C"].orig)
    assert c.router() is not None
    assert all(type(info) is records.orig_ifinfo for info in c.ifinfo_values())
    for neigh in c.neighbours.values():
        infos = neigh.ifinfo_values()
        assert infos and all(type(info) is records.neigh_ifinfo for info in infos)
        assert all(not hasattr(info, "__dict__") and not hasattr(info, "algo") for info in infos)
    # the default table's, then the hard interface's (V makes it where it forwards)
    assert [outif for outif, _ in c.ifinfo_items()] in ([None], [None, mesh.ifaces[0]])


def test_per_outif_records_from_one_to_several_interfaces_and_back():
    node = OrigNode(Mac("02:00:00:00:00:09"), 0.0)
    e0, e1, e2 = (HardInterface(f"e{i}", Mac(f"02:00:00:00:01:0{i}")) for i in range(3))
    assert node.ifinfo_get(None) is None and node.ifinfo_get(e0) is None and node.ifinfo_items() == []
    made = {outif: node.ifinfo_new(outif, OrigIfInfo) for outif in (None, e0, e1, e2)}
    assert node.ifinfo_new(e1, OrigIfInfo) is made[e1]  # made once
    assert all(node.ifinfo_get(outif) is info for outif, info in made.items())
    assert dict(node.ifinfo_items()) == made and len(node.ifinfo_values()) == 4
    assert node.ifinfo_pop(e0) is made[e0] and node.ifinfo_get(e0) is None
    assert node.ifinfo_pop(e0) is None
    assert node.ifinfo_pop(e2) is made[e2]  # one left: back in the slot
    assert node.ifinfo_get(e1) is made[e1] and node.if_key is e1
    assert node.ifinfo_pop(e1) is made[e1] and node.ifinfo_pop(None) is made[None]
    assert node.ifinfo_items() == [] and node.router(e1) is None
    again = node.ifinfo_new(e2, OrigIfInfo)
    assert node.ifinfo_get(e2) is again and node.ifinfo_get(e1) is None


def test_the_packed_tq_ring_is_the_kernels_ring_buffer():
    rng = random.Random(7)
    info, ring, index = IvNeighIfInfo(), [0] * TQ_GLOBAL_WINDOW_SIZE, 0
    for _ in range(20000):
        value = rng.choice([0, 0, 1, 255, rng.randrange(256)])
        info.push_tq(value)
        ring[index] = value
        index = (index + 1) % TQ_GLOBAL_WINDOW_SIZE
        nonzero = [v for v in ring if v]
        assert info.tq_recv == ring and info.tq_index == index
        assert info.tq_avg == (sum(nonzero) // len(nonzero) if nonzero else 0)
        assert info.tq_ring < 1 << 60  # two digits of a Python int: one 32-byte object


def test_tt_crcs_kept_compact_read_as_a_dict():
    node = OrigNode(Mac("02:00:00:00:00:09"), 0.0)
    assert node.tt_crcs == {}
    node.tt_crcs = {0: 0xDEADBEEF}
    assert node.crcs_flat == 0xDEADBEEF and node.tt_crcs == {0: 0xDEADBEEF}  # the untagged VLAN alone
    node.tt_crcs = {0: 1, 5: 2}
    assert node.crcs_flat == (0, 1, 5, 2) and node.tt_crcs == {0: 1, 5: 2}
    node.tt_crcs = {7: 3}
    assert node.tt_crcs == {7: 3}
    node.tt_crcs = {}
    assert node.tt_crcs == {}
