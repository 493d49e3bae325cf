"""B.A.T.M.A.N. IV routing in the deterministic simulator, checked against the kernel's
numbers (research notes batman-adv-v15.md §4 and §6).

The kernel formulas used throughout (worked numbers are written out in each test):

* calc_tq (§6.4), for an OGM from direct neighbour N, with `echo` = how many of my last 64
  own OGMs N echoed back, `rq` = how many of N's last 64 own OGMs I received:
      tq_own  = 255 * min(echo, rq) // rq          (0 if either count is 0)
      tq_asym = 255 - 255 * (64 - rq)**3 // 64**3
      tq      = tq_in * tq_own * tq_asym * (255 - iface_hop_penalty) // 255**3
  With full windows (echo = rq = 64) it changes nothing: tq_own = tq_asym = 255.
* forwarding (§6.6) applies the hop penalty 30: tq = tq * 225 // 255, once per forward.
  So a lossless path of h hops gives 255, 225, 198, 174, ... (h = 1, 2, 3, 4).
* the ring (§6.5): each neighbour keeps the last 5 TQs it delivered; tq_avg is the mean of
  the non-zero ones. A new-seqno OGM through another neighbour pushes a 0.

One kernel effect matters for exact numbers: the echo bookkeeping (§6.2, checklist item 2)
counts the own OGM sent last, whose echo comes back only after the neighbour's forward delay
(0..10 ms jitter, plus 100 ms hold-back when aggregation is on). An OGM from that neighbour
processed in that gap sees echo = 63, and tq_own = 255 * 63 // 64 = 251 for that one OGM
(test_echo_in_flight_costs_one_slot shows it). With the default 20 ms jitter the nodes'
OGM phases random-walk, so under the defaults such OGMs happen now and then on every link.
Tests that assert the lossless numbers to the unit therefore turn aggregation off, cut the
jitter to 2 ms and boot the interfaces at staggered times, so that no OGM is ever processed
while an echo is in flight. Routing decisions are checked with the defaults.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from batmand.core.bat_iv import receive_window
from batmand.core.config import MeshConfig
from batmand.sim.network import Network
from batmand.wire import IvOgm, OgmFlags, decode_frame

TQ_MAX = 255
HOP_PENALTY = 30
WINDOW = 64
RING = 5

# lossless path TQ by hop count: 255, 255*225//255 = 225, 225*225//255 = 198, 198*225//255 = 174
LOSSLESS = {1: 255, 2: 225, 3: 198, 4: 174}

# no echo in flight ever: aggregation off (no 100 ms hold-back), 2 ms jitter (no phase drift,
# forwards leave after 0 ms), interfaces booted at staggered times (see the module docstring)
EXACT = MeshConfig(aggregation=False, jitter_ms=2)

# When the lossless numbers hold: 70 s is not quite enough. The links come up about 1 s in,
# the first OGM from a new neighbour is not counted in the default table's window (§6.3: its
# neigh_node is only created afterwards), so the 64-OGM windows are full only after ~66 s;
# until then rq = echo = 63 on some links, and a per-interface table (whose window did count
# that first OGM) can forward 255*63//64 = 251 for one OGM. The ring then needs 5 more OGMs.
FULL_WINDOWS = 80.0


# --- the kernel's arithmetic, written out independently of batmand.core ---------------------

def calc_tq(tq_in: int, echo: int, rq: int, iface_penalty: int = 0) -> int:
    """batadv_iv_ogm_calc_tq, integer arithmetic in the kernel's order."""
    total = min(echo, rq)
    tq_own = 0 if total < 1 or rq < 1 else TQ_MAX * total // rq
    inv = WINDOW - rq
    tq_asym = TQ_MAX - TQ_MAX * inv ** 3 // WINDOW ** 3
    return tq_in * tq_own * tq_asym * (TQ_MAX - iface_penalty) // TQ_MAX ** 3


def hop_penalty(tq: int) -> int:
    return tq * (TQ_MAX - HOP_PENALTY) // TQ_MAX


def path_tq(hops: int, echo: int = WINDOW, rq: int = WINDOW) -> int:
    """TQ of an originator `hops` hops away when every link has the given window counts:
    the originator sends 255, every receiver applies calc_tq, every forwarder the penalty."""
    tq = TQ_MAX
    for hop in range(hops):
        if hop:
            tq = hop_penalty(tq)
        tq = calc_tq(tq, echo, rq)
    return tq


