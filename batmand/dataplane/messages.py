"""The messages between the control process and a data-plane worker: one small record
type per kind. channel.py carries them; each side dispatches on the record's type
through a dict of its handlers. Descriptors travel beside a message (SCM_RIGHTS), in the
order its docstring gives."""

from __future__ import annotations

from typing import NamedTuple

# --- control process -> worker ---------------------------------------------------------------


class Configure(NamedTuple):
    """The engine's settings; descriptors: the worker's TAP queue."""

    gro: bool
    csum_offload: bool


class AddPort(NamedTuple):
    """A hard interface; descriptors: its receive ring's socket (of the fanout group), a
    socket for its transmit ring."""

    name: str
    mac: bytes
    mtu: int
    ring: dict  # RxRing settings


class RemovePort(NamedTuple):
    name: str


class SetPorts(NamedTuple):
    """Addresses and MTUs of the active hard interfaces (Engine.set_ports)."""

    ports: dict  # name -> (mac, mtu)
    primary: bytes | None
    wifi: bool


class TableUpdate(NamedTuple):
    """A change of the forwarding table (a part of one: channel.split_update)."""

    update: object  # ForwardingUpdate


class TableBegin(NamedTuple):
    """A whole table follows in TablePart messages; it replaces the worker's at TableEnd."""


class TablePart(NamedTuple):
    update: object  # ForwardingUpdate


class TableEnd(NamedTuple):
    pass


class Report(NamedTuple):
    """Send Seen and Stats now."""


class Stop(NamedTuple):
    pass


# --- worker -> control process ---------------------------------------------------------------


class SlowHost(NamedTuple):
    """A frame from the host for the core."""

    frame: bytes


class SlowMesh(NamedTuple):
    """A frame from hard interface `ifname` for the core."""

    ifname: str
    frame: bytes


class Seen(NamedTuple):
    """Local clients that sent through the fast path: (mac, vid) -> time (a part of them)."""

    clients: dict


class Stats(NamedTuple):
    counters: dict
    ring_drops: dict  # per hard interface: frames lost for lack of ring slots
    table: dict  # the sizes of the worker's forwarding table


class Resync(NamedTuple):
    """A message of the control process could not be decoded: send the whole table."""


TO_WORKER = (Configure, AddPort, RemovePort, SetPorts, TableUpdate, TableBegin, TablePart, TableEnd, Report, Stop)
FROM_WORKER = (SlowHost, SlowMesh, Seen, Stats, Resync)
KINDS = TO_WORKER + FROM_WORKER  # on the wire, a message is (its kind's index here, *its fields)
