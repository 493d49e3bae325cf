"""The features' hooks on the host path, in one ordered place: frames the host sends into
the mesh (the kernel's batadv_interface_tx) and frames the mesh delivers to the host
(batadv_interface_rx). A hook sees the frame and may consume it (answer it itself, send it
its own way, drop it); the first that does ends the walk.

Positions follow the kernel's order of these checks: bridge loop avoidance first (a frame
of a claimed client must not enter the mesh here), then the gateway's DHCP handling, the
distributed ARP table, and multicast (which decides between unicast copies and a flood)."""

from __future__ import annotations

import bisect
from typing import Callable

# positions, in the kernel's order: BLA before the sender is learnt (LEARN), DAT snoops
# DHCPACKs before the gateway's DHCP handling, and ARP after it
BLA, LEARN, DAT_DHCP, GATEWAY_DHCP, DAT, MULTICAST = 10, 12, 15, 20, 30, 40
# toward the host: checks on the mesh packet first (BLA: a backbone gateway's broadcast),
# then DAT's snooping; from INTERFACE_RX on, the frame has been counted as received
# (batadv_interface_rx), where BLA decides last
BLA_MESH, INTERFACE_RX, BLA_RX = 5, 100, 110

TxHook = Callable[[float, object, int], bool]  # (now, inner frame, TT vid) -> consumed
# (now, inner frame, TT vid, the packet that carried it: Bcast, Unicast, Unicast4Addr) -> consumed
RxHook = Callable[[float, object, int, object], bool]


class HostHooks:
    def __init__(self) -> None:
        self._tx: list[tuple[int, int, TxHook]] = []
        self._rx: list[tuple[int, int, RxHook]] = []

    def on_host_tx(self, position: int, hook: TxHook) -> None:
        """A hook for frames from the host, after the sender was learnt and before the frame
        is broadcast or sent to the originator that serves its destination."""
        bisect.insort(self._tx, (position, len(self._tx), hook))

    def on_host_rx(self, position: int, hook: RxHook) -> None:
        """A hook for frames about to be delivered to the host."""
        bisect.insort(self._rx, (position, len(self._rx), hook))

    def host_tx(self, now: float, inner, vid: int, *, learnt: bool = True) -> bool:
        """The hooks after the sender was learnt, or (learnt=False) those before LEARN."""
        return any(hook(now, inner, vid) for position, _, hook in self._tx if (position > LEARN) == learnt)

    def host_rx(self, now: float, inner, vid: int, packet, *, counted: bool = False) -> bool:
        """The hooks before the frame is counted as received, or (counted=True) after."""
        return any(hook(now, inner, vid, packet) for position, _, hook in self._rx
                   if (position >= INTERFACE_RX) == counted)