def ring_avg(ring: list[int]) -> int:
    nonzero = [v for v in ring if v]
    return sum(nonzero) // len(nonzero) if nonzero else 0


def test_worked_numbers_of_the_formula():
    """The hand-computed values the tests below rely on."""
    assert [path_tq(h) for h in (1, 2, 3, 4)] == [255, 225, 198, 174] == [LOSSLESS[h] for h in (1, 2, 3, 4)]
    # half of the window received, everything echoed: asym = 255 - 255*32**3//64**3 = 255 - 31
    assert calc_tq(255, echo=64, rq=32) == 224
    # everything received, half echoed: tq_own = 255*32//64 = 127 (127.5 truncated)
    assert calc_tq(255, echo=32, rq=64) == 127
    # one echo still in flight: tq_own = 255*63//64 = 251
    assert calc_tq(255, echo=63, rq=64) == 251
    # worst case with an echo in flight at every receiver of a 4-hop path: 251, 217, 188, 162
    assert [path_tq(h, echo=63) for h in (1, 2, 3, 4)] == [251, 217, 188, 162]


# --- helpers -----------------------------------------------------------------------------

def router(net: Network, a: str, b: str):
    orig_node = net.nodes[a].mesh.originators.get(net.nodes[b].orig)
    return orig_node.router() if orig_node else None


def ring(net: Network, a: str, b: str) -> list[int]:
    r = router(net, a, b)
    return list(r.ifinfo_get(None).tq_recv) if r else []


def link_counts(net: Network, a: str, b: str) -> tuple[int, int]:
    """(rq, echo) that calc_tq uses at `a` for the first link of a's route toward `b`, with
    N = the next-hop interface: rq = how many of N's own last 64 OGMs `a` received, echo =
    how many of a's last 64 own OGMs (on that interface) N echoed back."""
    r = router(net, a, b)
    orig_neigh = r.orig_node  # the originator entry of the next-hop MAC itself
    link = orig_neigh.neighbours[(orig_neigh.orig, r.if_incoming)]
    return receive_window(orig_neigh, link, None).bit_count(), orig_neigh.ifinfo_get(r.if_incoming).bcast_own_sum


def originators(net: Network, a: str) -> set:
    return set(net.nodes[a].mesh.originators.nodes)


def line_interfaces(names: str) -> list[tuple[str, str]]:
    """The interfaces net.link() would create for a line: left end if0 (if1 for the nodes
    that already have an if0 toward their left neighbour), right end if0."""
    ifaces = []
    for i, (a, b) in enumerate(zip(names, names[1:])):
        ifaces.append((a, "if0" if i == 0 else "if1"))
        ifaces.append((b, "if0"))
    return ifaces


def build_line(net: Network, names: str, *, stagger: bool = False) -> None:
    """A line with one interface per link end (B: if0 toward A, if1 toward C, ...).
    With stagger, every interface boots 1/len(interfaces) s after the previous one."""
    for name in names:
        net.add_node(name)
    ifaces = line_interfaces(names)
    if stagger:
        for name, ifname in ifaces:
            net.add_interface(net.nodes[name], ifname)
            net.run_for(1.0 / len(ifaces))
    for i, (a, b) in enumerate(zip(names, names[1:])):
        net.link(a, b, a_if="if0" if i == 0 else "if1", b_if="if0")


def line_neighbour(names: str, a: str, b: str) -> str:
    i, j = names.index(a), names.index(b)
    return names[i + 1] if j > i else names[i - 1]


def all_routes_right(net: Network, names: str) -> bool:
    return all(net.next_hop(a, b) == line_neighbour(names, a, b) for a in names for b in names if a != b)


# --- 1. five-node line ------------------------------------------------------------------

LINE = "ABCDE"


def test_line_converges_within_ten_ogm_intervals():
    """Defaults (1 s OGM interval). From a fresh network every node must have a route to
    every other originator, through its line neighbour, within 10 OGM intervals.

    Each hop needs a couple of OGMs: the first one from a new neighbour creates its
    originator entry (and the bidirectional check fails: no echo yet), the echo of the next
    own OGM makes the link bidirectional; only then is a multi-hop OGM arriving via that
    neighbour accepted ("OGM via unknown neighbour" otherwise), and it is forwarded only
    from the next OGM on (from_best_next_hop needs the router set by the previous one).
    Early on the windows hold few OGMs, tq_asym is tiny (rq = 2: 255 - 255*62**3//64**3 = 24)
    and a far originator's TQ truncates to 0 after a few hops - such OGMs are dropped - so
    the 4-hop routes appear last (measured: 2 s for neighbours, 8.3 s for A<->E)."""
    net = Network(seed=11)
    build_line(net, LINE)
    converged_at = None
    while net.now < 10.0 - 1e-9:
        net.run_for(0.1)
        if converged_at is None and all_routes_right(net, LINE):
            converged_at = net.now
    print(f"\n5-node line: all 20 routes right after {converged_at:.1f} s")
    assert converged_at is not None and converged_at <= 10.0
    for a in LINE:
        for b in LINE:
            if a != b:
                assert net.nodes[b].orig in originators(net, a)
                assert net.next_hop(a, b) == line_neighbour(LINE, a, b), (a, b)
                assert net.tq(a, b) > 0


