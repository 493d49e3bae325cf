"""The data plane's decisions (batmand.dataplane.decision) against the protocol core.

A property test builds a Mesh in a random state with the core's own methods (hard
interfaces, some Wi-Fi, some set down; VLANs; our clients learnt from host frames, some
committed, some deleted or roamed away by other originators' announcements; originators
with routes or none, announcing clients in TT diffs, some roaming; our own TT version),
takes the forwarding table from the ForwardingUpdate actions the Mesh returned, and feeds
random UNICAST frames (to us or another originator, TTVN before/equal/after, TTL 0/1/2+,
tagged or not, multicast and batman-in-batman inner frames, cut short) and host frames to
both. Wherever a decision delivers, forwards or encapsulates, the core must do the same
with the same bytes; SLOW is always allowed (the core then decides). A decision must also
depend only on the bytes of its key (the engine caches it by them).

The slow-path rules are checked with rules set by hand: an ARP rule makes ARP frames SLOW
in both directions while other frames stay fast, an L4 rule claims only its port, and
the multicast and client rules claim theirs."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from hypothesis import Phase, given, settings, strategies as st

from batmand.core.config import MeshConfig
from batmand.core.events import Deliver, ForwardingUpdate, Transmit
from batmand.core.forwarding import FROM_HOST, TO_HOST, ForwardingTable, SlowPath, SlowRule
from batmand.core.mesh import Mesh
from batmand.dataplane.decision import (DELIVER, SLOW, DeliverSeen, Encapsulate, Forward, decide_host, decide_mesh, host_key,
                                        host_key_ip4, mesh_key_ip4,
                                        mesh_key)
from batmand.dataplane.engine import Engine
from batmand.wire import BROADCAST, ETH_P_BATMAN, Mac, TtChange, TtClientFlags as F, TtDataFlags, TtTvlv, TtVlan
from batmand.wire.constants import VLAN_HAS_TAG
from batmand.wire.fastpath import unicast_prefix

NOW = 10.0
SOFT = Mac("02:00:00:00:00:aa")
IFACE_MACS = [Mac(f"02:00:00:00:0{i}:01") for i in range(1, 4)]
ORIGS = [Mac(f"02:5e:00:00:00:0{i}") for i in range(1, 6)]
CLIENTS = [Mac(f"06:c1:00:00:00:0{i}") for i in range(1, 8)]
STRANGER = Mac("06:ee:00:00:00:01")  # nobody's client
MULTICAST = [BROADCAST, Mac("01:00:5e:00:00:01"), Mac("33:33:00:00:00:01"), Mac("01:80:c2:00:00:00")]
VLANS = (5, 7)  # the soft interface's tagged VLANs (some states have them)
ETHERTYPES = (0x0800, 0x0800, 0x86DD, 0x0806, ETH_P_BATMAN, 0x8100, 0x88B5)
RULES = (SlowRule(TO_HOST, 0x0806), SlowRule(FROM_HOST, 0x0806), SlowRule(FROM_HOST, 0x0800, 17, 67),
         SlowRule(TO_HOST, 0x0800, 17, 68), SlowRule(TO_HOST, 0x86DD, 17), SlowRule(FROM_HOST, 0x86DD, 58))
ARP_BOTH = SlowPath(rules=frozenset({SlowRule(TO_HOST, 0x0806), SlowRule(FROM_HOST, 0x0806)}))


def ethernet(dst: bytes, src: bytes, tci: int | None, ethertype: int, payload: bytes = b"") -> bytes:
    tag = b"" if tci is None else struct.pack("!HH", 0x8100, tci)
    return bytes(dst) + bytes(src) + tag + struct.pack("!H", ethertype) + payload


def unicast(dst: bytes, src: bytes, dest: bytes, ttvn: int, inner: bytes, ttl: int = 50) -> bytes:
    return bytes(dst) + bytes(src) + struct.pack("!HBBBB", ETH_P_BATMAN, 0x40, 15, ttl, ttvn) + bytes(dest) + inner


@dataclass
class World:
    """A Mesh and the forwarding table it published, with the engine's view of the ports."""

    mesh: Mesh
    table: ForwardingTable
    primary: bytes | None
    wifi: bool

    def take(self, actions: list) -> list:
        for action in actions:
            if isinstance(action, ForwardingUpdate):
                self.table.apply(action)
        return actions

    def set_ports(self) -> None:
        """What the daemon tells the data plane (service._update_datapath_ifaces), as the engine takes it."""
        engine = Engine(-1, None, None)
        active = self.mesh.active_ifaces()
        engine.set_ports({i.name: (bytes(i.mac), i.mtu) for i in active},
                         bytes(self.mesh.primary.mac) if self.mesh.primary else None, any(i.wifi for i in active))
        self.primary, self.wifi = engine.primary, engine.wifi


