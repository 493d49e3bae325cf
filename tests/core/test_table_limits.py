"""Table limits that never lock the real mesh out (issue 12, "Table lock-out" and "CPU
amplification"), in the simulator and against single cores.

A flood of spoofed originators (OGMs or ELPs that never echo ours) fills the originator
and hard-interface neighbour tables; a real node that joins afterwards, while the flood goes
on, still gets in and gets a route: the weakest entries (no route, never bidirectional) make
room, least recently heard first. Temporary TT entries (learnt from broadcasts) have their
own budget and never cost an announced client its place. Limits are read when they are used,
so a reload that changes them takes effect. The work per hostile frame stays bounded: these
tests count it (entries visited, CRCs computed), the timings are in bench/limits.py."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from batmand.core import translation_table
from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.sim.network import Network
from batmand.wire import (BROADCAST, ELP_TVLV_PADDING, Bcast, Elp, InnerFrame, IvOgm, Mac, TtChange, TtTvlv, TtVlan, Unicast,
                          Unicast4Addr, UnicastFrag, build_frame)
from batmand.wire.constants import TtClientFlags as F, TtDataFlags
from batmand.wire.tt_crc import tt_entry_crc

ATTACKER = Mac("02:66:66:66:66:66")
LIMIT = MeshConfig().max_originators  # the defaults: 5,000 originators, 1,000 hard-interface neighbours
HARDIF_LIMIT = MeshConfig().max_hardif_neighbours


def spoofed(i: int) -> Mac:
    return Mac(b"\x02\x5f" + i.to_bytes(4, "big"))


def spoofed_ogm(i: int, *, direct: bool = True, seqno: int = 1000, tvlvs=()) -> bytes:
    """An OGM of fake originator i, heard directly (it claims to be our neighbour) or relayed
    by the attacker. It never echoes our own OGMs."""
    orig = spoofed(i)
    sender = orig if direct else ATTACKER
    ogm = IvOgm(ttl=50, seqno=seqno, orig=orig, prev_sender=sender, tq=255, tvlvs=list(tvlvs))
    return build_frame(BROADCAST, sender, ogm)


def spoofed_elp(i: int) -> bytes:
    orig = spoofed(i)
    return build_frame(BROADCAST, orig, Elp(orig=orig, seqno=1, elp_interval=500), padding=ELP_TVLV_PADDING)


def inject(net: Network, name: str, ifname: str, frames) -> None:
    """Frames arriving on a node's interface from outside the simulated links (an attacker)."""
    node = net.nodes[name]
    for frame in frames:
        net._handle(node, node.mesh.receive(net.now, ifname, frame))


def two_nodes_apart(seed: int, config: MeshConfig | None = None):
    """A and B with a link that is still down."""
    net = Network(seed=seed, config=config or MeshConfig())
    net.add_node("A")
    net.add_node("B")
    link = net.link("A", "B")
    link.up = False
    net.run_for(3.0)
    return net, link


def join_under_flood(net: Network, link, make, first: int, per_second: int = 500, seconds: float = 6.0) -> int:
    """Bring the link up while the flood goes on with new spoofed originators; returns the
    next unused spoofed index."""
    link.up = True
    step = 0.1
    for _ in range(int(seconds / step)):
        net.run_for(step)
        count = int(per_second * step)
        inject(net, "A", "if0", (make(i) for i in range(first, first + count)))
        first += count
    return first


