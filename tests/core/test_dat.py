"""The distributed ARP table in the core: the DHT's hashes and candidates with worked
numbers (computed by hand from the kernel's definitions: batadv_hash_dat is Jenkins'
one-at-a-time hash, batadv_choose_orig the kernel's jhash), every snooping path in the
simulator, the cache's timeout, limit and VLANs, and the kernel's own DAT frames replayed."""

from __future__ import annotations

import struct


from batmand.capture import read_capture
from batmand.core.config import MeshConfig
from batmand.core.dat import arp_of, dhcp_ack_of
from batmand.core.dat_hash import closeness, hash_dat, jhash6, orig_position, select_candidates
from batmand.core.forwarding import FROM_HOST, TO_HOST, SlowRule
from batmand.sim.network import Network
from batmand.sim.replay import replay
from batmand.wire import Bcast, DatTvlv, InnerFrame, IvOgm, Mac, Unicast, Unicast4Addr, WireError, decode_frame
from tests.conftest import PCAP_DIR

IP = {n: bytes([10, 0, 0, n]) for n in range(1, 10)}


def host(n: int) -> Mac:
    return Mac(f"02:cc:00:00:00:{n:02x}")


def arp(op: int, sha: Mac, spa: bytes, tha: Mac, tpa: bytes, dst: Mac | None = None, vid: int | None = None) -> bytes:
    tag = b"" if vid is None else struct.pack("!HH", 0x8100, vid)
    body = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, op, sha, spa, tha, tpa)
    return bytes(dst or (b"\xff" * 6 if op == 1 else tha)) + bytes(sha) + tag + b"\x08\x06" + body


def who_has(asker: int, target: int, vid: int | None = None) -> bytes:
    return arp(1, host(asker), IP[asker], Mac(bytes(6)), IP[target], vid=vid)


def is_at(owner: int, asker: int, vid: int | None = None) -> bytes:
    return arp(2, host(owner), IP[owner], host(asker), IP[asker], vid=vid)


# --- the DHT: worked numbers -----------------------------------------------------------------


def test_hashes_worked_by_hand():
    # one-at-a-time over 0a 00 00 01 00 00 (IP, then the VID big-endian): 0x57202f3a
    assert hash_dat(IP[1], 0, 2**32) == 0x57202F3A
    assert hash_dat(IP[1], 0) == 0x57202F3A % 65535 == 34394
    assert hash_dat(IP[1], 0, 1024) == 826
    assert hash_dat(IP[1], 0x8001) == 12472 and hash_dat(IP[1], 0x8005) == 58867  # tagged VIDs hash apart
    # the kernel's jhash of a 6-byte originator address
    assert jhash6(Mac("02:00:00:00:01:00")) == 0x37A82C22
    assert [orig_position(Mac(m)) for m in ("02:00:00:00:01:00", "02:00:00:00:02:00", "02:00:00:00:03:00")] == \
        [25546, 61777, 21455]
    assert orig_position(Mac("02:00:00:00:00:01")) == 10116  # the research notes' vector
    assert orig_position(Mac("02:00:00:00:02:01")) == 23271 and hash_dat(bytes([10, 254, 0, 12]), 0) == 23216


def test_candidates_are_the_closest_going_up_the_ring():
    macs = [Mac(m) for m in ("02:00:00:00:01:00", "02:00:00:00:02:00", "02:00:00:00:03:00")]
    # key 34394: 61777 is 27383 above it (closeness 38152), 21455 wraps (12938), 25546 (8847)
    assert [closeness(orig_position(m), 34394) for m in macs] == [8847, 38152, 12938]
    assert select_candidates(34394, macs) == [macs[1], macs[2], macs[0]]
    # at most three; fewer when fewer are capable
    more = macs + [Mac("02:00:00:00:04:00"), Mac("02:00:00:00:05:00")]
    positions = {m: orig_position(m) for m in more}
    for key in (0, 1, 21455, 21456, 34394, 65534):
        expected = sorted(more, key=lambda m: ((positions[m] - key) % 65536, bytes(m)))[:3]
        assert select_candidates(key, more) == expected, key
    assert select_candidates(5, macs[:2]) == sorted(macs[:2], key=lambda m: (orig_position(m) - 5) % 65536)
    assert select_candidates(5, []) == []
    # a node exactly at the key is the closest; two at one place: the lower address first
    twin = {Mac("02:00:00:00:01:00"): 100, Mac("02:00:00:00:00:ff"): 100}
    assert sorted(twin, key=lambda m: (-closeness(twin[m], 100), bytes(m)))[0] == Mac("02:00:00:00:00:ff")


