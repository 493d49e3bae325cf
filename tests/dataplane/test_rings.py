"""PACKET_MMAP rings, the BPF split and the fanout group, on a real veth pair: UNICAST
frames of many inner flows reach the fanout members, each flow on one member and in
order; everything else reaches the control socket; a TX ring sends a burst in one call."""

import os
import resource
import socket
import struct
import subprocess
import time

import pytest
from pyroute2 import netns

from batmand.dataplane import bpf, rings
from batmand.wire.fastpath import unicast_prefix
from tests.daemon.labs import prefix
from tests.netns import entered

FLOWS = 32
PER_FLOW = 40
DST_MAC = bytes.fromhex("020000000b0b")


def _sh(*cmds: str) -> None:
    for cmd in cmds:
        subprocess.run(cmd, shell=True, check=True)


@pytest.fixture
def veth_pair():
    """Namespaces <p>a / <p>b joined by veth va - vb (MTU 1560)."""
    p = prefix()
    _sh(f"ip netns add {p}a", f"ip netns add {p}b")
    try:
        _sh(f"ip -n {p}a link add va type veth peer name vb netns {p}b",
            f"ip -n {p}a link set va up mtu 1560", f"ip -n {p}b link set vb address 02:00:00:00:0b:0b up mtu 1560")
        yield f"{p}a", f"{p}b"
    finally:
        subprocess.run(f"ip netns del {p}a; ip netns del {p}b", shell=True)


def _udp_frame(flow: int, seq: int, pad: int = 50) -> bytes:
    payload = struct.pack("!HI", flow, seq) + bytes(pad)
    udp = struct.pack("!HHHH", 1000 + flow, 2000, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]))
    inner = bytes.fromhex("020000000011020000000022") + b"\x08\x00" + ip + udp
    return unicast_prefix(DST_MAC, bytes.fromhex("02000000000a"), bytes.fromhex("020000000003"), 0) + inner