@pytest.mark.parametrize("algo,make", [("BATMAN_IV", spoofed_ogm), ("BATMAN_V", spoofed_elp)])
def test_real_neighbour_joins_a_table_full_of_spoofed_originators(algo, make):
    net, link = two_nodes_apart(seed=41, config=MeshConfig(routing_algo=algo))
    A = net.nodes["A"].mesh
    iface = A.iface("if0")
    inject(net, "A", "if0", (make(i) for i in range(LIMIT + 1000)))
    assert len(A.originators.nodes) == LIMIT
    assert len(iface.neighbours) == HARDIF_LIMIT

    join_under_flood(net, link, make, LIMIT + 1000)
    B = net.nodes["B"]
    assert net.next_hop("A", "B") == "B" and net.next_hop("B", "A") == "A"
    assert B.macs["if0"] in iface.neighbours
    assert net.nodes["A"].fwd.origs.get(B.orig) is not None  # published to the data path too
    assert len(A.originators.nodes) <= LIMIT and len(iface.neighbours) <= HARDIF_LIMIT
    assert A.counters["drop_originator_evicted"] > 0 and A.counters["drop_hardif_neighbour_evicted"] > 0

    # with a route (and, in IV, echoes) B is not pushed out by another full table of spoofs
    inject(net, "A", "if0", (make(i) for i in range(100_000, 100_000 + LIMIT + 1000)))
    assert A.originators.get(B.orig) is not None and B.macs["if0"] in iface.neighbours
    net.run_for(2.0)
    assert net.next_hop("A", "B") == "B"


def test_spoofed_originators_cost_bounded_work(monkeypatch):
    """Each spoofed originator beyond the limit evicts one entry; the candidates looked at
    stay a small constant per frame even when most of the table is protected."""
    net, link = two_nodes_apart(seed=42)
    A = net.nodes["A"].mesh
    checks = []
    original = getattr(A.algo, "orig_has_evidence", lambda orig_node: False)

    def counted(orig_node):
        checks.append(orig_node.orig)
        return original(orig_node)

    monkeypatch.setattr(A.algo, "orig_has_evidence", counted, raising=False)
    link.up = True
    net.run_for(10.0)
    assert net.next_hop("A", "B") == "B"
    inject(net, "A", "if0", (spoofed_ogm(i) for i in range(LIMIT)))
    del checks[:]
    frames = 2000
    inject(net, "A", "if0", (spoofed_ogm(i) for i in range(LIMIT, LIMIT + frames)))
    assert A.counters["drop_originator_evicted"] >= frames
    assert len(checks) <= 3 * frames


def test_table_full_of_real_evidence_refuses_and_counts():
    """When every entry has a route, a newcomer is refused (counted), nothing is evicted."""
    net = Network(seed=43, config=MeshConfig(max_originators=3))
    for name in "ABCDEFG":
        net.add_node(name)
    for a, b in zip("ABCDEFG", "BCDEFG"):
        net.link(a, b)
    net.run_for(20.0)
    D = net.nodes["D"].mesh
    assert len(D.originators.nodes) <= 3
    assert D.counters["drop_originator_table_full"] > 0
    routed = [n for n in D.originators.nodes.values() if n.router() is not None]
    assert routed  # what got in first keeps its route
    before = {n.orig for n in routed}
    net.run_for(10.0)
    assert before <= set(D.originators.nodes)


# --- temporary TT entries ---------------------------------------------------------------------


def client(i: int) -> Mac:
    return Mac(b"\x06\xbc" + i.to_bytes(4, "big"))


def spoofed_bcasts(origs, seqnos: dict, count: int, start: int = 0):
    """Broadcasts claimed by `origs` (round robin, next seqno each), each from a new client."""
    for k in range(start, start + count):
        orig = origs[k % len(origs)]
        seqnos[orig] = seqnos.get(orig, 5000) + 1
        inner = InnerFrame(h_dest=BROADCAST, h_source=client(k), h_proto=0x88B5, payload=bytes(30))
        yield build_frame(BROADCAST, ATTACKER, Bcast(ttl=2, seqno=seqnos[orig], orig=orig, inner=inner))


def announce(net: Network, name: str, mac: Mac) -> None:
    net.host_send(name, bytes(BROADCAST) + bytes(mac) + b"\x08\x06" + bytes(28))


def soft(net: Network, name: str) -> Mac:
    return net.nodes[name].mesh.soft_mac


