"""The routing algorithm interface (the kernel's struct batadv_algo_ops) and the registry
the algorithms add themselves to (batadv_algo_register). Nothing outside an algorithm's
own module asks which one runs: the mesh, the listings and the daemon go through this.

Algorithm-specific state lives in the algorithm's own objects, as the kernel's bat_iv/bat_v
sub-structs: on hard interfaces and their neighbours in an `algo` slot; per (originator or
neighbour, outgoing interface) in the records themselves, which the algorithm extends by
subclassing (there are many of those: no second object, no indirection)."""

from __future__ import annotations

from typing import Callable, Protocol

from .originator import NeighIfInfo, OrigIfInfo

Receiver = Callable[[float, object, object, bytes], None]  # (now, hard interface, decoded frame, raw)
Parser = Callable[[bytes], list]  # raw frame -> its packets as the receiver reads them (WireError: malformed)


class RoutingAlgorithm(Protocol):
    name: str  # as batctl ra shows it
    receives: tuple[int, ...]  # packet types of its announcements
    metric_key: str  # the listings' metric column, as batctl's JSON calls it ("tq", "throughput")
    estimates_links: bool  # its metric needs link speeds and Wi-Fi station data from the daemon
    # its per-outgoing-interface records: slotted subclasses of originator.NeighIfInfo and
    # OrigIfInfo with its own fields (register() puts the base classes if it has none)
    neigh_ifinfo: type
    orig_ifinfo: type

    def __init__(self, mesh) -> None: ...

    # interface operations
    def iface_enabled(self, now: float, iface) -> None: ...
    def iface_disabled(self, iface) -> None: ...
    def iface_deactivated(self, iface) -> None: ...

    # announcements and timers
    def receivers(self) -> dict[int, Receiver]: ...
    # optional: packet types read in place instead of by decode_frame (what the receiver gets)
    def parsers(self) -> dict[int, Parser]: ...
    def tick(self, now: float) -> None: ...
    def next_deadline(self) -> float: ...

    # neighbour and originator operations
    def metric(self, neigh, outif=None) -> int: ...
    def orig_has_evidence(self, orig_node) -> bool: ...
    def neigh_has_evidence(self, iface, neigh) -> bool: ...
    def originator_metric(self, neigh, outif=None) -> int | None: ...  # the listing's value (batctl's units)
    def neighbour_metric(self, hardif_neigh) -> int | None: ...

    # gateway selection (algo_ops.gw): the gateways are gateway.GatewayNode records
    gw_sel_class_default: int
    gw_sel_class_max: int
    def gw_metric(self, orig_node) -> int | None: ...  # toward the gateway (tq, throughput); None: no route
    def gw_best(self, gateways: list, sel_class: int): ...  # the one to select, or None
    def gw_is_eligible(self, current, candidate, sel_class: int) -> bool: ...  # worth choosing again?

    # sequence numbers across restarts
    def seqno_state(self) -> dict: ...
    def restore_seqnos(self, state: dict, ahead: int) -> None: ...


def jittered(mesh, now: float, interval_ms: int) -> float:
    """When a periodic announcement is next due: interval - jitter + a random [0, 2 jitter)
    ms, as the kernel schedules OGMs and ELPs (so that nodes do not fall into step)."""
    jitter = mesh.config.jitter_ms
    return now + (interval_ms - jitter + mesh.rng.randrange(2 * jitter)) / 1000.0


def algo_state(record, make):
    """An algorithm's own state in a shared record's `algo` slot (hard interfaces and their
    neighbours), made on first use."""
    if record.algo is None:
        record.algo = make()
    return record.algo


def routed_metric(algo, orig_node) -> int | None:
    """The metric of our own (default) router toward `orig_node`, None without a route:
    what the gateway operations compare (the kernel's router_ifinfo for BATADV_IF_DEFAULT)."""
    router = orig_node.router()
    if router is None or router.ifinfo_get(None) is None:
        return None
    return algo.metric(router)


ALGORITHMS: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: the algorithm is available by its name (batadv_algo_register). Its
    records must extend the core's ones, as the core reads and makes them too."""
    for attr, base in (("neigh_ifinfo", NeighIfInfo), ("orig_ifinfo", OrigIfInfo)):
        record = getattr(cls, attr, None) or base
        if not (isinstance(record, type) and issubclass(record, base)):
            raise TypeError(f"{cls.__name__}.{attr} must be a subclass of {base.__name__}")
        setattr(cls, attr, record)
    ALGORITHMS[cls.name] = cls
    return cls
