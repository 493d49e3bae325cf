"""Bridge loop avoidance in the simulator (the kernel's bridge_loop_avoidance.c): two
gateways A and B bridged into one LAN with a host L, a mesh node C with a host behind it.
Mesh: A - C - D - B, so A hears C's frames first. Claim frames against the kernel's
layout, group id convergence, the start-up hold, one claim per client, no duplicates
either way, and the other gateway taking over when one stops."""

from __future__ import annotations

import struct

from batmand.core.bla import PERIOD, print_vid
from batmand.core.bla_frames import (ANNOUNCE, ANNOUNCE_PREFIX, BROADCAST, CLAIM, REQUEST, UNCLAIM, claim_frame, crc16,
                                     parse_claim)
from batmand.core.config import MeshConfig
from batmand.core.events import Uevent
from batmand.sim.network import Network
from batmand.wire import InnerFrame, IvOgm, Mac, decode_frame

L_MAC = Mac("02:11:00:00:00:01")  # a host on the LAN
C_HOST = Mac("02:22:00:00:00:01")  # a host behind mesh node C


def frame(dst: bytes, src: bytes, text: bytes) -> bytes:
    return bytes(dst) + bytes(src) + struct.pack("!H", 0x88B5) + text.ljust(46, b".")


def _net():
    net = Network(seed=3, bla=True)
    for name in "ABCD":
        net.add_node(name, MeshConfig(orig_interval_ms=200, purge_timeout_ms=20_000))
    net.link("A", "C")
    net.link("C", "D")
    net.link("D", "B")
    lan = net.bridge(["A", "B"])
    net.run_for(5)
    return net, lan


def _on_lan(lan, text: bytes) -> int:
    """Copies of the frame with this payload that gateways put onto the LAN."""
    return sum(1 for _, sender, f in lan.frames if sender is not None and f[14:14 + len(text)] == text)


def _at(net, name, text: bytes) -> int:
    return sum(1 for _, f in net.nodes[name].delivered if f[14:14 + len(text)] == text)


def test_claim_frames_are_the_kernels_bytes():
    # the kernel's layout (batadv_bla_send_claim): ARP reply, magic ff:43:05, type, group
    primary = Mac("02:00:00:00:01:01")
    assert crc16(b"123456789") == 0xBB3D and crc16(primary) == 0xB2C1
    announce = claim_frame(ANNOUNCE, eth_dst=BROADCAST, eth_src=primary, sender_hw=ANNOUNCE_PREFIX + b"\x82\x00",
                           group=0xB2C1, vid=0)
    assert announce.hex() == ("ffffffffffff020000000101080600010800060400024305430582000000000"
                              "0ff4305 02b2c100000000").replace(" ", "")
    claim = claim_frame(CLAIM, eth_dst=BROADCAST, eth_src=Mac("02:00:00:00:02:00"), sender_hw=primary,
                        group=0xB2C1, vid=0x8000 | 10)
    assert claim.hex() == ("ffffffffffff02000000020081 00000a08060001080006040002020000000101"
                           "00000000ff430500b2c100000000").replace(" ", "")
    parsed = parse_claim(InnerFrame.decode(claim))
    assert (parsed.kind, parsed.group, parsed.sender_hw, parsed.eth_src, parsed.depth) == \
        (CLAIM, 0xB2C1, primary, Mac("02:00:00:00:02:00"), 1)
    # not a claim: another magic, a priority tag (newest kernels: untagged, never a claim)
    assert parse_claim(InnerFrame.decode(claim.replace(b"\xff\x43\x05", b"\xff\x43\x06"))) is None
    priority = claim[:12] + b"\x81\x00\x00\x00" + claim[16:]
    assert parse_claim(InnerFrame.decode(priority)) is None
    assert print_vid(0) == -1 and print_vid(0x8000 | 10) == 10


