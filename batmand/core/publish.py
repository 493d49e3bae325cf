"""Publishing the forwarding table the data plane reads: what changed since the last call,
as one ForwardingUpdate. The published state is kept in a ForwardingTable of its own, the
same the data plane applies the updates to, so that only real changes go out."""

from __future__ import annotations

from batmand.wire import Mac

from .events import ClientRoute, ForwardingUpdate, OrigRoute
from .forwarding import ForwardingTable, SlowPath


class Publisher:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.published = ForwardingTable()  # what the data plane holds
        self.dirty_origs: set[Mac] = set()
        self._slow_path: list = []  # the features' contributions: () -> SlowPath
        self._combined: tuple = ((), SlowPath())  # the last parts and their union

    def need_slow_path(self, contribution) -> None:
        """A feature's frames the data plane must leave to the core (ARP while DAT is on,
        DHCP for a gateway client...): contribution() -> SlowPath, asked on every publish."""
        self._slow_path.append(contribution)

    def slow_path(self) -> SlowPath:
        parts = tuple(contribution() for contribution in self._slow_path)
        if parts == self._combined[0]:
            return self._combined[1]  # asked after every batch of frames: mostly unchanged
        combined = self._combine(parts)
        self._combined = (parts, combined)
        return combined

    @staticmethod
    def _combine(parts: tuple) -> SlowPath:
        watched = [p.to_host_sources for p in parts if p.to_host_sources is not None]
        return SlowPath(rules=frozenset().union(*(p.rules for p in parts)), multicast=any(p.multicast for p in parts),
                        clients=frozenset().union(*(p.clients for p in parts)),
                        from_host_sources=frozenset().union(*(p.from_host_sources for p in parts)),
                        from_last_hops=frozenset().union(*(p.from_last_hops for p in parts)),
                        to_host_sources=frozenset.intersection(*watched) if watched else None)

    def orig_route(self, orig: Mac) -> OrigRoute | None:
        node = self.mesh.originators.get(orig)
        router = node.router() if node else None
        if router is None:
            return None
        return OrigRoute(router.addr, router.if_incoming.name, node.last_ttvn)

    def take(self) -> ForwardingUpdate | None:
        tt, published = self.mesh.tt, self.published
        origs = {}
        for orig in self.dirty_origs:
            route = self.orig_route(orig)
            if published.origs.get(orig) != route:
                origs[orig] = route
                tt.dirty_clients.update(tt.by_orig.get(orig, ()))  # their clients' best originator
        self.dirty_origs.clear()
        clients = {}
        for key in tt.dirty_clients:
            best = tt.best_orig(*key)
            route = ClientRoute(best, tt.is_roaming(*key)) if best is not None else None
            if published.clients.get(key) != route:
                clients[key] = route
        tt.dirty_clients.clear()
        local = {key: (tt.is_my_client(*key) if key in tt.local else None) for key in tt.dirty_local}
        tt.dirty_local.clear()
        ttvn = tt.ttvn if tt.ttvn != published.own_ttvn else None
        wanted = self.slow_path()
        slow = wanted if wanted != published.slow_path else None
        if not (origs or clients or local or ttvn is not None or slow is not None):
            return None
        update = ForwardingUpdate(origs, clients, local, ttvn, slow_path=slow)
        published.apply(update)
        return update
