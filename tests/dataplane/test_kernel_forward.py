"""Forwarding in the kernel (dataplane.kernel_forward) against the data plane's own rules
(decision.decide_mesh), on real veths: A - M - B, the program on M's interfaces, frames
sent from A. A frame decide_mesh forwards must come out at B rewritten as the data plane
would rewrite it (and not reach M's own socket); every other frame must reach M's socket
unchanged (the daemon decides) and not B."""

from __future__ import annotations

import contextlib
import random
import select
import socket
import time

import pytest

from batmand.core.events import ForwardingUpdate, OrigRoute
from batmand.core.forwarding import ForwardingTable
from batmand.dataplane.decision import Forward, decide_mesh
from batmand.dataplane import kernel_forward
from batmand.dataplane.kernel_forward import KernelForward
from batmand.wire.constants import ETH_P_BATMAN, VLAN_HAS_TAG
from batmand.wire.fastpath import TTL_OFF
from batmand.wire.mac import Mac
from tests.netns import entered, ip, namespace

DEST = Mac(b"\x02\xde\x57\x00\x00\x01")  # the originator M routes toward B
ELSEWHERE = Mac(b"\x02\xde\x57\x00\x00\x02")  # routed back out of m1 to A
LOCAL_CLIENT = b"\x02\xc1\x1e\x00\x00\x01"  # a client of M's own
M1_MTU, M2_MTU = 1500, 1400
TTVN = 200


def link_mac(netns: str, ifname: str) -> bytes:
    return bytes.fromhex(ip("-br", "link", "show", ifname, netns=netns).split()[2].replace(":", ""))


def packet_socket(netns: str, ifname: str, proto: int) -> socket.socket:
    with entered(netns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(proto))
    sock.bind((ifname, proto))
    sock.setblocking(False)
    return sock


@contextlib.contextmanager
def line():
    """A - M - B: A's a0 to M's m1, M's m2 to B's b0; yields the namespaces and MACs."""
    with namespace() as a, namespace() as m, namespace() as b:
        ip("link", "add", "a0", "netns", a, "type", "veth", "peer", "name", "m1", "netns", m)
        ip("link", "add", "m2", "netns", m, "type", "veth", "peer", "name", "b0", "netns", b)
        ip("link", "set", "m2", "mtu", str(M2_MTU), netns=m)
        ip("link", "set", "b0", "mtu", str(M2_MTU), netns=b)
        for ns, dev in ((a, "a0"), (m, "m1"), (m, "m2"), (b, "b0")):
            ip("link", "set", dev, "up", netns=ns)
        yield {"a": a, "m": m, "b": b, "a0": link_mac(a, "a0"), "m1": link_mac(m, "m1"),
               "m2": link_mac(m, "m2"), "b0": link_mac(b, "b0")}


def route_update(net: dict, **extra) -> ForwardingUpdate:
    origs = {DEST: OrigRoute(next_hop=Mac(net["b0"]), iface="m2", ttvn=TTVN),
             ELSEWHERE: OrigRoute(next_hop=Mac(net["a0"]), iface="m1", ttvn=3)}
    return ForwardingUpdate(origs=extra.get("origs", origs), clients={},
                            local_clients=extra.get("local_clients", {(Mac(LOCAL_CLIENT), 0): True}))


@contextlib.contextmanager
def forwarder(net: dict, wifi: bool = False):
    with entered(net["m"]):
        kf = KernelForward()
        if not kf.active:
            pytest.skip(f"no eBPF forwarding here: {kf.error}")
        try:
            kf.set_ports({"m1": (net["m1"], M1_MTU), "m2": (net["m2"], M2_MTU)}, None, wifi)
            kf.apply(route_update(net))
            yield kf
        finally:
            kf.close()


def frame(net: dict, *, dst=None, src=None, ptype=0x40, version=15, ttl=5, ttvn=TTVN, dest=DEST,
          inner_dst=b"\x02\xbb\x00\x00\x00\x01", inner=b"\x08\x00", payload_len=60, tag: int = 0) -> bytearray:
    outer = (dst or net["m1"]) + (src or net["a0"]) + ETH_P_BATMAN.to_bytes(2, "big")
    header = bytes((ptype, version, ttl, ttvn & 0xFF)) + bytes(dest)
    vlan = b"\x81\x00" + tag.to_bytes(2, "big") if tag else b""
    return bytearray(outer + header + inner_dst + b"\x02\xaa\x00\x00\x00\x01" + vlan + inner + bytes(payload_len))


def mark(frames: list) -> list[bytes]:
    """Each frame's last 4 bytes its index, to find it again (beyond what anyone reads)."""
    out = []
    for i, f in enumerate(frames):
        f = bytearray(f)
        f[-4:] = i.to_bytes(4, "big")
        out.append(bytes(f))
    return out


