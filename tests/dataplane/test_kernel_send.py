"""Sending in the kernel (dataplane.kernel_forward) against the data plane's own rules
(decision.decide_host), on a real veth and a real TAP: M's bat0 (a TAP) and m1, a veth
to A. Frames the host sends into bat0: one decide_host encapsulates may come out of m1 as
the data plane would build it (and then not reach the TAP); every other frame must reach
the TAP unchanged (the daemon decides), and nothing may come out of m1."""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import time

import pytest
import pytun

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.core.forwarding import FROM_HOST, ForwardingTable, SlowPath, SlowRule
from batmand.dataplane.decision import Encapsulate, decide_host
from batmand.dataplane.kernel_forward import KernelForward
from batmand.wire.constants import ETH_P_BATMAN
from batmand.wire.fastpath import unicast_prefix
from batmand.wire.mac import Mac
from tests.dataplane.test_kernel_deliver import ip4, ip6
from tests.dataplane.test_kernel_forward import link_mac, mark, packet_socket
from tests.netns import entered, ip, namespace

SOFT_MAC = b"\x02\x50\xf7\x00\x00\x01"
BRIDGED = b"\x02\xc1\x1e\x00\x00\x05"  # another client of ours
LEAVING = b"\x02\xc1\x1e\x00\x00\x06"  # in our table, roamed away
ORIG = Mac(b"\x02\x0a\x00\x00\x00\x01")  # the originator behind A
REMOTE = b"\x02\xbb\x00\x00\x00\x01"  # a client of ORIG
ROAMING = b"\x02\xbb\x00\x00\x00\x02"  # a client of ORIG that roams (frames carry TTVN - 1)
UNROUTED = b"\x02\xbb\x00\x00\x00\x03"  # a client of an originator we have no route to
GROUP = b"\x01\x00\x5e\x00\x00\x07"  # a multicast group ORIG's host listens to: in the table too
TTVN = 0  # (so a roaming client's frames carry 255)
M1_MTU = 1400
DHCP = SlowRule(FROM_HOST, 0x0800, 17, 67)
ETH_P_ALL = 0x0003


