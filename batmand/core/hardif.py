"""Hard interfaces attached to the mesh and the one-hop neighbours heard on each."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import Mac

from .config import HardifConfig
from .eviction import EvictionOrder


@dataclass(eq=False, slots=True)
class HardifNeigh:
    """A MAC heard on one hard interface (batadv_hardif_neigh_node)."""

    addr: Mac
    orig: Mac  # originator this neighbour was first learnt for
    last_seen: float
    algo: object = None  # the routing algorithm's own state (V: ELP and the link estimate)
    key: tuple = ()  # (addr, interface): the key of the originators' neighbour entries through it


@dataclass
class WifiStation:
    """What nl80211 reports about one station (for the Wi-Fi throughput estimate)."""

    expected_throughput_kbps: int | None = None
    tx_bitrate_100kbps: int | None = None


@dataclass
class LinkFacts:
    """What the daemon measures about a hard interface's link, for an algorithm that
    estimates link throughput (ethtool's speed and duplex, nl80211's stations)."""

    speed_mbit: int | None = None  # None when the driver does not say
    full_duplex: bool = False
    stations: dict = field(default_factory=dict)  # Wi-Fi: neighbour MAC -> WifiStation


@dataclass(eq=False)
class HardInterface:
    """One hard interface (batadv_hard_iface). Compared by identity: it is the key of the
    per-outgoing-interface routing tables."""

    name: str
    mac: Mac
    mtu: int = 1500
    wifi: bool = False
    active: bool = True
    settings: HardifConfig = field(default_factory=HardifConfig)  # batctl hardif IFACE et|to|hp
    link: LinkFacts = field(default_factory=LinkFacts)
    neighbours: dict[Mac, HardifNeigh] = field(default_factory=dict)
    eviction: EvictionOrder = field(default_factory=EvictionOrder)  # which neighbour makes room first
    algo: object = None  # the routing algorithm's own state (IV: the OGM seqno; V: ELP)

    def __repr__(self) -> str:
        return f"<HardInterface {self.name} {self.mac}>"

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