def test_temporary_entries_never_lock_out_announced_clients():
    """100,000 broadcasts from new clients, claimed by 60 originators B knows (spoofed ones,
    learnt from relayed OGMs): without a budget of their own they fill the 100,000-entry
    global table. A's real client, announced afterwards, must still get in."""
    net = Network(seed=44)
    net.add_node("A")
    net.add_node("B")
    link = net.link("A", "B")
    net.run_for(10.0)
    B = net.nodes["B"].mesh
    fakes = [spoofed(i) for i in range(60)]
    inject(net, "B", "if0", (spoofed_ogm(i, direct=False) for i in range(60)))
    assert all(B.originators.get(f) is not None for f in fakes)
    link.up = False  # B's rebroadcasts of the flood go nowhere (they would only cost A time)
    inject(net, "B", "if0", spoofed_bcasts(fakes, {}, 100_000))
    link.up = True

    real = Mac("02:cc:00:00:01:01")
    announce(net, "A", real)
    net.run_for(5.0)
    entry = B.tt.global_.get((real, 0))
    assert entry is not None and not entry.flags & F.TEMP
    assert set(entry.origs) == {net.nodes["A"].orig}
    assert net.nodes["B"].fwd.lookup(real, 0)[0] == net.nodes["A"].orig
    assert B.counters["drop_tt_global_table_full"] == 0
    # the temporary entries kept within their own budget, the oldest ones made room
    budget = B.config.max_temporary_tt_entries
    assert sum(1 for e in B.tt.global_.values() if e.flags & F.TEMP) <= budget
    # (A's own broadcast of the client, before its announcement, made one more temporary)
    assert B.counters["drop_tt_temporary_evicted"] in (100_000 - budget, 100_000 - budget + 1)
    assert (client(99_999), 0) in B.tt.global_ and (client(0), 0) not in B.tt.global_


def test_temporary_entries_do_not_use_up_an_originators_budget():
    """3,000 spoofed broadcasts claimed by A itself: A's next announced client is taken from
    the OGM diff, without a TT request (the per-originator limit counts announced clients)."""
    net = Network(seed=45)
    net.add_node("A")
    net.add_node("B")
    net.link("A", "B")
    net.run_for(10.0)
    A, B = net.nodes["A"], net.nodes["B"].mesh
    requests = B.counters["tt_request_tx"]
    inject(net, "B", "if0", spoofed_bcasts([A.orig], {}, 3_000))
    real = Mac("02:cc:00:00:01:02")
    announce(net, "A", real)
    net.run_for(5.0)
    entry = B.tt.global_.get((real, 0))
    assert entry is not None and not entry.flags & F.TEMP
    assert B.counters["drop_tt_global_originator_full"] == 0
    assert B.counters["tt_request_tx"] == requests
    assert len(B.tt.by_orig[A.orig]) > B.config.max_global_tt_entries_per_originator  # the temporary ones


def test_clients_of_spoofed_originators_never_lock_out_a_routed_originators():
    """Spoofed originators (no route, never bidirectional) announce clients in their OGM
    diffs until the global table is full; a client of A (which B has a route to) still gets
    in, and what goes is what an unrouted originator announced."""
    net = Network(seed=47, config=MeshConfig(max_global_tt_entries=2_000))
    net.add_node("A")
    net.add_node("B")
    net.link("A", "B")
    net.run_for(10.0)
    B = net.nodes["B"].mesh

    def announcing(i: int) -> bytes:
        changes = [TtChange(flags=0, addr=client(1000 * i + k), vid=0) for k in range(20)]
        return spoofed_ogm(i, tvlvs=[TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=1, vlans=[TtVlan(crc=0, vid=0)],
                                            changes=changes)])

    inject(net, "B", "if0", (announcing(i) for i in range(150)))
    assert sum(1 for e in B.tt.global_.values() if not e.flags & F.TEMP) == 2_000
    assert B.counters["drop_tt_global_table_full"] > 0

    real = Mac("02:cc:00:00:01:03")
    announce(net, "A", real)
    net.run_for(5.0)
    entry = B.tt.global_.get((real, 0))
    assert entry is not None and not entry.flags & F.TEMP and set(entry.origs) == {net.nodes["A"].orig}
    assert B.counters["drop_tt_global_evicted"] > 0
    assert sum(1 for e in B.tt.global_.values() if not e.flags & F.TEMP) <= 2_000
    assert (soft(net, "A"), 0) in B.tt.global_  # A's own MAC stayed


