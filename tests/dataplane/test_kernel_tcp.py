"""TCP through the kernel path alone (dataplane.kernel_forward), both ways: two nodes P
and Q, each a bat0 TAP that nobody reads (what reaches the daemon is lost) and the
programs, joined by a veth; a real TCP transfer between the two bat0 addresses.

The sender's stack hands bat0 GSO frames: the passage must cut them into segments that
each carry our header and fit the hard interface, as the kernel module sends them. The
receiver's passage merges them again (GRO) while `gro` is on, and hands bat0 each
segment while it is off. The bytes must arrive whole and in order."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time

import pytest
import pytun

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.core.forwarding import SlowPath
from batmand.dataplane.kernel_forward import KernelForward
from batmand.wire.constants import ETH_P_BATMAN, PacketType
from batmand.wire.fastpath import DEST_OFF
from batmand.wire.mac import Mac
from tests.dataplane.test_kernel_forward import link_mac, packet_socket
from tests.netns import entered, ip, namespace

HARD_MTU = 1560  # room for a full 1500-byte inner frame and our header
SOFT = {"p": (b"\x02\x50\x00\x00\x00\x01", "10.79.0.1"), "q": (b"\x02\x50\x00\x00\x00\x02", "10.79.0.2")}
SIZE = 8 << 20
ETH_P_ALL = 0x0003


@contextlib.contextmanager
def pair(gro: bool):
    """P's p1 - Q's q1, each node's bat0 with its address, the peer's in its neighbour
    table (ARP would go to the daemon), and its kernel path knowing the other's client."""
    with namespace() as p, namespace() as q, contextlib.ExitStack() as stack:
        ns = {"p": p, "q": q}
        ip("link", "add", "p1", "netns", p, "type", "veth", "peer", "name", "q1", "netns", q)
        taps, paths = {}, {}
        for node, other in (("p", "q"), ("q", "p")):
            ip("link", "set", f"{node}1", "mtu", str(HARD_MTU), "up", netns=ns[node])
            with entered(ns[node]):
                taps[node] = pytun.TunTapDevice(name="bat0", flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
            stack.callback(taps[node].close)
            os.set_blocking(taps[node].fileno(), False)
            mac, addr = SOFT[node]
            ip("link", "set", "bat0", "address", str(Mac(mac)), "mtu", "1500", "up", netns=ns[node])
            ip("addr", "add", f"{addr}/24", "dev", "bat0", netns=ns[node])
            ip("neigh", "add", SOFT[other][1], "lladdr", str(Mac(SOFT[other][0])), "dev", "bat0", netns=ns[node])
        macs = {node: link_mac(ns[node], f"{node}1") for node in ns}
        for node, other in (("p", "q"), ("q", "p")):
            with entered(ns[node]):
                kf = KernelForward("bat0", gro=gro)
                stack.callback(kf.close)
                if not kf.active:
                    pytest.skip(f"no eBPF here: {kf.error}")
                assert kf.passage is not None, kf.deliver_error
                kf.set_ports({f"{node}1": (macs[node], HARD_MTU)}, macs[node], False)
                kf.set_soft(True, 1500)
                kf.apply(ForwardingUpdate(
                    origs={Mac(macs[other]): OrigRoute(next_hop=Mac(macs[other]), iface=f"{node}1", ttvn=1)},
                    clients={(Mac(SOFT[other][0]), 0): ClientRoute(Mac(macs[other]))},
                    local_clients={(Mac(SOFT[node][0]), 0): True}, slow_path=SlowPath()))
                assert kf.status()["send"] == "on" and kf.status()["deliver"] == "on"
                paths[node] = kf
        yield ns, macs, taps, paths


def transfer(ns: dict) -> tuple[str, str]:
    """SIZE random bytes from P to Q over TCP: the SHA-256 sent and received."""
    data = os.urandom(SIZE)
    with entered(ns["q"]):
        server = socket.create_server((SOFT["q"][1], 5201))
    got = hashlib.sha256()

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(20)
            while chunk := conn.recv(1 << 16):
                got.update(chunk)

    receiver = threading.Thread(target=receive)
    receiver.start()
    try:
        with entered(ns["p"]):
            client = socket.create_connection((SOFT["q"][1], 5201), timeout=20)
        with client:
            client.sendall(data)
    finally:
        receiver.join(30)
        server.close()
    return hashlib.sha256(data).hexdigest(), got.hexdigest()


@pytest.mark.parametrize("gro", [True, False], ids=["gro", "no-gro"])
def test_tcp_crosses_the_kernel_path_cut_to_segments_and_merged(gro):
    with pair(gro) as (ns, macs, taps, paths):
        wire = packet_socket(ns["q"], "q1", ETH_P_ALL)  # what crossed the veth (taps come before tc)
        host = packet_socket(ns["q"], "bat0", ETH_P_ALL)  # what Q's host got
        for sock in (wire, host):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
        try:
            sent, received = transfer(ns)
            on_wire = [f for f in drain(wire) if f[12:14] == ETH_P_BATMAN.to_bytes(2, "big") and f[:6] == macs["q"]]
            at_host = drain(host)
        finally:
            wire.close()
            host.close()
        assert received == sent, "the transfer arrived damaged or short"
        # every frame on the wire a plain unicast to Q's originator that fits the veth
        assert on_wire and all(f[14] == PacketType.UNICAST and f[DEST_OFF:DEST_OFF + 6] == macs["q"]
                               for f in on_wire)
        assert max(len(f) for f in on_wire) <= HARD_MTU + 14
        assert max(len(f) for f in on_wire) > 1400, "no full-size segments: the sender's GSO frames were not cut"
        merged = [f for f in at_host if len(f) > 1514]
        assert bool(merged) == gro, f"{len(merged)} frames bigger than the MTU reached bat0"
        # nothing reached either daemon, so every data frame went through the kernel
        for node in ("p", "q"):
            assert not to_daemon(taps[node], 6), f"{node}'s TAP got TCP frames"
        assert paths["p"].counters()["tx"] >= SIZE // 1500
        assert paths["q"].counters()["rx"] >= SIZE // 1500
        assert paths["p"].status()["dropped"] == paths["q"].status()["dropped"] == 0


def drain(sock: socket.socket) -> list[bytes]:
    sock.setblocking(False)
    frames = []
    while True:
        try:
            frames.append(sock.recv(1 << 17))
        except BlockingIOError:
            return frames


def to_daemon(tap, protocol: int) -> list[bytes]:
    """The IPv4 frames of `protocol` the host wrote into the TAP (the daemon's way)."""
    frames = []
    while True:
        try:
            frame = os.read(tap.fileno(), 1 << 17)
        except BlockingIOError:
            return frames
        if frame[12:14] == b"\x08\x00" and frame[14 + 9] == protocol:
            frames.append(frame)


UDP_SEGMENT = 103  # (linux/udp.h): the stack hands bat0 one GSO frame for several datagrams


def test_udp_gso_stays_with_the_daemon():
    """Only TCP crosses the passage to be cut: a UDP GSO frame goes to the daemon (which
    cuts it), never out of the hard interface whole."""
    with pair(True) as (ns, macs, taps, paths):
        with entered(ns["q"]):
            receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with entered(ns["p"]):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            receiver.bind((SOFT["q"][1], 5300))
            receiver.settimeout(0.5)
            sender.setsockopt(socket.SOL_UDP, UDP_SEGMENT, 500)  # (the whole frame fits the route's MTU)
            sender.sendto(bytes(1000), (SOFT["q"][1], 5300))
            sender.setsockopt(socket.SOL_UDP, UDP_SEGMENT, 0)
            sender.sendto(b"whole", (SOFT["q"][1], 5300))  # a plain datagram: the kernel's
            assert receiver.recv(4096) == b"whole"
            with pytest.raises(TimeoutError):
                receiver.recv(4096)
        finally:
            sender.close()
            receiver.close()
        time.sleep(0.2)
        udp = [len(frame) - 14 - 28 for frame in to_daemon(taps["p"], 17)]
        assert udp == [500, 500], f"P's daemon got UDP payloads {udp}"
        assert paths["p"].counters()["tx"] == 1
