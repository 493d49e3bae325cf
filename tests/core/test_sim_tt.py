"""Translation table, TTVN rerouting and broadcast in the deterministic simulator.

Research notes (shared/research/batman-adv-v15.md): §12 translation table (local/global
tables, ttvn, one commit per own OGM, a diff repeated in 4 OGMs, CRC, TT request/response,
roaming, temporary entries, timeouts), §9 unicast TTVN check / rerouting, §10 broadcast.

Clients are "added" by making a node's host send a frame from the client's MAC, "removed" by
letting their local entry time out, and "moved" by having another node's host send from the
same MAC. Every scenario runs on a fixed seed; the expectations are computed here, from the
rules of the notes, not read back from the core.
"""

from __future__ import annotations

import collections

import pytest

from batmand.core.config import MeshConfig
from batmand.sim.network import Network
from batmand.wire import Bcast, Mac, TtClientFlags as F, TtDataFlags, TtTvlv, UnicastTvlv, decode_frame
from batmand.wire.tt_crc import tt_entry_crc, tt_vlan_crc

LINE = "ABCDE"
BROADCAST = "ff:ff:ff:ff:ff:ff"
WARMUP = 15.0  # routes everywhere and every startup TT exchange (first commits, requests) done

# short timeouts for the "removed" scenario (the kernel's are 600 s / 5 s)
FAST_TT = dict(tt_local_timeout_ms=5_000, tt_work_period_ms=1_000)


def client(n: int) -> Mac:
    return Mac(f"02:cc:00:00:00:{n:02x}")


def arp_like(src: Mac, dst: str = BROADCAST) -> bytes:
    """An Ethernet broadcast ARP-sized frame from `src` (how a host 'adds' a client)."""
    return bytes(Mac(dst)) + bytes(Mac(src)) + b"\x08\x06" + bytes(28)


def ip_like(src: Mac, dst: Mac, tag: bytes = b"") -> bytes:
    """A unicast IPv4-sized frame; `tag` makes the payload recognisable."""
    return bytes(dst) + bytes(src) + b"\x08\x00" + (tag + bytes(46))[:46]


def crc32c_linux(data: bytes) -> int:
    """Linux crc32c(0, data), bit by bit: reflected Castagnoli 0x82F63B78, initial value 0,
    no final XOR (§12.5). Independent of batmand.wire.tt_crc, to check it."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc


def vlan_crc_by_hand(macs, vid: int = 0) -> int:
    crc = 0
    for mac in macs:
        crc ^= crc32c_linux(vid.to_bytes(2, "big") + b"\x00" + bytes(mac))  # vid, flags & 0xF0, mac
    return crc


assert crc32c_linux(b"123456789") == 0x58E3FA20  # the notes' test vector


class Sniffer:
    """Records every frame any node transmits: (time, node name, interface, decoded Frame)."""

    def __init__(self, net: Network) -> None:
        self.log: list = []
        inner = net._transmit

        def tap(node, action):
            self.log.append((net.now, node.name, action.iface, decode_frame(action.frame)))
            inner(node, action)

        net._transmit = tap

    def tt_tvlvs(self, since: float = 0.0):
        """(time, sender node, UnicastTvlv, TtTvlv) for every TT request/response hop."""
        out = []
        for t, name, _, frame in self.log:
            if t >= since and isinstance(frame.packet, UnicastTvlv):
                for tvlv in frame.packet.tvlvs:
                    if isinstance(tvlv, TtTvlv):
                        out.append((t, name, frame.packet, tvlv))
        return out


def build_line(seed: int, config: MeshConfig | None = None, names: str = LINE, warmup: float = WARMUP) -> Network:
    net = Network(seed=seed, config=config or MeshConfig())
    for name in names:
        net.add_node(name)
    for a, b in zip(names, names[1:]):
        net.link(a, b)
    net.run_for(warmup)
    return net


def soft(net: Network, name: str) -> Mac:
    return net.nodes[name].mesh.soft_mac


def announced_by(net: Network, at: str, owner: str) -> set:
    """The (mac, vid) keys node `at` holds in its global table for originator `owner`."""
    tt = net.nodes[at].mesh.tt
    orig = net.nodes[owner].orig
    return {key for key, entry in tt.global_.items() if orig in entry.origs}


def orig_node(net: Network, at: str, owner: str):
    return net.nodes[at].mesh.originators.get(net.nodes[owner].orig)


def link_mac(net: Network, owner: str, peer: str) -> Mac:
    """MAC of `owner`'s interface on its link to `peer`."""
    segment = net.find_segment(owner, peer)
    (ifname,) = [ifn for node, ifn in segment.endpoints if node.name == owner]
    return net.nodes[owner].macs[ifname]