# --- parsing -----------------------------------------------------------------------------------


def test_arp_and_dhcpack_parsing_with_the_kernels_checks():
    parsed = arp_of(InnerFrame.decode(who_has(1, 2)))
    assert (parsed.op, parsed.sha, parsed.spa, parsed.tpa) == (1, host(1), IP[1], IP[2])
    assert arp_of(InnerFrame.decode(is_at(2, 1, vid=5))).tha == host(1)
    assert arp_of(InnerFrame.decode(b"\xff" * 6 + bytes(host(1)) + b"\x08\x00" + bytes(40))) is None  # not ARP
    bad = [who_has(1, 2)[:14 + 27],  # cut short
           arp(1, host(1), bytes(4), Mac(bytes(6)), IP[2]),  # an RFC 5227 probe (sender 0.0.0.0)
           arp(1, host(1), IP[1], Mac(bytes(6)), bytes([224, 0, 0, 1])),  # multicast target
           arp(1, host(1), bytes([127, 0, 0, 1]), Mac(bytes(6)), IP[2]),
           arp(1, Mac("01:00:5e:00:00:01"), IP[1], Mac(bytes(6)), IP[2]),  # multicast sender
           arp(2, host(2), IP[2], Mac(bytes(6)), IP[1], dst=host(1)),  # a reply to nobody
           who_has(1, 2)[:14] + b"\x00\x06" + who_has(1, 2)[16:]]  # not Ethernet
    assert all(arp_of(InnerFrame.decode(f)) is False for f in bad)
    # a DHCPACK (op 2, cookie, option 53 = 5) from port 67: yiaddr, chaddr and the server
    assert dhcp_ack_of(InnerFrame.decode(dhcpack(IP[7], host(7)))) == (IP[7], host(7), IP[9])
    offer = dhcpack(IP[7], host(7), msg_type=2)
    assert dhcp_ack_of(InnerFrame.decode(offer)) is None
    assert dhcp_ack_of(InnerFrame.decode(dhcpack(IP[7], host(7))[:-60])) is None  # shorter than BOOTP


def dhcpack(yiaddr: bytes, chaddr: Mac, server: Mac = Mac("02:cc:00:00:00:09"), msg_type: int = 5,
            dst: Mac = Mac("ff:ff:ff:ff:ff:ff")) -> bytes:
    bootp = bytes([2, 1, 6, 0]) + bytes(12) + yiaddr + bytes(8) + bytes(chaddr) + bytes(10 + 192) \
        + b"\x63\x82\x53\x63" + bytes([53, 1, msg_type, 255])
    udp = struct.pack("!HHHH", 67, 68, 8 + len(bootp), 0) + bootp
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, IP[9], b"\xff" * 4)
    return bytes(dst) + bytes(server) + b"\x08\x00" + ip + udp


# --- the snooping paths in the simulator ---------------------------------------------------------

FAST = dict(orig_interval_ms=200)


def _star(names="ABCDE", **config):
    """Every node linked to the hub A (one hop from A, two from each other)."""
    net = Network(seed=5)
    for name in names:
        net.add_node(name, MeshConfig(**FAST, **config))
    for name in names[1:]:
        net.link("A", name)
    net.run_for(8)
    return net


def _sends(net, name, run):
    """The data packets (not OGMs) `name` transmits while `run()` runs."""
    return [p for p in (decode_frame(f).packet for f in net.sent_by(name, run)) if not isinstance(p, IvOgm)]


def _mac_of(net, name):
    return net.nodes[name].orig


def _owner(net, mac):
    return net.owner_of(mac)


