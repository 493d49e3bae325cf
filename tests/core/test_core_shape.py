"""The core's shape for the features to come: a feature registers its packet handlers, its
TVLV handlers and containers and its host-path hooks with the mesh, as the kernel's do;
the routing algorithm is one behind an interface that nothing outside it asks about."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import batmand
from batmand.core import hooks
from batmand.core.algorithm import ALGORITHMS
from batmand.core.config import MeshConfig
from batmand.core.events import ForwardingUpdate
from batmand.core.forwarding import FROM_HOST, SlowPath, SlowRule
from batmand.core.mesh import Mesh
from batmand.sim.network import Network
from batmand.wire import BROADCAST, InnerFrame, IvOgm, Mac, Mcast, UnknownTvlv, build_frame, decode_frame
from batmand.wire.constants import PacketType
from batmand.wire.tvlv import tvlv_type

PACKAGE = Path(batmand.__file__).parent


def _pair(**config) -> Network:
    net = Network(seed=5, config=MeshConfig(orig_interval_ms=200, **config))
    net.add_node("A")
    net.add_node("B")
    net.link("A", "B")
    return net


def test_a_feature_adds_a_container_to_our_ogms_and_handles_it_in_theirs():
    net = _pair()
    a, b = net.nodes["A"], net.nodes["B"]
    heard, absent = [], []
    reserved = a.mesh.tvlv.fixed_bytes  # what the core's own fixed containers keep (GW's 12 bytes)
    # a feature of type 0x30 on A contributes a container; B's handlers hear it (and, with
    # when_absent, also hear of the OGMs of nodes that lack it: the kernel's CIFNOTFND)
    a.mesh.tvlv.contribute(lambda now, room: UnknownTvlv(0x30, 1, b"\x01\x02"))
    b.mesh.tvlv.handle_ogm(0x30, 1, lambda now, orig, tvlv: heard.append((orig.orig, tvlv.value)))
    b.mesh.tvlv.handle_ogm(0x31, 1, lambda now, orig, tvlv: absent.append(tvlv), when_absent=True)
    net.run_for(5)
    assert heard and all(orig == a.orig and value == b"\x01\x02" for orig, value in heard)
    assert absent and set(absent) == {None}
    # the TT container still comes along, after the fixed-size one was given its room
    containers = a.mesh.ogm_tvlvs(net.now)
    assert [tvlv_type(t) for t in containers] == [4, 2, 0x30]  # in the order the features registered (TT, DAT)
    assert a.mesh.tvlv.fixed_bytes == reserved + 6


def test_further_copies_of_an_ogm_reach_only_the_handlers_that_want_each():
    """B hears each of A's OGMs twice, from A and forwarded by C, with the same containers.
    A handler registered with each_copy=False hears each OGM once (a repeat would change
    nothing it keeps: TT, DAT, MCAST); one with the default hears every copy, as the
    kernel's handlers do (the gateway's election check)."""
    net = Network(seed=5, config=MeshConfig(orig_interval_ms=200))
    for name in "ABC":
        net.add_node(name)
    for x, y in ("AB", "AC", "BC"):
        net.link(x, y)
    a, b = net.nodes["A"], net.nodes["B"]
    a.mesh.tvlv.contribute(lambda now, room: UnknownTvlv(0x30, 1, b"\x01\x02"))
    every, once = [], []
    b.mesh.tvlv.handle_ogm(0x30, 1, lambda now, orig, tvlv: every.append((orig.orig, orig.tvlvs_seen[0])))
    b.mesh.tvlv.handle_ogm(0x31, 1, lambda now, orig, tvlv: once.append((orig.orig, orig.tvlvs_seen[0])),
                           when_absent=True, each_copy=False)
    net.run_for(5)
    every_a = [seqno for orig, seqno in every if orig == a.orig]
    once_a = [seqno for orig, seqno in once if orig == a.orig]
    assert len(once_a) == len(set(once_a)) > 10  # one call per OGM
    assert len(set(every_a)) > 10 and set(every_a) <= set(once_a)  # (A's first OGM was built before 0x30)
    assert len(every_a) > len(once_a) + 10  # and the copies through C


def test_a_packet_type_handler_registered_by_a_feature():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:aa"))
    mesh.add_interface(0.0, "e0", Mac("02:00:00:00:00:01"))
    got = []
    mesh.register_receiver(PacketType.MCAST, lambda now, iface, frame, raw: got.append(frame.packet.packet_type))
    inner = InnerFrame(h_dest=Mac("01:00:5e:00:00:01"), h_source=Mac("02:cc:00:00:00:01"), h_proto=0x0800,
                       payload=bytes(30))
    mesh.receive(1.0, "e0", build_frame(BROADCAST, Mac("02:00:00:00:00:02"), Mcast(ttl=5, inner=inner)))
    assert got == [PacketType.MCAST]  # before: dropped as an unhandled type
    assert mesh.counters["drop_unhandled_packet_type"] == 0
    # unicast-class types nobody knows are still handled (routed on, or dropped as ours)
    assert all(mesh.receivers.get(t) is not None for t in range(0x40, 0x80))


def test_host_path_hooks_run_in_the_kernels_order_and_may_consume():
    net = _pair()
    net.run_for(5)
    a, b = net.nodes["A"], net.nodes["B"]
    calls = []

    def dat(now, inner, vid):
        calls.append("dat")
        return inner.h_proto == 0x0806  # answers ARP itself

    def bla(now, inner, vid):
        calls.append("bla")
        return False

    a.mesh.hooks.on_host_tx(hooks.DAT, dat)
    a.mesh.hooks.on_host_tx(hooks.BLA, bla)  # registered later, runs first
    seen_at_b = []
    b.mesh.hooks.on_host_rx(hooks.BLA, lambda now, inner, vid, packet: seen_at_b.append(inner.h_proto) or False)
    client = Mac("02:cc:00:00:00:01")
    arp = bytes(BROADCAST) + bytes(client) + b"\x08\x06" + bytes(28)
    other = bytes(BROADCAST) + bytes(client) + b"\x88\xb5" + bytes(28)
    sent_before = a.transmitted
    net.host_send("A", arp)
    assert calls == ["bla", "dat"] and a.transmitted == sent_before  # consumed: nothing went out
    net.host_send("A", other)
    net.run_for(1)
    assert seen_at_b == [0x88B5]  # the other frame was broadcast and reached B's host path
    assert not any(InnerFrame.decode(f).h_proto == 0x0806 for _, f in b.delivered)


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_seqnos_continue_where_a_restarted_node_stopped(algo):
    config = MeshConfig(routing_algo=algo)
    mac = Mac("02:00:00:00:00:01")
    old = Mesh(config, soft_mac=Mac("02:00:00:00:00:aa"))
    old.add_interface(0.0, "e0", mac)
    for t in range(1, 30):
        old.tick(t * 0.5)
    saved = old.seqno_state()
    new = Mesh(config, soft_mac=Mac("02:00:00:00:00:aa"))
    new.restore_seqnos(saved, ahead=10)
    new.add_interface(0.0, "e0", mac)
    assert new.seqno_state().keys() == saved.keys()
    for key, value in new.seqno_state().items():
        # each continues forward, `ahead` or more (ELP twice: it is sent twice as often;
        # IV has scheduled its next OGM), never a random new start
        if isinstance(value, dict):
            assert list(value) == [str(mac)] and 10 <= (value[str(mac)] - saved[key][str(mac)]) % 2**32 <= 21, key
        elif key != "frag_seqno":
            assert 10 <= (value - saved[key]) % 2**32 <= 1010, key


def test_no_one_outside_an_algorithm_asks_which_algorithm_runs():
    """No isinstance of an algorithm class, no comparison with an algorithm's name and no
    hasattr on the algorithm outside the algorithm modules (batmanctl, which picks batctl's
    table format by the name the daemon reports, as batctl does, is not the core)."""
    algorithm_modules = {"core/bat_iv.py", "core/bat_v.py", "core/algorithm.py"}
    names = {cls.__name__ for cls in ALGORITHMS.values()} | set(ALGORITHMS)
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module in algorithm_modules or module.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "hasattr"):
                args = ast.unparse(node)
                if any(name in args for name in names) or (node.func.id == "hasattr" and "algo" in args):
                    offenders.append(f"{where}: {args}")
            if isinstance(node, ast.Compare):
                text = ast.unparse(node)
                if "algo" in text and any(f'"{name}"' in text or f"'{name}'" in text for name in ALGORITHMS):
                    offenders.append(f"{where}: {text}")
    assert not offenders, offenders


def test_our_ogm_carries_what_the_features_contribute_within_512_bytes():
    net = _pair()
    a = net.nodes["A"]
    a.mesh.tvlv.contribute(lambda now, room: UnknownTvlv(0x30, 1, bytes(100)))
    for n in range(60):  # more TT changes than the room left after the 104-byte container
        net.host_send("A", bytes(BROADCAST) + bytes(Mac(bytes([2, 0xcc, 0, 0, 1, n]))) + b"\x88\xb5" + bytes(28))
    sent = []
    transmit = net._transmit
    net._transmit = lambda node, action: (sent.append(action.frame) if node is a else None, transmit(node, action))
    net.run_for(3)
    own = [p for f in sent for p in decode_frame(f).packets if isinstance(p, IvOgm) and p.orig == a.orig]
    assert own and max(24 + p.tvlv_len for p in own) <= 512
    assert any(tvlv_type(t) == 0x30 for p in own for t in p.tvlvs)


def test_a_malformed_container_of_a_known_type_reaches_no_handler():
    """A TT container whose value does not fit the TT layout (hostile, or from a broken
    node) is ignored, as the kernel's handlers ignore it; before, it reached the TT handler."""
    net = _pair()
    net.run_for(3)
    b = net.nodes["B"]
    orig = b.mesh.originators.get(net.nodes["A"].orig)
    b.mesh.ogm_tvlvs_received(net.now, orig, [UnknownTvlv(4, 1, b"\x01\x02")])  # too short for tt_data
    b.mesh.tvlv.unicast_received(net.now, orig.orig, b.mesh.primary.mac, [UnknownTvlv(4, 1, b"\x01\x02")])


def test_a_feature_tells_the_data_plane_which_frames_it_must_see():
    """What a feature needs to see on the host path (ARP while DAT is on, say) goes out
    with the forwarding table, so that the data plane hands those frames to the core."""
    # DAT and BLA off: no rules of their own
    mesh = Mesh(MeshConfig(distributed_arp_table=False, bridge_loop_avoidance=False), soft_mac=Mac("02:00:00:00:00:aa"))
    arp = SlowPath(rules=frozenset({SlowRule(FROM_HOST, 0x0806)}))
    wanted = [SlowPath()]
    mesh.publisher.need_slow_path(lambda: wanted[0])
    mesh.add_interface(0.0, "e0", Mac("02:00:00:00:00:01"))
    wanted[0] = arp  # the feature was switched on
    updates = [a for a in mesh.tick(1.0) if isinstance(a, ForwardingUpdate)]
    assert [u.slow_path for u in updates] == [arp]
    assert not [a for a in mesh.tick(2.0) if isinstance(a, ForwardingUpdate) and a.slow_path is not None]