def counters(net: Network, *names: str) -> dict:
    keys = ("tt_request_tx", "tt_request_rx", "tt_response_tx", "tt_response_rx")
    return {n: {k: net.nodes[n].mesh.counters[k] for k in keys} for n in names or net.nodes}


def assert_fwd_line(net: Network, names: str, target: str, mac: Mac, ttvn: int) -> None:
    """Every node of a line maps `mac` to `target`'s originator via its line neighbour."""
    t = names.index(target)
    for i, name in enumerate(names):
        if name == target:
            continue
        neighbour = names[i - 1] if i > t else names[i + 1]
        hit = net.nodes[name].fwd.lookup(mac, 0)
        assert hit is not None, (name, mac)
        orig, next_hop, iface, hdr_ttvn = hit
        assert orig == net.nodes[target].orig
        assert next_hop == link_mac(net, neighbour, name), (name, net.owner_of(next_hop))
        assert net.next_hop(name, target) == neighbour
        assert hdr_ttvn == ttvn


# --- 1. added ---------------------------------------------------------------------------------


def test_added_clients_known_everywhere_with_ttvn_and_crc():
    net = build_line(seed=11)
    A = net.nodes["A"]
    # startup: A's only commit so far announced its own soft-interface MAC (ttvn 0 -> 1)
    assert A.mesh.tt.ttvn == 1
    clients = [client(1), client(2), client(3)]
    for c in clients:
        net.host_send("A", arp_like(c))
    net.run_for(10.0)

    # the three ADDs were queued in one OGM interval: one commit, ttvn 1 -> 2
    assert A.mesh.tt.ttvn == 2
    expected_keys = {(c, 0) for c in clients} | {(soft(net, "A"), 0)}
    assert set(A.mesh.tt.local) == expected_keys
    assert all(not e.flags & (F.NEW | F.PENDING) for e in A.mesh.tt.local.values())
    expected_crc = tt_vlan_crc([(mac, 0) for mac, _ in expected_keys], 0)
    assert expected_crc == vlan_crc_by_hand(mac for mac, _ in expected_keys)
    assert A.mesh.tt.local_crc(0) == expected_crc
    assert A.mesh.tt.local_crcs == {0: expected_crc}
    # A's own clients never enter A's global table
    assert not expected_keys & set(A.mesh.tt.global_)

    for name in "BCDE":
        assert announced_by(net, name, "A") == expected_keys, name
        on = orig_node(net, name, "A")
        assert on.has_tt and on.last_ttvn == 2
        assert on.tt_crcs == {0: expected_crc}
        tt = net.nodes[name].mesh.tt
        for c in clients:
            entry = tt.global_[(c, 0)]
            assert entry.flags & (F.ROAM | F.TEMP) == 0
            assert set(entry.origs) == {A.orig}
            assert entry.origs[A.orig].ttvn == 2  # the ttvn of the commit that added it
        # A's own MAC came with ttvn 1 (by diff or in a full table at ttvn 1) and kept it
        assert tt.global_[(soft(net, "A"), 0)].origs[A.orig].ttvn == 1
    assert_fwd_line(net, LINE, "A", client(1), ttvn=2)
    assert_fwd_line(net, LINE, "A", client(3), ttvn=2)
    # no originator other than A changed its table: nobody else moved past ttvn 1
    assert {n: net.nodes[n].mesh.tt.ttvn for n in "BCDE"} == dict.fromkeys("BCDE", 1)


# --- 2. unicast to a client, unknown unicast ---------------------------------------------------