def test_line_lossless_defaults():
    """Defaults, after 80 s (see FULL_WINDOWS): every node lists every other node, next
    hops are the line neighbours, and the TQ is the lossless value of the hop count,
    255 / 225 / 198 / 174 - or, for the few OGMs that were processed while the receiver's
    last echo was still in flight, at most one 63/64 step lower per receiving hop
    (251 / 217 / 188 / 162 is the floor, see test_worked_numbers_of_the_formula)."""
    net = Network(seed=12)
    build_line(net, LINE)
    net.run_for(FULL_WINDOWS)
    for a in LINE:
        assert {net.nodes[b].orig for b in LINE if b != a} <= originators(net, a)
        for b in LINE:
            if a == b:
                continue
            hops = abs(LINE.index(a) - LINE.index(b))
            assert net.next_hop(a, b) == line_neighbour(LINE, a, b), (a, b)
            values = ring(net, a, b)
            assert all(path_tq(hops, echo=63) <= v <= LOSSLESS[hops] for v in values), (a, b, values)
            assert path_tq(hops, echo=63) <= net.tq(a, b) <= LOSSLESS[hops]
            # the forwarding table published to the data path agrees with the router
            r = router(net, a, b)
            route = net.nodes[a].fwd.origs[net.nodes[b].orig]
            assert (route.next_hop, route.iface) == (r.addr, r.if_incoming.name)


def test_line_lossless_tq_exact():
    """Same line, with no echo ever in flight (EXACT): after 80 s the whole 5-entry ring of
    every route holds exactly the lossless value, so tq_avg is exactly
    direct 255, 2 hops 255*225//255 = 225, 3 hops 198, 4 hops 174."""
    net = Network(seed=13, config=EXACT)
    build_line(net, LINE, stagger=True)
    net.run_for(FULL_WINDOWS - net.now)
    for a in LINE:
        for b in LINE:
            if a == b:
                continue
            hops = abs(LINE.index(a) - LINE.index(b))
            r = router(net, a, b)
            assert net.owner_of(r.addr) == line_neighbour(LINE, a, b)
            assert list(r.ifinfo_get(None).tq_recv) == [LOSSLESS[hops]] * RING, (a, b)
            assert net.tq(a, b) == LOSSLESS[hops], (a, b)
            # the counts that make calc_tq neutral on the first link: all 64 received and echoed
            assert link_counts(net, a, b) == (64, 64), (a, b)


def test_echo_in_flight_costs_one_slot():
    """The kernel effect behind the tolerance of test_line_lossless_defaults, pinned down.
    Aggregation on: B echoes A's OGM only after its 100 ms hold-back. B boots 50 ms after A
    (2 ms jitter keeps that phase), so each of B's OGMs reaches A while the echo of A's last
    OGM is still on its way: at A, echo = 63, rq = 64, TQ of B = 255*63//64 = 251.
    The other way round, A's OGMs reach B 950 ms after B's own, long after the echo:
    echo = rq = 64, TQ of A at B = 255."""
    net = Network(seed=14, config=MeshConfig(jitter_ms=2))
    a, b = net.add_node("A"), net.add_node("B")
    net.add_interface(a, "if0")
    net.run_for(0.05)
    net.add_interface(b, "if0")
    net.link("A", "B", a_if="if0", b_if="if0")
    net.run_for(80)
    assert ring(net, "A", "B") == [251] * RING and net.tq("A", "B") == 251
    assert ring(net, "B", "A") == [255] * RING and net.tq("B", "A") == 255
    # nothing is lost: in A's echo window for B every bit but (possibly) bit 0 - the OGM A
    # sent last, whose echo may be on its way right now - is set
    bcast_own = net.nodes["A"].mesh.originators.get(b.orig).ifinfo_get(a.mesh.iface("if0")).bcast_own
    assert bcast_own | 1 == 2 ** 64 - 1


