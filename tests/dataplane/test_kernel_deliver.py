"""Delivery in the kernel (dataplane.kernel_forward) against the data plane's own rules
(decision.decide_mesh), on a real veth and a real TAP: A - M, M's soft interface a TAP
with an address, the program on M's m1. A frame decide_mesh delivers may reach M's soft
interface as its inner frame, finished (a packet socket there sees it as the host does);
every frame the kernel does not deliver must reach M's socket on m1 unchanged (the
daemon decides), and nothing else may come out anywhere."""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import time

import pytest
import pytun

from batmand.core.events import ForwardingUpdate
from batmand.core.forwarding import TO_HOST, ForwardingTable, SlowPath, SlowRule
from batmand.dataplane.decision import DELIVER, DeliverSeen, decide_mesh
from batmand.dataplane.kernel_forward import KernelForward
from batmand.wire.constants import ETH_P_BATMAN
from batmand.wire.mac import Mac
from tests.dataplane.test_kernel_forward import gather, link_mac, mark, packet_socket
from tests.netns import entered, ip, namespace

PRIMARY = b"\x02\x00\x00\x00\x00\x99"  # M's originator address (m1's MAC is set to it)
SOFT_MAC = b"\x02\x50\xf7\x00\x00\x01"
SOFT_IP, A_IP = "10.77.0.1", "10.77.0.2"
SOURCE = b"\x02\xaa\x00\x00\x00\x01"  # the inner sender
OTHER_CLIENT = b"\x02\xc1\x1e\x00\x00\x05"  # a client of ours behind bat0 (a bridge would have it)
LEAVING = b"\x02\xc1\x1e\x00\x00\x06"  # in our table, but roamed away
DHCP = SlowRule(TO_HOST, 0x0800, 17, 68)
ETH_P_ALL = 0x0003