def test_unicast_reaches_client_and_unknown_unicast_is_dropped():
    net = build_line(seed=12)
    A, E = net.nodes["A"], net.nodes["E"]
    net.host_send("A", arp_like(client(1)))
    net.run_for(5.0)
    assert E.fwd.lookup(client(1), 0) is not None

    sender = client(0x51)  # a client behind E
    frame = ip_like(sender, client(1), b"hello A")
    before = {n: net.nodes[n].mesh.counters["forward"] for n in LINE}
    a_delivered = len(A.delivered)
    net.host_send("E", frame)
    net.run_for(0.5)
    got = [f for _, f in A.delivered[a_delivered:]]
    assert got == [frame]  # exactly once, byte for byte
    # forwarded once by each of D, C, B and by nobody else
    assert {n: net.nodes[n].mesh.counters["forward"] - before[n] for n in LINE} == \
        {"A": 0, "B": 1, "C": 1, "D": 1, "E": 0}
    for name in "BCDE":
        assert all(f != frame for _, f in net.nodes[name].delivered)

    # unknown unicast: not in any table -> dropped at E, counted, never flooded
    unknown = Mac("02:dd:00:00:00:01")
    assert all(net.nodes[n].fwd.lookup(unknown, 0) is None for n in LINE)
    frame = ip_like(sender, unknown, b"nobody")
    c = E.mesh.counters
    dropped, unknown_drops, tx = c["tx_dropped"], c["drop_tx_unknown_unicast"], c["tx"]
    transmitted = E.transmitted
    net.host_send("E", frame)
    assert E.transmitted == transmitted  # nothing left E for it
    assert (c["tx_dropped"], c["drop_tx_unknown_unicast"], c["tx"]) == (dropped + 1, unknown_drops + 1, tx)
    net.run_for(2.0)
    for name in LINE:
        assert all(f != frame for _, f in net.nodes[name].delivered)


# --- 3. removed ------------------------------------------------------------------------------


def test_timed_out_clients_disappear_one_ttvn_per_commit():
    net = build_line(seed=13, config=MeshConfig(**FAST_TT))
    A = net.nodes["A"]
    c1, c2, c3 = client(1), client(2), client(3)
    for c in (c1, c2, c3):
        net.host_send("A", arp_like(c))
    net.run_for(2.0)
    assert A.mesh.tt.ttvn == 2  # 1 (own MAC at startup) + one commit for the 3 ADDs

    # c1 stays active, c2 for 3 more seconds, c3 goes quiet now; sample A's ttvn every 100 ms
    seen = [A.mesh.tt.ttvn]
    gone_c3_at = gone_c2_at = None
    for step in range(150):
        if step % 10 == 0:
            net.host_send("A", arp_like(c1))
            if step < 30:
                net.host_send("A", arp_like(c2))
        net.run_for(0.1)
        if A.mesh.tt.ttvn != seen[-1]:
            seen.append(A.mesh.tt.ttvn)
        if gone_c3_at is None and (c3, 0) not in A.mesh.tt.local:
            gone_c3_at = net.now
            # c2 has not timed out yet: the two deletions are separate commit batches
            assert (c2, 0) in A.mesh.tt.local
        if gone_c2_at is None and (c2, 0) not in A.mesh.tt.local:
            gone_c2_at = net.now
    assert gone_c3_at is not None and gone_c2_at is not None
    assert gone_c2_at - gone_c3_at > 1.5  # different OGM intervals
    assert seen == [2, 3, 4]  # exactly +1 per committed batch, nothing in between

    keys = {(soft(net, "A"), 0), (c1, 0)}
    assert set(A.mesh.tt.local) == keys
    crc = tt_vlan_crc([(mac, 0) for mac, _ in keys], 0)
    assert A.mesh.tt.local_crc(0) == crc
    for name in "BCDE":
        tt = net.nodes[name].mesh.tt
        assert (c2, 0) not in tt.global_ and (c3, 0) not in tt.global_, name
        assert announced_by(net, name, "A") == keys
        on = orig_node(net, name, "A")
        assert on.last_ttvn == 4 and on.tt_crcs == {0: crc}
        assert net.nodes[name].fwd.lookup(c3, 0) is None
        assert net.nodes[name].fwd.lookup(c2, 0) is None
    assert_fwd_line(net, LINE, "A", c1, ttvn=4)


# --- 4. moved (roaming) ------------------------------------------------------------------------