def _adopt(net, name, n):
    """Node `name`'s host has address n (its MAC becomes a local client there)."""
    net.host_send(name, arp(1, host(n), IP[n], Mac(bytes(6)), IP[n]))  # a gratuitous request: suppressed
    net.run_for(1)


def test_our_ogms_announce_dat_and_peers_become_candidates():
    net = _star("ABC")
    a = net.nodes["A"].mesh
    assert any(isinstance(t, DatTvlv) for t in a.ogm_tvlvs(net.now))
    assert a.dat.capable == {_mac_of(net, "B"), _mac_of(net, "C")}
    # off: no container; the peers see it is no candidate any more after its next OGM
    net.set_option("B", "distributed_arp_table", False)
    net.run_for(1)
    assert not any(isinstance(t, DatTvlv) for t in net.nodes["B"].mesh.ogm_tvlvs(net.now))
    assert a.dat.capable == {_mac_of(net, "C")}


def test_a_miss_asks_the_candidates_and_the_answer_is_stored_and_reused():
    net = _star("ABCDEFG")
    d = net.nodes["D"].mesh
    # gratuitous requests stay home: answered by the host itself, the held-back broadcast is
    # dropped (the kernel counts it as tx all the same)
    assert not any(isinstance(p, Bcast) for p in _sends(net, "C", lambda: _adopt(net, "C", 3)))
    assert net.nodes["C"].mesh.dat.lookup(IP[3], 0) == host(3)
    # B's host asks for 10.0.0.4: nobody has it; B sends a GET to each candidate of the key
    cands = [net.owner_of(o.orig) for o in net.nodes["B"].mesh.dat.candidates(IP[4], 0)]
    assert len(cands) == 3 and "B" not in cands
    sent = _sends(net, "B", lambda: (net.host_send("B", who_has(2, 4)), net.run_for(0.1)))
    gets = [p for p in sent if isinstance(p, Unicast4Addr)]
    assert sorted(_owner(net, p.dest) for p in gets) == sorted(cands) and {p.subtype for p in gets} == {2}
    assert all(p.inner.encode() == who_has(2, 4) for p in gets) and not any(isinstance(p, Bcast) for p in sent)
    assert net.nodes["B"].mesh.counters["dat_get_tx"] == 3
    assert sum(n.mesh.counters["dat_get_rx"] for n in net.nodes.values()) == 3
    # 250 ms later nobody answered: the held-back broadcast goes out, D's host sees it and
    # replies by unicast; D stores the reply at both addresses' candidates (PUTs)
    sent = _sends(net, "B", lambda: net.run_for(0.3))
    assert [type(p) for p in sent] == [Bcast]
    net.nodes["D"].delivered.clear()
    sent = _sends(net, "D", lambda: (net.host_send("D", is_at(4, 2)), net.run_for(0.1)))
    puts = [p for p in sent if isinstance(p, Unicast4Addr)]
    expected = {(net.owner_of(o.orig), ip) for ip in (IP[4], IP[2]) for o in d.dat.candidates(ip, 0)}
    assert {(_owner(net, p.dest), ip) for p in puts for ip in (IP[4], IP[2])} >= expected
    assert len(puts) == len([o for ip in (IP[4], IP[2]) for o in d.dat.candidates(ip, 0)])
    assert type(sent[-1]) is Unicast  # the reply itself, after its PUTs
    # every candidate of 10.0.0.4 now stores it
    for name in cands:
        assert net.nodes[name].mesh.dat.lookup(IP[4], 0) == host(4)
    # another node's host asks: each candidate answers from its cache (DAT_CACHE_REPLY), the
    # host gets the answer (the first; the others are duplicates) and the broadcast never leaves
    asker = next(n for n in "CEFG" if n not in cands)
    node = net.nodes[asker]
    node.mesh.dat.cache.pop((IP[4], 0), None)  # it may have stored the address as a candidate of 10.0.0.2
    _adopt(net, asker, 5)  # its host is announced first: the candidates answer through the TT
    node.delivered.clear()
    sent = _sends(net, asker, lambda: (net.host_send(asker, who_has(5, 4)), net.run_for(0.5)))
    assert not any(isinstance(p, Bcast) for p in sent)
    assert [f for _, f in node.delivered] == [is_at(4, 5)]
    answering = [net.owner_of(o.orig) for o in node.mesh.dat.candidates(IP[4], 0)]
    knew = [n for n in answering if net.nodes[n].mesh.dat.lookup(IP[4], 0) == host(4)]
    assert len(knew) >= 2 and sum(net.nodes[n].mesh.counters["dat_cached_reply_tx"] for n in net.nodes) == len(knew)
    # asked again, it answers its host itself: nothing goes out
    node.delivered.clear()
    assert _sends(net, asker, lambda: (net.host_send(asker, who_has(5, 4)), net.run_for(0.5))) == []
    assert [f for _, f in node.delivered] == [is_at(4, 5)]