def test_two_gateways_agree_and_nothing_loops_or_arrives_twice():
    net, lan = _net()
    a, b = net.nodes["A"].mesh, net.nodes["B"].mesh
    # L's first frame passes both gateways (nothing holds it yet); C's duplicate list
    # drops the second copy, so C's host gets it once
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"first"))
    net.run_for(1)
    assert _at(net, "C", b"first") == 1
    assert net.nodes["C"].mesh.counters["drop_bcast_duplicate_frame"] == 1
    # both are backbone gateways now, in one group (the higher of the two), each holding
    # multicast back until its entry is in sync
    group = max(crc16(net.nodes["A"].orig), crc16(net.nodes["B"].orig))
    assert a.bla.group == b.bla.group == group
    assert a.bla.is_backbone_gw(net.nodes["B"].orig, 0) and b.bla.is_backbone_gw(net.nodes["A"].orig, 0)
    assert a.bla.num_requests == b.bla.num_requests == 1
    dropped = a.counters["tx_dropped"]
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"held"))
    net.run_for(1)
    assert _at(net, "C", b"held") == 0 and a.counters["tx_dropped"] == dropped + 1
    net.run_for(3 * PERIOD + 1)
    assert a.bla.num_requests == b.bla.num_requests == 0
    # C's host broadcasts: A hears it first and claims C's host; B learns the claim on the
    # LAN and leaves it to A: one copy on the LAN, and it does not come back into the mesh
    net.host_send("C", frame(BROADCAST, C_HOST, b"from-c"))
    net.run_for(1)
    assert _on_lan(lan, b"from-c") == 1 and _at(net, "C", b"from-c") == 0
    owners = {n: {r["bla_address"]: r["bla_backbone"] for r in net.nodes[n].mesh.bla.claim_rows()} for n in "AB"}
    assert owners["A"][str(C_HOST)] == owners["B"][str(C_HOST)] == str(net.nodes["A"].orig)
    again = [net.host_send("C", frame(BROADCAST, C_HOST, b"again")), net.run_for(1)]
    assert again and _on_lan(lan, b"again") == 1
    # the CRCs agree: the announcements that follow ask for nothing
    net.run_for(2 * PERIOD)
    assert [r["bla_crc"] for r in a.bla.backbone_rows(net.now) if r.get("bla_own")] == [crc16(C_HOST)]
    assert {r["bla_backbone"]: r["bla_crc"] for r in b.bla.backbone_rows(net.now)}[str(net.nodes["A"].orig)] == \
        crc16(C_HOST)
    # unicast both ways arrives once
    net.host_send("C", frame(L_MAC, C_HOST, b"to-l"))
    net.lan_send(lan, frame(C_HOST, L_MAC, b"to-c"))
    net.run_for(1)
    assert _on_lan(lan, b"to-l") == 1 and _at(net, "C", b"to-c") == 1


def test_the_other_gateway_takes_over_when_one_stops():
    net, lan = _net()
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(3 * PERIOD + 2)
    net.host_send("C", frame(BROADCAST, C_HOST, b"one"))
    net.run_for(1)
    assert _on_lan(lan, b"one") == 1
    net.stop("A")
    # B keeps leaving C's host to A until A's entry times out (no ANNOUNCE for 60 s)
    net.run_for(6 * PERIOD + PERIOD + 1)
    b = net.nodes["B"].mesh
    assert not b.bla.is_backbone_gw(net.nodes["A"].orig, 0)
    net.host_send("C", frame(BROADCAST, C_HOST, b"two"))
    net.run_for(1)
    assert _on_lan(lan, b"two") == 1
    assert {r["bla_address"]: r["bla_backbone"] for r in b.bla.claim_rows()}[str(C_HOST)] == str(net.nodes["B"].orig)