def test_roaming_client_moves_to_new_node():
    net = build_line(seed=14)
    A, E = net.nodes["A"], net.nodes["E"]
    c1, c2 = client(1), client(2)
    net.host_send("A", arp_like(c1))
    net.host_send("A", arp_like(c2))
    net.run_for(5.0)
    assert A.mesh.tt.ttvn == 2 and E.mesh.tt.ttvn == 1
    assert E.fwd.lookup(c1, 0)[0] == A.orig

    net.host_send("E", arp_like(c1))  # c1 now speaks from behind E
    # E saw a client A announces: one ROAM_ADV, to A
    assert E.mesh.counters["tt_roam_adv_tx"] == 1
    assert E.mesh.tt.global_[(c1, 0)].flags & F.ROAM
    for _ in range(20):  # four hops of 0.2 ms: look at A right when the advertisement lands
        net.run_for(0.0002)
        if A.mesh.counters["tt_roam_adv_rx"]:
            break
    assert A.mesh.counters["tt_roam_adv_rx"] == 1
    # A: the local entry is leaving (DEL|ROAM queued, kept as ROAM|PENDING until the commit),
    # and a ROAM global entry points at E with E's last known ttvn + 1
    local = A.mesh.tt.local[(c1, 0)]
    assert local.flags & (F.ROAM | F.PENDING) == F.ROAM | F.PENDING
    glob = A.mesh.tt.global_[(c1, 0)]
    assert glob.flags & F.ROAM and set(glob.origs) == {E.orig}
    assert glob.origs[E.orig].ttvn == 2

    # §9: while the TT diffs travel, C still sends to A, which reroutes the frame to E
    assert net.nodes["C"].fwd.lookup(c1, 0)[0] == A.orig
    frame = ip_like(client(0x33), c1, b"to c1 mid-roam")
    net.host_send("C", frame)
    net.run_for(0.5)
    assert [f for _, f in E.delivered if f == frame] == [frame]
    assert all(f != frame for _, f in A.delivered)

    net.run_for(10.0)
    assert E.mesh.counters["tt_roam_adv_tx"] == 1 and A.mesh.counters["tt_roam_adv_rx"] == 1
    # one commit on each side: A deleted c1 (2 -> 3), E added it (1 -> 2)
    assert A.mesh.tt.ttvn == 3 and E.mesh.tt.ttvn == 2
    assert (c1, 0) not in A.mesh.tt.local
    assert set(E.mesh.tt.local) == {(soft(net, "E"), 0), (c1, 0)}
    assert (c1, 0) not in E.mesh.tt.global_  # the client roamed to E: E's global entry is gone
    crc_a = tt_vlan_crc([(soft(net, "A"), 0), (c2, 0)], 0)
    crc_e = tt_vlan_crc([(soft(net, "E"), 0), (c1, 0)], 0)
    assert A.mesh.tt.local_crc(0) == crc_a and E.mesh.tt.local_crc(0) == crc_e
    for name in LINE:
        tt = net.nodes[name].mesh.tt
        if name != "A":
            on = orig_node(net, name, "A")
            assert on.last_ttvn == 3 and on.tt_crcs == {0: crc_a}, name
            assert announced_by(net, name, "A") == {(soft(net, "A"), 0), (c2, 0)}
        if name != "E":
            on = orig_node(net, name, "E")
            assert on.last_ttvn == 2 and on.tt_crcs == {0: crc_e}, name
            assert announced_by(net, name, "E") == {(soft(net, "E"), 0), (c1, 0)}
            entry = tt.global_[(c1, 0)]
            assert set(entry.origs) == {E.orig} and not entry.flags & (F.ROAM | F.TEMP)
            assert entry.origs[E.orig].ttvn == 2
    assert_fwd_line(net, LINE, "E", c1, ttvn=2)
    assert_fwd_line(net, LINE, "A", c2, ttvn=3)
    # and the data path follows: A's host reaches c1 behind E
    frame = ip_like(client(0x11), c1, b"after the move")
    net.host_send("A", frame)
    net.run_for(0.5)
    assert [f for _, f in E.delivered if f == frame] == [frame]


# --- 5. recovery after missed diffs ----------------------------------------------------------


def _cut_and_change(net: Network, batches: list[list[Mac]]):
    """Cut D-E, let A commit one batch per ~2.5 s, wait until the 4-OGM repeat window of the
    last batch has passed, restore the link. Returns (TT counters of all nodes before, sniffer)."""
    A, E = net.nodes["A"], net.nodes["E"]
    segment = net.find_segment("D", "E")
    sniffer = Sniffer(net)
    before = counters(net)
    segment.up = False
    ttvn = A.mesh.tt.ttvn
    for batch in batches:
        for c in batch:
            net.host_send("A", arp_like(c))
        net.run_for(2.5)
        ttvn += 1
        assert A.mesh.tt.ttvn == ttvn  # one commit per batch, each in its own OGM interval
    net.run_for(6.0)  # the last diff rode in 4 OGMs; all of them are gone now
    assert A.mesh.tt.tvlv.changes == [] and A.mesh.tt.ogm_append_cnt == 0
    assert orig_node(net, "E", "A").last_ttvn == 1  # E heard none of it
    segment.up = True
    net.run_for(5.0)
    return before, sniffer


