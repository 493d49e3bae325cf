"""The interop matrix: batmand and the Linux kernel's batman-adv (2022.3) in one mesh.

Column B.A.T.M.A.N. IV (and V), rows: (a) batmand - kernel, (b) kernel - batmand - kernel,
(c) batmand - kernel - batmand, (d) a 5-node ring with 2 kernel nodes and a cut link.
Each cell runs every check in matrix.check_all; the cell's report is printed."""

import json

import pytest

from batmand.lab import Lab, load
from tests.daemon.labs import prefix, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import _o_rows, check_all, originator, ping

INTERVAL_MS = 500
WORKERS = 2  # the data plane with worker processes (fanout rings, TAP queues, offloads) meets the kernel


def _lab(topology: str, algo: str) -> Lab:
    topo = load(topology)
    topo.batmand["orig_interval_ms"] = INTERVAL_MS
    topo.batmand["routing_algo"] = algo
    topo.batmand["workers"] = WORKERS
    if algo == "BATMAN_V":  # virtio-net reports no speed: give both sides the same figure
        for name, node in topo.nodes.items():
            ifaces = [l.ifname_a if l.a == name else l.ifname_b for l in topo.links if name in (l.a, l.b)]
            node.batmand["hardif"] = {i: {"throughput_override": "100mbit"} for i in ifaces}
    return Lab(topo, prefix())


CELLS = [("interop-pair", None), ("interop-kbk", ("k1", "k3")), ("interop-bkb", ("b1", "b3"))]


@pytest.mark.parametrize("algo", ["BATMAN_IV", "BATMAN_V"])
@pytest.mark.parametrize("topology,tcp_pair", CELLS, ids=[c[0] for c in CELLS])
def test_cell(topology, tcp_pair, algo):
    lab = _lab(topology, algo)
    require_kernel_nodes(len(lab.kernel_nodes))
    report = {}
    with lab:
        lab.start(timeout=120)
        if tcp_pair is None:
            tcp_pair = (lab.kernel_nodes[0], lab.daemon_nodes[0])
        check_all(lab, report, tcp_pair=tcp_pair, algo=algo)
        if topology in ("interop-kbk", "interop-pair"):  # our node's kernel moved frames (the default)
            status = json.loads(lab.batmanctl(lab.daemon_nodes[0], "dp", "--json", check=True).stdout)
            kernel = report["kernel_forward"] = status["kernel_forward"]
            if topology == "interop-kbk":  # the kernel nodes' frames crossed our node
                assert kernel["forward"] > 0, kernel
            else:  # delivered from the kernel node and sent to it (TCP both ways, pings)
                assert kernel["rx"] > 0 and kernel["tx"] > 0, kernel
                assert kernel["tx"] > 1000, "our node's TCP to the kernel node was not sent by its kernel path"
    print(f"\nINTEROP {algo} {topology}: {json.dumps(report)}")


@pytest.mark.parametrize("algo", ["BATMAN_IV", "BATMAN_V"])
def test_ring_with_a_cut_link(algo):
    lab = _lab("interop-ring", algo)
    require_kernel_nodes(len(lab.kernel_nodes))
    report = {}
    with lab:
        lab.start(timeout=120)
        check_all(lab, report, tcp_pair=None, algo=algo)
        # cut one link of the ring: everybody still reaches everybody the other way round
        link = lab.topology.links[0]
        lab.set_loss(link.a, link.b, 100)
        origs = {n: originator(lab, n) for n in lab.topology.nodes}
        _, rerouted = wait_for(lambda: all(ping(lab, link.a, z, count=1) for z in lab.topology.nodes
                                           if z != link.a and lab.is_kernel(z) != lab.is_kernel(link.a)),
                               timeout=60, step=1.0)
        report["cut"] = f"{link.a}-{link.b} cut: reachable again after {rerouted:.1f} s"
        lab.set_loss(link.a, link.b, 0)
        _, restored = wait_for(lambda: any(r["orig_address"] == origs[link.b] and r["best"]
                                           and r["neigh_address"] in (origs[link.b],)
                                           for r in _o_rows(lab, link.a)), timeout=90, step=1.0)
        report["restore"] = f"direct route back after {restored:.1f} s"
    print(f"\nINTEROP {algo} interop-ring: {json.dumps(report)}")
