"""alfred + batadv-vis in a mixed mesh: batmand - kernel - batmand. The kernel node runs
Debian's alfred and `batadv-vis -s` in its guest (the VM image carries them), the batmand
nodes publish with alfred_vis = true; batadv-vis on a batmand node and on the kernel node
both draw all three nodes with their links."""

from __future__ import annotations

import shutil

import pytest

from tests.daemon.alfred_lab import Alfreds, wait_drawn
from tests.daemon.labs import make_lab
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import _iface_macs, originator

pytestmark = pytest.mark.skipif(not shutil.which("alfred"), reason="needs Debian's alfred (scripts/setup.sh)")
NODES = ("b1", "k2", "b3")


@pytest.fixture(scope="module")
def mixed():
    require_kernel_nodes(1)
    lab = make_lab("interop-bkb", orig_interval_ms=500, alfred_vis=True, alfred_vis_interval_ms=1000)
    alfreds = Alfreds(lab)
    for node in ("b1", "b3"):
        lab.topology.nodes[node].batmand["alfred_socket"] = alfreds.socket(node)
    with lab:
        try:
            lab.start(timeout=180)
            missing = lab.exec("k2", ["sh", "-c", "command -v alfred && command -v batadv-vis"])
            assert missing.returncode == 0, ("the kernel nodes' VM image has no alfred: run "
                                             "scripts/kernel-node-setup.sh (it adds Debian's alfred package)")
            for node in NODES:
                alfreds.start(node)
            lab.alfreds = alfreds
            lab.origs = {n: originator(lab, n) for n in NODES}
            lab.ifaces = {n: _iface_macs(lab, n) for n in NODES}
            yield lab
        finally:
            alfreds.stop_all()


def _complete(lab):
    """Every node drawn, each with a link to the other end of each of its links: k2 (its own
    record from batadv-vis -s) to b1 and b3, b1 and b3 to one of k2's interfaces."""
    o, k2 = lab.origs, lab.ifaces["k2"]

    def check(picture) -> bool:
        if set(picture) != {o["b1"], o["k2"], o["b3"]}:
            return False
        links = {node: {n for _, n in picture[o[node]][1]} for node in NODES}
        return (links["k2"] == {o["b1"], o["b3"]} and len(links["b1"]) == 1 and links["b1"] <= k2
                and len(links["b3"]) == 1 and links["b3"] <= k2)

    return check


def test_batadv_vis_draws_batmand_and_kernel_nodes(mixed):
    doc, waited = wait_drawn(mixed.alfreds, "b1", _complete(mixed), timeout=60)
    print(f"\nbatadv-vis on b1 drew batmand and kernel nodes after {waited:.1f} s more")
    kernel = next(v for v in doc["vis"] if v["primary"] == mixed.origs["k2"])
    assert kernel["neighbors"] and all(1.0 <= float(n["metric"]) <= 255.0 for n in kernel["neighbors"])
    # the kernel node's own batadv-vis sees our records through its alfred
    wait_drawn(mixed.alfreds, "k2", _complete(mixed), timeout=30)