@contextlib.contextmanager
def node():
    with namespace() as a, namespace() as m:
        ip("link", "add", "a0", "netns", a, "type", "veth", "peer", "name", "m1", "netns", m)
        for ns, dev in ((a, "a0"), (m, "m1")):
            ip("link", "set", dev, "mtu", str(M1_MTU), "up", netns=ns)
        with entered(m):
            tap = pytun.TunTapDevice(name="bat0", flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
        try:
            os.set_blocking(tap.fileno(), False)
            ip("link", "set", "bat0", "address", str(Mac(SOFT_MAC)), "mtu", "1500", "up", netns=m)
            yield {"a": a, "m": m, "a0": link_mac(a, "a0"), "m1": link_mac(m, "m1"), "tap": tap}
        finally:
            tap.close()


def tables(net: dict, slow: SlowPath = SlowPath()) -> ForwardingUpdate:
    return ForwardingUpdate(
        origs={ORIG: OrigRoute(next_hop=Mac(net["a0"]), iface="m1", ttvn=TTVN)},
        clients={(Mac(REMOTE), 0): ClientRoute(ORIG), (Mac(ROAMING), 0): ClientRoute(ORIG, roam=True),
                 (Mac(UNROUTED), 0): ClientRoute(Mac(b"\x02\x0a\x00\x00\x00\x09")), (Mac(GROUP), 0): ClientRoute(ORIG)},
        local_clients={(Mac(SOFT_MAC), 0): True, (Mac(BRIDGED), 0): True, (Mac(LEAVING), 0): False},
        slow_path=slow)


def table_of(net: dict, slow: SlowPath = SlowPath()) -> ForwardingTable:
    table = ForwardingTable()
    table.apply(tables(net, slow))
    return table


@contextlib.contextmanager
def sender(net: dict, slow: SlowPath = SlowPath(), soft_mtu: int = 1500):
    """bat0's MTU 1500 by default: m1's 1400 cannot carry a full TCP segment, so TCP is
    the daemon's."""
    with entered(net["m"]):
        kf = KernelForward("bat0")
        if not kf.active:
            pytest.skip(f"no eBPF here: {kf.error}")
        assert kf.status()["send"] == "on" and kf.passage is not None, kf.send_error or kf.deliver_error
        try:
            kf.set_ports({"m1": (net["m1"], M1_MTU)}, None, False)
            kf.set_soft(True, soft_mtu)
            net["soft_mtu"] = soft_mtu
            kf.apply(tables(net, slow))
            yield kf
        finally:
            kf.close()


def frame(inner: bytes = b"", *, dst=REMOTE, src=SOFT_MAC, ethertype=0x0800, tag: int = 0) -> bytearray:
    vlan = b"\x81\x00" + tag.to_bytes(2, "big") if tag else b""
    return bytearray(dst + src + vlan + ethertype.to_bytes(2, "big") + (inner or ip4(17, 5000)))


def encapsulated(net: dict, table: ForwardingTable, f: bytes) -> bytes | None:
    """What the data plane makes of a host frame: the frame out of m1, or None (the daemon's)."""
    decision = decide_host(f, table)
    if decision.__class__ is not Encapsulate:
        return None
    tcp = (f[12:14] == b"\x08\x00" and f[14] == 0x45 and f[23] == 6) or (f[12:14] == b"\x86\xdd" and f[20] == 6)
    # TCP only where a full segment fits (so a flow never takes both ways), the rest by length
    if (M1_MTU < net["soft_mtu"] + 24) if tcp else (len(f) + 24 - 14 > M1_MTU):
        return None
    return unicast_prefix(bytes(decision.next_hop), net["m1"], bytes(decision.orig), decision.ttvn) + bytes(f)


def exchange(net: dict, frames: list[bytes]) -> tuple[dict, dict]:
    """Send the frames into bat0 as the host; what A got and what the TAP (the daemon) got, by index."""
    host = packet_socket(net["m"], "bat0", ETH_P_ALL)
    at_a, tap = packet_socket(net["a"], "a0", ETH_P_BATMAN), net["tap"].fileno()
    got: tuple[dict, dict] = ({}, {})
    try:
        for f in frames:
            host.send(f)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            ready, _, _ = select.select([at_a, tap], [], [], 0.2)
            while at_a in ready:
                try:
                    data = at_a.recv(4096)
                except BlockingIOError:
                    break
                got[0][int.from_bytes(data[-4:], "big")] = data
            while tap in ready:
                try:
                    data = os.read(tap, 4096)
                except BlockingIOError:
                    break
                got[1][int.from_bytes(data[-4:], "big")] = data
    finally:
        for s in (host, at_a):
            s.close()
    return got


def check(net: dict, table: ForwardingTable, frames: list[bytes]) -> list[int]:
    """Every frame went where decide_host allows; returns the indices the kernel sent."""
    at_a, at_tap = exchange(net, frames)
    sent = []
    for i, f in enumerate(frames):
        want = encapsulated(net, table, f)
        where = f"frame {i} {bytes(f[:40]).hex()}"
        if i in at_a:
            assert want is not None, f"{where}: sent, decide_host says no"
            assert at_a[i] == want, f"{where}: sent as {at_a[i][:50].hex()}, want {want[:50].hex()}"
            assert i not in at_tap, f"{where}: sent and left to the daemon"
            sent.append(i)
        else:
            assert at_tap.get(i) == bytes(f), f"{where}: neither sent nor left to the daemon unchanged"
    return sent


def test_the_kernel_sends_only_what_the_data_plane_sends():
    with node() as net, sender(net, SlowPath(rules=frozenset({DHCP}))) as kf:
        cases = [
            frame(), frame(ip4(1, 0)), frame(ip6(17, 53), ethertype=0x86DD), frame(src=BRIDGED),
            frame(dst=ROAMING), frame(ip4(17, 5000, payload_len=M1_MTU - 24 - 28)),  # sent: 6
            frame(ip4(6, 80)), frame(ip6(6, 80), ethertype=0x86DD),  # TCP: m1 cannot carry a full segment
            frame(ip4(17, 67)),  # the DHCP rule
            frame(ip4(17, 5000, payload_len=M1_MTU - 24 - 28 + 1)),  # too long for m1: fragmented by the daemon
            frame(dst=UNROUTED), frame(dst=b"\x02\xbb\x00\x00\x00\x09"), frame(dst=b"\xff" * 6), frame(dst=GROUP),
            frame(dst=b"\x33\x33\x00\x00\x00\x01", ethertype=0x86DD, inner=ip6(17, 5000)),
            frame(src=LEAVING), frame(src=b"\x02\x99\x00\x00\x00\x01"), frame(tag=5), frame(ethertype=0x0806),
            frame(ip4(17, 5000, ihl=6)), frame(ethertype=ETH_P_BATMAN),
        ]
        frames = mark(cases)
        sent = check(net, table_of(net, SlowPath(rules=frozenset({DHCP}))), frames)
        assert sent == list(range(6))
        counters = kf.counters()
        assert counters["tx"] == len(sent) and counters["tx_bytes"] == sum(len(frames[i]) for i in sent)
        seen = kf.take_seen()
        assert set(seen) >= {(Mac(SOFT_MAC), 0), (Mac(BRIDGED), 0)}, "senders not reported seen"


def test_tcp_crosses_the_passage_where_a_full_segment_fits():
    """bat0's MTU small enough for m1: TCP too, through the passage (segments counted there)."""
    with node() as net, sender(net, soft_mtu=M1_MTU - 24) as kf:
        frames = mark([frame(ip4(6, 80)), frame(ip6(6, 22), ethertype=0x86DD), frame(),
                       frame(ip4(6, 80, payload_len=M1_MTU - 24 - 28))])
        assert check(net, table_of(net), frames) == [0, 1, 2, 3]
        assert kf.counters()["tx"] == 4 and kf.status()["dropped"] == 0


def test_watched_senders_and_ipv6_rules_are_the_cores():
    """BLA's claimed senders (from_host_sources) and a rule for every IPv6 packet."""
    slow = SlowPath(from_host_sources=frozenset({(Mac(BRIDGED), 0)}), rules=frozenset({SlowRule(FROM_HOST, 0x86DD)}))
    with node() as net, sender(net, slow):
        frames = mark([frame(src=BRIDGED), frame(ip6(17, 53), ethertype=0x86DD), frame()])
        assert check(net, table_of(net, slow), frames) == [2]


def test_random_frames_agree_with_decide_host():
    rng = random.Random(5)
    slow = SlowPath(rules=frozenset({DHCP, SlowRule(FROM_HOST, 0x86DD, 58, None)}))
    with node() as net, sender(net, slow):
        base = [frame(), frame(ip4(17, 67)), frame(ip6(58, 0), ethertype=0x86DD), frame(dst=ROAMING), frame(dst=GROUP),
                frame(src=BRIDGED, inner=ip4(1, 0))]
        frames = []
        for _ in range(400):
            f = bytearray(rng.choice(base))
            for _ in range(rng.randint(1, 3)):
                f[rng.randrange(0, 14 + 24)] = rng.choice(
                    (0, 1, 2, 6, 17, 0x45, 0x46, 0x81, 0x86, 0xDD, 0xbb, 0x02, 0x03, rng.randrange(256)))
            frames.append(f)
        assert len(check(net, table_of(net, slow), mark(frames))) > 50


def test_route_and_clients_follow_the_table_and_taps_stop_sending():
    with node() as net, sender(net) as kf:
        table = table_of(net)
        assert check(net, table, mark([frame()])) == [0]
        # the client moves to an originator we have no route to: the daemon's
        update = ForwardingUpdate(origs={}, clients={(Mac(REMOTE), 0): ClientRoute(Mac(b"\x02\x0a\x00\x00\x00\x09"))},
                                  local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, mark([frame()])) == []
        update = ForwardingUpdate(origs={}, clients={(Mac(REMOTE), 0): ClientRoute(ORIG)}, local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, mark([frame()])) == [0]
        # the route goes: the daemon's
        update = ForwardingUpdate(origs={ORIG: None}, clients={}, local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, mark([frame()])) == []
        update = ForwardingUpdate(origs={ORIG: OrigRoute(next_hop=Mac(net["a0"]), iface="m1", ttvn=9)},
                                  clients={}, local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, mark([frame()])) == [0]
        # a packet socket listens on bat0 (tcpdump): the host's frames go through the TAP
        with entered(net["m"]):
            tcpdump = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            tcpdump.bind(("bat0", ETH_P_ALL))
            with entered(net["m"]):
                kf.watch_taps()
            assert kf.status()["send"] == "a packet socket listens on the soft interface"
            assert check(net, table, mark([frame()])) == []
        finally:
            tcpdump.close()
        with entered(net["m"]):
            kf.watch_taps()
        assert kf.status()["send"] == "on"
        assert check(net, table, mark([frame()])) == [0]