# --- 2. random 20-node mesh -------------------------------------------------------------

def random_connected_graph(seed: int, n: int = 20, extra: int = 15) -> list[tuple[int, int]]:
    """A random tree (node i hangs off a random earlier node) plus `extra` random edges:
    connected by construction, average degree 2*(n-1+extra)/n = 3.4 for the defaults."""
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}
    while len(edges) < n - 1 + extra:
        x, y = sorted(rng.sample(range(n), 2))
        edges.add((x, y))
    return sorted(edges)


def bfs(adj: dict[int, set[int]], source: int) -> dict[int, int]:
    dist = {source: 0}
    queue = deque([source])
    while queue:
        u = queue.popleft()
        for v in sorted(adj[u]):
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def test_random_mesh_shortest_paths_and_lossless_tq():
    """20 nodes, 34 lossless links (average degree 3.4), one radio interface per node
    joined to a point-to-point segment per neighbour. After 80 s, for every ordered pair
    (a, b): a's next hop is a neighbour one BFS hop closer to b, and the TQ is the
    lossless value of the BFS distance h: 255 for h=1, then tq*225//255 per extra hop
    (225, 198, 174, 153, 134, ...), computed here by hand. EXACT config (module docstring)."""
    n = 20
    edges = random_connected_graph(seed=2)
    adj = {i: set() for i in range(n)}
    for x, y in edges:
        adj[x].add(y)
        adj[y].add(x)
    dist = {i: bfs(adj, i) for i in range(n)}
    assert all(len(dist[i]) == n for i in range(n)), "graph must be connected"
    assert 3.0 <= 2 * len(edges) / n <= 4.0
    diameter = max(max(d.values()) for d in dist.values())
    assert diameter >= 4  # long enough paths to exercise the hop penalty repeatedly

    expected_tq = {1: TQ_MAX}
    for h in range(2, diameter + 1):
        expected_tq[h] = expected_tq[h - 1] * (TQ_MAX - HOP_PENALTY) // TQ_MAX
    assert [expected_tq[h] for h in (1, 2, 3, 4)] == [255, 225, 198, 174]

    net = Network(seed=21, config=EXACT)
    names = [f"N{i:02d}" for i in range(n)]
    for name in names:  # boot the radios 50 ms apart
        net.add_node(name)
        net.add_interface(net.nodes[name], "if0")
        net.run_for(1.0 / n)
    for x, y in edges:
        net.link(names[x], names[y], a_if="if0", b_if="if0")
    net.run_for(FULL_WINDOWS - net.now)

    by_hops: dict[int, int] = {}
    for i in range(n):
        assert originators(net, names[i]) >= {net.nodes[names[j]].orig for j in range(n) if j != i}
        for j in range(n):
            if i == j:
                continue
            h = dist[i][j]
            hop = net.next_hop(names[i], names[j])
            assert hop is not None, (i, j)
            k = names.index(hop)
            assert k in adj[i] and dist[k][j] == h - 1, f"{names[i]}->{names[j]} via {hop}: not a shortest path"
            assert net.tq(names[i], names[j]) == expected_tq[h], (i, j, h)
            by_hops[h] = by_hops.get(h, 0) + 1
    print(f"\n20-node mesh: pairs by hop count {dict(sorted(by_hops.items()))}")


# --- 3. lossy links ---------------------------------------------------------------------

def first_ogm(frame: bytes) -> IvOgm | None:
    packets = decode_frame(frame).packets
    return packets[0] if packets and isinstance(packets[0], IvOgm) else None


def two_nodes(config: MeshConfig, seed: int, offset: float = 0.5) -> Network:
    """A and B on one link, B's interface booted `offset` s after A's (0.5: opposite OGM
    phases, so no OGM is processed while an echo is in flight)."""
    net = Network(seed=seed, config=config)
    a, b = net.add_node("A"), net.add_node("B")
    net.add_interface(a, "if0")
    net.run_for(offset)
    net.add_interface(b, "if0")
    net.link("A", "B", a_if="if0", b_if="if0")
    return net