def test_incoming_replies_duplicates_and_what_reaches_the_host():
    net = _star("ABC")
    b = net.nodes["B"].mesh
    _adopt(net, "B", 2)
    # an unrequested reply for a client that is not ours goes no further
    reply = is_at(3, 7)
    b.dat._host_rx(net.now, InnerFrame.decode(reply), 0, None)
    assert b.dat.lookup(IP[3], 0) == host(3) and b.dat.lookup(IP[7], 0) == host(7)
    assert b.dat._host_rx(net.now, InnerFrame.decode(is_at(3, 2)), 0, None) is True  # known: a duplicate
    assert b.dat._host_rx(net.now, InnerFrame.decode(is_at(8, 2)), 0, None) is False  # new, for our host: delivered
    assert b.dat._host_rx(net.now, InnerFrame.decode(is_at(9, 7)), 0, None) is True  # new, not for our host


def test_unicast_requests_and_the_data_planes_slow_path():
    net = _star("ABC")
    a = net.nodes["A"].mesh
    _adopt(net, "C", 3)
    a.dat.cache_add(net.now, IP[3], host(3), 0)
    # a unicast re-probe answered from the cache is not sent (tx_dropped, as the kernel)
    probe = arp(1, host(1), IP[1], host(3), IP[3], dst=host(3))
    dropped = a.counters["tx_dropped"]
    assert _sends(net, "A", lambda: (net.host_send("A", probe), net.run_for(0.1))) == []
    assert a.counters["tx_dropped"] == dropped + 1
    # the data plane must hand the host's ARP and DHCP replies to the core, both ways
    rules = net.nodes["A"].fwd.slow_path.rules
    assert {SlowRule(FROM_HOST, 0x0806), SlowRule(TO_HOST, 0x0806), SlowRule(FROM_HOST, 0x0800, 17, 68),
            SlowRule(TO_HOST, 0x0800, 17, 68)} <= rules
    net.set_option("A", "distributed_arp_table", False)
    net.run_for(0.5)
    assert not net.nodes["A"].fwd.slow_path.rules


def test_dhcpack_snooping_stores_the_lease_at_its_candidates():
    net = _star("ABCDE")
    g = net.nodes["C"].mesh
    _adopt(net, "C", 9)  # the DHCP server's host
    ack = dhcpack(IP[7], host(7))
    sent = _sends(net, "C", lambda: (net.host_send("C", ack), net.run_for(0.1)))
    puts = [p for p in sent if isinstance(p, Unicast4Addr) and p.subtype == 3]
    assert len(puts) == len(g.dat.candidates(IP[7], 0)) + len(g.dat.candidates(IP[9], 0))
    synthesized = arp(2, host(7), IP[7], host(9), IP[9])
    assert all(p.inner.encode() == synthesized for p in puts)
    assert g.dat.lookup(IP[7], 0) == host(7) and g.dat.lookup(IP[9], 0) == host(9)
    for o in g.dat.candidates(IP[7], 0):
        assert net.nodes[net.owner_of(o.orig)].mesh.dat.lookup(IP[7], 0) == host(7)
    # the ACK itself reaches the client's node, which learns from it too
    assert any(isinstance(p, Bcast) and p.inner.encode() == ack for p in sent)
    assert net.nodes["A"].mesh.dat.lookup(IP[7], 0) == host(7)


