"""Route changes against the engine's cached decisions, on real parts (a veth's rings, a
TAP as bat0). A router switch or a client that moved makes the engine forget only the
decisions that read those routes (in a large mesh routers switch many times a second);
whatever it keeps must still be what decision.py says for the table after the change.
Rounds of random changes (router switches, routes lost and found, TT versions, clients
moving and roaming, now and then a change every decision reads), each followed by every
frame once: what leaves the veth, reaches bat0 or goes to the slow path must be what
decide_host / decide_mesh say on an independent copy of the table."""

from __future__ import annotations

import random

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.core.forwarding import ForwardingTable
from batmand.dataplane.decision import DELIVER, SLOW, Encapsulate, Forward, decide_host, decide_mesh
from batmand.dataplane.engine import Engine
from batmand.wire import Mac
from batmand.wire.fastpath import DEST_OFF
from tests.dataplane.test_decision import ethernet, unicast
from tests.dataplane.test_engine import OURS, _received, _serve, veth_and_tap

HOPS = [Mac(f"02:5e:00:00:01:{i:02x}") for i in range(2)]  # next hops, behind the veth
ORIGS = [Mac(f"02:5e:00:00:02:{i:02x}") for i in range(4)]
CLIENTS = [Mac(f"06:c1:00:00:00:{i:02x}") for i in range(6)]
MINE = Mac("06:c1:00:00:01:01")  # our host's client
ROUNDS = 30


def _change(rng: random.Random, table: ForwardingTable) -> ForwardingUpdate:
    origs, clients, local = {}, {}, {}
    for _ in range(rng.randint(1, 2)):
        kind = rng.choice(["switch", "switch", "lost", "found", "ttvn", "move", "roam", "gone", "local"])
        orig, client = rng.choice(ORIGS), (rng.choice(CLIENTS), 0)
        route = table.origs.get(orig)
        if kind == "switch" and route is not None:
            origs[orig] = OrigRoute(HOPS[HOPS.index(route.next_hop) ^ 1], "vb", route.ttvn)
        elif kind == "lost":
            origs[orig] = None
        elif kind == "found" and route is None:
            origs[orig] = OrigRoute(rng.choice(HOPS), "vb", rng.randrange(256))
        elif kind == "ttvn" and route is not None:
            origs[orig] = OrigRoute(route.next_hop, "vb", (route.ttvn + 1) & 0xFF)
        elif kind == "move":
            clients[client] = ClientRoute(rng.choice(ORIGS))
        elif kind == "roam" and client in table.clients:
            clients[client] = ClientRoute(table.clients[client].orig, roam=not table.clients[client].roam)
        elif kind == "gone":
            clients[client] = None
        elif kind == "local":  # read by every decision: everything is forgotten
            local[(MINE, 0)] = True
    return ForwardingUpdate(origs, clients, local)


def test_decisions_kept_across_route_changes_are_the_tables_decisions():
    rng = random.Random(19)
    oracle = ForwardingTable()
    oracle.apply(ForwardingUpdate(
        origs={o: OrigRoute(HOPS[i % 2], "vb", 10 * i) for i, o in enumerate(ORIGS)},
        clients={(c, 0): ClientRoute(ORIGS[i % len(ORIGS)]) for i, c in enumerate(CLIENTS)},
        local_clients={(MINE, 0): True}))
    from_host = [ethernet(c, MINE, None, 0x0800, bytes(46)) for c in CLIENTS]
    to_forward = [unicast(OURS, HOPS[0], o, oracle.origs[o].ttvn, ethernet(CLIENTS[0], CLIENTS[1], None, 0x0800,
                                                                            bytes(46))) for o in ORIGS]
    for_us = [unicast(OURS, HOPS[1], OURS, 0, ethernet(MINE, CLIENTS[2], None, 0x0800, bytes(46)))]
    slow_host, slow_mesh = [], []
    kept = 0  # rounds after which decisions stayed cached
    with veth_and_tap(HOPS[0]) as (soft, port, host, wire):
        engine = Engine(soft.fd, slow_host.append, lambda ifname, frame: slow_mesh.append(frame), gro=False)
        engine.add_port(port)
        engine.set_ports({"vb": (bytes(OURS), 1500)}, bytes(OURS), False)
        engine.set_table(ForwardingTable())
        engine.apply(oracle.snapshot())
        fds = [port.rx.fileno(), soft.fd]
        seen = set()
        for round_ in range(ROUNDS + 1):
            if round_:
                update = _change(rng, oracle)
                oracle.apply(update)
                cached = len(engine._host_cache) + len(port.decisions)
                engine.apply(update)
                kept += bool(not update.local_clients and cached and (engine._host_cache or port.decisions))
            for frame in from_host + to_forward + for_us:
                is_host = frame in from_host
                slow_host.clear()
                slow_mesh.clear()
                _received(host, 0)
                _received(wire, 0)
                (host if is_host else wire).send(frame)
                _serve(engine, port, fds, wait=0.03)
                delivered = _received(host, 0.01)
                sent = [f for f in _received(wire, 0.01) if f[12:14] == b"\x43\x05"]
                kind = decide_host(frame, oracle) if is_host else decide_mesh(frame, OURS, OURS, oracle, False)
                seen.add(type(kind).__name__ if kind not in (SLOW, DELIVER) else kind)
                to = frame[:6] if is_host else frame[DEST_OFF:DEST_OFF + 6]
                where = f"round {round_}, {'host' if is_host else 'mesh'} frame to {to.hex(':')}: {kind}"
                if kind is SLOW:
                    assert (slow_host if is_host else slow_mesh) == [frame] and not sent and not delivered, where
                elif kind is DELIVER:
                    assert delivered == [frame[24:]] and not sent and not slow_mesh, where
                elif isinstance(kind, Encapsulate):
                    assert [(f[:6], f[6:12], f[DEST_OFF:DEST_OFF + 6], f[17], f[24:]) for f in sent] == \
                        [(kind.next_hop, OURS, kind.orig, kind.ttvn, frame)] and not slow_host, where
                else:
                    assert isinstance(kind, Forward), where
                    assert [(f[:6], f[6:12], f[24:]) for f in sent] == [(kind.next_hop, OURS, frame[24:])] \
                        and not slow_mesh, where
    assert seen >= {SLOW, DELIVER, "Encapsulate", "Forward"}, seen  # every kind of decision was met
    assert kept > ROUNDS // 3, kept  # a route change left the other routes' decisions cached
