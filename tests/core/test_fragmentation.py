"""Fragmentation against the kernel's capture and the kernel's reassembly rules."""

import collections

import pytest

from batmand.core.config import MeshConfig
from batmand.core.counters import Counters
from batmand.core.fragmentation import SIZE_LIMIT, Reassembly, fragment, priority_of
from batmand.core.events import Transmit
from batmand.sim import Network
from batmand.wire import Mac, UnicastFrag, decode_frame, decode_packets
from tests.wire.captures import decoded

A, B = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:02:01")


def _kernel_fragments():
    """(frame bytes, UnicastFrag) of the capture, in wire order, grouped by seqno."""
    groups = collections.defaultdict(list)
    for cf, frame in decoded("batman_iv-2node-fragmentation.pcapng"):
        if isinstance(frame.packet, UnicastFrag):
            groups[frame.packet.seqno].append((cf.data, frame.packet))
    return groups


def test_our_fragments_equal_the_kernels():
    """Rebuild the packet from the kernel's fragments, cut it again with the same MTU,
    seqno and priority: every fragment is byte-identical and leaves in the same order."""
    mtus = {A: 1400, B: 1500}  # A's eth0 was lowered to 1400 in the capture
    checked = 0
    for seqno, parts in _kernel_fragments().items():
        frags = [p for _, p in parts]
        whole = b"".join(f.data for f in sorted(frags, key=lambda f: -f.no))
        assert len(whole) == frags[0].total_size
        first = frags[0]
        ours = fragment(whole, mtus[first.orig], seqno=seqno, orig=first.orig, dest=first.dest,
                        priority=first.priority)
        assert ours == [data[14:] for data, _ in parts]
        checked += 1
    assert checked == 4


def test_reassembled_packet_is_the_original_unicast():
    for parts in _kernel_fragments().values():
        reassembly = Reassembly(Counters(), MeshConfig(max_fragment_bytes=1 << 20))
        results = [reassembly.add(0.0, p) for _, p in parts]
        assert results[:-1] == [None] * (len(parts) - 1)
        packets, _ = decode_packets(results[-1])
        assert packets[0].packet_type == 0x40 and packets[0].inner.h_proto == 0x0800
        assert reassembly.bytes == 0 and not reassembly.chains


def _frag(no, seqno=7, data=b"x" * 100, total=200, orig=A):
    return UnicastFrag(no=no, dest=B, orig=orig, seqno=seqno, total_size=total, data=data)


def test_reassembly_rules():
    counters = Counters()
    r = Reassembly(counters, MeshConfig(max_fragment_bytes=1 << 20))
    assert r.add(0.0, _frag(1, data=b"H" * 100)) is None
    assert r.add(0.0, _frag(1, data=b"H" * 100)) is None  # duplicate no
    assert counters["drop_fragment_duplicate"] == 1
    assert r.add(0.0, _frag(0, data=b"T" * 100)) == b"H" * 100 + b"T" * 100  # head first
    # a new seqno in the same bucket (seqno % 8) discards the old chain
    r.add(0.0, _frag(1, seqno=3))
    r.add(0.0, _frag(0, seqno=11))
    assert list(r.chains.values())[0].seqno == 11 and r.bytes == 100
    # different total_size within one chain: the chain is dropped
    r.add(0.0, _frag(1, seqno=11, total=300))
    assert not r.chains and counters["drop_fragment_chain_invalid"] == 1
    # larger than anything 16 fragments of 1280 bytes can carry
    r.add(0.0, _frag(0, seqno=1, total=SIZE_LIMIT + 2))
    assert not r.chains and counters["drop_fragment_chain_invalid"] == 2
    # incomplete chains time out after 10 s since their last fragment
    r.add(0.0, _frag(0, seqno=2))
    r.add(5.0, _frag(1, seqno=4))
    r.purge(10.5)
    assert [c.seqno for c in r.chains.values()] == [4] and counters["drop_fragment_timeout"] == 1


def test_reassembly_budget_evicts_the_oldest_chains():
    counters = Counters()
    r = Reassembly(counters, MeshConfig(max_fragment_bytes=1000))
    for i in range(30):  # 30 originators, each starting a 2-fragment packet
        r.add(float(i), _frag(0, orig=Mac(bytes([2, 0, 0, 0, 9, i]))))
    assert r.bytes <= 1000 and len(r.chains) == 10
    assert counters["drop_fragment_buffer_full"] == 20
    assert {k[0][5] for k in r.chains} == set(range(20, 30))  # the newest stayed


def test_too_many_fragments_is_refused():
    assert fragment(b"x" * (16 * 80 + 1), 100, seqno=1, orig=A, dest=B) is None
    assert len(fragment(b"x" * (16 * 80), 100, seqno=1, orig=A, dest=B)) == 16


@pytest.mark.parametrize("inner,prio", [
    (bytes(12) + b"\x81\x00\xa0\x0a\x08\x00", 5),  # VLAN PCP 5
    (bytes(12) + b"\x08\x00\x45\xb8" + bytes(18), 5),  # DSCP EF (0xb8) -> 5
    (bytes(12) + b"\x86\xdd\x6b\x80\x00\x00" + bytes(36), 5),  # traffic class 0xb8
    (bytes(12) + b"\x08\x06" + bytes(28), 0),
])
def test_priority_from_inner_frame(inner, prio):
    assert priority_of(inner) == prio


def _line(mtus):
    net = Network(seed=5, config=MeshConfig(orig_interval_ms=500))
    names = "ABC"[: len(mtus) + 1]
    for name in names:
        net.add_node(name)
    for (a, b), mtu in zip(zip(names, names[1:]), mtus):
        net.link(a, b)
        for node, peer in ((a, b), (b, a)):
            iface = net.nodes[node].mesh.iface(f"if{len(net.nodes[node].macs) - 1}")
            iface.mtu = mtu
    net.run_for(20)
    return net


def _big_frame(net, src, dst, size=1500):
    dst_mac = net.nodes[dst].mesh.soft_mac
    return bytes(dst_mac) + bytes(net.nodes[src].mesh.soft_mac) + b"\x08\x00" + bytes(size - 14)


@pytest.mark.parametrize("mtus,dst,counts", [
    # A - B over a 1400-byte link: A fragments, B reassembles
    ([1400], "B", {"A": {"frag_tx": 2}, "B": {"frag_rx": 2}}),
    # the next link is as small: B forwards the fragments whole (no re-fragmentation)
    ([1400, 1400], "C", {"B": {"frag_fwd": 2, "frag_rx": 0}}),
    # the next link is big enough: B merges and sends the packet on whole
    ([1400, 1560], "C", {"B": {"frag_rx": 2}, "C": {"frag_rx": 0}}),
], ids=["small-link", "forwarded-whole", "merged-on-the-way"])
def test_fragments_across_the_mesh(mtus, dst, counts):
    net = _line(mtus)
    frame = _big_frame(net, "A", dst)
    net.host_send("A", frame)
    net.run_for(0.5)
    assert [f for _, f in net.nodes[dst].delivered][-1] == frame
    for node, expected in counts.items():
        assert {k: net.nodes[node].mesh.counters[k] for k in expected} == expected