def record_pushes(net: Network, at: str, neighbour: str, log: list) -> object:
    """Spy on the TQ ring of `at`'s (default-table) route to direct neighbour `neighbour`:
    every value pushed is logged as (value, echo, rq, seqno, last_own, last_own_echoed):
    the counts read at the moment of the push - the ones calc_tq just used -, the seqno of
    the neighbour's OGM just processed, and the seqno of our own OGM sent last on that
    interface with whether its echo is already in (bit 0 of the echo window)."""
    r = router(net, at, neighbour)
    info = r.ifinfo_get(None)  # IV's TQ ring of the route
    echo_info = r.orig_node.ifinfo_get(r.if_incoming)
    link_neigh = r.orig_node.neighbours[(r.orig_node.orig, r.if_incoming)]
    neigh_orig = r.orig_node
    iface = r.if_incoming

    class Spied(type(info)):  # this one record only (the records have slots: no attribute to patch)
        __slots__ = ()

        def push_tq(self, value: int) -> None:
            log.append((value, echo_info.bcast_own_sum, receive_window(neigh_orig, link_neigh, None).bit_count(),
                        neigh_orig.ifinfo_get(None).last_real_seqno,
                        (iface.algo.ogm_seqno - 2) & 0xFFFFFFFF, bool(echo_info.bcast_own & 1)))
            super().push_tq(value)

    info.__class__ = Spied
    return info


def test_deterministic_loss_worked_numbers():
    """A-B, aggregation off (each OGM its own frame). A's own OGMs with an even seqno are
    dropped on the way A->B, nothing else is lost.

    At B, for A: rq = 32 (every other one of A's last 64), echo = 64 (A echoes all of B's
    OGMs, and echoes are not A's own OGMs so they are not dropped):
        tq_own = 255*min(64,32)//32 = 255, tq_asym = 255 - 255*32**3//64**3 = 255 - 31 = 224,
        TQ of A at B = 255*255*224*255 // 255**3 = 224.
    At A, for B: rq = 64, echo = 32 (B only echoes the odd ones):
        tq_own = 255*32//64 = 127, tq_asym = 255, TQ of B at A = 127.
    The windows are full after 64 of A's OGMs and the ring then needs 5 more of the odd
    ones (10 s); the counts calc_tq used are recorded at every TQ pushed during 80..90 s
    (reading them at an arbitrary instant could catch an echo in flight at A: 31)."""
    net = two_nodes(MeshConfig(aggregation=False), seed=31)
    a_orig = net.nodes["A"].orig

    def drop(src: str, dst: str, frame: bytes) -> bool:
        ogm = first_ogm(frame)
        return src == "A" and ogm is not None and ogm.orig == a_orig and ogm.seqno % 2 == 0

    net.find_segment("A", "B").drop = drop
    net.run_for(80 - net.now)
    pushes = {"B": [], "A": []}
    record_pushes(net, "B", "A", pushes["B"])
    record_pushes(net, "A", "B", pushes["A"])
    net.run_for(10)

    # at B: 5 of A's (odd) OGMs in 10 s, each with rq = 32, echo = 64 -> 224
    assert calc_tq(255, echo=64, rq=32) == 224
    assert 4 <= len(pushes["B"]) <= 6
    assert pushes["B"] and all(seqno % 2 == 1 for _, _, _, seqno, *_ in pushes["B"])
    assert [(v, echo, rq) for v, echo, rq, *_ in pushes["B"]] == [(224, 64, 32)] * len(pushes["B"])
    assert ring(net, "B", "A") == [224] * RING
    assert net.tq("B", "A") == 224

    # at A: all 10 of B's OGMs, each with rq = 64, echo = 32 -> 127
    assert calc_tq(255, echo=32, rq=64) == 127
    assert len(pushes["A"]) >= 9
    assert [(v, echo, rq) for v, echo, rq, *_ in pushes["A"]] == [(127, 32, 64)] * len(pushes["A"])
    assert ring(net, "A", "B") == [127] * RING
    assert net.tq("A", "B") == 127


@pytest.mark.parametrize("config, offset", [(MeshConfig(jitter_ms=2), 0.05), (MeshConfig(aggregation=False), 0.5)],
                         ids=["aggregation-echo-in-flight", "no-aggregation"])