def test_hostile_claim_frames_from_the_lan_change_little():
    net, lan = _net()
    a = net.nodes["A"].mesh
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(1)
    group, before = a.bla.group, dict(a.bla.backbones)
    dropped = a.counters["tx_dropped"]
    # a claim frame of another group from a MAC that is no originator: consumed, nothing learnt
    net.lan_send(lan, claim_frame(ANNOUNCE, eth_dst=BROADCAST, eth_src=Mac("02:66:00:00:00:01"),
                                  sender_hw=ANNOUNCE_PREFIX + b"\x12\x34", group=group ^ 0x1111, vid=0))
    # an unknown claim type and a QinQ claim frame: into the mesh as ordinary traffic / dropped
    odd = claim_frame(CLAIM, eth_dst=BROADCAST, eth_src=L_MAC, sender_hw=Mac("02:66:00:00:00:02"), group=group, vid=0)
    net.lan_send(lan, odd[:35] + b"\x09" + odd[36:])
    qinq = claim_frame(CLAIM, eth_dst=BROADCAST, eth_src=L_MAC, sender_hw=Mac("02:66:00:00:00:02"), group=group,
                       vid=0x8000 | 5)
    net.lan_send(lan, qinq[:12] + b"\x81\x00\x00\x07" + qinq[12:])
    net.run_for(1)
    assert a.bla.group == group and a.bla.backbones == before
    assert a.counters["tx_dropped"] >= dropped + 2
    # a LAN host inventing backbone gateways in our group fills the table only so far
    for i in range(300):
        net.lan_send(lan, claim_frame(ANNOUNCE, eth_dst=BROADCAST, eth_src=Mac(bytes([2, 0x77, 0, 0, i >> 8, i & 0xFF])),
                                      sender_hw=ANNOUNCE_PREFIX + b"\x00\x00", group=group, vid=0))
    net.run_for(1)
    assert len(a.bla.backbones) == a.config.max_bla_backbones and a.counters["drop_bla_backbone_table_full"] > 0


def test_claims_a_mesh_peer_makes_us_keep_are_bounded_and_traffic_still_flows():
    """C's host sends broadcasts from ever new sources: the gateways claim them up to
    max_bla_claims (ours; the kernel has no limit), count the rest, and still pass them."""
    net, lan = _net()
    a = net.nodes["A"].mesh
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(3 * PERIOD + 2)  # past the hold
    for node in ("A", "B"):
        net.nodes[node].mesh.set_option(net.now, "max_bla_claims", 5)
    for i in range(8):
        net.host_send("C", frame(BROADCAST, Mac(bytes([2, 0x55, 0, 0, 0, i])), b"src%d" % i))
        net.run_for(0.2)
    assert len(a.bla.claims) == 5 and a.counters["drop_bla_claim_table_full"] > 0
    assert all(_on_lan(lan, b"src%d" % i) >= 1 for i in range(8))


def test_a_loop_bla_cannot_break_is_reported():
    """B bridges the same LAN with BLA off: A's LOOPDETECT frame (every 6th period, from a
    random ba:be source) crosses the LAN to B, which floods it into the mesh, and it comes
    back to A from a node that is no backbone gateway of its LAN: the kernel's log line and
    a `bla loopdetect` uevent with the VID. The copy that came back is not delivered."""
    net = Network(seed=3, bla=True)
    for name in "ABCD":
        net.add_node(name, MeshConfig(orig_interval_ms=200, purge_timeout_ms=20_000,
                                      bridge_loop_avoidance=name != "B"))
    net.link("A", "C")
    net.link("C", "D")
    net.link("D", "B")
    lan = net.bridge(["A"])
    net.run_for(5)
    a = net.nodes["A"].mesh
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))  # A's own entry exists from here
    # B joins the LAN one period before the LOOPDETECT: from then on every broadcast circles
    # through B's bridge and the mesh, as it would for real, so the test does not wait there
    while a.bla.loopdetect_next > 1:
        net.run_for(1)
    lan.members.append("B")
    for _ in range(2 * int(PERIOD)):
        net.run_for(1)
        if net.nodes["A"].uevents:
            break

    def loopdetects(frames) -> list[bytes]:
        return [f for f in frames if f[:6] == b"\xff" * 6 and f[6:8] == b"\xba\xbe"]

    sent = loopdetects(f for _, sender, f in lan.frames if sender == "A")
    assert sent, "A sent no LOOPDETECT frame"
    assert [e for _, e in net.nodes["A"].uevents] == [Uevent("bla", "loopdetect", "-1")]
    assert loopdetects(f for _, f in net.nodes["A"].delivered) == sent