def test_cache_timeout_limit_vlans_and_unusable_arp():
    net = _star("ABC", dat_timeout_ms=3_000, max_dat_entries=4)
    a = net.nodes["A"].mesh
    # VLANs are kept apart: the same address on VLAN 5 is another entry
    a.dat.cache_add(net.now, IP[1], host(1), 0)
    a.dat.cache_add(net.now, IP[1], host(5), 0x8005)
    assert a.dat.lookup(IP[1], 0) == host(1) and a.dat.lookup(IP[1], 0x8005) == host(5)
    rows = a.dat.rows(net.now)
    assert {(r["dat_cache_ip4address"], r["dat_cache_vid"], r["dat_cache_hwaddress"]) for r in rows} == \
        {("10.0.0.1", -1, str(host(1))), ("10.0.0.1", 5, str(host(5)))}
    # the limit: the entry refreshed longest ago makes room
    a.dat.cache_add(net.now, IP[2], host(2), 0)
    a.dat.cache_add(net.now, IP[1], host(1), 0)  # refreshed
    a.dat.cache_add(net.now, IP[3], host(3), 0)
    a.dat.cache_add(net.now, IP[4], host(4), 0)
    assert len(a.dat.cache) == 4 and a.dat.lookup(IP[1], 0x8005) is None and a.dat.lookup(IP[1], 0) == host(1)
    assert a.counters["drop_dat_cache_full"] == 1
    # entries not refreshed within the timeout go at a purge (every timeout here, 10 s in
    # the kernel): after one to two timeouts
    net.run_for(2.5)
    assert len(a.dat.rows(net.now)) == 4
    net.run_for(3.5)
    a.dat.cache_add(net.now, IP[4], host(4), 0)
    net.run_for(1)
    assert [r["dat_cache_ip4address"] for r in a.dat.rows(net.now)] == ["10.0.0.4"]
    net.run_for(6)
    assert a.dat.rows(net.now) == []
    # an ARP DAT cannot use is counted and goes its way (a kernel node floods it too)
    probe = arp(1, host(1), bytes(4), Mac(bytes(6)), IP[2])
    sent = _sends(net, "A", lambda: (net.host_send("A", probe), net.run_for(0.05)))
    assert {type(p) for p in sent} == {Bcast} and a.counters["dat_arp_unusable"] == 1  # out of each link


def test_tagged_requests_are_answered_on_their_vlan():
    net = _star("ABC")
    a = net.nodes["A"].mesh
    a.set_vlans(net.now, {5})
    a.dat.cache_add(net.now, IP[3], host(3), 0x8005)
    net.nodes["A"].delivered.clear()
    assert _sends(net, "A", lambda: (net.host_send("A", who_has(1, 3, vid=5)), net.run_for(0.5))) == []
    assert [f for _, f in net.nodes["A"].delivered] == [is_at(3, 1, vid=5)]
    # untagged, the same address is unknown: asked of the candidates
    sent = _sends(net, "A", lambda: (net.host_send("A", who_has(1, 3)), net.run_for(0.1)))
    assert {p.subtype for p in sent if isinstance(p, Unicast4Addr)} == {2}


def test_priority_tagged_arp_is_no_business_of_dat():
    """A priority tag (802.1Q, VID 0) is untagged to the kernel's DAT since 2025.0, and the
    ARP parser then meets 0x8100 where it wants 0x0806: such a request floods at once, a
    reply is not stored (2022.3 took them as VLAN 0x8000)."""
    net = _star("ABC")
    a = net.nodes["A"].mesh
    sent = _sends(net, "A", lambda: (net.host_send("A", who_has(1, 2, vid=0)), net.run_for(0.1)))
    assert sent and all(isinstance(p, Bcast) for p in sent)
    assert not a.dat.cache and a.counters["dat_get_tx"] == 0
    assert a.dat._host_rx(net.now, InnerFrame.decode(is_at(3, 1, vid=0)), 0, None) is False
    assert not a.dat.cache


# --- against the kernel's bytes -----------------------------------------------------------------

