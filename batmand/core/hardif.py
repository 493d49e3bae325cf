"""Hard interfaces attached to the mesh and the one-hop neighbours heard on each."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import Mac

from .eviction import EvictionOrder


@dataclass(eq=False)
class HardifNeigh:
    """A MAC heard on one hard interface (batadv_hardif_neigh_node)."""

    addr: Mac
    orig: Mac  # originator this neighbour was first learnt for
    last_seen: float
    # B.A.T.M.A.N. V: ELP state and the link throughput estimate (an EWMA, 100 kbit/s units)
    elp_latest_seqno: int = 0
    elp_interval: int = 0
    throughput_internal: int = 0  # linux/average.h EWMA, 10 fractional bits
    last_unicast_tx: float = float("-inf")

    def throughput_add(self, value: int) -> None:
        """ewma_throughput_add: weight 1/8, 10 fractional bits (DECLARE_EWMA(throughput, 10, 8))."""
        internal = self.throughput_internal
        self.throughput_internal = ((internal << 3) - internal + (value << 10)) >> 3 if internal else value << 10

    @property
    def throughput(self) -> int:
        return self.throughput_internal >> 10


@dataclass
class WifiStation:
    """What nl80211 reports about one station (for the Wi-Fi throughput estimate)."""

    expected_throughput_kbps: int | None = None
    tx_bitrate_100kbps: int | None = None


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
    # B.A.T.M.A.N. IV: next own OGM seqno (always "last scheduled + 1"); None: random at enable
    ogm_seqno: int | None = None
    neighbours: dict[Mac, HardifNeigh] = field(default_factory=dict)
    eviction: EvictionOrder = field(default_factory=EvictionOrder)  # which neighbour makes room first
    # B.A.T.M.A.N. V
    elp_interval_ms: int = 500  # batctl hardif IFACE et
    elp_seqno: int | None = None  # None: random at enable
    throughput_override: int = 0  # 100 kbit/s units, 0 = estimate (batctl hardif IFACE to)
    link_speed_mbit: int | None = None  # from ethtool, None when the driver does not say
    full_duplex: bool = False
    stations: dict = field(default_factory=dict)  # Wi-Fi: neighbour MAC -> WifiStation
    default_throughput_warned: bool = False

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
