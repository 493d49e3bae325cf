"""Replay what a kernel node saw on one interface into a protocol core.

The core takes the kernel node's place: frames it received are fed to `receive`, and the
node's own OGMs (sent in the capture by the kernel, not by us) only advance the core's
OGM counter and echo windows, so that the neighbours' echoes are counted exactly as the
kernel counted them. The core sends nothing of its own."""

from __future__ import annotations

import random
from collections.abc import Iterable

from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.wire import IvOgm, Mac, WireError, decode_frame


def replay(frames: Iterable[tuple[float, bytes]], *, iface: str, mac: Mac, soft_mac: Mac,
           config: MeshConfig | None = None, until: float | None = None) -> Mesh:
    frames = list(frames)
    start = frames[0][0] if frames else 0.0
    mesh = Mesh(config or MeshConfig(), soft_mac=soft_mac, rng=random.Random(0), now=start)
    mesh.add_interface(start, iface, mac)
    hard_iface = mesh.iface(iface)
    mesh.algo.queue.clear()  # the kernel node's own OGMs are in the capture
    for ts, data in frames:
        mesh.tick(ts)
        mesh.algo.queue.clear()
        if data[6:12] == mac:
            try:
                frame = decode_frame(data)
            except WireError:
                continue
            for packet in frame.packets:
                if isinstance(packet, IvOgm) and packet.orig == mac:
                    mesh.algo.own_ogm_sent(hard_iface, packet.seqno)
            continue
        mesh.receive(ts, iface, data)
    if until is not None:
        mesh.tick(until)
    return mesh