def test_missed_diffs_recovered_with_one_full_table_request():
    net = build_line(seed=15)
    A, E = net.nodes["A"], net.nodes["E"]
    before, sniffer = _cut_and_change(net, [[client(1), client(2)], [client(3)]])
    assert A.mesh.tt.ttvn == 3

    # §12.6: E's last_ttvn for A is 1, A's OGMs now say 3 without changes -> else branch,
    # ttvn != last_ttvn -> exactly one FULL_TABLE request; its answer makes ttvn and CRC match,
    # so later OGMs trigger nothing.
    after = counters(net)
    assert after["E"]["tt_request_tx"] - before["E"]["tt_request_tx"] == 1
    assert all(after[n]["tt_request_tx"] == before[n]["tt_request_tx"] for n in "ABCD")
    requests = [(name, pkt, tt) for _, name, pkt, tt in sniffer.tt_tvlvs()
                if tt.flags & 0x0F == TtDataFlags.REQUEST and name == "E"]
    assert len(requests) == 1
    _, pkt, tt = requests[0]
    assert (pkt.src, pkt.dst) == (E.orig, A.orig)
    assert tt.flags == TtDataFlags.REQUEST | TtDataFlags.FULL_TABLE
    crc = tt_vlan_crc([(soft(net, "A"), 0), (client(1), 0), (client(2), 0), (client(3), 0)], 0)
    assert tt.ttvn == 3 and [(v.vid, v.crc) for v in tt.vlans] == [(0, crc)]
    # D knows A's table at exactly ttvn 3 with these CRCs: it answers on A's behalf
    # (src = A), full table, and the request goes no further
    responses = [(name, pkt, tt) for _, name, pkt, tt in sniffer.tt_tvlvs()
                 if tt.flags & 0x0F == TtDataFlags.RESPONSE]
    assert [(name, pkt.src, pkt.dst) for name, pkt, _ in responses] == [("D", A.orig, E.orig)]
    resp = responses[0][2]
    assert resp.flags == TtDataFlags.RESPONSE | TtDataFlags.FULL_TABLE and resp.ttvn == 3
    assert {(ch.addr, ch.vid) for ch in resp.changes} == announced_by(net, "D", "A")
    assert after["C"]["tt_request_rx"] == before["C"]["tt_request_rx"]

    on = orig_node(net, "E", "A")
    assert on.last_ttvn == 3 and on.tt_crcs == {0: crc} == {0: A.mesh.tt.local_crc(0)}
    assert announced_by(net, "E", "A") == {(soft(net, "A"), 0)} | {(client(i), 0) for i in (1, 2, 3)}
    assert E.fwd.lookup(client(3), 0)[0] == A.orig
    # and it stays quiet
    quiet = counters(net)
    net.run_for(10.0)
    assert counters(net) == quiet


def test_missed_single_diff_recovered_with_one_diff_request():
    """Only one commit missed: ttvn == last_ttvn + 1 but the OGM has no changes any more ->
    one request WITHOUT FULL_TABLE; D holds A's last diff (tt_buff) and answers with it."""
    net = build_line(seed=16)
    A, E = net.nodes["A"], net.nodes["E"]
    before, sniffer = _cut_and_change(net, [[client(1), client(2)]])
    after = counters(net)
    assert after["E"]["tt_request_tx"] - before["E"]["tt_request_tx"] == 1
    requests = [(pkt, tt) for _, name, pkt, tt in sniffer.tt_tvlvs()
                if tt.flags & 0x0F == TtDataFlags.REQUEST and name == "E"]
    assert len(requests) == 1
    assert requests[0][1].flags == TtDataFlags.REQUEST and requests[0][1].ttvn == 2
    responses = [(name, pkt, tt) for _, name, pkt, tt in sniffer.tt_tvlvs()
                 if tt.flags & 0x0F == TtDataFlags.RESPONSE]
    assert [(name, pkt.src, pkt.dst) for name, pkt, _ in responses] == [("D", A.orig, E.orig)]
    resp = responses[0][2]
    assert resp.flags == TtDataFlags.RESPONSE and resp.ttvn == 2
    assert {(ch.flags, ch.addr) for ch in resp.changes} == {(0, client(1)), (0, client(2))}
    on = orig_node(net, "E", "A")
    crc = tt_vlan_crc([(soft(net, "A"), 0), (client(1), 0), (client(2), 0)], 0)
    assert on.last_ttvn == 2 and on.tt_crcs == {0: crc} == {0: A.mesh.tt.local_crc(0)}
    assert announced_by(net, "E", "A") == {(soft(net, "A"), 0), (client(1), 0), (client(2), 0)}