DAT_PCAP = "batman_iv-2node-dat-4addr"
PAST_BLA_HOLD = MeshConfig(bridge_loop_avoidance=False)
A_MAC, A_SOFT = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:01:00")
B_MAC, B_SOFT = Mac("02:00:00:00:02:01"), Mac("02:00:00:00:02:00")
TTVN = 17  # the header's TTVN: the kernel knew its peer's before the capture began, a replay does not


def _pkt(data):
    try:
        return decode_frame(data).packet
    except WireError:
        return None


def _unmasked(frames):
    return [f[:TTVN] + f[TTVN + 1:] for f in frames]


def _dat_frames(frames, sender):
    return [d for _, d in frames if d[6:12] == sender and isinstance(_pkt(d), (Unicast4Addr, Unicast))
            and _pkt(d).inner.h_proto == 0x0806]


def test_replayed_kernel_nodes_send_the_kernels_dat_frames():
    """A pings B's fresh address: A's GET, B's two PUTs and its reply are, byte for byte
    (but the TTVN), what our core sends in each one's place; A's host gets the answer from
    the first PUT and A's held-back broadcast never goes out."""
    frames = [(cf.timestamp, cf.data) for cf in read_capture(str(PCAP_DIR / f"{DAT_PCAP}.pcapng"))]
    # the kernel nodes' BLA was past its start-up hold of broadcasts when the capture began
    as_a = replay(frames, iface="eth0", mac=A_MAC, soft_mac=A_SOFT, host_frames=True, warm_up=True,
                  config=PAST_BLA_HOLD)
    kernel_a = _dat_frames(frames, A_MAC)
    assert [(_pkt(d).subtype) for d in kernel_a] == [2]
    assert _unmasked(_dat_frames(as_a.transmitted, A_MAC)) == _unmasked(kernel_a)
    assert not any(isinstance(_pkt(d), Bcast) for _, d in as_a.transmitted)
    reply = _pkt(_dat_frames(frames, B_MAC)[0]).inner.encode()
    assert [f for _, f in as_a.delivered if f[12:14] == b"\x08\x06"] == [reply]
    assert as_a.mesh.counters["dat_get_tx"] == 1 and as_a.mesh.counters["dat_put_rx"] == 2
    as_b = replay(frames, iface="eth0", mac=B_MAC, soft_mac=B_SOFT, host_frames=True, warm_up=True,
                  config=PAST_BLA_HOLD)
    kernel_b = _dat_frames(frames, B_MAC)
    assert [type(_pkt(d)).__name__ + str(getattr(_pkt(d), "subtype", "")) for d in kernel_b] == \
        ["Unicast4Addr3", "Unicast4Addr3", "Unicast"]
    # the PUTs; the reply itself needs A's bat0 MAC in B's TT, which the kernel B had learnt
    # before the capture (a replay's TT requests go unanswered)
    assert _unmasked(_dat_frames(as_b.transmitted, B_MAC)) == _unmasked(kernel_b[:2])
    assert as_b.mesh.counters["dat_get_rx"] == 1 and as_b.mesh.counters["dat_put_tx"] == 2
    # B learnt A's address from the GET, and answered the later arping from its cache
    assert as_b.mesh.dat.lookup(bytes([10, 254, 0, 1]), 0) == A_SOFT


def test_an_iv_ogm_without_tvlvs_changes_no_capability():
    """batadv_tvlv_ogm_receive returns at once for an OGM whose TVLV area is empty (IV
    secondary interfaces send such OGMs): not even the CIFNOTFND handlers run."""
    from batmand.wire import IvOgm as Ogm, build_frame
    net = _star("AB")
    a, b = net.nodes["A"].mesh, net.nodes["B"]
    assert a.dat.capable == {b.orig}
    seqno = a.originators.get(b.orig).ifinfo_get(None).last_real_seqno + 1  # B's next OGM
    bare = Ogm(seqno=seqno, orig=b.orig, prev_sender=b.orig, tq=255, ttl=50, tvlvs=[])
    a.receive(net.now, "if0", build_frame(Mac("ff:ff:ff:ff:ff:ff"), b.orig, bare))
    assert a.originators.get(b.orig).ifinfo_get(None).last_real_seqno == seqno  # it was processed
    assert a.dat.capable == {b.orig}