def _claims(net, node: str) -> dict:
    return {(r["bla_address"], r["bla_vid"]): r["bla_backbone"] for r in net.nodes[node].mesh.bla.claim_rows()}


def _lan_claim_frames(lan, kind: int, sender: str) -> list:
    return [c for _, s, f in lan.frames if s == sender
            for c in [parse_claim(InnerFrame.decode(f))] if c is not None and c.kind == kind]


def test_a_client_that_roams_into_the_lan_is_unclaimed():
    """C's host, claimed by A, turns up on the LAN: A sees it sending from its own LAN side
    and sends an UNCLAIM (batadv_bla_tx's roaming client), B drops its copy of that first
    frame (A's client, a broadcast) and learns the UNCLAIM; nobody holds the claim, and C's
    node gets the frame once."""
    net, lan = _net()
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(3 * PERIOD + 2)
    net.host_send("C", frame(BROADCAST, C_HOST, b"one"))
    net.run_for(1)
    assert _claims(net, "A")[(str(C_HOST), -1)] == _claims(net, "B")[(str(C_HOST), -1)] == str(net.nodes["A"].orig)
    net.lan_send(lan, frame(BROADCAST, C_HOST, b"roamed"))
    net.run_for(1)
    unclaims = _lan_claim_frames(lan, UNCLAIM, "A")
    assert [(u.eth_src, u.sender_hw) for u in unclaims] == [(net.nodes["A"].orig, C_HOST)]
    assert (str(C_HOST), -1) not in _claims(net, "A") and (str(C_HOST), -1) not in _claims(net, "B")
    assert _at(net, "C", b"roamed") == 1


def test_a_crc_mismatch_makes_a_request_and_the_claims_come_again():
    """B loses its copy of A's claims (as after a lost CLAIM frame): A's next ANNOUNCE
    carries a CRC B's table does not match, B sends a REQUEST to A, forgets what it had
    of A and holds multicast back; A answers with all its claims and an ANNOUNCE, and the
    tables agree again."""
    net, lan = _net()
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(3 * PERIOD + 2)
    net.host_send("C", frame(BROADCAST, C_HOST, b"one"))
    net.run_for(1)
    b = net.nodes["B"].mesh.bla
    b._del_claim(C_HOST, 0)  # lost
    net.run_for(PERIOD + 1)
    requests = _lan_claim_frames(lan, REQUEST, "B")
    assert requests and requests[0].eth_dst == net.nodes["A"].orig
    net.run_for(1)
    assert _claims(net, "B")[(str(C_HOST), -1)] == str(net.nodes["A"].orig)
    net.run_for(PERIOD + 1)
    assert b.num_requests == 0


def test_vlans_are_claimed_each_on_their_own():
    """A LAN host's tagged broadcast on VLAN 5 makes each gateway an own entry on VLAN 5
    (its ANNOUNCEs tagged 5, a hold of its own); C's host on VLAN 5 is claimed there,
    independently of the untagged claims."""
    net, lan = _net()
    for name in "ABCD":
        node = net.nodes[name]
        net._handle(node, node.mesh.set_vlans(net.now, {5}))

    def tagged(dst, src, text):
        f = frame(dst, src, text)
        return f[:12] + b"\x81\x00\x00\x05" + f[12:]

    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(1)
    # while the untagged entry holds multicast back, a VLAN 5 broadcast is dropped before it
    # makes an entry (batadv_bla_tx: the hold comes first); the next one after the hold does
    a = net.nodes["A"].mesh.bla
    net.lan_send(lan, tagged(BROADCAST, L_MAC, b"held5"))
    net.run_for(1)
    assert {r["bla_vid"] for r in a.backbone_rows(net.now)} == {-1}
    net.run_for(3 * PERIOD)
    net.lan_send(lan, tagged(BROADCAST, L_MAC, b"start5"))
    net.run_for(3 * PERIOD + 2)
    assert {(r["bla_backbone"], r["bla_vid"]) for r in a.backbone_rows(net.now)} >= {
        (str(net.nodes["A"].orig), -1), (str(net.nodes["A"].orig), 5),
        (str(net.nodes["B"].orig), -1), (str(net.nodes["B"].orig), 5)}
    assert {InnerFrame.decode(f).vid for _, s, f in lan.frames if s == "A"
            and (c := parse_claim(InnerFrame.decode(f))) is not None and c.kind == ANNOUNCE} == {None, 5}
    net.host_send("C", tagged(BROADCAST, C_HOST, b"on5"))
    net.run_for(1)
    assert sum(1 for _, s, f in lan.frames if s is not None and f[18:22] == b"on5.") == 1
    claims = _claims(net, "A")
    assert (str(C_HOST), 5) in claims and (str(C_HOST), -1) not in claims
    assert _claims(net, "B")[(str(C_HOST), 5)] == claims[(str(C_HOST), 5)]


