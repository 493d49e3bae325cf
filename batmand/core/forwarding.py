"""The forwarding table the data path reads: destination client -> originator -> next hop,
and which frames it must leave to the core (the slow path).

The core publishes ForwardingUpdate records; whoever forwards data frames (the inline data
path, or each worker process) applies them and looks destinations up here. Two levels keep
updates small: a route change touches one originator entry, not every client behind it.

The slow-path rules keep the data plane feature-agnostic: a feature of the core that must
see some frames on the host path (DAT answering ARP, the gateway client's DHCP, BLA,
multicast) publishes rules saying which, and the data plane hands those frames to the core
instead of moving them itself (batmand.dataplane.decision applies them). Forwarded frames
are never subject to them: like the kernel's, features act where frames enter or leave
the soft interface."""

from __future__ import annotations

from dataclasses import dataclass

from batmand.wire.mac import Mac  # the module, not the package: workers load no more of wire

from .events import ClientRoute, ForwardingUpdate, OrigRoute

FROM_HOST = "from_host"  # frames the host sends into the soft interface (bat0 TX)
TO_HOST = "to_host"  # UNICAST frames from the mesh that the soft interface would deliver (bat0 RX)


@dataclass(frozen=True, slots=True)
class SlowRule:
    """Frames in `direction` with this ethertype (the one behind a single 802.1Q tag) and,
    when given, this IP protocol (IPv4 protocol, IPv6 next header) and destination port
    (the 16 bits at offset 2 of the L4 header: UDP's and TCP's). A frame too short to
    tell counts as matching."""

    direction: str  # FROM_HOST or TO_HOST
    ethertype: int
    ip_proto: int | None = None
    dst_port: int | None = None

    def __post_init__(self) -> None:
        if self.direction not in (FROM_HOST, TO_HOST):
            raise ValueError(f"slow-path rule direction {self.direction!r} (choose {FROM_HOST} or {TO_HOST})")
        if self.dst_port is not None and self.ip_proto is None:
            raise ValueError("a slow-path rule with a port needs its IP protocol")


@dataclass(frozen=True, slots=True)
class SlowPath:
    """Which frames the data plane must hand to the core. Empty: none beyond those it
    leaves to the core anyway (broadcasts, unknown clients, stale TT versions...)."""

    rules: frozenset = frozenset()  # of SlowRule
    multicast: bool = False  # UNICAST frames to the host whose inner destination is multicast
    clients: frozenset = frozenset()  # (Mac, vid): every frame from or to these, both directions
    from_host_sources: frozenset = frozenset()  # (Mac, vid): frames from the host sent by these
    # (Mac, vid) or None: frames to the host from any other source (BLA: sources we have not
    # claimed); those from these are delivered and reported seen (take_seen)
    to_host_sources: frozenset | None = None
    # last hops (the outer source MAC) whose UNICAST for us the core decides (BLA: a gateway
    # of our own LAN, whose unicast for our host came over the LAN already)
    from_last_hops: frozenset = frozenset()

    def l4(self, direction: str) -> bool:
        """Whether a rule in `direction` reads the IP protocol (then the data plane's
        cached decisions must be keyed by it too)."""
        return any(r.direction == direction and r.ip_proto is not None for r in self.rules)

    def port_protos(self, direction: str) -> frozenset:
        """The IP protocols whose destination port a rule in `direction` reads: for any
        other protocol the 16 bits there (ICMP's checksum, say) decide nothing, and the
        data plane's keys leave them out (else every ping would be a new key)."""
        return frozenset(r.ip_proto for r in self.rules
                         if r.direction == direction and r.ip_proto is not None and r.dst_port is not None)


NO_SLOW_PATH = SlowPath()  # what a feature that needs nothing contributes (the same object every time)


class ForwardingTable:
    def __init__(self) -> None:
        self.origs: dict[Mac, OrigRoute] = {}
        self.clients: dict[tuple[Mac, int], ClientRoute] = {}
        # True: our client; False: still in our table but deleted or roamed away (frames
        # for it need the slow path's TTVN handling)
        self.local_clients: dict[tuple[Mac, int], bool] = {}
        self.own_ttvn = 0
        self.slow_path = SlowPath()

    def apply(self, update: ForwardingUpdate) -> None:
        if update.own_ttvn is not None:
            self.own_ttvn = update.own_ttvn
        if update.slow_path is not None:
            self.slow_path = update.slow_path
        for table, changes in ((self.origs, update.origs), (self.clients, update.clients)):
            for key, value in changes.items():
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = value
        for key, state in update.local_clients.items():
            if state is None:
                self.local_clients.pop(key, None)
            else:
                self.local_clients[key] = state

    def snapshot(self) -> ForwardingUpdate:
        """The whole table as one update (applied to an empty table, it makes this one)."""
        return ForwardingUpdate(origs=dict(self.origs), clients=dict(self.clients),
                                local_clients=dict(self.local_clients), own_ttvn=self.own_ttvn,
                                slow_path=self.slow_path)

    def lookup(self, dst: bytes, vid: int) -> tuple[Mac, Mac, str, int] | None:
        """(originator, next-hop MAC, hard interface, ttvn to put in the header) or None."""
        client = self.clients.get((dst, vid))
        if client is None:
            return None
        route = self.origs.get(client.orig)
        if route is None:
            return None
        ttvn = (route.ttvn - 1) & 0xFF if client.roam else route.ttvn
        return client.orig, route.next_hop, route.iface, ttvn