# --- 6. steady state --------------------------------------------------------------------------


def test_steady_state_sends_no_tt_requests_or_responses():
    net = build_line(seed=17)
    for i, name in enumerate("ACE"):
        for j in range(3):
            net.host_send(name, arp_like(client(16 * (i + 1) + j)))
    net.run_for(10.0)
    ttvns = {n: net.nodes[n].mesh.tt.ttvn for n in LINE}
    assert ttvns == {"A": 2, "B": 1, "C": 2, "D": 1, "E": 2}
    snapshot = counters(net)
    sniffer = Sniffer(net)
    net.run_for(60.0)
    assert counters(net) == snapshot
    assert sniffer.tt_tvlvs() == []
    assert {n: net.nodes[n].mesh.tt.ttvn for n in LINE} == ttvns
    # and every node agrees with every originator's CRC
    for owner in LINE:
        crc = net.nodes[owner].mesh.tt.local_crc(0)
        for name in LINE:
            if name != owner:
                assert orig_node(net, name, owner).tt_crcs == {0: crc}


# --- 7. broadcast ------------------------------------------------------------------------------


def test_broadcast_delivered_once_everywhere_and_creates_temp_entries():
    # A diamond A-B-D-C-A plus E hanging off B: D hears every broadcast of A twice (via B and
    # via C). (E hangs off B, not D: D's route to A flaps between the equal B and C, and an
    # OGM of A can then legitimately go unforwarded by D, as in the kernel.)
    net = Network(seed=18)
    for name in LINE:
        net.add_node(name)
    for a, b in (("A", "B"), ("A", "C"), ("B", "D"), ("C", "D"), ("B", "E")):
        net.link(a, b)
    net.run_for(WARMUP)
    A = net.nodes["A"]
    requests = counters(net)

    # first an unrelated change, so that its diff reaches the receivers while the TEMP entry
    # below exists (their CRC recomputation must leave TEMP entries out). A unicast to an
    # unknown MAC is dropped, but its source is learnt all the same.
    early = client(0x70)
    net.host_send("A", ip_like(early, Mac("02:dd:00:00:00:70")))
    while A.mesh.tt.ttvn == 1:
        net.run_for(0.01)
    assert A.mesh.tt.ttvn == 2  # committed; the OGM carrying it leaves in ~1 s

    sniffer = Sniffer(net)
    talker = client(0x77)  # unknown to everybody so far
    frames = [arp_like(talker)[:-1] + bytes([i]) for i in (1, 2)]
    net.host_send("A", frames[0])
    net.run_for(0.05)

    own = [(f.ethernet.h_dest, f.packet) for _, n, _, f in sniffer.log if n == "A" and isinstance(f.packet, Bcast)]
    assert len(own) == 2  # once per interface (Ethernet: one copy each)
    assert all(dst.is_broadcast and p.seqno == 2 and p.ttl == 49 and p.orig == A.orig for dst, p in own)
    # rebroadcasts carry the decremented TTL: B and C 48, D 47; E has nobody left to send to
    ttls = {(n, f.packet.ttl) for _, n, _, f in sniffer.log if n != "A" and isinstance(f.packet, Bcast)}
    assert ttls == {("B", 48), ("C", 48), ("D", 47)}
    # B sends toward D and E, C toward D (never back to A, the originator); D rebroadcasts only
    # the first copy, on its other link only, where it is a duplicate; E's only neighbour is B
    sent = collections.Counter(n for _, n, _, f in sniffer.log if isinstance(f.packet, Bcast))
    assert sent == {"A": 2, "B": 2, "C": 1, "D": 1}
    for name in "BCDE":
        got = [f for _, f in net.nodes[name].delivered]
        assert got == [frames[0]], name  # D dropped the second copy (duplicate window)
        entry = net.nodes[name].mesh.tt.global_[(talker, 0)]
        assert entry.flags & F.TEMP
        assert set(entry.origs) == {A.orig}
        assert entry.origs[A.orig].ttvn == orig_node(net, name, "A").last_ttvn == 1
        assert net.nodes[name].fwd.lookup(talker, 0)[0] == A.orig
    assert not A.delivered

    net.host_send("A", frames[1])
    net.run_for(0.05)
    own = [f.packet.seqno for _, n, _, f in sniffer.log if n == "A" and isinstance(f.packet, Bcast)]
    assert own == [2, 2, 3, 3]
    for name in "BCDE":
        assert [f for _, f in net.nodes[name].delivered] == frames, name

    # the ttvn-2 diff (early) has arrived everywhere, the talker's ADD (ttvn 3) not yet: the
    # recomputed CRC covers the soft MAC and `early`, not the TEMP entry, and matches A's
    net.run_for(1.5)
    assert A.mesh.tt.ttvn == 3  # the talker's ADD is committed, its OGM not sent yet
    crc2 = tt_vlan_crc([(soft(net, "A"), 0), (early, 0)], 0)
    for name in "BCDE":
        assert orig_node(net, name, "A").last_ttvn == 2
        assert orig_node(net, name, "A").tt_crcs == {0: crc2}
        assert net.nodes[name].mesh.tt.global_[(talker, 0)].flags & F.TEMP

    # A's next commit announces the talker: the TEMP entries become real ones
    net.run_for(5.0)
    assert A.mesh.tt.ttvn == 3
    crc3 = tt_vlan_crc([(soft(net, "A"), 0), (early, 0), (talker, 0)], 0)
    assert A.mesh.tt.local_crc(0) == crc3
    for name in "BCDE":
        entry = net.nodes[name].mesh.tt.global_[(talker, 0)]
        assert not entry.flags & F.TEMP and entry.origs[A.orig].ttvn == 3
        assert orig_node(net, name, "A").tt_crcs == {0: crc3}
    assert counters(net) == requests  # no TT request/response was needed at any point


