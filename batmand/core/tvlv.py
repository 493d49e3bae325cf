"""TVLV handlers and containers, registered by the features (the kernel's tvlv.c).

A feature registers, per (type, version): a handler for the container when it rides in an
originator's OGM (optionally also called when the OGM lacks it: the kernel's CIFNOTFND,
how a feature learns that a node does not support it), a handler for it in a
UNICAST_TVLV, and a builder for its container in our own OGMs. Containers nobody handles
are ignored, as the kernel ignores them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from batmand.wire.tvlv import malformed, tvlv_type, tvlv_version

OgmHandler = Callable[[float, object, object], None]  # (now, orig_node, tvlv or None when absent)
UnicastHandler = Callable[[float, object, object, object], bool]  # (now, src, dst, tvlv) -> handled here
Builder = Callable[[float, int], object]  # (now, bytes of room left) -> the container or None


@dataclass(frozen=True)
class _OgmHandler:
    handle: OgmHandler
    when_absent: bool
    each_copy: bool | Callable[[object], bool]


class TvlvRegistry:
    def __init__(self) -> None:
        self._ogm: dict[tuple[int, int], _OgmHandler] = {}
        self._unicast: dict[tuple[int, int], UnicastHandler] = {}
        self._containers: list[tuple[Builder, bool, int | None]] = []
        self._measured: dict[int, int] = {}  # what each fixed container took in our last OGM

    def handle_ogm(self, ttype: int, version: int, handler: OgmHandler, *, when_absent: bool = False,
                   each_copy: bool | Callable[[object], bool] = True) -> None:
        """`each_copy=False`: the handler keeps nothing new when it is handed the same
        containers again for the same OGM, so the further copies of that OGM (one through
        each neighbour) need not be handed to it. A callable decides at the first copy,
        from the container (None: absent), whether the further ones go to the handler."""
        self._ogm[(ttype, version)] = _OgmHandler(handler, when_absent, each_copy)

    def handle_unicast(self, ttype: int, version: int, handler: UnicastHandler) -> None:
        self._unicast[(ttype, version)] = handler

    def contribute(self, builder: Builder, *, flexible: bool = False, reserve: int | None = None) -> None:
        """A container of our OGMs, built right before each one; builder(now, room) returns
        it or None. A flexible one (TT: it can leave its diff out) is built after the
        others, with the room they left. `reserve`: the most bytes a fixed one takes (GW:
        12), kept free for it even while it is not sent, so that what the flexible one
        took on (TT's VLANs) still fits once it is."""
        self._containers.append((builder, flexible, reserve))

    @property
    def fixed_bytes(self) -> int:
        """The room the fixed containers take: their reserve, or what they took last."""
        return sum(reserve if reserve is not None else self._measured.get(i, 0)
                   for i, (_, flexible, reserve) in enumerate(self._containers) if not flexible)

    # --- used by the core --------------------------------------------------------------------

    def ogm_received(self, now: float, orig_node, tvlvs, seqno: int | None = None) -> None:
        """batadv_tvlv_ogm_receive: each container to its handler, then the handlers that
        want to hear of a container the OGM did not carry. With `seqno`, a further copy of
        the originator's last OGM with the very same containers (`tvlvs` is the same
        object: the OGM parser interns them) goes only to the handlers that want each copy."""
        if seqno is not None:
            seen = orig_node.tvlvs_seen
            if seen is not None and seen[0] == seqno and seen[1] is tvlvs:
                for handle, tvlv in seen[2]:
                    handle(now, orig_node, tvlv)
                return
        calls = self._ogm_calls(tvlvs)
        if seqno is not None:
            orig_node.tvlvs_seen = (seqno, tvlvs, tuple((h, t) for h, t, each_copy in calls
                                                        if each_copy is True or (each_copy and each_copy(t))))
        for handle, tvlv, _ in calls:
            handle(now, orig_node, tvlv)

    def _ogm_calls(self, tvlvs) -> list:
        """(handler, container or None, each_copy) for an OGM's containers, in the kernel's
        order: the containers', then the absent ones'."""
        calls = []
        called = set()
        for tvlv in tvlvs:
            if malformed(tvlv):
                continue  # ignored, as the kernel's handlers ignore a value of the wrong size
            key = (tvlv_type(tvlv), tvlv_version(tvlv))
            handler = self._ogm.get(key)
            if handler is not None:
                called.add(key)
                calls.append((handler.handle, tvlv, handler.each_copy))
        for key, handler in self._ogm.items():
            if handler.when_absent and key not in called:
                calls.append((handler.handle, None, handler.each_copy))
        return calls

    def unicast_received(self, now: float, src, dst, tvlvs: list) -> bool:
        """batadv_tvlv_containers_process for a UNICAST_TVLV: False when some handler says
        the packet is not (only) for us, so it must be routed on."""
        handled = True
        for tvlv in tvlvs:
            if malformed(tvlv):
                continue
            handler = self._unicast.get((tvlv_type(tvlv), tvlv_version(tvlv)))
            if handler is not None:
                handled &= handler(now, src, dst, tvlv)
        return handled

    def ogm_containers(self, now: float, room: int) -> list:
        """Our OGM's containers, in registration order, within `room` bytes in all."""
        built: dict[int, object] = {}
        for flexible_pass in (False, True):
            for i, (build, flexible, _) in enumerate(self._containers):
                if flexible != flexible_pass:
                    continue
                tvlv = build(now, room)
                if tvlv is not None:
                    built[i] = tvlv
                    room -= container_size(tvlv)
            if not flexible_pass:
                self._measured = {i: container_size(t) for i, t in built.items()}
        return [built[i] for i in sorted(built)]


def container_size(tvlv) -> int:
    return 4 + len(tvlv.encode_value())  # type, version, length, value
