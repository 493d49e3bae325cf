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
from batmand.core.events import Deliver, Transmit
from batmand.core.mesh import Mesh
from batmand.wire import Bcast, Elp, IvOgm, Mac, Ogm2, Unicast, Unicast4Addr, Unicast4AddrSubtype, WireError, decode_frame


@dataclass
class Replay:
    mesh: Mesh
    transmitted: list[tuple[float, bytes]] = field(default_factory=list)
    delivered: list[tuple[float, bytes]] = field(default_factory=list)  # to the host


def replay(frames: Iterable[tuple[float, bytes]], *, iface: str, mac: Mac, soft_mac: Mac,
           config: MeshConfig | None = None, host_frames: bool = False, warm_up: bool = False) -> Replay:
    """With `warm_up`, the capture's announcements (OGMs, ELPs) are played once before, so
    that the core knows its routes as the kernel node did, which ran before the capture
    began; then the whole capture, a capture's length later."""
    frames = list(frames)
    start = frames[0][0] if frames else 0.0
    mesh = Mesh(config or MeshConfig(), soft_mac=soft_mac, rng=random.Random(0), now=start)
    mesh.add_interface(start, iface, mac)
    mesh.algo.silence()  # no own OGMs: the kernel node's are in the capture
    result = Replay(mesh)
    if warm_up and frames:
        _play(Replay(mesh), frames, iface, mac, host_frames=False, announcements_only=True)
        shift = frames[-1][0] - start + 1.0
        frames = [(ts + shift, data) for ts, data in frames]
    _play(result, frames, iface, mac, host_frames=host_frames)
    return result


def _play(result: Replay, frames: list, iface: str, mac: Mac, *, host_frames: bool,
          announcements_only: bool = False) -> None:
    mesh = result.mesh
    hard_iface = mesh.iface(iface)

    def collect(now: float, actions: list) -> None:
        result.transmitted += [(now, a.frame) for a in actions if isinstance(a, Transmit)]
        result.delivered += [(now, a.frame) for a in actions if isinstance(a, Deliver)]

    for ts, data in frames:
        collect(ts, mesh.tick(ts))
        if announcements_only and not _is_announcement(data):
            continue
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


def _is_announcement(data: bytes) -> bool:
    try:
        return isinstance(decode_frame(data).packet, (IvOgm, Elp, Ogm2))
    except WireError:
        return False


def _from_own_host(packet, mac: Mac) -> bool:
    """A data packet the node made of its own host's frame (it forwards no others here)."""
    if isinstance(packet, Bcast):
        return packet.orig == mac
    if isinstance(packet, Unicast4Addr):  # DATA, or a DHT_GET: the host's own ARP request
        return packet.src == mac and packet.subtype in (Unicast4AddrSubtype.DATA, Unicast4AddrSubtype.DAT_DHT_GET)
    return isinstance(packet, Unicast)