def often(draw, p: float) -> bool:
    return draw(st.integers(0, 99)) < p * 100


def build(draw) -> World:
    """A Mesh in a random state, built with the core's own methods."""
    algo = draw(st.sampled_from(["BATMAN_IV", "BATMAN_V"]))
    # BLA off: the slow path below is drawn at random and replaces what the core publishes,
    # and BLA needs its own (its sources) to agree with the core
    mesh = Mesh(MeshConfig(routing_algo=algo, bridge_loop_avoidance=False), soft_mac=SOFT, rng=random.Random(1),
                now=0.0)
    world = World(mesh, ForwardingTable(), None, False)
    take = world.take
    for i in range(draw(st.integers(1, 3))):
        take(mesh.add_interface(NOW, f"e{i}", IFACE_MACS[i], wifi=often(draw, 0.15)))
    vids = draw(st.sets(st.sampled_from(VLANS)))
    take(mesh.set_vlans(NOW, vids))
    vid_keys = [0] + [VLAN_HAS_TAG | v for v in sorted(vids)]

    def from_host(client: Mac, vid: int) -> None:  # the host sends from `client`: the core learns it
        tci = None if vid == 0 else vid & 0x0FFF
        take(mesh.soft_iface_frame(NOW, ethernet(BROADCAST, client, tci, 0x0806, bytes(28))))

    # our clients: learnt, then committed (so that a later removal leaves them pending); some new after that
    mesh.tt.ttvn = draw(st.integers(0, 255))
    ours = draw(st.lists(st.tuples(st.sampled_from(CLIENTS), st.sampled_from(vid_keys)), max_size=4, unique=True))
    for client, vid in ours:
        from_host(client, vid)
    mesh.tt.commit(NOW)
    for client, vid in draw(st.lists(st.tuples(st.sampled_from(CLIENTS), st.sampled_from(vid_keys)), max_size=2)):
        from_host(client, vid)

    # originators, routes (or none) through a direct or another originator's neighbour
    nodes = [mesh.originators.get_or_create(orig, NOW)
             for orig in draw(st.lists(st.sampled_from(ORIGS), min_size=1, max_size=5, unique=True))]
    for node in nodes:
        node.last_ttvn = draw(st.integers(0, 252))
        via = draw(st.sampled_from([None, node, node, node, *nodes]))
        if via is None:
            continue
        neigh = mesh.originators.neigh_get_or_create(node, draw(st.sampled_from(mesh.ifaces)), via.orig, via, NOW)
        other = draw(st.sampled_from(nodes))
        alt = mesh.originators.neigh_get_or_create(node, draw(st.sampled_from(mesh.ifaces)), other.orig, other, NOW)
        for outif in [None, *mesh.active_ifaces()]:
            # On wired links every table picks the same router; on Wi-Fi, forwarding out of
            # the interface a frame came in on costs more (half duplex): another may win there.
            wifi_penalty = outif is not None and outif.wifi and outif is neigh.if_incoming
            mesh.update_route(node, outif, alt if wifi_penalty else neigh, NOW)

    # their clients in TT diffs (taking some of ours away), then some roaming away from them
    for node in nodes:
        some = st.tuples(st.sampled_from(CLIENTS + [SOFT]), st.sampled_from(vid_keys))
        announced = draw(st.lists(st.sampled_from(ours) | some if ours else some, max_size=3, unique=True))
        flags = draw(st.sampled_from([0, F.ROAM, F.ROAM, F.WIFI]))
        changes = [TtChange(flags=flags, addr=c, vid=v) for c, v in announced]
        tt_diff(mesh, node, changes)
        tt_diff(mesh, node, [TtChange(flags=F.DEL | F.ROAM, addr=c, vid=v) for c, v in announced if often(draw, 0.3)])
    for client, vid in draw(st.lists(st.tuples(st.sampled_from(CLIENTS), st.sampled_from(vid_keys)), max_size=2)):
        from_host(client, vid)  # a client of another originator roams to us
    for node in nodes:
        if often(draw, 0.15):  # the route is lost: what the originator announced goes with it
            for outif in [None, *mesh.active_ifaces()]:
                mesh.update_route(node, outif, None, NOW)
    if len(mesh.ifaces) > 1 and often(draw, 0.3):
        take(mesh.deactivate_interface(NOW, draw(st.sampled_from(mesh.ifaces)).name))
    take(mesh.set_vlans(NOW, vids))  # a no-op that returns what is waiting (the table's updates among it)
    world.set_ports()
    if often(draw, 0.3):  # rules set by hand (no feature publishes any yet)
        rules = draw(st.frozensets(st.sampled_from(RULES)))
        clients = draw(st.frozensets(st.tuples(st.sampled_from(CLIENTS), st.sampled_from(vid_keys)), max_size=2))
        world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(rules, often(draw, 0.5), clients)))
    return world


