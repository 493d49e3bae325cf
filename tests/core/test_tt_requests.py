"""TT requests that find no route: the kernel records them anyway and asks again only after
the 3 s request timeout (a link that comes back up then carries no unicast for 3 s); ours
wait for the route and go out the moment it exists. Waiting and unanswered requests share
one budget (max_pending_tt_requests), so spoofed originators cannot pile them up."""

from __future__ import annotations

from batmand.core.config import MeshConfig
from batmand.core.events import ForwardingUpdate, Transmit
from batmand.core.forwarding import ForwardingTable
from batmand.core.mesh import Mesh
from batmand.core.originator import NeighNode
from batmand.wire import Mac, TtDataFlags, TtTvlv, TtVlan, UnicastTvlv, build_frame, decode_frame


def _mesh(**config) -> Mesh:
    mesh = Mesh(MeshConfig(**config), soft_mac=Mac("02:00:00:00:00:aa"), now=0.0)
    mesh.add_interface(0.0, "e0", Mac("02:00:00:00:00:01"))
    return mesh


def _announce(mesh: Mesh, now: float, orig: Mac):
    """orig's OGM TT container (ttvn 1, no changes): we must ask for its table."""
    node = mesh.originators.get_or_create(orig, now)
    mesh.ogm_tvlvs_received(now, node, [TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=1, vlans=[TtVlan(crc=5, vid=0)])])
    return node, mesh._take()


def _requests(actions) -> list[UnicastTvlv]:
    out = []
    for action in actions:
        if isinstance(action, Transmit):
            packet = decode_frame(action.frame).packet
            if isinstance(packet, UnicastTvlv):
                out.append(packet)
    return out


def test_a_request_without_a_route_goes_out_when_the_route_appears():
    mesh = _mesh()
    orig = Mac("02:00:00:00:00:02")
    node, actions = _announce(mesh, 1.0, orig)
    assert _requests(actions) == [] and mesh.counters["tt_request_tx"] == 0  # no route yet
    neigh = NeighNode(orig, mesh.iface("e0"), node, 1.1)
    node.neighbours[(orig, mesh.iface("e0"))] = neigh
    mesh.update_route(node, None, neigh, 1.1)  # long before the kernel's 3 s
    sent = _requests(mesh._take())
    assert len(sent) == 1 and sent[0].dst == orig and mesh.counters["tt_request_tx"] == 1
    assert sent[0].tvlvs[0].flags & TtDataFlags.REQUEST


def test_waiting_and_unanswered_requests_share_one_budget():
    mesh = _mesh(max_pending_tt_requests=10)
    for n in range(25):  # originators we have no route to, each asking to be asked
        _announce(mesh, 1.0, Mac(bytes([2, 0x5e, 0, 0, 0, n])))
    assert len(mesh.tt.unrouted) == 10
    assert mesh.counters["drop_tt_pending_requests_full"] == 15
    _announce(mesh, 2.0, Mac(bytes([2, 0x5e, 0, 0, 0, 3])))  # one that already waits: no new slot needed
    assert mesh.counters["drop_tt_pending_requests_full"] == 15


def test_the_ttvn_a_full_table_response_brings_is_published_at_once():
    """The data plane stamps an originator's TT version on unicast headers and checks it
    when forwarding: a version learnt from a TT response (not an OGM) must reach the
    forwarding table with those actions, not with that originator's next OGM."""
    mesh = _mesh()
    table = ForwardingTable()

    def take(actions):
        for action in actions:
            if isinstance(action, ForwardingUpdate):
                table.apply(action)
        return actions

    orig = Mac("02:00:00:00:00:02")
    node, actions = _announce(mesh, 1.0, orig)  # ttvn 1, no changes: we ask
    neigh = NeighNode(orig, mesh.iface("e0"), node, 1.1)
    node.neighbours[(orig, mesh.iface("e0"))] = neigh
    mesh.update_route(node, None, neigh, 1.1)
    take(actions + mesh._take())
    response = TtTvlv(flags=TtDataFlags.RESPONSE | TtDataFlags.FULL_TABLE, ttvn=7, vlans=[TtVlan(crc=0, vid=0)])
    me = mesh.primary.mac
    take(mesh.receive(1.2, "e0", build_frame(me, orig, UnicastTvlv(dst=me, src=orig, tvlvs=[response]))))
    assert node.last_ttvn == 7 and table.origs[orig].ttvn == 7