def test_random_loss_tq_is_the_formula_of_the_recorded_counts(config, offset):
    """A-B, every frame A->B lost with p = 0.3 (a seeded generator of the test, so the test
    knows which of A's OGMs got through), B->A lossless. In the first variant (aggregation
    on, 2 ms jitter to hold the phase) B boots 50 ms after A, so B's OGMs reach A while A's
    last echo is still held back at B: the formula must hold with those counts too. The
    second variant has aggregation off, default jitter, opposite phases.

    For every TQ pushed into a ring after the windows are full, the value must be
    calc_tq(255, echo, rq) of the window counts at that moment (captured when it is
    pushed). At B the receive count rq is also recomputed from the test's own record:
    the number of A's seqnos in (s-64, s] that were not dropped, s = the OGM just received."""
    p = 0.3
    loss_rng = random.Random(1234)
    net = two_nodes(config, seed=32, offset=offset)
    a_orig = net.nodes["A"].orig
    delivered: set[int] = set()

    def drop(src: str, dst: str, frame: bytes) -> bool:
        if src != "A":
            return False
        if loss_rng.random() < p:
            return True
        delivered.update(o.seqno for o in decode_frame(frame).packets if isinstance(o, IvOgm) and o.orig == a_orig)
        return False

    net.find_segment("A", "B").drop = drop
    net.run_for(75 - net.now)

    pushes = {"B": [], "A": []}
    info_b = record_pushes(net, "B", "A", pushes["B"])
    info_a = record_pushes(net, "A", "B", pushes["A"])
    net.run_for(60)

    assert len(pushes["B"]) >= 30 and len(pushes["A"]) >= 55
    for value, echo, rq, seqno, *_ in pushes["B"]:
        recorded_rq = sum(1 for s in delivered if 0 <= (seqno - s) % 2 ** 32 < WINDOW)
        assert rq == recorded_rq, (seqno, rq, recorded_rq)
        assert value == calc_tq(255, echo, rq), (value, echo, rq)
    for value, echo, rq, *_ in pushes["A"]:
        assert rq == 64  # B->A is lossless
        assert value == calc_tq(255, echo, rq), (value, echo, rq)
    # pushes at A made while A's last OGM had reached B but its echo had not come back yet
    in_flight = sum(1 for *_, last_own, echoed in pushes["A"] if last_own in delivered and not echoed)
    if offset < 0.1:
        assert in_flight >= len(pushes["A"]) // 3
    # the ring holds the last 5 pushes, tq_avg is their non-zero mean
    for info, recorded in ((info_b, pushes["B"]), (info_a, pushes["A"])):
        last = [v for v, *_ in recorded[-RING:]]
        assert sorted(info.tq_recv) == sorted(last)
        assert info.tq_recv[(info.tq_index - 1) % RING] == last[-1]
        assert info.tq_avg == ring_avg(info.tq_recv)
    # loss shows: both counts well below 64, and the TQ is not constant
    assert all(25 <= rq <= 60 for _, _, rq, *_ in pushes["B"])
    assert all(25 <= echo <= 60 for _, echo, *_ in pushes["A"])
    assert len({v for v, *_ in pushes["B"]}) > 1
    print(f"\nloss {p} A->B ({'aggregation' if config.aggregation else 'no aggregation'}): "
          f"TQ of A at B {net.tq('B', 'A')} (last rq/echo {pushes['B'][-1][2]}/{pushes['B'][-1][1]}), "
          f"TQ of B at A {net.tq('A', 'B')} (last rq/echo {pushes['A'][-1][2]}/{pushes['A'][-1][1]}), "
          f"{in_flight}/{len(pushes['A'])} pushes at A with an echo in flight")


# --- 4. rerouting -----------------------------------------------------------------------

SQUARE = [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]


