"""The forwarding table the data path reads: destination client -> originator -> next hop.

The core publishes ForwardingUpdate records; whoever forwards data frames (the inline data
path, or each worker process) applies them and looks destinations up here. Two levels keep
updates small: a route change touches one originator entry, not every client behind it."""

from __future__ import annotations

from batmand.wire import Mac

from .events import ClientRoute, ForwardingUpdate, OrigRoute


class ForwardingTable:
    def __init__(self) -> None:
        self.origs: dict[Mac, OrigRoute] = {}
        self.clients: dict[tuple[Mac, int], ClientRoute] = {}
        # True: our client; False: still in our table but deleted or roamed away (frames
        # for it need the slow path's TTVN handling)
        self.local_clients: dict[tuple[Mac, int], bool] = {}
        self.own_ttvn = 0

    def apply(self, update: ForwardingUpdate) -> None:
        if update.own_ttvn is not None:
            self.own_ttvn = update.own_ttvn
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