def tt_diff(mesh: Mesh, node, changes: list[TtChange]) -> None:
    """The originator's next OGM carries these TT changes (the core applies them, as they
    come with the next TT version)."""
    if changes:
        tt = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=node.last_ttvn + 1, vlans=[TtVlan(crc=0, vid=0)], changes=changes)
        mesh.ogm_tvlvs_received(NOW, node, [tt])


def payload(draw, ethertype: int) -> bytes:
    """An IPv4/IPv6 header with a UDP/TCP/ICMP protocol and ports (L4 rules read them),
    else random bytes; sometimes cut short."""
    ports = struct.pack("!HH", draw(st.sampled_from([67, 68, 5000])), draw(st.sampled_from([67, 68, 546, 53])))
    proto = draw(st.sampled_from([17, 6, 1, 58]))
    if ethertype == 0x0800:
        ihl = draw(st.sampled_from([5, 5, 6, 15, 2]))
        data = bytes([0x40 | ihl]) + bytes(8) + bytes([proto]) + bytes(10) + bytes(max(0, ihl - 5) * 4) + ports
    elif ethertype == 0x86DD:
        data = b"\x60" + bytes(5) + bytes([proto]) + bytes(33) + ports
    else:
        data = draw(st.binary(max_size=32))
    data += bytes(draw(st.integers(0, 30)))
    return data[:draw(st.integers(0, len(data)))] if often(draw, 0.1) else data


def inner(draw, toward: dict, sender: dict) -> bytes:
    """A frame from a random or a `sender` client to a random or a `toward` client."""
    macs = CLIENTS + [SOFT, STRANGER]
    dst = draw(st.sampled_from(macs + MULTICAST))
    src = draw(st.sampled_from(macs + [MULTICAST[1]]))
    tci = draw(st.sampled_from([None, None, None, 0, 5, 7, 9, 0x2005]))  # 0: priority tag; 0x2005: PCP 1, VID 5
    if toward and often(draw, 0.5):
        dst, vid = draw(st.sampled_from(sorted(toward)))
        tci = draw(st.sampled_from([None, 0] if vid == 0 else [vid & 0x0FFF, 0xE000 | vid & 0x0FFF]))
    if sender and often(draw, 0.5):
        src = draw(st.sampled_from(sorted(k[0] for k in sender)))
    ethertype = draw(st.sampled_from(ETHERTYPES))
    return ethernet(dst, src, tci, ethertype, payload(draw, ethertype))


