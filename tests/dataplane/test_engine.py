"""One Engine on real parts (a veth's receive and transmit rings, a TAP as bat0) against
the protocol core: frames from the mesh and from the host, each sent twice (the second
meets the cached decision), including a priority-tagged batman-adv frame right after an
ordinary frame with the same addresses and tag. What the engine delivers to bat0, sends
out of the veth or hands to the slow path must be what decision.py says, with the bytes
the core's own Deliver / Transmit actions carry for the same frame
(test_decision.py checks the decisions against the core for random tables)."""

from __future__ import annotations

import contextlib
import random
import select
import socket
import subprocess
import time

import pytest

from batmand.core.config import MeshConfig
from batmand.core.events import Deliver, ForwardingUpdate, Transmit
from batmand.core.forwarding import ForwardingTable
from batmand.core.mesh import Mesh
from batmand.daemon.softif import SoftInterface
from batmand.dataplane import bpf
from batmand.dataplane.decision import DELIVER, SLOW, Encapsulate, Forward, decide_host, decide_mesh
from batmand.dataplane.engine import Engine, Port
from batmand.dataplane.rings import RxRing, TxRing
from batmand.wire import BROADCAST, Mac, TtChange, TtDataFlags, TtTvlv, TtVlan
from tests.dataplane.test_decision import ethernet, unicast
from tests.netns import entered, namespace

SOFT = Mac("02:00:00:00:00:aa")
OURS = Mac("02:00:00:00:0b:0b")  # the engine's hard interface, vb
NEIGHBOUR = Mac("02:5e:00:00:00:01")  # va: an originator and our next hop
BEYOND = Mac("02:5e:00:00:00:02")  # an originator behind it
THEIRS, MINE, STRANGER = Mac("06:c1:00:00:00:01"), Mac("06:c1:00:00:00:02"), Mac("06:ee:00:00:00:01")
NOW = 10.0


def _mesh() -> tuple[Mesh, ForwardingTable]:
    """The core's state: vb our interface; NEIGHBOUR (client THEIRS) and BEYOND reached
    through NEIGHBOUR; our client MINE; and the table it published. BLA off (its fast path
    is in test_decision.test_bla_sources)."""
    mesh = Mesh(MeshConfig(bridge_loop_avoidance=False), soft_mac=SOFT, rng=random.Random(1), now=0.0)
    table = ForwardingTable()
    actions = mesh.add_interface(NOW, "vb", OURS)
    actions += mesh.soft_iface_frame(NOW, ethernet(BROADCAST, MINE, None, 0x0806, bytes(28)))
    first = mesh.originators.get_or_create(NEIGHBOUR, NOW)
    for orig in (NEIGHBOUR, BEYOND):
        node = mesh.originators.get_or_create(orig, NOW)
        neigh = mesh.originators.neigh_get_or_create(node, mesh.iface("vb"), NEIGHBOUR, first, NOW)
        for outif in (None, mesh.iface("vb")):
            mesh.update_route(node, outif, neigh, NOW)
    tt = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=1, vlans=[TtVlan(crc=0, vid=0)],
                changes=[TtChange(flags=0, addr=THEIRS, vid=0)])
    mesh.ogm_tvlvs_received(NOW, first, [tt])
    actions += mesh.set_vlans(NOW, set())
    for action in actions:
        if isinstance(action, ForwardingUpdate):
            table.apply(action)
    return mesh, table


def _packet_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    sock.bind((ifname, 0))
    sock.setblocking(False)
    return sock


def _received(sock: socket.socket, wait: float = 0.05) -> list[bytes]:
    """The frames that arrived (not the ones this host sent) so far and within `wait` s."""
    frames, deadline = [], time.monotonic() + wait
    while True:
        try:
            data, addr = sock.recvfrom(65535)
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return frames
            select.select([sock], [], [], remaining)
            continue
        if addr[2] != socket.PACKET_OUTGOING:
            frames.append(data)