def expected(net: dict, table: ForwardingTable, f: bytes, wifi: bool = False) -> bytes | None:
    """What decide_mesh makes of a frame from A on m1: the frame B gets, or None (the daemon's)."""
    decision = decide_mesh(f, net["m1"], b"\x02\x00\x00\x00\x00\x99", table, wifi)
    if decision.__class__ is not Forward:
        return None
    mtu = M2_MTU if decision.iface == "m2" else M1_MTU
    if len(f) - 14 > mtu:
        return None  # the engine leaves it to the core, which fragments it
    out = net["b0"] if decision.iface == "m2" else None
    if out is None:
        return b"to A"  # forwarded back out of m1
    g = bytearray(f)
    g[0:12] = bytes(decision.next_hop) + net["m2"]
    g[TTL_OFF] -= 1
    return bytes(g)


def exchange(net: dict, frames: list[bytes]) -> tuple[dict, ...]:
    """Send the frames from A; what B, M's socket and A (back out of m1) got, by index."""
    return gather(packet_socket(net["a"], "a0", ETH_P_BATMAN), frames,
                  [packet_socket(net["b"], "b0", ETH_P_BATMAN), packet_socket(net["m"], "m1", ETH_P_BATMAN),
                   packet_socket(net["a"], "a0", ETH_P_BATMAN)])


def gather(sender: socket.socket, frames: list[bytes], socks: list[socket.socket]) -> tuple[dict, ...]:
    """Send the frames; what each socket received within a second (not what it sent), by
    the index in each frame's last 4 bytes. Closes the sockets."""
    got: tuple[dict, ...] = tuple({} for _ in socks)
    try:
        for f in frames:
            sender.send(f)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            ready, _, _ = select.select(socks, [], [], 0.2)
            for sock in ready:
                while True:
                    try:
                        data, addr = sock.recvfrom(4096)
                    except BlockingIOError:
                        break
                    if addr[2] == socket.PACKET_OUTGOING:
                        continue
                    got[socks.index(sock)][int.from_bytes(data[-4:], "big")] = data
    finally:
        for s in [sender] + socks:
            s.close()
    return got


def check(net: dict, table: ForwardingTable, frames: list[bytes], wifi: bool = False) -> int:
    """Every frame went where decide_mesh sends it; returns how many the kernel forwarded."""
    at_b, at_m, at_a = exchange(net, frames)
    forwarded = 0
    for i, f in enumerate(frames):
        want = expected(net, table, f, wifi)
        where = f"frame {i} {f[:42].hex()}"
        if want is None:
            if f[12:14] == ETH_P_BATMAN.to_bytes(2, "big"):  # else no socket of the daemon's sees it
                assert i in at_m and at_m[i] == f, f"{where}: the daemon should get it unchanged"
            assert i not in at_b and i not in at_a, f"{where}: forwarded, but decide_mesh says no"
        elif want == b"to A":
            assert i in at_a and i not in at_m, f"{where}: should go back out of m1"
            forwarded += 1
        else:
            assert i not in at_m, f"{where}: decide_mesh forwards it, the kernel left it to the daemon"
            assert at_b.get(i) == want, f"{where}: B got {at_b.get(i, b'').hex()[:84]}, want {want[:42].hex()}"
            forwarded += 1
    return forwarded


def table_of(net: dict) -> ForwardingTable:
    table = ForwardingTable()
    table.apply(route_update(net))
    return table


def test_the_kernel_forwards_what_the_data_plane_forwards_and_nothing_else():
    with line() as net, forwarder(net) as kf:
        cases = [
            frame(net),  # forwarded
            frame(net, ttl=2), frame(net, ttl=1), frame(net, ttl=0),
            frame(net, ttvn=TTVN + 1), frame(net, ttvn=TTVN - 1), frame(net, ttvn=TTVN + 127), frame(net, ttvn=TTVN + 129),
            frame(net, dst=net["m2"]), frame(net, dst=b"\xff" * 6), frame(net, src=b"\x03\x00\x00\x00\x00\x01"),
            frame(net, ptype=0x41), frame(net, ptype=0x42), frame(net, version=14),
            frame(net, inner=ETH_P_BATMAN.to_bytes(2, "big")),
            frame(net, tag=7, inner=ETH_P_BATMAN.to_bytes(2, "big")), frame(net, tag=7),
            frame(net, inner_dst=LOCAL_CLIENT), frame(net, tag=9, inner_dst=LOCAL_CLIENT),
            frame(net, dest=Mac(b"\x02\x00\x00\x00\x00\x77")), frame(net, dest=ELSEWHERE, ttvn=3),
            frame(net, payload_len=M2_MTU - 10 - 14), frame(net, payload_len=M2_MTU - 10 - 14 + 1),  # fits m2 exactly
            frame(net, payload_len=M2_MTU),  # fits m1, too long for m2
            frame(net)[:12] + b"\x81\x00\x00\x05" + frame(net)[12:],  # on a VLAN we have no device for
            frame(net, payload_len=0)[:38],  # just the headers
        ]
        frames = mark(cases[:-1]) + [bytes(cases[-1][:34]) + (len(cases) - 1).to_bytes(4, "big")]
        table = table_of(net)
        forwarded = check(net, table, frames)
        assert forwarded >= 8, "too few of the cases were forwarded to tell anything"
        counters = kf.counters()
        assert counters["forward"] == forwarded
        sent_to_b = sum(len(f) for f in frames if expected(net, table, f) is not None)
        assert counters["forward_bytes"] == sent_to_b