def step_event(net: Network) -> None:
    """Advance the simulator to its next event (a timer or a frame arrival) and run it
    (peeks at the simulator's event queue: run_until has no "one event" mode)."""
    net.run_until(net._queue[0][0])


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_cut_link_reroutes_within_the_ring_length(seed):
    """Square A-B-D / A-C-D, defaults: two equal 2-hop paths A->D. Cut the link from A to
    its current next hop toward D. IV keeps the old router while its 5-entry TQ ring still
    has a non-zero entry; each new-seqno OGM of D arriving via the other neighbour pushes a
    0, so the old ring is all zeros after at most 5 of D's OGMs (plus the 100 ms
    aggregation hold-back and jitter): the switch must happen within 6.5 s. It can be
    earlier: when the other path's average is higher (in-flight echoes make the two paths'
    averages differ by a few units), or equal while the cut neighbour's echo count - which
    drops by one per own OGM after the cut - is lower (the tie-break of §6.5)."""
    net = Network(seed=seed)
    for name in "ABCD":
        net.add_node(name)
    for x, y in SQUARE:
        net.link(x, y)
    net.run_for(80)
    old = net.next_hop("A", "D")
    assert old in ("B", "C")
    other = "C" if old == "B" else "B"
    old_router = router(net, "A", "D")

    segment = net.find_segment("A", old)
    segment.up = False
    cut_at = net.now
    while net.next_hop("A", "D") == old and net.now - cut_at < 20:
        step_event(net)  # one event at a time: the state below is the one the switch saw
    reroute = net.now - cut_at
    old_ring = list(old_router.ifinfo_get(None).tq_recv)
    new_avg = net.tq("A", "D")
    print(f"\nseed {seed}: A->D via {old} cut, switched to {net.next_hop('A', 'D')} after {reroute:.2f} s "
          f"(old ring {old_ring}, new tq {new_avg})")
    assert net.next_hop("A", "D") == other
    assert reroute <= 6.5
    # the kernel's rule (§6.5): the new router won on a higher average, or on an equal one
    # with a better echo count - the cut neighbour no longer echoes A's OGMs
    echo_old = old_router.orig_node.ifinfo_get(old_router.if_incoming).bcast_own_sum
    new_router = router(net, "A", "D")
    echo_new = new_router.orig_node.ifinfo_get(new_router.if_incoming).bcast_own_sum
    assert ring_avg(old_ring) < new_avg or (ring_avg(old_ring) == new_avg and echo_old < echo_new)
    # the 3-hop detour to the cut-off neighbour shows up as well
    net.run_for(10)
    assert net.next_hop("A", old) == other
    assert path_tq(3, echo=63) <= net.tq("A", old) <= LOSSLESS[3]

    segment.up = True
    restored_at = net.now
    while net.next_hop("A", old) != old and net.now - restored_at < 30:
        net.run_for(0.1)
    print(f"seed {seed}: link restored, A->{old} direct again after {net.now - restored_at:.1f} s")
    assert net.next_hop("A", old) == old
    net.run_for(80)
    for x in "ABCD":
        for y in "ABCD":
            if x == y:
                continue
            hops = 2 if {x, y} in ({"A", "D"}, {"B", "C"}) else 1
            hop = net.next_hop(x, y)
            if hops == 1:
                assert hop == y, (x, y, hop)
            else:  # A<->D via B or C, B<->C via A or D
                assert hop in ({"B", "C"} if {x, y} == {"A", "D"} else {"A", "D"}), (x, y, hop)
            assert path_tq(hops, echo=63) <= net.tq(x, y) <= LOSSLESS[hops], (x, y)


# --- 5. purge ---------------------------------------------------------------------------

def test_purge_forgets_a_stopped_node():
    """Line A-B-C, purge timeout 5 s (MeshConfig(purge_timeout_ms=5000)), purge worker every
    1 s. Stop C; let its last OGM settle and call L the time A (resp. B) last saw C.
    Kernel (§6.8): the neighbour entry (the route) dies at the first purge with
    now - last_seen > 5 s, i.e. in (L+5, L+6], and losing the route deletes everything C
    announced in TT (batadv_update_route -> tt_global_del_orig), so C's soft-interface MAC
    leaves the global TT and the published forwarding table in the same step. The
    originator itself goes at the first purge with now - last_seen > 10 s: (L+10, L+11]."""
    net = Network(seed=51, config=MeshConfig(purge_timeout_ms=5000))
    build_line(net, "ABC")
    net.run_for(30)
    c = net.nodes["C"]
    client = (c.mesh.soft_mac, 0)
    for name in "AB":
        node = net.nodes[name]
        assert c.orig in node.mesh.originators.nodes and net.next_hop(name, "C") is not None
        assert client in node.mesh.tt.global_
        assert c.orig in node.fwd.origs and client in node.fwd.clients

    net.stop("C")
    net.run_for(0.5)  # frames already on their way (B's forwards of C's last OGM) arrive
    last_seen = {name: net.nodes[name].mesh.originators.get(c.orig).last_seen for name in "AB"}
    route_gone: dict[str, float] = {}
    orig_gone: dict[str, float] = {}
    while len(orig_gone) < 2 and net.now < last_seen["A"] + 15:
        net.run_for(0.05)
        for name in "AB":
            node = net.nodes[name]
            orig_node = node.mesh.originators.get(c.orig)
            routed = orig_node is not None and orig_node.router() is not None
            if not routed and name not in route_gone:
                route_gone[name] = net.now
                # in the same step: TT entries and the published forwarding entries are gone
                assert client not in node.mesh.tt.global_
                assert c.orig not in node.fwd.origs and client not in node.fwd.clients
            if orig_node is None and name not in orig_gone:
                orig_gone[name] = net.now
    for name in "AB":
        print(f"\n{name}: route to C gone {route_gone[name] - last_seen[name]:.2f} s, originator gone "
              f"{orig_gone[name] - last_seen[name]:.2f} s after C was last seen")
        assert 5.0 < route_gone[name] - last_seen[name] <= 6.0 + 0.05
        assert 10.0 < orig_gone[name] - last_seen[name] <= 11.0 + 0.05
        node = net.nodes[name]
        assert c.orig not in node.mesh.originators.nodes
        assert client not in node.mesh.tt.global_
        assert c.orig not in node.fwd.origs and client not in node.fwd.clients
        assert net.next_hop(name, "C") is None
    # B's hard-interface neighbour entry for C timed out too, A and B still route to each other
    assert c.macs["if0"] not in net.nodes["B"].mesh.iface("if1").neighbours
    assert net.next_hop("A", "B") == "B" and net.next_hop("B", "A") == "A"


