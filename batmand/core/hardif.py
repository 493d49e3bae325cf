"""Hard interfaces attached to the mesh and the one-hop neighbours heard on each."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import Mac


@dataclass(eq=False)
class HardifNeigh:
    """A MAC heard on one hard interface (batadv_hardif_neigh_node)."""

    addr: Mac
    orig: Mac  # originator this neighbour was first learnt for
    last_seen: float


@dataclass(eq=False)
class HardInterface:
    """One hard interface (batadv_hard_iface). Compared by identity: it is the key of the
    per-outgoing-interface routing tables."""

    name: str
    mac: Mac
    mtu: int = 1500
    wifi: bool = False
    hop_penalty: int = 0  # per-interface penalty (batctl hardif IFACE hp), kernel default 0
    active: bool = True
    # B.A.T.M.A.N. IV: next own OGM seqno (always "last scheduled + 1")
    ogm_seqno: int = 0
    neighbours: dict[Mac, HardifNeigh] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"<HardInterface {self.name} {self.mac}>"

    def neigh_get_or_create(self, addr: Mac, orig: Mac, now: float, limit: int) -> HardifNeigh | None:
        neigh = self.neighbours.get(addr)
        if neigh is None:
            if len(self.neighbours) >= limit:
                return None
            neigh = self.neighbours[addr] = HardifNeigh(addr, orig, now)
        return neigh

    def no_broadcast(self, orig: Mac, orig_neigh: Mac | None) -> str | None:
        """Why a (re)broadcast need not leave this interface (batadv_hardif_no_broadcast):
        nobody listens, or the only neighbour is the originator or the one we got it from."""
        if not self.neighbours:
            return "no recipient"
        if len(self.neighbours) > 1:
            return None
        (only,) = self.neighbours.values()
        if only.orig == orig:
            return "only neighbour is the originator"
        if orig_neigh is not None and only.orig == orig_neigh:
            return "only neighbour is the sender"
        return None