def mesh_frame(draw, world: World):
    mesh = world.mesh
    iface = draw(st.sampled_from(mesh.active_ifaces()))
    ours = [i.mac for i in mesh.ifaces]
    outer_dst = draw(st.sampled_from([iface.mac] * 6 + ours + [STRANGER, BROADCAST]))
    outer_src = draw(st.sampled_from(ORIGS + [ORIGS[0], Mac("03:00:00:00:00:01")]))
    routed = sorted(world.table.origs)
    dest = draw(st.sampled_from([mesh.primary.mac] * 4 + ours + routed * 6 + ORIGS + [STRANGER]))
    node = mesh.originators.get(dest)
    base = mesh.tt.ttvn if dest in ours else node.last_ttvn if node else 0
    ttvn = (base + draw(st.sampled_from([0, 0, 0, 1, -1, 127, -128]))) & 0xFF
    toward = {**world.table.local_clients, **world.table.clients}
    frame = unicast(outer_dst, outer_src, dest, ttvn, inner(draw, toward, world.table.clients),
                    ttl=draw(st.sampled_from([0, 1, 2, 50, 50])))
    if often(draw, 0.05):
        frame = frame[:14] + bytes([draw(st.sampled_from([0x40, 0x42, 0x44])), 14]) + frame[16:]
    if often(draw, 0.05):
        frame = frame[:draw(st.integers(14, len(frame)))]
    return iface, frame


def host_frame(draw, world: World) -> bytes:
    frame = inner(draw, world.table.clients, world.table.local_clients)
    return frame[:draw(st.integers(1, len(frame)))] if often(draw, 0.05) else frame


def check_mesh(world: World, iface, frame: bytes, tail: bytes) -> object:
    decision = decide_mesh(frame, bytes(iface.mac), world.primary, world.table, world.wifi)
    l4, ports = world.table.slow_path.l4(TO_HOST), world.table.slow_path.port_protos(TO_HOST)
    other = mesh_key(frame, l4) + tail
    if mesh_key(other, l4) == mesh_key(frame, l4):  # the engine caches by the key: it must be all that counts
        assert decide_mesh(other, bytes(iface.mac), world.primary, world.table, world.wifi) == decision
    other = mesh_key(frame, l4, ports) + tail  # the narrower key, the port only where a rule reads it
    if mesh_key(other, l4, ports) == mesh_key(frame, l4, ports):
        assert decide_mesh(other, bytes(iface.mac), world.primary, world.table, world.wifi) == decision
    actions = world.take(world.mesh.receive(NOW, iface.name, frame))
    delivered = [a.frame for a in actions if isinstance(a, Deliver)]
    sent = [(a.iface, a.frame) for a in actions if isinstance(a, Transmit)]
    if decision == DELIVER or isinstance(decision, DeliverSeen):
        assert delivered == [frame[24:]] and sent == [], (frame.hex(), actions)
    elif isinstance(decision, Forward):
        out = world.mesh.iface(decision.iface).mac
        rewritten = bytes(decision.next_hop) + out + frame[12:16] + bytes([frame[16] - 1]) + frame[17:]
        assert sent == [(decision.iface, rewritten)] and delivered == [], (frame.hex(), decision, actions)
    else:
        assert decision == SLOW, decision
    return decision


def check_host(world: World, frame: bytes, tail: bytes) -> object:
    decision = decide_host(frame, world.table)
    l4, ports = world.table.slow_path.l4(FROM_HOST), world.table.slow_path.port_protos(FROM_HOST)
    other = host_key(frame, l4) + tail
    if host_key(other, l4) == host_key(frame, l4):
        assert decide_host(other, world.table) == decision
    other = host_key(frame, l4, ports) + tail
    if host_key(other, l4, ports) == host_key(frame, l4, ports):
        assert decide_host(other, world.table) == decision
    actions = world.take(world.mesh.soft_iface_frame(NOW, frame))
    sent = [(a.iface, a.frame) for a in actions if isinstance(a, Transmit)]
    if isinstance(decision, Encapsulate):
        out = world.mesh.iface(decision.iface).mac
        prefix = unicast_prefix(decision.next_hop, out, decision.orig, decision.ttvn)
        assert sent == [(decision.iface, prefix + frame)], (frame.hex(), decision, actions)
        assert world.mesh.tt.is_my_client(*decision.client)
    else:
        assert decision == SLOW, decision
    return decision