# --- 8. limits ---------------------------------------------------------------------------------


def _announce_many(limit_config: MeshConfig, n_clients: int, seed: int) -> Network:
    """A - B - C; B has the limits, A announces n_clients (plus its own MAC)."""
    net = Network(seed=seed)
    net.add_node("A")
    net.add_node("B", config=limit_config)
    net.add_node("C")
    net.link("A", "B")
    net.link("B", "C")
    net.run_for(WARMUP)
    for i in range(n_clients):
        net.host_send("A", arp_like(client(0x80 + i)))
    net.run_for(10.0)
    return net


def test_global_table_limit():
    limit = 6
    net = _announce_many(MeshConfig(max_global_tt_entries=limit), n_clients=8, seed=19)
    B = net.nodes["B"]
    # before the burst B held A's and C's soft MACs (2 entries); 8 more do not fit (the
    # temporary entries from the clients' broadcasts have a budget of their own)
    assert sum(1 for e in B.mesh.tt.global_.values() if not e.flags & F.TEMP) <= limit
    assert B.mesh.counters["drop_tt_global_table_full"] > 0
    assert (soft(net, "C"), 0) in B.mesh.tt.global_  # what was there stays
    # C (no limit) has the full table of A
    assert len(announced_by(net, "C", "A")) == 9


def test_global_table_per_originator_limit():
    limit = 4
    net = _announce_many(MeshConfig(max_global_tt_entries_per_originator=limit), n_clients=8, seed=20)
    B = net.nodes["B"]
    assert len(announced_by(net, "B", "A")) <= limit
    assert B.mesh.counters["drop_tt_global_originator_full"] > 0
    assert announced_by(net, "B", "C") == {(soft(net, "C"), 0)}  # other originators unaffected
    assert len(announced_by(net, "C", "A")) == 9


def test_originator_table_limit():
    limit = 3
    net = Network(seed=21, config=MeshConfig(max_originators=limit))
    names = "ABCDEFG"
    for name in names:
        net.add_node(name)
    for a, b in zip(names, names[1:]):
        net.link(a, b)
    net.run_for(20.0)
    for name in names:
        assert len(net.nodes[name].mesh.originators.nodes) <= limit, name
    # the middle of a 7-node line hears 6 originators: some had to be refused
    assert all(net.nodes[n].mesh.counters["drop_originator_table_full"] > 0 for n in "CDE")