# --- limits read when used (a reload that changes them) -------------------------------------


def _mesh(**config) -> Mesh:
    mesh = Mesh(MeshConfig(**config), soft_mac=Mac("02:00:00:00:00:aa"))
    mesh.add_interface(0.0, "if0", Mac("02:00:00:00:00:01"))
    return mesh


def _receive(mesh: Mesh, frames, now: float = 1.0) -> None:
    for frame in frames:
        mesh.receive(now, "if0", frame)


def test_changed_limits_take_effect():
    mesh = _mesh()
    _receive(mesh, (spoofed_ogm(i) for i in range(300)))
    assert len(mesh.originators.nodes) == 300 and len(mesh.iface("if0").neighbours) == 300
    # what SIGHUP does: the running config object takes the new values
    mesh.config.__dict__.update(MeshConfig(max_originators=100, max_hardif_neighbours=50).__dict__)
    _receive(mesh, (spoofed_ogm(i) for i in range(300, 310)))
    assert len(mesh.originators.nodes) <= 100
    assert len(mesh.iface("if0").neighbours) <= 50
    mesh.config.max_originators = 1000
    _receive(mesh, (spoofed_ogm(i) for i in range(310, 800)))
    assert len(mesh.originators.nodes) > 100


def test_changed_neighbour_limit_takes_effect():
    """B.A.T.M.A.N. V: ELPs from many MACs that all claim one originator."""
    mesh = _mesh(routing_algo="BATMAN_V")
    orig = spoofed(1)

    def elp(k):
        return build_frame(BROADCAST, spoofed(1000 + k), Elp(orig=orig, seqno=1), padding=ELP_TVLV_PADDING)

    _receive(mesh, (elp(k) for k in range(10)))
    assert len(mesh.originators.get(orig).neighbours) == 10
    mesh.config.max_neighbours_per_originator = 4
    mesh.config.max_originators = 5000
    _receive(mesh, (elp(k) for k in range(10, 20)))
    assert len(mesh.originators.get(orig).neighbours) == 10  # no new ones beyond the new limit
    assert mesh.counters["drop_neighbour_table_full"] == 10


def _frag(orig: Mac, seqno: int, no: int = 0, size: int = 100) -> UnicastFrag:
    return UnicastFrag(no=no, dest=Mac("02:00:00:00:00:01"), orig=orig, seqno=seqno, total_size=3001,
                       data=bytes(size))


def test_changed_fragment_limits_take_effect():
    mesh = _mesh()
    reassembly = mesh.reassembly
    for i in range(100):
        reassembly.add(1.0, _frag(spoofed(i), 0, size=1000))
    assert reassembly.bytes == 100_000
    mesh.config.max_fragment_bytes = 64 * 1024
    reassembly.add(1.0, _frag(spoofed(100), 0, size=1000))
    assert reassembly.bytes <= 64 * 1024
    mesh.config.frag_timeout_ms = 1_000
    reassembly.purge(2.5)
    assert not reassembly.chains


# --- bounded work per hostile frame ---------------------------------------------------------


class VisitCounting(OrderedDict):
    """A mapping that counts how many keys iterating over it visits."""

    visits = 0

    def __iter__(self):
        for key in super().__iter__():
            self.visits += 1
            yield key


def test_fragment_eviction_visits_a_constant_number_of_chains():
    mesh = _mesh(max_fragment_bytes=2000 * 100)
    counters, r = mesh.counters, mesh.reassembly
    r.chains = VisitCounting()
    for i in range(2000):
        r.add(1.0, _frag(spoofed(i), 0))
    assert counters["drop_fragment_buffer_full"] == 0
    r.chains.visits = 0
    for i in range(2000, 2100):
        r.add(2.0, _frag(spoofed(i), 0))
    assert counters["drop_fragment_buffer_full"] == 100
    assert r.chains.visits <= 100 * 2
    r.chains.visits = 0
    r.forget(spoofed(1500))
    assert r.chains.visits <= 8 and r.bytes == 1999 * 100