# --- 6. secondary interfaces ------------------------------------------------------------

def test_secondary_interface_ogms_stay_on_their_link():
    """Line A-B-C-D with one interface per link end: B has if0 (primary, toward A) and if1
    (secondary, toward C), C has if0 (primary, toward B) and if1 (secondary, toward D).
    A secondary interface sends its own OGMs only on itself, TTL 2, orig = its own MAC, no
    TVLVs; the neighbour echoes them once (TTL 1, DIRECTLINK) on the same interface and
    nowhere else (§6.2 "secondary OGMs: only echo on same iface", checklist item 4).
    So C lists B's secondary MAC as an originator, A and D do not - as in the kernel's
    3-node capture, where C lists 02:00:00:bb:02:02 and A does not. C also reaches B's
    primary originator through next hop B.if1 (the capture: Nexthop 02:00:00:bb:02:02)."""
    net = Network(seed=61)
    build_line(net, "ABCD")
    seen: dict[tuple[str, str], list[tuple[str, IvOgm]]] = {}

    def sniffer(key):
        def drop(src: str, dst: str, frame: bytes) -> bool:
            seen.setdefault(key, []).extend((src, o) for o in decode_frame(frame).packets if isinstance(o, IvOgm))
            return False
        return drop

    for x, y in (("A", "B"), ("B", "C"), ("C", "D")):
        net.find_segment(x, y).drop = sniffer((x, y))
    net.run_for(30)

    b_sec, c_sec = net.nodes["B"].macs["if1"], net.nodes["C"].macs["if1"]
    b_pri = net.nodes["B"].orig
    assert b_pri == net.nodes["B"].macs["if0"]
    assert b_sec in originators(net, "C")
    assert b_sec not in originators(net, "A") and b_sec not in originators(net, "D")
    assert c_sec in originators(net, "D")
    assert c_sec not in originators(net, "A") and c_sec not in originators(net, "B")
    # C's route to B's secondary originator: direct, via the secondary MAC itself
    sec_router = net.nodes["C"].mesh.originators.get(b_sec).router()
    assert sec_router.addr == b_sec and sec_router.if_incoming.name == "if0"
    assert sec_router.ifinfo_get(None).tq_avg > 0
    # everybody reaches B's primary originator; C through next hop B.if1
    for name in "ACD":
        assert net.next_hop(name, "B") is not None
    assert router(net, "C", "B").addr == b_sec
    assert router(net, "A", "B").addr == b_pri

    # on the wire
    sec_own = [o for src, o in seen[("B", "C")] if src == "B" and o.orig == b_sec]
    sec_echo = [o for src, o in seen[("B", "C")] if src == "C" and o.orig == b_sec]
    assert len(sec_own) >= 25 and len(sec_echo) >= 20
    assert all(o.ttl == 2 and not o.tvlvs and o.prev_sender == b_sec for o in sec_own)
    assert all(o.ttl == 1 and o.flags & OgmFlags.DIRECTLINK and o.prev_sender == b_sec for o in sec_echo)
    assert not any(o.orig == b_sec for _, o in seen[("A", "B")] + seen[("C", "D")])
    assert not any(o.orig == c_sec for _, o in seen[("A", "B")] + seen[("B", "C")])
    # primary OGMs are the ones that travel: TTL 50 and a TT container when B sends them
    b_primary_own = [o for src, o in seen[("B", "C")] if src == "B" and o.orig == b_pri]
    assert b_primary_own and all(o.ttl == 50 and o.tvlvs for o in b_primary_own)
