"""Originator upkeep (the kernel's originator.c and the route part of routing.c): the
router of each originator per outgoing interface, the originator worker that times out
neighbours and originators, and what goes when an originator or an interface's routes go."""

from __future__ import annotations

from .hardif import HardInterface
from .originator import OrigNode


class Routes:
    def __init__(self, mesh) -> None:
        self.mesh = mesh

    def update(self, orig_node: OrigNode, outif, neigh, now: float | None = None) -> None:
        """batadv_update_route: a route lost makes us forget what the originator announced;
        a new one lets a TT request that had no route go out."""
        mesh = self.mesh
        info = orig_node.ifinfo_new(outif, mesh.algo.orig_ifinfo)
        old = info.router
        info.router = neigh
        if old is not None and neigh is None:
            mesh.tt.global_del_orig(orig_node)
        if outif is None:
            mesh.route_changed(orig_node)
            if old is None and neigh is not None and now is not None:
                mesh.tt.route_appeared(now, orig_node)

    def reselect(self, orig_node: OrigNode) -> None:
        """batadv_find_best_neighbor for every table, after neighbours went."""
        metric = self.mesh.algo.metric
        for outif in [None] + self.mesh.active_ifaces():
            best = None
            for neigh in orig_node.neighbours.values():
                if best is None or metric(neigh, outif) > metric(best, outif):
                    best = neigh
            if orig_node.router(outif) is not best:
                self.update(orig_node, outif, best)

    def forget_via(self, iface: HardInterface) -> None:
        """An interface went down or away: the neighbours heard on it and the tables for
        traffic that came in on it."""
        for orig_node in list(self.mesh.originators.nodes.values()):
            orig_node.drop_neighbours([k for k in orig_node.neighbours if k[1] is iface])
            orig_node.ifinfo_pop(iface)
            for neigh in orig_node.neighbours.values():
                neigh.ifinfo_pop(iface)
            self.reselect(orig_node)

    def forget_originator(self, orig_node: OrigNode) -> None:
        """An originator leaves the table (timed out or evicted): its routes, clients and
        fragments go with it."""
        mesh = self.mesh
        mesh.reassembly.forget(orig_node.orig)
        for outif in [None] + mesh.active_ifaces():
            if orig_node.router(outif) is not None:
                self.update(orig_node, outif, None)
        mesh.tt.global_del_orig(orig_node)
        mesh.route_changed(orig_node)
        mesh.tell_originator_removed(orig_node)

    def purge(self, now: float) -> None:
        """The originator worker (every second): time out neighbours and originators, and
        list the entries without evidence (again) as the ones a full table may evict."""
        mesh = self.mesh
        neigh_timeout = mesh.config.purge_timeout
        originators = mesh.originators
        mesh.reassembly.purge(now)
        orig_cutoff, neigh_cutoff = now - 2 * neigh_timeout, now - neigh_timeout
        for orig_node in list(originators.nodes.values()):
            if orig_node.last_seen < orig_cutoff:
                originators.remove(orig_node)
                continue
            stale = [k for k, n in orig_node.neighbours.items()
                     if n.last_seen < neigh_cutoff or not n.if_incoming.active]
            if stale:
                orig_node.drop_neighbours(stale)
                self.reselect(orig_node)
            originators.review(orig_node)
        originators.candidates.prune(originators.nodes)
        for iface in mesh.ifaces:
            for addr in [a for a, n in iface.neighbours.items() if now - n.last_seen > neigh_timeout]:
                del iface.neighbours[addr]
            for addr, neigh in iface.neighbours.items():
                if not mesh.algo.neigh_has_evidence(iface, neigh):
                    iface.eviction.keep(addr)
            iface.eviction.prune(iface.neighbours)
        mesh.tell_purged(now)