@contextlib.contextmanager
def node():
    """A's a0 - M's m1; M's soft interface bat0, a TAP with an address. Yields the names,
    MACs and the TAP."""
    with namespace() as a, namespace() as m:
        ip("link", "add", "a0", "netns", a, "type", "veth", "peer", "name", "m1", "netns", m)
        ip("link", "set", "m1", "address", Mac(PRIMARY).__str__(), netns=m)
        for ns, dev in ((a, "a0"), (m, "m1")):
            ip("link", "set", dev, "mtu", "1560", "up", netns=ns)  # room for a full 1500-byte inner frame
        with entered(m):
            tap = pytun.TunTapDevice(name="bat0", flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
        try:
            ip("link", "set", "bat0", "address", str(Mac(SOFT_MAC)), "up", netns=m)
            ip("addr", "add", f"{SOFT_IP}/24", "dev", "bat0", netns=m)
            ip("neigh", "add", A_IP, "lladdr", str(Mac(SOURCE)), "dev", "bat0", netns=m)
            yield {"a": a, "m": m, "a0": link_mac(a, "a0"), "m1": PRIMARY, "tap": tap}
        finally:
            tap.close()


GROUP = b"\x01\x00\x5e\x00\x00\x01"  # a multicast group our host listens to: in our table too


def tables(slow: SlowPath = SlowPath()) -> ForwardingUpdate:
    local = {(Mac(SOFT_MAC), 0): True, (Mac(OTHER_CLIENT), 0): True, (Mac(LEAVING), 0): False, (Mac(GROUP), 0): True}
    return ForwardingUpdate(origs={}, clients={}, local_clients=local, slow_path=slow)


@contextlib.contextmanager
def deliverer(net: dict, slow: SlowPath = SlowPath(), gro: bool = True):
    with entered(net["m"]):
        kf = KernelForward("bat0", gro=gro)
        if not kf.active:
            pytest.skip(f"no eBPF here: {kf.error}")
        assert kf.passage is not None, kf.deliver_error
        try:
            kf.set_ports({"m1": (PRIMARY, 1500)}, PRIMARY, False)
            kf.set_soft(True, 1500)
            kf.apply(tables(slow))
            yield kf
        finally:
            kf.close()


def ip4(proto: int, dport: int, payload_len: int = 40, ihl: int = 5, src=A_IP, dst=SOFT_IP) -> bytes:
    total = ihl * 4 + 8 + payload_len
    header = bytes((0x40 | ihl, 0)) + total.to_bytes(2, "big") + bytes(4) + bytes((64, proto)) + bytes(2) \
        + socket.inet_aton(src) + socket.inet_aton(dst) + bytes((ihl - 5) * 4)
    header = header[:10] + _csum(header).to_bytes(2, "big") + header[12:]
    return header + (40000).to_bytes(2, "big") + dport.to_bytes(2, "big") + (8 + payload_len).to_bytes(2, "big") \
        + bytes(2) + bytes(payload_len)


def ip6(next_header: int, dport: int, payload_len: int = 40) -> bytes:
    return bytes((0x60, 0, 0, 0)) + (8 + payload_len).to_bytes(2, "big") + bytes((next_header, 64)) \
        + b"\xfd" + bytes(14) + b"\x02" + b"\xfd" + bytes(14) + b"\x01" \
        + (40000).to_bytes(2, "big") + dport.to_bytes(2, "big") + (8 + payload_len).to_bytes(2, "big") + bytes(2) \
        + bytes(payload_len)


def _csum(data: bytes) -> int:
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def frame(net: dict, inner: bytes = b"", *, dest=PRIMARY, inner_dst=SOFT_MAC, source=SOURCE, ethertype=0x0800,
          ttl=5, ttvn=1, ptype=0x40, src=None, tag: int = 0) -> bytearray:
    outer = net["m1"] + (src or net["a0"]) + ETH_P_BATMAN.to_bytes(2, "big")
    header = bytes((ptype, 15, ttl, ttvn)) + dest
    vlan = b"\x81\x00" + tag.to_bytes(2, "big") if tag else b""
    return bytearray(outer + header + inner_dst + source + vlan + ethertype.to_bytes(2, "big")
                     + (inner or ip4(17, 5000)))


def exchange(net: dict, frames: list[bytes]) -> tuple[dict, ...]:
    """Send the frames from A; what bat0's host side and M's socket on m1 got, by index."""
    return gather(packet_socket(net["a"], "a0", ETH_P_BATMAN), frames,
                  [packet_socket(net["m"], "bat0", ETH_P_ALL), packet_socket(net["m"], "m1", ETH_P_BATMAN)])


def table_of(slow: SlowPath = SlowPath()) -> ForwardingTable:
    table = ForwardingTable()
    table.apply(tables(slow))
    return table


def check(net: dict, table: ForwardingTable, frames: list[bytes]) -> int:
    """Every frame went where decide_mesh allows; returns how many the kernel delivered."""
    return len(delivered_by_kernel(net, table, frames))


def delivered_by_kernel(net: dict, table: ForwardingTable, frames: list[bytes]) -> list[int]:
    """check's work: the indices of the frames the kernel delivered."""
    at_soft, at_m = exchange(net, frames)
    delivered = []
    for i, f in enumerate(frames):
        decision = decide_mesh(f, net["m1"], PRIMARY, table, False)
        where = f"frame {i} {bytes(f[:60]).hex()}"
        if i in at_soft:
            assert decision is DELIVER or decision.__class__ is DeliverSeen, f"{where}: delivered, decide_mesh says {decision}"
            assert at_soft[i] == bytes(f[24:]), f"{where}: delivered as {at_soft[i][:40].hex()}"
            assert i not in at_m, f"{where}: delivered and left to the daemon"
            delivered.append(i)
        elif f[12:14] == ETH_P_BATMAN.to_bytes(2, "big"):  # else no socket of the daemon's sees it
            assert at_m.get(i) == bytes(f), f"{where}: neither delivered nor left to the daemon unchanged"
    return delivered


def test_the_kernel_delivers_only_what_the_data_plane_delivers():
    with node() as net, deliverer(net, SlowPath(rules=frozenset({DHCP}))) as kf:
        cases = [
            frame(net), frame(net, ip4(6, 80)), frame(net, ip4(17, 67)), frame(net, ip6(17, 5000), ethertype=0x86DD),
            frame(net, ip6(6, 22), ethertype=0x86DD), frame(net, inner_dst=OTHER_CLIENT),
            frame(net, ip4(6, 80, payload_len=1500 - 28)),  # a full-size inner frame; delivered: 7
            frame(net, ip4(17, 68)),  # DHCP: the core's
            frame(net, ip6(17, 68), ethertype=0x86DD),  # the rule names IPv4 only
            frame(net, inner_dst=LEAVING), frame(net, inner_dst=b"\x02\xbb\x00\x00\x00\x09"),
            frame(net, inner_dst=GROUP), frame(net, inner_dst=b"\xff" * 6),
            frame(net, tag=5), frame(net, ethertype=0x0806), frame(net, ethertype=ETH_P_BATMAN),
            frame(net, ip4(17, 5000, ihl=6)), frame(net, ip4(17, 68, ihl=6)),
            frame(net, dest=b"\x02\x00\x00\x00\x00\x98"), frame(net, ttl=1), frame(net, ptype=0x41),
            frame(net, src=b"\x03\x00\x00\x00\x00\x01"), frame(net, ttvn=200),
        ]
        frames = mark(cases)
        delivered = delivered_by_kernel(net, table_of(SlowPath(rules=frozenset({DHCP}))), frames)
        assert delivered[:7] == list(range(7)), "the plain frames for us and our clients must be delivered"
        counters = kf.counters()
        assert counters["rx"] == len(delivered)
        assert counters["rx_bytes"] == sum(len(frames[i]) - 24 for i in delivered)
        assert kf.status()["deliver"] == "on" and kf.status()["dropped"] == 0


def test_a_rule_for_every_ipv6_packet_takes_them_all():
    slow = SlowPath(rules=frozenset({SlowRule(TO_HOST, 0x86DD)}))
    with node() as net, deliverer(net, slow):
        frames = mark([frame(net, ip6(17, 5000), ethertype=0x86DD), frame(net)])
        assert delivered_by_kernel(net, table_of(slow), frames) == [1]


def test_random_frames_agree_with_decide_mesh():
    """Valid frames with a few random bytes of their headers and first IP bytes changed."""
    rng = random.Random(19)
    slow = SlowPath(rules=frozenset({DHCP, SlowRule(TO_HOST, 0x86DD, 58, None)}))
    with node() as net, deliverer(net, slow):
        base = [frame(net), frame(net, ip4(6, 443)), frame(net, ip6(6, 80), ethertype=0x86DD),
                frame(net, ip4(17, 68)), frame(net, ip6(58, 0), ethertype=0x86DD)]
        frames = []
        for _ in range(400):
            f = bytearray(rng.choice(base))
            for _ in range(rng.randint(1, 3)):
                f[rng.randrange(0, 24 + 14 + 24)] = rng.choice(
                    (0, 1, 2, 6, 17, 0x40, 0x43, 0x44, 0x45, 0x05, 0x81, 0x0F, 0x86, 0xDD, rng.randrange(256)))
            frames.append(f)
        assert check(net, table_of(slow), mark(frames)) > 50


def test_the_host_answers_what_the_kernel_delivered():
    """An ICMP echo request delivered in the kernel reaches bat0's host stack: the reply
    comes out of the TAP (to the daemon)."""
    with node() as net, deliverer(net) as kf:
        request = bytearray(ip4(1, 0, payload_len=24))
        request[20:28] = b"\x08\x00\x00\x00\x12\x34\x00\x01"
        request[20 + 2:20 + 4] = _csum(bytes(request[20:])).to_bytes(2, "big")
        sender = packet_socket(net["a"], "a0", ETH_P_BATMAN)
        try:
            os_fd = net["tap"].fileno()
            os.set_blocking(os_fd, False)
            sender.send(frame(net, bytes(request)))
            deadline, reply = time.monotonic() + 2.0, None
            while time.monotonic() < deadline and reply is None:
                select.select([os_fd], [], [], 0.2)
                try:
                    data = os.read(os_fd, 4096)
                except BlockingIOError:
                    continue
                if data[12:14] == b"\x08\x00" and data[14 + 9] == 1 and data[14 + 20] == 0:
                    reply = data
        finally:
            sender.close()
        assert reply is not None, "no echo reply from the host"
        assert reply[0:6] == SOURCE and reply[6:12] == SOFT_MAC
        assert kf.counters()["rx"] == 1


def test_watched_sources_are_delivered_and_reported_seen():
    """BLA on: only from sources we claimed, each reported seen with the time it was
    last delivered."""
    claimed = (Mac(SOURCE), 0)
    slow = SlowPath(multicast=True, to_host_sources=frozenset({claimed}))
    with node() as net, deliverer(net, slow) as kf:
        table = table_of(slow)
        before = time.monotonic()
        frames = mark([frame(net), frame(net, source=b"\x02\xaa\x00\x00\x00\x02"), frame(net, inner_dst=GROUP)])
        assert check(net, table, frames) == 1  # (BLA: multicast to the host is the core's)
        seen = kf.take_seen()  # (bat0's own address may be there too: the host answers from it)
        assert claimed in seen and before <= seen[claimed] <= time.monotonic()
        assert (Mac(b"\x02\xaa\x00\x00\x00\x02"), 0) not in seen
        assert claimed not in kf.take_seen(), "reported once per delivery, not again"
        # the claim goes: its frames are the daemon's
        update = ForwardingUpdate(origs={}, clients={}, local_clients={}, slow_path=SlowPath(
            multicast=True, to_host_sources=frozenset()))
        kf.apply(update)
        table.apply(update)
        assert check(net, table, mark([frame(net)])) == 0
        # BLA off again: everything as before
        update = ForwardingUpdate(origs={}, clients={}, local_clients={}, slow_path=SlowPath())
        kf.apply(update)
        table.apply(update)
        assert check(net, table, frames) == 2


def test_no_primary_or_soft_interface_down_no_delivery_and_closing_detaches():
    with node() as net:
        with deliverer(net) as kf:
            assert check(net, table_of(), mark([frame(net)])) == 1
            with entered(net["m"]):
                kf.set_ports({"m1": (PRIMARY, 1500)}, None, False)
            assert kf.status()["deliver"] == "no primary interface"
            at_soft, at_m = exchange(net, mark([frame(net)]))
            assert at_m and not at_soft
            with entered(net["m"]):
                kf.set_ports({"m1": (PRIMARY, 1500)}, PRIMARY, False)
            assert check(net, table_of(), mark([frame(net)])) == 1
            kf.set_soft(False, 1500)  # bat0 down: the daemon's (it counts the frames it cannot write)
            assert kf.status()["deliver"] == "the soft interface is down"
            at_soft, at_m = exchange(net, mark([frame(net)]))
            assert at_m and not at_soft
            for end in ("bat0-kseg", "bat0-kgro"):
                assert "inet6" not in ip("addr", "show", end, netns=net["m"]), "the host may send into it"
        at_soft, at_m = exchange(net, mark([frame(net)]))
        assert at_m and not at_soft
        assert "bat0-k" not in ip("-br", "link", netns=net["m"]), "the passage outlived the daemon's use"


def test_what_the_host_sends_into_the_passage_goes_nowhere():
    """The host's own frames out of either end of the passage (IPv6 neighbour discovery
    where /proc/sys is read-only, a DHCP client, a packet socket): neither into bat0
    nor out of m1, and the passage still delivers."""
    with node() as net, deliverer(net):
        own = link_mac(net["m"], "bat0-kseg")
        assert link_mac(net["m"], "bat0-kgro") == own
        ipv6 = ip6(58, 0)
        frames = mark([b"\x33\x33\x00\x00\x00\x02" + own + b"\x86\xdd" + ipv6,
                       b"\xff" * 6 + own + b"\x08\x00" + ip4(17, 67, dst="255.255.255.255"),
                       SOFT_MAC + own + b"\x08\x00" + ip4(17, 5000),  # unicast to bat0's address, in
                       bytes(frame(net))[:6] + own + bytes(frame(net))[12:]])  # ours, as if stage one made it
        for end in ("bat0-kseg", "bat0-kgro"):
            at_soft, at_a = gather(packet_socket(net["m"], end, ETH_P_ALL), frames,
                                   [packet_socket(net["m"], "bat0", ETH_P_ALL), packet_socket(net["a"], "a0", ETH_P_ALL)])
            came = [i for i in range(len(frames)) if i in at_soft or i in at_a]  # (not m1's own MLD reports)
            assert not came, f"the host's frames {came} out of {end} came out at bat0 or A"
        assert check(net, table_of(), mark([frame(net)])) == 1


def test_a_passage_left_by_a_daemon_killed_hard_is_replaced():
    """A veth pair outlives a SIGKILL: the next start takes the old one away and delivers."""
    from batmand.dataplane import veth

    stale = b"\x02\x00\x00\x00\x00\x42"
    with node() as net:
        with entered(net["m"]):
            veth.add_pair("bat0-kseg", "bat0-kgro", str(Mac(stale)), 1500)
        with deliverer(net):
            assert link_mac(net["m"], "bat0-kseg") != stale
            assert check(net, table_of(), mark([frame(net)])) == 1
        assert "bat0-k" not in ip("-br", "link", netns=net["m"])
