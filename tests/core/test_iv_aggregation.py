"""B.A.T.M.A.N. IV's aggregation queue (batadv_iv_ogm_queue_add): an OGM to forward joins
the newest pending aggregate that can take it, as the kernel's walk from the head of its
list finds it, and starts a new one when none can."""

from __future__ import annotations

import struct

from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.wire import Mac


def ogm(size: int, ttl: int = 50, seqno: int = 1) -> bytes:
    """An element of `size` bytes: a global OGM (no DIRECTLINK, TTL > 1) with TVLV filler."""
    tvlv_len = size - 24
    return struct.pack("!BBBBI6s6sBBH", 0, 15, ttl, 0, seqno, b"\x02" * 6, b"\x02" * 6, 0, 200,
                       tvlv_len) + bytes(tvlv_len)


def test_an_ogm_joins_the_newest_aggregate_that_can_take_it():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:aa"), now=0.0)
    mesh.add_interface(0.0, "eth0", Mac("02:00:00:00:00:01"))
    iface = mesh.iface("eth0")
    iv = mesh.algo
    iv._set_queue([])  # (our own first OGM, which forwarded ones may join, out of the way)
    iv._queue_add(ogm(400), iface, iface, own=False, send_time=1.00)  # an aggregate due at 1.10
    iv._queue_add(ogm(200), iface, iface, own=False, send_time=1.02)  # too big for it: one at 1.12
    older, newer = iv.queue
    assert (older.size, newer.size) == (400, 200)
    iv._queue_add(ogm(24, seqno=7), iface, iface, own=False, send_time=1.05)  # fits either
    assert (older.size, newer.size) == (400, 224)
    assert newer.ogms[-1] == ogm(24, seqno=7)
    # one that only the older one can take in time goes there
    iv._queue_add(ogm(24, seqno=8), iface, iface, own=False, send_time=1.005)
    assert (older.size, newer.size) == (424, 224)
    # and one that neither can take starts an aggregate of its own
    iv._queue_add(ogm(24, seqno=9), iface, iface, own=False, send_time=1.20)
    assert len(iv.queue) == 3