def test_random_frames_agree_with_decide_mesh():
    """Valid frames with a few random bytes of their headers changed."""
    rng = random.Random(19)
    with line() as net, forwarder(net):
        base = [frame(net), frame(net, tag=5), frame(net, dest=ELSEWHERE, ttvn=3)]
        frames = []
        for i in range(400):
            f = bytearray(rng.choice(base))
            for _ in range(rng.randint(1, 3)):
                f[rng.randrange(0, 42)] = rng.choice((0, 1, 2, 0x40, 0x43, 0x05, 0x81, 0x0F, rng.randrange(256)))
            frames.append(f)
        check(net, table_of(net), mark(frames))


def test_routes_clients_ports_and_wifi_follow_the_table():
    with line() as net, forwarder(net) as kf:
        table = table_of(net)
        plain = mark([frame(net), frame(net, inner_dst=b"\x02\xbb\x00\x00\x00\x02")])
        assert check(net, table, plain) == 2
        # the route goes away: the daemon's
        update = ForwardingUpdate(origs={DEST: None}, clients={}, local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, plain) == 0
        # back, with a newer TTVN: frames of the old one are the daemon's
        update = ForwardingUpdate(origs={DEST: OrigRoute(next_hop=Mac(net["b0"]), iface="m2", ttvn=TTVN + 1)},
                                  clients={}, local_clients={})
        kf.apply(update)
        table.apply(update)
        assert check(net, table, plain) == 0
        assert check(net, table, mark([frame(net, ttvn=TTVN + 1)])) == 1
        # a new client of ours: frames for it are the daemon's; gone again: forwarded
        client = (Mac(b"\x02\xbb\x00\x00\x00\x02"), VLAN_HAS_TAG | 3)
        for state, want in ((True, 0), (None, 1)):
            update = ForwardingUpdate(origs={}, clients={}, local_clients={client: state})
            kf.apply(update)
            table.apply(update)
            assert check(net, table, mark([frame(net, ttvn=TTVN + 1, inner_dst=bytes(client[0]), tag=3)])) == want
        # Wi-Fi: nothing
        with entered(net["m"]):
            kf.set_ports({"m1": (net["m1"], M1_MTU), "m2": (net["m2"], M2_MTU)}, None, True)
        assert check(net, table, mark([frame(net, ttvn=TTVN + 1)]), wifi=True) == 0
        # m2 no longer a port of ours: nothing toward it
        with entered(net["m"]):
            kf.set_ports({"m1": (net["m1"], M1_MTU)}, None, False)
        at_b, at_m, _ = exchange(net, mark([frame(net, ttvn=TTVN + 1)]))
        assert at_m and not at_b
        assert kf.status()["interfaces"] == ["m1"]


def test_closing_detaches_the_programs():
    with line() as net:
        with forwarder(net):
            assert check(net, table_of(net), mark([frame(net)])) == 1
        at_b, at_m, _ = exchange(net, mark([frame(net)]))
        assert at_m and not at_b


def test_full_maps_leave_frames_to_the_daemon(monkeypatch):
    """Routes beyond the map's room are the daemon's; a client of ours the map cannot
    hold would make the program forward what the daemon keeps: then nothing is attached."""
    monkeypatch.setattr(kernel_forward, "MAX_ROUTES", 1)
    monkeypatch.setattr(kernel_forward, "MAX_LOCAL", 2)
    with line() as net, forwarder(net) as kf:
        assert kf.status()["routes"] == 1
        # whichever route did not fit: its frames reach M's socket
        at_b, at_m, at_a = exchange(net, mark([frame(net), frame(net, dest=ELSEWHERE, ttvn=3)]))
        assert (0 in at_b) != (1 in at_a), "exactly one of the two routes is in the kernel"
        assert (0 in at_m) == (0 not in at_b) and (1 in at_m) == (1 not in at_a)
        more = {(Mac(b"\x02\xc1\x1e\x00\x00\x02"), 0): True, (Mac(b"\x02\xc1\x1e\x00\x00\x03"), 0): True}
        kf.apply(ForwardingUpdate(origs={}, clients={}, local_clients=more))
        assert not kf.active and kf.error and kf.status()["interfaces"] == []
        at_b, at_m, at_a = exchange(net, mark([frame(net), frame(net, dest=ELSEWHERE, ttvn=3)]))
        assert not at_b and not at_a and set(at_m) == {0, 1}