def _past_the_hold_with_c_claimed_by_a(net, lan) -> None:
    net.lan_send(lan, frame(BROADCAST, L_MAC, b"start"))
    net.run_for(3 * PERIOD + 2)
    net.host_send("C", frame(BROADCAST, C_HOST, b"one"))
    net.run_for(1)
    assert _claims(net, "B")[(str(C_HOST), -1)] == str(net.nodes["A"].orig)


def test_dat_answers_for_a_claimed_client_only_at_its_gateway():
    """Both gateways know C's host's IPv4 address from their DAT caches; the LAN host asks
    for it: only A, which claimed it, answers from its cache (batadv_bla_check_claim in
    batadv_dat_snoop_outgoing_arp_request), so the LAN gets one reply."""
    net, lan = _net()
    _past_the_hold_with_c_claimed_by_a(net, lan)
    c_ip, l_ip = bytes([10, 0, 0, 3]), bytes([10, 0, 0, 200])
    for name in "AB":
        net.nodes[name].mesh.dat.cache_add(net.now, c_ip, C_HOST, 0)
    request = (bytes(BROADCAST) + bytes(L_MAC) + b"\x08\x06"
               + struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, L_MAC, l_ip, bytes(6), c_ip))
    net.lan_send(lan, request)
    net.run_for(1)
    replies = [(s, f) for _, s, f in lan.frames if s is not None and f[12:14] == b"\x08\x06" and f[20:22] == b"\x00\x02"
               and f[28:32] == c_ip]
    assert [s for s, _ in replies] == ["A"] and replies[0][1][22:28] == bytes(C_HOST)


def test_multicast_leaves_out_the_gateways_of_our_lan():
    """B wants all IPv4 multicast (bridged, no querier: flags 0x07) and C's host listens to
    the group: the LAN host's multicast leaves A for C only; B has it from the LAN."""
    from batmand.core.multicast import HostGroups
    from tests.core.test_multicast import G4, G4_MAC

    net, lan = _net()
    for name in "ABCD":
        groups = HostGroups(bridged=True) if name == "B" else HostGroups(ipv4=(G4,)) if name == "C" else HostGroups()
        net.nodes[name].mesh.multicast.update(net.now, groups)
    _past_the_hold_with_c_claimed_by_a(net, lan)
    a = net.nodes["A"].mesh
    assert net.nodes["B"].orig in a.multicast.wants["ipv4"] and a.tt.best_orig(G4_MAC, 0) == net.nodes["C"].orig
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 32, 0, 0, 1, 17, 0, bytes([10, 0, 0, 200]), G4) + bytes(12)
    mcast = bytes(G4_MAC) + bytes(L_MAC) + b"\x08\x00" + ip
    sent = net.sent_by("A", lambda: (net.lan_send(lan, mcast), net.run_for(0.05)))
    packets = [p for p in map(lambda f: decode_frame(f).packet, sent) if not isinstance(p, IvOgm)]
    to = [p.dest for p in packets if hasattr(p, "dest")] + [
        d for p in packets for t in getattr(p, "tvlvs", ()) for d in getattr(t, "dests", ())]
    assert packets and net.nodes["C"].orig in to and net.nodes["B"].orig not in to
    assert any(f[14:] == ip for _, f in net.nodes["C"].delivered)