def _send_from(ns: str, frames: list[bytes], other: bytes) -> None:
    """In a child process inside `ns`: the frames through a TX ring, then `other` plainly."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            netns.setns(ns)
            tx = rings.TxRing("va")
            for frame in frames:
                assert tx.put((frame,), len(frame))
                if tx.pending >= 64:
                    tx.flush()
            tx.flush()
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            s.bind(("va", 0))
            s.send(other)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0, "the sender failed"


@pytest.mark.parametrize("version", [rings.TPACKET_V2, rings.TPACKET_V3], ids=["v2", "v3"])
def test_fanout_keeps_flows_whole_and_in_order(veth_pair, version):
    ns_a, ns_b = veth_pair
    with entered(ns_b):
        group = os.getpid() & 0xFFFF or 1
        members = [rings.RxRing("vb", version=version, program=bpf.UNICAST_ONLY, fanout_group=group,
                                vnet_hdr=True) for _ in range(2)]
        control = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        bpf.attach(control, bpf.ALL_BUT_UNICAST)
        control.bind(("vb", 0x4305))
        control.settimeout(2)
    try:
        frames = [_udp_frame(flow, seq) for seq in range(PER_FLOW) for flow in range(FLOWS)]
        ogm_like = DST_MAC + bytes(6) + b"\x43\x05" + b"\x00\x0f" + bytes(30)
        _send_from(ns_a, frames, ogm_like)
        time.sleep(0.3)  # V3 hands a block over when its timer retires it
        owner: dict[int, int] = {}
        seqs: dict[int, list[int]] = {}
        shares = []
        for index, ring in enumerate(members):
            got = ring.frames(100_000)
            shares.append(len(got))
            for off, length, _status in got:
                frame = ring.view[off:off + length]
                assert frame[14] == 0x40, "a non-UNICAST frame passed the data filter"
                flow, seq = struct.unpack_from("!HI", frame, 24 + 14 + 28)
                assert owner.setdefault(flow, index) == index, f"flow {flow} reached two members"
                seqs.setdefault(flow, []).append(seq)
            ring.release()
        assert sum(shares) == FLOWS * PER_FLOW
        assert all(seqs[f] == list(range(PER_FLOW)) for f in range(FLOWS)), "a flow lost or reordered frames"
        assert min(shares) > 0, f"one member got nothing: {shares}"
        assert control.recv(2000)[14] == 0x00, "the control socket did not get the OGM"
        control.settimeout(0.2)
        with pytest.raises(TimeoutError):
            control.recv(2000)  # and nothing else: UNICAST stays with the fanout members
    finally:
        for ring in members:
            ring.close()
        control.close()


def test_filters_drop_frames_for_other_hosts(veth_pair):
    """A promiscuous interface shows frames for other MACs: neither filter passes them."""
    ns_a, ns_b = veth_pair
    with entered(ns_b):
        subprocess.run(["ip", "link", "set", "vb", "promisc", "on"], check=True)
        ring = rings.RxRing("vb", program=bpf.UNICAST_ONLY, vnet_hdr=True)
        control = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        bpf.attach(control, bpf.ALL_BUT_UNICAST)
        control.bind(("vb", 0x4305))
        control.settimeout(0.3)
    try:
        stranger = bytes.fromhex("02000000cccc")
        frames = [stranger + _udp_frame(0, seq)[6:] for seq in range(5)]
        _send_from(ns_a, frames, stranger + bytes(6) + b"\x43\x05\x00\x0f" + bytes(30))
        time.sleep(0.1)
        assert ring.frames(100) == []
        with pytest.raises(TimeoutError):
            control.recv(2000)
    finally:
        ring.close()
        control.close()


def test_a_frame_bigger_than_a_slot_is_counted_not_cut(veth_pair):
    """The MTU grew past the ring's slots (until the daemon rebuilds the ring): such a frame
    is dropped and counted, never handed on cut short."""
    ns_a, ns_b = veth_pair
    _sh(f"ip -n {ns_a} link set va mtu 9000", f"ip -n {ns_b} link set vb mtu 9000")
    with entered(ns_b):
        ring = rings.RxRing("vb", mtu=1560, program=bpf.UNICAST_ONLY, vnet_hdr=True)
    try:
        small, big = _udp_frame(0, 1), _udp_frame(0, 0) + bytes(4000)
        _send_from(ns_a, [small], big)  # (the TX ring's slots are sized for 1560 too: big goes plainly)
        time.sleep(0.1)
        assert [length for _, length, _ in ring.frames(10)] == [len(small)]
        ring.release()
        assert ring.truncated == 1
    finally:
        ring.close()


def _read_all(ring, budget: int) -> list[int]:
    """Every waiting frame, `budget` at a time, as their (flow, seq) numbers."""
    seqs = []
    while True:
        got = ring.frames(budget)
        for off, length, _status in got:
            flow, seq = struct.unpack_from("!HI", ring.view, off + 24 + 14 + 28)
            seqs.append((flow, seq))
        ring.release()
        if ring.drained:
            return seqs


@pytest.mark.parametrize("version", [rings.TPACKET_V2, rings.TPACKET_V3], ids=["v2", "v3"])
def test_a_burst_that_fills_half_the_ring_grows_it(veth_pair, version):
    """A ring starts small (the daemon's: a third of its burst size). A burst that fills
    more than half of it marks it crowded; read empty, it is re-made with max_frames slots
    and mapped again, and a burst bigger than the first ring then arrives whole and in
    order, with no drop, and nothing is left in the socket's plain queue."""
    ns_a, ns_b = veth_pair
    with entered(ns_b):
        # (V3: a block timer long enough that the test's sender fills every block it starts)
        ring = rings.RxRing("vb", version=version, frames=64, max_frames=600, program=bpf.UNICAST_ONLY,
                            vnet_hdr=True, block_timeout_ms=100)
    ogm_like = DST_MAC + bytes(6) + b"\x43\x05" + b"\x00\x0f" + bytes(30)
    try:
        small = ring.frame_nr
        # a trickle never crowds it
        _send_from(ns_a, [_udp_frame(0, seq) for seq in range(8)], ogm_like)
        time.sleep(0.3)  # (V3: the block timer hands the frames over)
        assert _read_all(ring, 16) == [(0, seq) for seq in range(8)]
        assert not ring.crowded and ring.frame_nr == small
        # a burst of more than half the ring does (full-size frames: a V3 ring's slots are
        # nominal, its blocks hold what fits)
        burst = small - 8 if version == rings.TPACKET_V2 else small * 2 // 3
        _send_from(ns_a, [_udp_frame(1, seq, pad=1400) for seq in range(burst)], ogm_like)
        time.sleep(0.3)
        assert _read_all(ring, 16) == [(1, seq) for seq in range(burst)]
        assert ring.crowded, "a burst that filled the ring did not mark it crowded"
        rings.statistics(ring.sock)  # (clears the counters)
        assert ring.grow()
        assert ring.frame_nr >= 600 and ring.ring_bytes > rings.ring_bytes_for(1560, small) and not ring.crowded
        big = 2 * small + 16
        _send_from(ns_a, [_udp_frame(2, seq, pad=1400) for seq in range(big)], ogm_like)
        time.sleep(0.3)
        assert _read_all(ring, 64) == [(2, seq) for seq in range(big)], "frames after the growth were lost"
        assert rings.statistics(ring.sock) == (big, 0)
        assert not ring.crowded and not ring.grow(), "a grown ring grows no further"
        ring.sock.setblocking(False)
        with pytest.raises(BlockingIOError):
            ring.sock.recv(2000)  # nothing went to the plain queue
    finally:
        ring.close()


def test_a_ring_with_a_slice_held_is_grown_later(veth_pair):
    """grow() needs the mapping closed: while a slice of it is referenced, it changes nothing
    and the ring reads on; once the slice is gone it grows."""
    ns_a, ns_b = veth_pair
    with entered(ns_b):
        ring = rings.RxRing("vb", frames=64, max_frames=300, program=bpf.UNICAST_ONLY, vnet_hdr=True)
    try:
        small = ring.frame_nr
        held = ring.view[0:16]
        assert not ring.grow() and ring.frame_nr == small
        _send_from(ns_a, [_udp_frame(0, seq) for seq in range(4)], DST_MAC + bytes(6) + b"\x43\x05" + bytes(32))
        time.sleep(0.2)
        assert _read_all(ring, 16) == [(0, seq) for seq in range(4)]
        held.release()
        assert ring.grow() and ring.frame_nr >= 300
    finally:
        ring.close()


def test_an_inherited_ring_that_grew_is_mapped_at_its_size(veth_pair):
    """A worker restarted after its ring grew maps the socket it inherits with the sizes
    the daemon first gave: the kernel refuses those, and the grown sizes are used."""
    ns_a, ns_b = veth_pair
    with entered(ns_b):
        ring = rings.RxRing("vb", frames=64, max_frames=300, program=bpf.UNICAST_ONLY, vnet_hdr=True)
    try:
        assert ring.grow()
        ring.view.release()
        ring.map.close()
        again = rings.RxRing("vb", frames=64, max_frames=300, vnet_hdr=True, sock=ring.sock)
        assert again.frame_nr == ring.frame_nr
        _send_from(ns_a, [_udp_frame(3, seq) for seq in range(200)], DST_MAC + bytes(6) + b"\x43\x05" + bytes(32))
        time.sleep(0.2)
        assert _read_all(again, 64) == [(3, seq) for seq in range(200)]
    finally:
        ring.sock.close()


def test_a_ring_without_room_to_grow_keeps_its_size(veth_pair):
    """No address space for the bigger ring (RLIMIT_AS, in a child process that maps the
    ring as a worker does): grow() makes the small ring again, answers False and gives up
    growing for good, and the ring reads on."""
    _ns_a, ns_b = veth_pair
    with entered(ns_b):
        opened = rings.RxRing("vb", frames=64, max_frames=40000, program=bpf.UNICAST_ONLY, vnet_hdr=True,
                              mapped=False)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ring = rings.RxRing("vb", frames=64, max_frames=40000, vnet_hdr=True, sock=opened.sock)
            small, small_bytes = ring.frame_nr, ring.ring_bytes
            vm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize"))
            resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (8 << 20), resource.RLIM_INFINITY))
            assert rings.ring_bytes_for(1560, 40000) > 8 << 20
            grown = ring.grow()
            if not grown and ring.frame_nr == ring.max_frames == small and ring.ring_bytes == small_bytes \
                    and ring.frames(10) == [] and not ring.grow():
                code = 0
            else:
                code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    opened.close()
    assert os.waitstatus_to_exitcode(status) == 0, "the ring did not fall back to its small size"