# --- 9. ttvn wrap ------------------------------------------------------------------------------


def test_ttvn_wrap_costs_exactly_one_full_table_request():
    """§12.6: the "+1" test is done on ints, so 255 -> 0 is not consecutive: each node that
    follows A's diffs asks for A's full table exactly once at the wrap, and never before."""
    net = build_line(seed=22, config=MeshConfig(tt_local_timeout_ms=3_000, tt_work_period_ms=1_000),
                     names="ABC")
    A = net.nodes["A"]
    sniffer = Sniffer(net)
    before = counters(net)
    n = 0
    while not (A.mesh.tt.ttvn == 2 and n > 200):  # through 255 -> 0, then two more commits
        n += 1
        net.host_send("A", arp_like(Mac(f"02:ee:00:00:{n >> 8:02x}:{n & 0xFF:02x}")))
        net.run_for(1.0)  # clients time out 3-4 s later: the table stays small
    net.run_for(10.0)  # the last clients time out, their deletions are committed and spread
    assert set(A.mesh.tt.local) == {(soft(net, "A"), 0)} and 2 < A.mesh.tt.ttvn < 10
    requests = [(name, pkt, tt) for _, name, pkt, tt in sniffer.tt_tvlvs()
                if tt.flags & 0x0F == TtDataFlags.REQUEST and pkt.src == net.nodes[name].orig]
    assert sorted((name, tt.flags, tt.ttvn) for name, _, tt in requests) == [
        ("B", TtDataFlags.REQUEST | TtDataFlags.FULL_TABLE, 0),
        ("C", TtDataFlags.REQUEST | TtDataFlags.FULL_TABLE, 0),
    ]
    after = counters(net)
    assert {k: after[k]["tt_request_tx"] - before[k]["tt_request_tx"] for k in "ABC"} == {"A": 0, "B": 1, "C": 1}
    for name in "BC":
        on = orig_node(net, name, "A")
        assert on.last_ttvn == A.mesh.tt.ttvn
        assert on.tt_crcs == {0: tt_entry_crc(soft(net, "A"), 0)}
        assert announced_by(net, name, "A") == {(soft(net, "A"), 0)}


# --- the TTVN check and clients that are being deleted ----------------------------------------


def test_stale_ttvn_frame_for_pending_client_is_dropped():
    """A long OGM interval keeps B's view of A's ttvn stale for ~5 s after each commit. In
    that window A's client c3 times out (PENDING until A's next commit) and B sends to it
    with the old ttvn. Kernel check_unicast_ttvn at A: ttvn is old -> reroute: c3 is not
    "my client" (PENDING) and no other originator has it -> not my client -> drop."""
    cfg = MeshConfig(orig_interval_ms=5_000, tt_local_timeout_ms=3_000, tt_work_period_ms=1_000)
    net = build_line(seed=23, config=cfg, names="AB", warmup=60.0)
    A, B = net.nodes["A"], net.nodes["B"]
    c3, other = client(3), client(0x99)
    net.host_send("A", arp_like(c3))
    for i in range(300):  # 15 s, c3 kept alive: announced to B
        if i % 10 == 0:
            net.host_send("A", arp_like(c3))
        net.run_for(0.05)
    assert B.fwd.lookup(c3, 0)[0] == A.orig
    net.host_send("A", arp_like(other))  # a change: A's next commit bumps the ttvn
    ttvn = A.mesh.tt.ttvn
    i = 0
    while A.mesh.tt.ttvn == ttvn:
        i += 1
        if i % 10 == 0:
            net.host_send("A", arp_like(c3))
            net.host_send("A", arp_like(other))
        net.run_for(0.05)
    # from now on c3 is silent; `other` stays alive
    while not A.mesh.tt.local[(c3, 0)].flags & F.PENDING:
        i += 1
        if i % 10 == 0:
            net.host_send("A", arp_like(other))
        net.run_for(0.05)
    assert orig_node(net, "B", "A").last_ttvn == A.mesh.tt.ttvn - 1  # B is one version behind
    assert B.fwd.lookup(c3, 0)[3] == A.mesh.tt.ttvn - 1
    frame = ip_like(client(0x42), c3, b"late")
    drops = A.mesh.counters["drop_unicast_ttvn"]
    net.host_send("B", frame)
    net.run_for(0.01)
    assert all(f != frame for _, f in A.delivered)
    assert A.mesh.counters["drop_unicast_ttvn"] == drops + 1