@given(st.data())
# No shrinking: it takes minutes over this many draws; the assertion shows the frame and the actions.
@settings(max_examples=150, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate))
def test_decisions_agree_with_the_core(data):
    world = build(data.draw)
    for _ in range(20):
        iface, frame = mesh_frame(data.draw, world)
        check_mesh(world, iface, frame, data.draw(st.binary(max_size=20)))
        check_host(world, host_frame(data.draw, world), data.draw(st.binary(max_size=20)))


def test_the_property_test_reaches_every_decision():
    """The random states and frames do make the decisions deliver, forward and
    encapsulate (not only SLOW, which would make the comparison empty)."""
    seen = set()

    @given(st.data())
    @settings(max_examples=60, deadline=None, database=None)
    def run(data):
        world = build(data.draw)
        for _ in range(20):
            iface, frame = mesh_frame(data.draw, world)
            decision = decide_mesh(frame, bytes(iface.mac), world.primary, world.table, world.wifi)
            seen.add(("mesh", "forward" if isinstance(decision, Forward) else decision))
            decision = decide_host(host_frame(data.draw, world), world.table)
            seen.add(("host", "encapsulate" if isinstance(decision, Encapsulate) else decision))

    run()
    assert seen == {("mesh", DELIVER), ("mesh", "forward"), ("mesh", SLOW), ("host", "encapsulate"), ("host", SLOW)}


# --------------------------------------------------------------------------- slow-path rules, set by hand


def small_mesh() -> World:
    """One interface; originator ORIGS[0] a direct neighbour with client CLIENTS[0]; our
    client CLIENTS[1]; ORIGS[1] reached through ORIGS[0]. BLA off: the tests set the slow
    path themselves (test_bla_sources for BLA's)."""
    mesh = Mesh(MeshConfig(bridge_loop_avoidance=False), soft_mac=SOFT, rng=random.Random(1), now=0.0)
    world = World(mesh, ForwardingTable(), None, False)
    world.take(mesh.add_interface(NOW, "e0", IFACE_MACS[0]))
    world.take(mesh.soft_iface_frame(NOW, ethernet(BROADCAST, CLIENTS[1], None, 0x0806, bytes(28))))
    first, second = (mesh.originators.get_or_create(o, NOW) for o in ORIGS[:2])
    for node in (first, second):
        neigh = mesh.originators.neigh_get_or_create(node, mesh.iface("e0"), first.orig, first, NOW)
        for outif in (None, mesh.iface("e0")):
            mesh.update_route(node, outif, neigh, NOW)
    tt_diff(mesh, first, [TtChange(flags=0, addr=CLIENTS[0], vid=0)])
    world.take(mesh.set_vlans(NOW, set()))
    world.set_ports()
    return world


def udp(dst: Mac, src: Mac, dport: int, tci: int | None = None, proto: int = 17) -> bytes:
    ip = bytes([0x45]) + bytes(8) + bytes([proto]) + bytes(10)
    return ethernet(dst, src, tci, 0x0800, ip + struct.pack("!HH", 5000, dport) + bytes(20))


