"""The throughput meter between batmand and the kernel's batman-adv (2022.3, batctl 2023.0
in a TCG VM): one interop-pair lab (b1 = batmand, k2 = kernel node, B.A.T.M.A.N. IV).

- `batctl tp` on the kernel node toward b1: our receiver ACKs the kernel's sender, and
  batctl prints its three result lines with plausible numbers;
- `batmanctl tp` on b1 toward k2: our sender, the kernel's receiver.
The VM runs under TCG: a few Mbit/s is what the kernel side manages there."""

from __future__ import annotations

import time

import pytest

from batmand.lab import Lab, load
from tests.daemon.labs import prefix
from tests.daemon.test_tp_lab import parse
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge

INTERVAL_MS = 500
FLOOR_MBPS = 1.0  # TCG: the guest's kernel is slow, but a test still moves megabits


@pytest.fixture(scope="module")
def pair():
    topo = load("interop-pair")
    topo.batmand["orig_interval_ms"] = INTERVAL_MS
    lab = Lab(topo, prefix())
    require_kernel_nodes(len(lab.kernel_nodes))
    with lab:
        lab.start(timeout=120)
        converge(lab)
        yield lab


def test_kernel_sender_our_receiver(pair):
    out = pair.exec("k2", ["batctl", "tp", "-t", "3000", pair.originator("b1")], timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    ms, total, mbps = parse(out.stdout)
    print(f"kernel k2 -> batmand b1: {mbps:.1f} Mbit/s ({total} bytes in {ms} ms)")
    assert 3000 <= ms <= 4000 and total % 1476 == 0 and mbps >= FLOOR_MBPS


def test_our_sender_kernel_receiver(pair):
    # a receiver session lingers up to 2 s after its last MSG (idle 1 s, checked every second),
    # and while it does, neither side may start a test toward the other (as in the kernel)
    time.sleep(2.1)
    out = pair.batmanctl("b1", "tp", "-t", "3000", pair.originator("k2"))
    assert out.returncode == 0, out.stdout + out.stderr
    ms, total, mbps = parse(out.stdout)
    print(f"batmand b1 -> kernel k2: {mbps:.1f} Mbit/s ({total} bytes in {ms} ms)")
    assert 3000 <= ms <= 3300 and total % 1476 == 0 and mbps >= FLOOR_MBPS