def _orig_with_entries(n: int):
    """A core that knows originator O with n announced clients (from a full-table response)."""
    mesh = _mesh()
    orig = spoofed(7)
    mesh.receive(1.0, "if0", spoofed_ogm(7))
    node = mesh.originators.get(orig)
    changes = [TtChange(flags=0, addr=client(k * 7919 + 3), vid=0) for k in range(n)]
    crc = 0
    for change in changes:
        crc ^= tt_entry_crc(change.addr, 0, 0)
    mesh.tt.requests[orig] = 1.0
    mesh.tt._handle_response(1.0, orig, TtTvlv(flags=TtDataFlags.RESPONSE | TtDataFlags.FULL_TABLE, ttvn=5,
                                               vlans=[TtVlan(crc=crc, vid=0)], changes=changes))
    assert node.last_ttvn == 5 and node.tt_crcs == {0: crc}
    return mesh, node, crc


def test_tt_diff_costs_its_changes_not_the_table(monkeypatch):
    mesh, node, crc = _orig_with_entries(1999)  # the next one fills the originator's budget
    calls = []
    monkeypatch.setattr(translation_table, "tt_entry_crc", lambda *a: calls.append(a) or tt_entry_crc(*a))
    new = client(5000)
    crc ^= tt_entry_crc(new, 0, 0)
    ogm = spoofed_ogm(7, seqno=1001, tvlvs=[TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=6, vlans=[TtVlan(crc=crc, vid=0)],
                                       changes=[TtChange(flags=0, addr=new, vid=0)])])
    mesh.receive(2.0, "if0", ogm)
    assert node.last_ttvn == 6 and node.tt_crcs == {0: crc}
    assert len(calls) <= 2
    # the same OGM again (a duplicate seqno): the kernel hands its TVLVs to TT all the same;
    # it only compares CRCs (no request: they match)
    del calls[:]
    requests = mesh.counters["tt_request_tx"]
    mesh.receive(2.1, "if0", ogm)
    assert not calls and mesh.counters["tt_request_tx"] == requests


def _reference_crcs(tt, orig: Mac) -> dict:
    """The per-VLAN CRC of `orig`'s entries, computed from scratch (ROAM/TEMP left out, a
    VLAN present as soon as any entry of it is)."""
    crcs: dict = {}
    for (addr, vid), entry in tt.global_.items():
        oe = entry.origs.get(orig)
        if oe is None:
            continue
        crcs.setdefault(vid, 0)
        if not entry.flags & (F.ROAM | F.TEMP):
            crcs[vid] ^= tt_entry_crc(addr, vid, oe.flags)
    return crcs


