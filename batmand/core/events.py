"""What the protocol core hands back to its caller: plain immutable records."""

from __future__ import annotations

from dataclasses import dataclass

from batmand.wire.mac import Mac  # the module, not the package: workers load no more of wire


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send `frame` (a whole Ethernet frame) out of hard interface `iface`."""

    iface: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand `frame` (an Ethernet frame) to the host through the soft interface."""

    frame: bytes


@dataclass(frozen=True, slots=True)
class OrigRoute:
    """How to reach an originator: next hop, the hard interface to use, its TT version."""

    next_hop: Mac
    iface: str
    ttvn: int


@dataclass(frozen=True, slots=True)
class ClientRoute:
    """Which originator serves a client (mac, vid); `roam` makes senders use ttvn - 1."""

    orig: Mac
    roam: bool = False


@dataclass(frozen=True, slots=True)
class ForwardingUpdate:
    """Changes to the data path's tables; a value of None removes the key."""

    origs: dict  # Mac -> OrigRoute | None
    clients: dict  # (Mac, vid) -> ClientRoute | None
    local_clients: dict  # (Mac, vid) -> True (ours), False (deleted or roamed, not committed yet), None (gone)
    own_ttvn: int | None = None  # our TT version when it changed (unicast to us carries it)
    slow_path: object = None  # forwarding.SlowPath when it changed: the frames the data plane must leave to us


@dataclass(frozen=True, slots=True)
class IcmpResult:
    """An answer to one of our own batman-adv pings / traceroute probes."""

    msg_type: int  # IcmpMsgType
    orig: Mac  # who answered
    seqno: int
    uid: int
    ttl: int
    now: float
    rr: tuple = ()


@dataclass(frozen=True, slots=True)
class Uevent:
    """What the kernel announces as a uevent of the mesh interface (BATTYPE, BATACTION,
    BATDATA): e.g. gw add/change with the gateway's originator, gw del without data."""

    type: str  # "gw"
    action: str  # "add", "change", "del"
    data: str | None = None


@dataclass(frozen=True, slots=True)
class TpResult:
    """The end of one of our throughput-meter tests, as the kernel reports it to batctl:
    `result` is COMPLETE (3) with the test time and the acknowledged bytes (also for a
    cancelled test), or an error reason (128..133) with both 0."""

    cookie: int  # uid << 16 | session[0] << 8 | session[1]
    dst: Mac
    result: int  # tp_meter.TpReason
    test_time_ms: int
    total_bytes: int
