"""Originators and their neighbours (the kernel's originator.c / types.h), algorithm-neutral.
The per-outgoing-interface records (NeighIfInfo, OrigIfInfo) are the base classes a routing
algorithm extends with its own fields (the kernel embeds its bat_iv / bat_v sub-structs in
them): the algorithm names its subclasses as its `neigh_ifinfo` / `orig_ifinfo` records
(algorithm.py) and creates them; the core creates `mesh.algo.orig_ifinfo` records.

Per-outgoing-interface tables: key None is the default table (locally generated traffic);
a HardInterface key holds the routers for traffic that arrived on that interface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from batmand.wire import Mac

from .eviction import EvictionOrder
from .hardif import HardifNeigh, HardInterface


@dataclass(eq=False, slots=True)
class NeighIfInfo:
    """Per (neighbour, outgoing interface) (batadv_neigh_ifinfo): all of it is the
    algorithm's (the kernel's last_ttl here is written, never read: left out, as there is
    one of these per neighbour, originator and outgoing interface)."""


@dataclass(eq=False, slots=True)
class OrigIfInfo:
    """Per (originator, outgoing interface) (batadv_orig_ifinfo): the selected router and the
    seqno state."""

    router: NeighNode | None = None
    last_real_seqno: int = 0
    last_ttl: int = 0
    seqno_reset: float = float("-inf")


_SEVERAL = object()  # PerOutif.if_key when if_info is a dict of the interfaces' records


class PerOutif:
    """The records of an originator or neighbour per outgoing interface (the kernel's ifinfo
    lists), without a dict for the usual one hard interface (a dict is 224 bytes, and there
    is one per neighbour of every originator): the default table's record (outif None) in
    `if_default`; the one interface's record in `if_info` with the interface in `if_key`,
    or once there are two or more, a dict of them in `if_info` (`if_key` is _SEVERAL)."""

    __slots__ = ()

    def ifinfo_get(self, outif):
        if outif is None:
            return self.if_default
        key = self.if_key
        if outif is key:
            return self.if_info
        return self.if_info.get(outif) if key is _SEVERAL else None

    def ifinfo_new(self, outif, make: Callable):
        """The record for `outif`, made by `make` (the algorithm's record class) if none."""
        info = self.ifinfo_get(outif)
        if info is None:
            info = make()
            if outif is None:
                self.if_default = info
            elif self.if_key is None:
                self.if_key, self.if_info = outif, info
            elif self.if_key is _SEVERAL:
                self.if_info[outif] = info
            else:
                self.if_key, self.if_info = _SEVERAL, {self.if_key: self.if_info, outif: info}
        return info

    def ifinfo_pop(self, outif):
        """Drop the record for `outif` (None if there was none)."""
        if outif is None:
            info, self.if_default = self.if_default, None
            return info
        key = self.if_key
        if outif is key:
            info, self.if_key, self.if_info = self.if_info, None, None
            return info
        if key is not _SEVERAL:
            return None
        several = self.if_info
        info = several.pop(outif, None)
        if len(several) == 1:  # back to the one slot
            ((self.if_key, self.if_info),) = several.items()
        return info

    def ifinfo_items(self) -> list:
        """(outif, record) for each table that has one."""
        items = [] if self.if_default is None else [(None, self.if_default)]
        key = self.if_key
        if key is _SEVERAL:
            items.extend(self.if_info.items())
        elif key is not None:
            items.append((key, self.if_info))
        return items

    def ifinfo_values(self) -> list:
        return [info for _, info in self.ifinfo_items()]


@dataclass(eq=False, slots=True)
class NeighNode(PerOutif):
    """A next hop toward an originator: neighbour MAC on one incoming hard interface."""

    addr: Mac
    if_incoming: HardInterface
    orig_node: "OrigNode"  # the neighbour's own originator entry
    last_seen: float
    # its NeighIfInfo records (PerOutif)
    if_default: NeighIfInfo | None = None
    if_key: object = None
    if_info: NeighIfInfo | dict | None = None


@dataclass(eq=False, slots=True)
class OrigNode(PerOutif):
    orig: Mac
    last_seen: float
    neighbours: dict = field(default_factory=dict)  # (addr, HardInterface) -> NeighNode
    # its OrigIfInfo records (PerOutif)
    if_default: OrigIfInfo | None = None
    if_key: object = None
    if_info: OrigIfInfo | dict | None = None
    # translation table state of this originator
    last_ttvn: int = 0
    has_tt: bool = False  # BATADV_ORIG_CAPA_HAS_TT initialised
    # tt_crcs as vid, crc, vid, crc, ..., or only the CRC when the untagged VLAN is the only
    # one, as for most originators (a dict per originator would be 224 bytes)
    crcs_flat: tuple | int = ()
    tt_buff: list | None = None  # last changes received (to answer diff requests)
    # broadcast duplicate window
    last_bcast_seqno: int = 0
    bcast_bits: int = 0
    bcast_seqno_reset: float = float("-inf")
    neigh_generation: int = 0  # counts changes of the neighbour set (what the algorithm derived from them is stale)
    # (seqno, containers, the handlers that want each copy): the last OGM whose containers
    # went to the TVLV handlers (TvlvRegistry.ogm_received); None: hand over the next copy
    tvlvs_seen: tuple | None = None

    def drop_neighbours(self, keys) -> None:
        for key in keys:
            del self.neighbours[key]
        if keys:
            self.neigh_generation += 1

    @property
    def tt_crcs(self) -> dict:
        """vid -> crc, recomputed from our global table (what its announcements must match)."""
        flat = self.crcs_flat
        if type(flat) is int:
            return {0: flat}
        return dict(zip(flat[::2], flat[1::2]))

    @tt_crcs.setter
    def tt_crcs(self, crcs: dict) -> None:
        if len(crcs) == 1 and 0 in crcs:
            self.crcs_flat = crcs[0]
        else:
            self.crcs_flat = tuple(x for item in crcs.items() for x in item)

    def router(self, outif=None) -> NeighNode | None:
        info = self.if_default if outif is None else self.if_info if outif is self.if_key else self.ifinfo_get(outif)
        return info.router if info else None


class OriginatorTable:
    """All known originators, bounded: a peer cannot make us store more than the configured
    number. A full table makes room by evicting the least recently heard originator without
    real evidence (`evidence(orig_node)`: a route, or in IV echoes of our OGMs), so a flood of
    spoofed originators cannot keep a real new neighbour out; when every entry has evidence,
    the newcomer is refused. Hard-interface neighbours are bounded the same way per interface
    (`neigh_evidence(iface, hardif_neigh)`). The limits are read from `config` at each use,
    so a reload that changes them takes effect."""

    def __init__(self, config, counters, *, evidence: Callable[[OrigNode], bool],
                 neigh_evidence: Callable[[HardInterface, object], bool],
                 forget: Callable[[OrigNode], None]) -> None:
        self.nodes: dict[Mac, OrigNode] = {}
        self.config = config
        self.counters = counters
        self.evidence = evidence
        self.neigh_evidence = neigh_evidence
        self.forget = forget  # drops everything that hangs off an originator (the mesh's purge)
        self.candidates = EvictionOrder()

    def get(self, addr: Mac) -> OrigNode | None:
        return self.nodes.get(addr)

    def get_or_create(self, addr: Mac, now: float) -> OrigNode | None:
        node = self.nodes.get(addr)
        if node is not None:
            self.candidates.touch(addr)
            return node
        while len(self.nodes) >= self.config.max_originators:
            weakest = self.candidates.pop_weakest(self._is_weak)
            if weakest is None:
                self.counters.drop("originator_table_full")
                return None
            self.counters.drop("originator_evicted")
            self.remove(self.nodes[weakest])
        addr = Mac(addr)  # one object: the table's key, the eviction order's and the node's address
        node = self.nodes[addr] = OrigNode(addr, last_seen=now)
        self.candidates.add(addr)
        return node

    def _is_weak(self, addr: Mac) -> bool:
        node = self.nodes.get(addr)
        return node is not None and not self.evidence(node)

    def remove(self, node: OrigNode) -> None:
        self.forget(node)
        self.nodes.pop(node.orig, None)
        self.candidates.discard(node.orig)

    def review(self, node: OrigNode) -> None:
        """The purge's pass: an entry that has lost its evidence may be evicted again."""
        if not self.evidence(node):
            self.candidates.keep(node.orig)

    def neigh_get_or_create(self, orig_node: OrigNode, hard_iface: HardInterface, addr: Mac,
                            orig_neigh: OrigNode, now: float) -> NeighNode | None:
        """batadv_neigh_node_get_or_create (+ the hard interface's neighbour entry)."""
        key = (addr, hard_iface)
        neigh = orig_node.neighbours.get(key)
        if neigh is None:
            if len(orig_node.neighbours) >= self.config.max_neighbours_per_originator:
                self.counters.drop("neighbour_table_full")
                return None
            hardif_neigh = self.hardif_neigh_get_or_create(hard_iface, addr, orig_node.orig, now)
            if hardif_neigh is None:
                return None
            # the neighbour's address is its originator's (IV): one Mac object for both
            mac = orig_neigh.orig if orig_neigh.orig == addr else Mac(addr)
            # the key: the hard interface neighbour's, one tuple for every originator heard through it
            neigh = orig_node.neighbours[hardif_neigh.key] = NeighNode(mac, hard_iface, orig_neigh, now)
            orig_node.neigh_generation += 1
        else:
            hard_iface.eviction.touch(addr)
            neigh.orig_node = orig_neigh
        return neigh

    def hardif_neigh_get_or_create(self, iface: HardInterface, addr: Mac, orig: Mac, now: float):
        """The neighbour entry on one hard interface, bounded like the originators."""
        neigh = iface.neighbours.get(addr)
        if neigh is not None:
            iface.eviction.touch(addr)
            return neigh
        while len(iface.neighbours) >= self.config.max_hardif_neighbours:
            weakest = iface.eviction.pop_weakest(lambda a: a in iface.neighbours and
                                                 not self.neigh_evidence(iface, iface.neighbours[a]))
            if weakest is None:
                self.counters.drop("hardif_neighbour_table_full")
                return None
            self.counters.drop("hardif_neighbour_evicted")
            del iface.neighbours[weakest]
        mac = Mac(addr)
        neigh = iface.neighbours[addr] = HardifNeigh(mac, Mac(orig), now, key=(mac, iface))
        iface.eviction.add(addr)
        return neigh