def test_an_arp_rule_makes_arp_slow_in_both_directions():
    world = small_mesh()
    mac, ttvn = IFACE_MACS[0], world.mesh.tt.ttvn
    arp_in = unicast(mac, ORIGS[0], mac, ttvn, ethernet(CLIENTS[1], CLIENTS[0], None, 0x0806, bytes(28)))
    ip_in = unicast(mac, ORIGS[0], mac, ttvn, ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)))
    arp_fwd = unicast(mac, ORIGS[0], ORIGS[1], 0, ethernet(CLIENTS[2], CLIENTS[0], None, 0x0806, bytes(28)))
    arp_out = ethernet(CLIENTS[0], CLIENTS[1], None, 0x0806, bytes(28))
    tagged_arp_out = ethernet(CLIENTS[0], CLIENTS[1], 0, 0x0806, bytes(28))  # priority-tagged: VID 0
    ip_out = ethernet(CLIENTS[0], CLIENTS[1], None, 0x0800, bytes(28))

    def decisions():
        return ([decide_mesh(f, mac, world.primary, world.table, False) for f in (arp_in, ip_in, arp_fwd)],
                [decide_host(f, world.table) for f in (arp_out, tagged_arp_out, ip_out)])

    fast_out = Encapsulate("e0", ORIGS[0], ORIGS[0], world.mesh.originators.get(ORIGS[0]).last_ttvn,
                           (CLIENTS[1], 0))
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath()))  # no feature asks (DAT off)
    assert decisions() == ([DELIVER, DELIVER, Forward("e0", ORIGS[0])], [fast_out] * 3)
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=ARP_BOTH))  # as the core publishes it while DAT is on
    # forwarded frames are never the features' business
    assert decisions() == ([SLOW, DELIVER, Forward("e0", ORIGS[0])], [SLOW, SLOW, fast_out])
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(rules=frozenset({SlowRule(FROM_HOST, 0x0806)}))))
    assert decisions() == ([DELIVER, DELIVER, Forward("e0", ORIGS[0])], [SLOW, SLOW, fast_out])
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath()))
    assert decisions() == ([DELIVER, DELIVER, Forward("e0", ORIGS[0])], [fast_out] * 3)


def test_an_l4_rule_claims_only_its_port_and_keys_the_cache_by_it():
    world = small_mesh()
    dhcp = SlowPath(rules=frozenset({SlowRule(FROM_HOST, 0x0800, 17, 67)}))
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=dhcp))
    to_67, to_68 = udp(CLIENTS[0], CLIENTS[1], 67), udp(CLIENTS[0], CLIENTS[1], 68)
    frames = {"udp 67": to_67, "udp 68": to_68, "tcp 67": udp(CLIENTS[0], CLIENTS[1], 67, proto=6),
              "tagged udp 67": udp(CLIENTS[0], CLIENTS[1], 67, tci=0), "udp 67, header cut": to_67[:30],
              "udp 67, port cut": to_67[:36]}
    slow = {name for name, frame in frames.items() if decide_host(frame, world.table) is SLOW}
    assert slow == {"udp 67", "tagged udp 67", "udp 67, header cut", "udp 67, port cut"}
    assert world.table.slow_path.l4(FROM_HOST) and not world.table.slow_path.l4(TO_HOST)
    assert host_key(to_67, True) != host_key(to_68, True)
    assert host_key(to_67, False) == host_key(to_68, False) == to_67[:14]
    # no rule reads TCP's port (nor ICMP's checksum there): the key leaves it out
    ports = world.table.slow_path.port_protos(FROM_HOST)
    assert ports == {17}
    tcp_67, tcp_68 = udp(CLIENTS[0], CLIENTS[1], 67, proto=6), udp(CLIENTS[0], CLIENTS[1], 68, proto=6)
    assert host_key(tcp_67, True, ports) == host_key(tcp_68, True, ports) == to_67[:14] + b"\x06"
    assert host_key(to_67, True, ports) == host_key(to_67, True) != host_key(to_68, True, ports)
    ihl6 = bytearray(to_67)  # IP options: the ports sit 4 bytes further
    ihl6[14] = 0x46
    ihl6[34:34] = bytes(4)
    assert decide_host(bytes(ihl6), world.table) is SLOW


