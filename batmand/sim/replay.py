"""Replay what a kernel node saw on one interface into a protocol core.

The core takes the kernel node's place: frames it received are fed to `receive`, and the
node's own OGMs (sent in the capture by the kernel, not by us) only advance the core's
OGM counter and echo windows, so that the neighbours' echoes are counted exactly as the
kernel counted them. The core never originates OGMs of its own here; what it would
transmit otherwise (rebroadcasts, TT requests, answers) is collected for comparison.

With `host_frames`, the frames the kernel node's own host sent into the mesh (the inner
frames of its BCAST and of its UNICAST / UNICAST_4ADDR DATA packets) are also handed to the
core as host frames at the same moment, so that what the core makes of them can be
compared with what the kernel sent."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from batmand.core.config import MeshConfig
from batmand.core.events import Transmit
from batmand.core.mesh import Mesh
from batmand.wire import Bcast, Elp, IvOgm, Mac, Unicast, Unicast4Addr, Unicast4AddrSubtype, WireError, decode_frame


@dataclass
class Replay:
    mesh: Mesh
    transmitted: list[tuple[float, bytes]] = field(default_factory=list)


def replay(frames: Iterable[tuple[float, bytes]], *, iface: str, mac: Mac, soft_mac: Mac,
           config: MeshConfig | None = None, host_frames: bool = False) -> Replay:
    frames = list(frames)
    start = frames[0][0] if frames else 0.0
    mesh = Mesh(config or MeshConfig(), soft_mac=soft_mac, rng=random.Random(0), now=start)
    mesh.add_interface(start, iface, mac)
    hard_iface = mesh.iface(iface)
    mesh.algo.silence()  # no own OGMs: the kernel node's are in the capture
    result = Replay(mesh)

    def collect(now: float, actions: list) -> None:
        result.transmitted += [(now, a.frame) for a in actions if isinstance(a, Transmit)]

    for ts, data in frames:
        collect(ts, mesh.tick(ts))
        if data[6:12] != mac:
            collect(ts, mesh.receive(ts, iface, data))
            continue
        try:
            frame = decode_frame(data)
        except WireError:
            continue
        for packet in frame.packets:
            if isinstance(packet, IvOgm) and packet.orig == mac:
                mesh.algo.own_ogm_sent(hard_iface, packet.seqno)
            elif isinstance(packet, Elp):
                mesh.algo.own_elp_sent(hard_iface)
            elif host_frames and _from_own_host(packet, mac):
                collect(ts, mesh.soft_iface_frame(ts, packet.inner.encode()))
    return result


def _from_own_host(packet, mac: Mac) -> bool:
    """A data packet the node made of its own host's frame (it forwards no others here)."""
    if isinstance(packet, Bcast):
        return packet.orig == mac
    if isinstance(packet, Unicast4Addr):
        return packet.src == mac and packet.subtype == Unicast4AddrSubtype.DATA
    return isinstance(packet, Unicast)