@pytest.mark.parametrize("limit", [None, 15])
def test_incremental_crc_equals_a_full_recomputation(limit):
    """Random adds, deletes, roams, temporary entries, timeouts and (with a tight limit, where
    the first originator counts as routed) evictions: the kept CRCs equal a recomputation."""
    import random

    rng = random.Random(5)
    mesh = _mesh(**({"max_global_tt_entries": limit} if limit else {}))
    origs = [spoofed(i) for i in range(4)]
    _receive(mesh, (spoofed_ogm(i) for i in range(4)))
    nodes = [mesh.originators.get(o) for o in origs]
    if limit:
        mesh.originators.evidence = lambda node: node.orig == origs[0]
    tt = mesh.tt
    macs = [client(k) for k in range(40)]
    for step in range(3000):
        node = rng.choice(nodes)
        mac, vid = rng.choice(macs), rng.choice((0, 0x8001))
        op = rng.random()
        if op < 0.4:
            tt.global_add(2.0, node.orig, mac, vid, rng.choice((0, F.WIFI, F.ISOLA)), 1)
        elif op < 0.55:
            tt.add_temporary(2.0, node, mac, vid)
        elif op < 0.65:
            tt.global_add(2.0, node.orig, mac, vid, F.ROAM, 1)
        elif op < 0.85:
            tt.global_del(2.0, node.orig, mac, vid, roaming=rng.random() < 0.3)
        elif op < 0.9:
            tt.local_add(2.0, mac, 0)  # the client shows up here: roams away from the others
        elif op < 0.95:
            tt.global_del_orig(node)
        else:
            tt.purge(2.0 + 1000.0)  # ROAM and TEMP entries time out
        for other in nodes:
            tt.update_orig_crc(other)
            assert other.tt_crcs == _reference_crcs(tt, other.orig), step
        for key in {k for keys in tt.by_orig.values() for k in keys}:
            assert key in tt.global_, step  # nothing refers to a freed entry
        temporary = [key for key, entry in tt.global_.items() if entry.flags & F.TEMP]
        assert sorted(tt.temporary) == sorted(temporary), step
        for other in nodes:
            expected = sum(1 for key in temporary if other.orig in tt.global_[key].origs)
            assert tt.orig_temporary.get(other.orig, 0) == expected, step
        if limit:
            assert tt._announced() <= limit, step
    if limit:
        assert mesh.counters["drop_tt_global_evicted"] > 0 and mesh.counters["drop_tt_global_table_full"] > 0


# --- batman-in-batman ----------------------------------------------------------------------


def _inner(h_proto: int, vlan: bool, src: Mac = Mac("02:cc:00:00:09:09")) -> InnerFrame:
    return InnerFrame(h_dest=Mac("02:cc:00:00:09:01"), h_source=src, h_proto=h_proto, payload=bytes(40),
                      vlan_tci=5 if vlan else None)


@pytest.mark.parametrize("vlan", [False, True])
def test_batman_in_batman_is_not_delivered(vlan):
    """batadv_interface_rx: an inner frame of ethertype 0x4305 (also behind one 802.1Q tag)
    is dropped, not counted as received, and teaches the TT nothing; a broadcast carrying one
    is still flooded on (the kernel rebroadcasts before it looks inside)."""
    net = Network(seed=46)
    for name in "ABC":
        net.add_node(name)
    net.link("A", "B")
    net.link("B", "C")
    net.run_for(10.0)
    A, B = net.nodes["A"], net.nodes["B"]
    mesh = B.mesh
    a_mac, b_mac = A.macs["if0"], B.macs["if0"]
    rx = mesh.counters["rx"]
    unicast = Unicast(ttvn=mesh.tt.ttvn, dest=B.orig, inner=_inner(0x4305, vlan))
    four = Unicast4Addr(ttvn=mesh.tt.ttvn, dest=B.orig, src=A.orig, subtype=1, inner=_inner(0x4305, vlan))
    bcast = Bcast(seqno=900, orig=A.orig, inner=_inner(0x4305, vlan))
    inject(net, "B", "if0", [build_frame(b_mac, a_mac, unicast), build_frame(b_mac, a_mac, four),
                             build_frame(BROADCAST, a_mac, bcast)])
    assert not B.delivered
    assert mesh.counters["drop_batman_in_batman"] == 3 and mesh.counters["rx"] == rx
    assert (Mac("02:cc:00:00:09:09"), 0x8005 if vlan else 0) not in mesh.tt.global_
    net.run_for(0.1)
    assert [f for _, f in net.nodes["C"].delivered] == []  # C drops it too, after B flooded it
    assert net.nodes["C"].mesh.counters["drop_batman_in_batman"] == 1
    # an ordinary frame the same way is delivered
    inject(net, "B", "if0", [build_frame(b_mac, a_mac, Unicast(ttvn=mesh.tt.ttvn, dest=B.orig,
                                                              inner=_inner(0x0800, vlan)))])
    assert len(B.delivered) == 1 and mesh.counters["rx"] == rx + 1