def test_multicast_and_client_rules():
    world = small_mesh()
    mac, ttvn = IFACE_MACS[0], world.mesh.tt.ttvn
    mcast_in = unicast(mac, ORIGS[0], mac, ttvn, ethernet(MULTICAST[1], CLIENTS[0], None, 0x0800, bytes(28)))
    from_claimed = unicast(mac, ORIGS[0], mac, ttvn, ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)))
    to_claimed = ethernet(CLIENTS[0], CLIENTS[1], None, 0x0800, bytes(28))
    assert decide_mesh(mcast_in, mac, world.primary, world.table, False) is DELIVER
    assert decide_mesh(from_claimed, mac, world.primary, world.table, False) is DELIVER
    assert isinstance(decide_host(to_claimed, world.table), Encapsulate)
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(multicast=True)))
    assert decide_mesh(mcast_in, mac, world.primary, world.table, False) is SLOW
    assert decide_mesh(from_claimed, mac, world.primary, world.table, False) is DELIVER
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(clients=frozenset({(CLIENTS[0], 0)}))))
    assert decide_mesh(mcast_in, mac, world.primary, world.table, False) is SLOW  # from the claimed client
    assert decide_mesh(from_claimed, mac, world.primary, world.table, False) is SLOW
    assert decide_host(to_claimed, world.table) is SLOW


def test_bla_sources():
    """With BLA on, frames to the host from a source we have not claimed go to the core (it
    claims it, or takes it over); from our claims they are delivered and reported seen;
    frames from the host sent by a client we claimed go to the core (it may have roamed)."""
    world = small_mesh()
    mac, ttvn = IFACE_MACS[0], world.mesh.tt.ttvn
    from_theirs = unicast(mac, ORIGS[0], mac, ttvn, ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)))
    claimed = frozenset({(CLIENTS[0], 0)})
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(to_host_sources=frozenset())))
    assert decide_mesh(from_theirs, mac, world.primary, world.table, False) is SLOW
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(to_host_sources=claimed,
                                                                      from_host_sources=claimed)))
    seen = decide_mesh(from_theirs, mac, world.primary, world.table, False)
    assert isinstance(seen, DeliverSeen) and seen.client == (CLIENTS[0], 0)
    assert decide_host(ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)), world.table) is SLOW
    # a unicast for us whose last hop is another gateway of our LAN: the core drops it
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(to_host_sources=claimed,
                                                                      from_last_hops=frozenset({ORIGS[0]}))))
    assert decide_mesh(from_theirs, mac, world.primary, world.table, False) is SLOW
    # and the core, with BLA on, publishes exactly its own claims so, and the other gateways
    mesh = Mesh(MeshConfig(), soft_mac=SOFT, rng=random.Random(1), now=0.0)
    mesh.add_interface(NOW, "e0", IFACE_MACS[0])
    mesh.bla._handle_claim(NOW, mesh.primary.mac, CLIENTS[0], 0)
    mesh.bla._handle_claim(NOW, ORIGS[1], CLIENTS[2], 0)
    published = mesh.publisher.slow_path()
    assert published.to_host_sources == published.from_host_sources == claimed and published.multicast
    assert published.from_last_hops == {ORIGS[1]}


def test_nothing_is_delivered_to_our_address_while_its_interface_is_down():
    """batadv_is_my_mac knows active interfaces only: with the primary down, a frame for
    our originator address is not ours (the core drops it); the engine must not deliver it."""
    world = small_mesh()
    world.take(world.mesh.add_interface(NOW, "e1", IFACE_MACS[1]))
    world.take(world.mesh.deactivate_interface(NOW, "e0"))
    world.set_ports()
    frame = unicast(IFACE_MACS[1], ORIGS[0], IFACE_MACS[0], world.mesh.tt.ttvn,
                    ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)))
    assert world.primary is None
    assert check_mesh(world, world.mesh.iface("e1"), frame, b"") is SLOW
    assert not any(isinstance(a, Deliver) for a in world.mesh.receive(NOW, "e1", frame))