@contextlib.contextmanager
def veth_and_tap(neighbour: Mac):
    """Two namespaces joined by a veth: va (the neighbour's end, MAC `neighbour`,
    promiscuous) and vb (ours, OURS) with a TAP as bat0 beside it. Yields bat0, vb as a
    Port (its rings), a packet socket on bat0 (the host) and one on va (the wire); all of
    it closed and removed afterwards."""
    with namespace() as ns_a, namespace() as ns_b:
        for ns in (ns_a, ns_b):  # no IPv6 chatter of the hosts' own among the frames
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                            "net.ipv6.conf.default.disable_ipv6=1"], check=True)
        subprocess.run(["ip", "-n", ns_a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", ns_b],
                       check=True)
        subprocess.run(["ip", "-n", ns_a, "link", "set", "va", "address", neighbour.hex(":"), "promisc", "on", "up"],
                       check=True)
        subprocess.run(["ip", "-n", ns_b, "link", "set", "vb", "address", OURS.hex(":"), "up"], check=True)
        with entered(ns_b):
            soft = SoftInterface("bat0", mac=bytes(SOFT))
        try:
            with entered(ns_b):
                soft.set_offload(True, False)
                soft.up()
                port = Port("vb", bytes(OURS), 1500, RxRing("vb", frames=256, vnet_hdr=True,
                                                            program=bpf.UNICAST_ONLY), TxRing("vb", vnet_hdr=True))
                host = _packet_socket("bat0")
            with entered(ns_a):
                wire = _packet_socket("va")
            try:
                yield soft, port, host, wire
            finally:
                host.close()
                wire.close()
                port.rx.close()
                port.tx.close()
        finally:
            soft.close()


def _serve(engine: Engine, port: Port, fds: list[int], wait: float = 0.15) -> None:
    """Run the engine's handlers for whatever its ring and TAP have, for `wait` seconds."""
    deadline = time.monotonic() + wait
    while (remaining := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(fds, [], [], remaining)
        if port.rx.fileno() in readable:
            engine.on_port(port)
        if engine.tap_fd in readable:
            engine.on_tap()


def _as_received(frame: bytes) -> bytes:
    """A frame as a packet socket shows it on arrival: the kernel takes an 802.1Q tag out
    of the data (into the packet's metadata) before the socket sees it."""
    return frame[:12] + frame[16:] if frame[12:14] == b"\x81\x00" else frame


@pytest.mark.parametrize("gro", [False, True])  # with GRO, a lone frame skips the coalescer
def test_engine_does_what_the_decisions_and_the_core_say(gro):
    mesh, table = _mesh()
    ttvn = mesh.tt.ttvn
    tagged_ip = ethernet(MINE, THEIRS, 0, 0x0800, bytes(40))
    from_mesh = {
        "to our client": unicast(OURS, NEIGHBOUR, OURS, ttvn, ethernet(MINE, THEIRS, None, 0x0800, bytes(40))),
        "to our client, tagged": unicast(OURS, NEIGHBOUR, OURS, ttvn, tagged_ip),
        "batman-in-batman, tagged": unicast(OURS, NEIGHBOUR, OURS, ttvn, tagged_ip[:16] + b"\x43\x05" + bytes(40)),
        "to a stranger": unicast(OURS, NEIGHBOUR, OURS, ttvn, ethernet(STRANGER, THEIRS, None, 0x0800, bytes(40))),
        "to forward": unicast(OURS, NEIGHBOUR, BEYOND, 0, ethernet(STRANGER, THEIRS, None, 0x0800, bytes(40))),
        "to forward, TTL 1": unicast(OURS, NEIGHBOUR, BEYOND, 0, ethernet(STRANGER, THEIRS, None, 0x0800, bytes(40)),
                                     ttl=1),
    }
    from_host = {
        "to their client": ethernet(THEIRS, MINE, None, 0x0800, bytes(46)),
        "to their client, tagged": ethernet(THEIRS, MINE, 0, 0x0800, bytes(46)),
        "batman-in-batman, tagged": ethernet(THEIRS, MINE, 0, 0x4305, bytes(46)),
        "from a stranger": ethernet(THEIRS, STRANGER, None, 0x0800, bytes(46)),
        "broadcast": ethernet(BROADCAST, MINE, None, 0x0800, bytes(46)),
    }
    kinds = {name: decide_mesh(frame, OURS, OURS, table, False) for name, frame in from_mesh.items()}
    kinds.update({"host: " + name: decide_host(frame, table) for name, frame in from_host.items()})
    assert [k for k in kinds.values() if k is not SLOW] == [DELIVER, DELIVER, Forward("vb", NEIGHBOUR),
                                                            *[Encapsulate("vb", NEIGHBOUR, NEIGHBOUR, 1, (MINE, 0))] * 2]

    slow_host, slow_mesh = [], []
    with veth_and_tap(NEIGHBOUR) as (soft, port, host, wire):
        engine = Engine(soft.fd, slow_host.append, lambda ifname, frame: slow_mesh.append(frame), gro=gro)
        engine.add_port(port)
        engine.set_ports({"vb": (bytes(OURS), 1500)}, bytes(OURS), False)
        engine.set_table(table)
        fds = [port.rx.fileno(), soft.fd]
        for name, frame in [*from_mesh.items(), *from_host.items()]:
            is_host = frame in from_host.values()
            for _ in range(2):  # the second time from the engine's cache
                slow_host.clear()
                slow_mesh.clear()
                _received(host, 0)
                _received(wire, 0)
                (host if is_host else wire).send(frame)
                _serve(engine, port, fds)
                delivered = _received(host)
                sent = [f for f in _received(wire) if f[12:14] == b"\x43\x05"]
                core = mesh.soft_iface_frame(NOW, frame) if is_host else mesh.receive(NOW, "vb", frame)
                kind = kinds[("host: " if is_host else "") + name]
                if kind is SLOW:
                    assert (slow_host if is_host else slow_mesh) == [frame], name
                    assert sent == [] and delivered == [], name
                elif kind is DELIVER:
                    expected = [_as_received(a.frame) for a in core if isinstance(a, Deliver)]
                    assert delivered == expected == [_as_received(frame[24:])], name
                    assert sent == [] and slow_mesh == [], name
                else:
                    assert sent == [a.frame for a in core if isinstance(a, Transmit)], name
                    assert len(sent) == 1 and delivered == [] and slow_mesh == slow_host == [], name
        # one TAP write per delivered frame, each counted where GRO counts its writes
        assert engine.counters["gro_written"] == (engine.counters["rx"] if gro else 0)
        assert engine.counters["gro_merged"] == 0 and engine.counters["rx"] > 0
