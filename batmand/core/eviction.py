"""Which entry of a full table makes room: the least recently heard of those without real
evidence (no route, never bidirectional), in O(1) amortised per new entry.

Entries join as candidates when they are created and whenever the purge finds them without
evidence again; gaining evidence is noticed lazily, when a candidate comes up for eviction
(it is then dropped from the candidates, not evicted). So a flood of new spoofed entries
costs a constant amount of work each, however many protected entries the table holds."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class EvictionOrder:
    def __init__(self) -> None:
        self._order: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, key) -> bool:
        return key in self._order

    def add(self, key) -> None:
        """A new entry, or one found without evidence: the most recently heard candidate."""
        self._order[key] = None
        self._order.move_to_end(key)

    def keep(self, key) -> None:
        """A candidate not yet listed joins at the young end; a listed one keeps its place."""
        if key not in self._order:
            self._order[key] = None

    def touch(self, key) -> None:
        """The entry was heard again: evicted last among the candidates."""
        if key in self._order:
            self._order.move_to_end(key)

    def discard(self, key) -> None:
        self._order.pop(key, None)

    def prune(self, present) -> None:
        """Forget keys whose entries went away by other means (timeouts, interface down)."""
        if len(self._order) > len(present):
            self._order = OrderedDict((key, None) for key in self._order if key in present)

    def pop_weakest(self, is_weak: Callable[[Hashable], bool]) -> Hashable | None:
        """The least recently heard candidate that still has no evidence (None: none left).
        Candidates that have gained evidence (or are gone) leave the order on the way."""
        while self._order:
            key, _ = self._order.popitem(last=False)
            if is_weak(key):
                return key
        return None