def test_a_frame_for_a_client_that_roamed_away_goes_to_its_new_owner():
    """Our client CLIENTS[1] reappears behind ORIGS[0] (announced there with ROAM): a frame
    for it addressed to us is rerouted by the core to ORIGS[0], never delivered here."""
    world = small_mesh()
    mesh = world.mesh
    mesh.tt.commit(NOW)
    tt_diff(mesh, mesh.originators.get(ORIGS[0]), [TtChange(flags=F.ROAM, addr=CLIENTS[1], vid=0)])
    world.take(mesh.set_vlans(NOW, set()))
    assert world.table.local_clients[(CLIENTS[1], 0)] is False
    frame = unicast(IFACE_MACS[0], ORIGS[0], IFACE_MACS[0], mesh.tt.ttvn,
                    ethernet(CLIENTS[1], CLIENTS[0], None, 0x0800, bytes(28)))
    assert check_mesh(world, mesh.iface("e0"), frame, b"") is SLOW
    sent = [a for a in mesh.receive(NOW, "e0", frame) if isinstance(a, Transmit)]
    assert len(sent) == 1 and sent[0].frame[18:24] == ORIGS[0]  # rerouted to the new owner


_IP4_HEADERS = st.binary(min_size=12, max_size=12).map(lambda macs: macs + b"\x08\x00\x45")


@settings(max_examples=300)
@given(_IP4_HEADERS, st.binary(max_size=40))
def test_the_ip4_host_key_carries_what_host_key_reads(head, rest):
    """The engine's one-unpack key for untagged IPv4 without options holds exactly the
    bytes host_key(frame, True) returns: equal fast keys, equal decisions."""
    frame = head + rest
    key = host_key_ip4(frame)
    if len(frame) < 38:
        assert key is None
        return
    eth, proto, port = key
    assert eth + bytes((proto,)) + port == host_key(frame, True)


@settings(max_examples=300)
@given(_IP4_HEADERS, st.binary(min_size=24, max_size=40))
def test_the_narrowed_ip4_keys_carry_what_the_narrow_keys_read(head, rest):
    """Without the port (the engine's key, narrowed on a miss, for a protocol whose port no
    rule reads): the fast keys' first two fields hold what host_key / mesh_key return with
    `ports`."""
    frame = head + rest
    ports = frozenset({17})
    eth, proto = host_key_ip4(frame)[:2]
    if proto not in ports:
        assert eth + bytes((proto,)) == host_key(frame, True, ports)
    outer = unicast(IFACE_MACS[0], ORIGS[0], ORIGS[1], 1, frame)
    head, proto = mesh_key_ip4(outer)[:2]
    if proto not in ports:
        assert head + outer[38:42] + bytes((proto,)) == mesh_key(outer, True, ports)


@settings(max_examples=300)
@given(st.binary(min_size=36, max_size=36), st.binary(max_size=40), st.binary(min_size=3, max_size=3))
def test_the_ip4_mesh_key_carries_what_decide_mesh_reads(outer, rest, ip_head):
    """mesh_key_ip4 leaves out the IP header's bytes 1-3 (TOS, total length) that mesh_key
    keeps: decide_mesh reads none of them; the rest is mesh_key's."""
    world = small_mesh()
    world.table.apply(ForwardingUpdate({}, {}, {}, slow_path=SlowPath(rules=frozenset(
        {SlowRule(TO_HOST, 0x0800, 17, 68)}))))
    frame = outer + b"\x08\x00\x45" + rest
    key = mesh_key_ip4(frame)
    if len(frame) < 62:
        assert key is None
        return
    head, proto, port = key
    assert head + frame[38:42] + bytes((proto,)) + port == mesh_key(frame, True)
    other = frame[:39] + ip_head + frame[42:]
    assert mesh_key_ip4(other) == key
    mac = bytes(IFACE_MACS[0])
    assert decide_mesh(other, mac, world.primary, world.table, False) == decide_mesh(frame, mac, world.primary,
                                                                                      world.table, False)


def test_frames_the_ip4_keys_do_not_fit_get_none():
    assert host_key_ip4(udp(CLIENTS[0], CLIENTS[1], 68, tci=0)) is None  # tagged
    options = bytearray(udp(CLIENTS[0], CLIENTS[1], 68))
    options[14] = 0x46
    assert host_key_ip4(bytes(options)) is None
    assert host_key_ip4(udp(CLIENTS[0], CLIENTS[1], 68)) == (udp(CLIENTS[0], CLIENTS[1], 68)[:14], 17, b"\x00\x44")
