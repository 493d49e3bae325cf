"""Run many protocol cores on a graph of lossy links with a virtual clock.

Links are broadcast segments joining (node, interface) endpoints; every frame a node
transmits reaches the other endpoints of its segment, each copy dropped with that
direction's loss probability. A segment may also have a rate (each sender's frames wait
their turn behind a bounded queue, tail-dropped when it is full) and a per-frame extra
delay (to reorder frames). Everything random comes from one seeded generator, so a
run is reproducible; minutes of mesh time run in seconds."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from batmand.core.config import MeshConfig
from batmand.core.events import Deliver, ForwardingUpdate, IcmpResult, TpResult, Transmit, Uevent
from batmand.core.forwarding import ForwardingTable
from batmand.core.mesh import Mesh
from batmand.wire import Mac

LATENCY = 0.0002  # seconds per hop on the simulated wire


@dataclass(eq=False)
class SimNode:
    name: str
    mesh: Mesh
    macs: dict[str, Mac] = field(default_factory=dict)  # interface name -> MAC
    fwd: ForwardingTable = field(default_factory=ForwardingTable)
    delivered: list[tuple[float, bytes]] = field(default_factory=list)
    icmp: list[IcmpResult] = field(default_factory=list)
    uevents: list[tuple[float, Uevent]] = field(default_factory=list)
    tp: list[tuple[float, TpResult]] = field(default_factory=list)
    transmitted: int = 0
    timer_at: float = float("inf")
    up: bool = True

    @property
    def orig(self) -> Mac:
        return self.mesh.primary.mac


@dataclass(eq=False)
class Lan:
    """A LAN the soft interfaces of `members` are bridged into (with hosts of its own): a
    frame a member delivers to its host goes onto the LAN, and from there into the other
    members' soft interfaces, as a Linux bridge floods it. `frames` records what went
    onto the LAN: (time, from member or None for a LAN host, frame)."""

    members: list[str]
    frames: list[tuple[float, str | None, bytes]] = field(default_factory=list)
    learnt: dict[bytes, str | None] = field(default_factory=dict)  # source MAC -> where it was seen


LAN_LATENCY = 0.00001  # a LAN hop is much faster than a mesh hop


@dataclass(eq=False)
class Segment:
    endpoints: list[tuple[SimNode, str]]
    loss: dict = field(default_factory=dict)  # (from node name, to node name) -> probability
    up: bool = True
    # deterministic loss for worked examples: drop(from name, to name, frame) -> True drops it
    drop: Callable[[str, str, bytes], bool] | None = None
    rate: float = 0.0  # bytes per second each sender may put on it (0: no limit)
    queue: float = 0.05  # seconds of frames a sender's queue holds before it drops
    # extra latency of one copy: delay(from name, to name, frame) -> seconds (reordering)
    delay: Callable[[str, str, bytes], float] | None = None
    busy: dict = field(default_factory=dict)  # sender name -> when its queue is empty


class Network:
    def __init__(self, seed: int = 1, config: MeshConfig | None = None, *, bla: bool = False) -> None:
        """`bla`: the nodes run bridge loop avoidance (the kernel's default; off here unless
        a test is about it)."""
        self.bla = bla
        self.rng = random.Random(seed)
        self.config = config or MeshConfig()
        self.now = 0.0
        self.nodes: dict[str, SimNode] = {}
        self.segments: list[Segment] = []
        self._queue: list = []
        self._seq = itertools.count()
        self._mac_counter = itertools.count(1)
        self.frames_sent = 0
        self.keep_deliveries = True
        self.lans: list[Lan] = []

    # --- building ----------------------------------------------------------------------------

    def add_node(self, name: str, config: MeshConfig | None = None) -> SimNode:
        n = next(self._mac_counter)
        soft_mac = Mac(bytes([0x02, 0x5A, 0, n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF]))
        config = config or self.config
        if not self.bla:  # no LAN behind the nodes: BLA would only hold broadcasts back for ~30 s
            config = dataclasses.replace(config, bridge_loop_avoidance=False)
        mesh = Mesh(config, soft_mac=soft_mac, rng=random.Random(self.rng.random()), now=self.now)
        node = self.nodes[name] = SimNode(name, mesh)
        self._handle(node, [])
        return node

    def add_interface(self, node: SimNode, ifname: str) -> Mac:
        n = next(self._mac_counter)
        mac = Mac(bytes([0x02, 0xBA, 0, n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF]))
        node.macs[ifname] = mac
        self._handle(node, node.mesh.add_interface(self.now, ifname, mac))
        return mac

    def link(self, a: str, b: str, loss: float = 0.0, loss_back: float | None = None, *,
             a_if: str | None = None, b_if: str | None = None) -> Segment:
        """A point-to-point link; each end gets a new interface unless one is named."""
        na, nb = self.nodes[a], self.nodes[b]
        a_if = a_if or f"if{len(na.macs)}"
        b_if = b_if or f"if{len(nb.macs)}"
        for node, ifname in ((na, a_if), (nb, b_if)):
            if ifname not in node.macs:
                self.add_interface(node, ifname)
        segment = Segment([(na, a_if), (nb, b_if)])
        segment.loss[(a, b)] = loss
        segment.loss[(b, a)] = loss if loss_back is None else loss_back
        self.segments.append(segment)
        return segment

    def segment(self, endpoints: list[tuple[str, str]]) -> Segment:
        """A shared medium (several nodes hear each other on one interface each)."""
        members = []
        for name, ifname in endpoints:
            node = self.nodes[name]
            if ifname not in node.macs:
                self.add_interface(node, ifname)
            members.append((node, ifname))
        segment = Segment(members)
        self.segments.append(segment)
        return segment

    def find_segment(self, a: str, b: str) -> Segment:
        for segment in self.segments:
            names = {n.name for n, _ in segment.endpoints}
            if {a, b} <= names:
                return segment
        raise KeyError(f"no link between {a} and {b}")

    # --- running -----------------------------------------------------------------------------

    def _push(self, when: float, kind: str, *payload) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), kind, payload))

    def _handle(self, node: SimNode, actions: list) -> None:
        for action in actions:
            if isinstance(action, Transmit):
                self._transmit(node, action)
            elif isinstance(action, Deliver):
                if self.keep_deliveries:
                    node.delivered.append((self.now, action.frame))
                for lan in self.lans:
                    if node.name in lan.members:
                        self._onto_lan(lan, node.name, action.frame)
            elif isinstance(action, ForwardingUpdate):
                node.fwd.apply(action)
            elif isinstance(action, IcmpResult):
                node.icmp.append(action)
            elif isinstance(action, Uevent):
                node.uevents.append((self.now, action))
            elif isinstance(action, TpResult):
                node.tp.append((self.now, action))
        deadline = node.mesh.next_deadline()
        if deadline < node.timer_at:
            node.timer_at = deadline
            self._push(deadline, "timer", node)

    def _transmit(self, node: SimNode, action: Transmit) -> None:
        node.transmitted += 1
        self.frames_sent += 1
        dst = action.frame[:6]
        for segment in self.segments:
            if not segment.up or (node, action.iface) not in segment.endpoints:
                continue
            at = self.now + LATENCY
            if segment.rate:
                start = max(self.now, segment.busy.get(node.name, 0.0))
                if start - self.now > segment.queue:
                    continue  # the queue is full: tail drop
                segment.busy[node.name] = start + len(action.frame) / segment.rate
                at = segment.busy[node.name] + LATENCY
            for peer, ifname in segment.endpoints:
                if peer is node or not peer.up:
                    continue
                if not dst[0] & 1 and dst != peer.macs[ifname]:
                    continue  # unicast to someone else on a shared medium
                if segment.drop is not None and segment.drop(node.name, peer.name, action.frame):
                    continue
                loss = segment.loss.get((node.name, peer.name), 0.0)
                if loss and self.rng.random() < loss:
                    continue
                extra = segment.delay(node.name, peer.name, action.frame) if segment.delay else 0.0
                self._push(at + extra, "rx", peer, ifname, action.frame)

    def run_until(self, until: float) -> None:
        while self._queue and self._queue[0][0] <= until:
            when, _, kind, payload = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            if kind == "timer":
                node = payload[0]
                if when != node.timer_at:
                    continue  # superseded
                node.timer_at = float("inf")
                if node.up:
                    self._handle(node, node.mesh.tick(self.now))
            elif kind == "rx":
                node, ifname, frame = payload
                if node.up:
                    self._handle(node, node.mesh.receive(self.now, ifname, frame))
            elif kind == "host":
                node, frame = payload
                if node.up:
                    self._handle(node, node.mesh.soft_iface_frame(self.now, frame))
        self.now = until

    def run_for(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    # --- driving nodes -----------------------------------------------------------------------

    def bridge(self, members: list[str]) -> Lan:
        """Bridge these nodes' soft interfaces into one LAN (see Lan)."""
        lan = Lan(list(members))
        self.lans.append(lan)
        return lan

    def lan_send(self, lan: Lan, frame: bytes) -> None:
        """A host on the LAN sends a frame: it reaches every member's soft interface."""
        self._onto_lan(lan, None, frame)

    def _onto_lan(self, lan: Lan, sender: str | None, frame: bytes) -> None:
        """As a learning bridge: a unicast frame goes only where its destination was seen
        sending (nowhere if that was the LAN side), anything else to every other member."""
        lan.frames.append((self.now, sender, frame))
        dst, src = bytes(frame[0:6]), bytes(frame[6:12])
        if not src[0] & 1:
            lan.learnt[src] = sender
        targets = lan.members
        if not dst[0] & 1 and dst in lan.learnt:
            targets = [lan.learnt[dst]] if lan.learnt[dst] is not None else []
        for name in targets:
            if name != sender and self.nodes[name].up:
                self._push(self.now + LAN_LATENCY, "host", self.nodes[name], frame)

    def host_send(self, name: str, frame: bytes) -> None:
        node = self.nodes[name]
        self._handle(node, node.mesh.soft_iface_frame(self.now, frame))

    def sent_by(self, name: str, run) -> list[bytes]:
        """The frames node `name` transmits while run() drives the network."""
        node, out, transmit = self.nodes[name], [], self._transmit

        def spy(n: SimNode, action: Transmit) -> None:
            if n is node:
                out.append(action.frame)
            transmit(n, action)
        self._transmit = spy
        try:
            run()
        finally:
            self._transmit = transmit
        return out

    def set_option(self, name: str, key: str, value) -> None:
        node = self.nodes[name]
        self._handle(node, node.mesh.set_option(self.now, key, value))

    def ping(self, name: str, dst: Mac, seqno: int, ttl: int = 50, uid: int = 0, record_route: bool = False) -> None:
        node = self.nodes[name]
        self._handle(node, node.mesh.ping(self.now, dst, seqno=seqno, ttl=ttl, uid=uid, record_route=record_route))

    def stop(self, name: str) -> None:
        self.nodes[name].up = False

    def start(self, name: str) -> None:
        node = self.nodes[name]
        node.up = True
        node.timer_at = float("inf")
        self._handle(node, node.mesh.tick(self.now))

    # --- looking at the result ---------------------------------------------------------------

    def next_hop(self, a: str, b: str):
        """The node name that `a` routes through toward `b`'s originator, or None."""
        router = self._router(a, b)
        if router is None:
            return None
        return self.owner_of(router.addr)

    def _router(self, a: str, b: str):
        orig_node = self.nodes[a].mesh.originators.get(self.nodes[b].orig)
        return orig_node.router() if orig_node else None

    def tq(self, a: str, b: str) -> int:
        router = self._router(a, b)
        return self.nodes[a].mesh.algo.metric(router) if router else 0

    def owner_of(self, mac: bytes) -> str | None:
        for node in self.nodes.values():
            if mac in node.macs.values():
                return node.name
        return None
