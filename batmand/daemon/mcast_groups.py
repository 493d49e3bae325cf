"""What multicast the hosts behind bat0 listen to, for the core's multicast optimisations:
the IPv4 and IPv6 groups of bat0 (or of the bridge it is a port of), as the kernel reads
them from the device (in_device / inet6_dev mc lists), here from /proc/net/igmp and
/proc/net/igmp6 of our network namespace, newest first as the kernel lists them.

When bat0 is a bridge port, also what the bridge knows (bridge_mcast.py): the groups it
snooped on its other ports, whether an IGMP/MLD querier exists and whether it is behind
another port (shadowing), and multicast router ports. When the bridge cannot be asked we
say "no querier", which makes us ask for all multicast of both families: more traffic
toward us, never less than the hosts want."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace

from batmand.core.multicast import HostGroups

from .bridge_mcast import QuerierWatch, read_bridge

log = logging.getLogger("batmand.multicast")


def _ipv4_groups(device: str, path: str = "/proc/net/igmp") -> tuple[bytes, ...]:
    groups, current = [], None
    try:
        with open(path) as f:
            next(f, None)  # the header
            for line in f:
                if not line.startswith("\t"):
                    parts = line.split()
                    current = parts[1] if len(parts) > 1 else None
                elif current == device:
                    word = line.split()[0]
                    groups.append(int(word, 16).to_bytes(4, "little"))  # the kernel prints it in host order
    except OSError:
        return ()
    return tuple(groups)


def _ipv6_groups(device: str, path: str = "/proc/net/igmp6") -> tuple[bytes, ...]:
    groups = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] == device:
                    groups.append(bytes.fromhex(parts[2]))
    except (OSError, ValueError):
        return ()
    return tuple(groups)


def bridge_of(device: str) -> str | None:
    try:
        return os.path.basename(os.readlink(f"/sys/class/net/{device}/master"))
    except OSError:
        return None


def _forwarding(family: str, device: str) -> bool:
    """A multicast routing daemon registered the device (conf/<dev>/mc_forwarding)."""
    try:
        with open(f"/proc/sys/net/{family}/conf/{device}/mc_forwarding") as f:
            return f.read().strip() not in ("", "0")
    except OSError:
        return False


class HostGroupsReader:
    """bat0's HostGroups, read every 500 ms. It keeps what one look cannot tell: the
    queriers' start-up delay, and whether the bridge could be asked last time (a failure
    is logged once, not every round)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.igmp, self.mld = QuerierWatch(), QuerierWatch()
        self._bridge_failing = False

    def read(self, now: float) -> HostGroups:
        bridge = bridge_of(self.device)
        dev = bridge or self.device
        groups = HostGroups(ipv4=_ipv4_groups(dev), ipv6=_ipv6_groups(dev), router4=_forwarding("ipv4", dev),
                            router6=_forwarding("ipv6", dev))
        if bridge is None:
            return groups
        try:
            view, our_port = read_bridge(bridge), socket.if_nametoindex(self.device)
        except OSError as exc:
            if not self._bridge_failing:
                log.warning("cannot read the multicast state of bridge %s (%s): asking for all multicast", bridge, exc)
            self._bridge_failing = True
            return replace(groups, bridged=True)
        self._bridge_failing = False
        querier4, shadowing4 = self.igmp.update(now, view, view.igmp, view.querier_on, our_port)
        querier6, shadowing6 = self.mld.update(now, view, view.mld, view.querier_on and view.has_ipv6_address,
                                               our_port)
        router4, router6 = view.routers_behind(our_port)
        return replace(groups, bridge_groups=view.groups_behind(our_port), bridged=True,
                       querier4=querier4, querier6=querier6, shadowing4=shadowing4, shadowing6=shadowing6,
                       router4=groups.router4 or router4, router6=groups.router6 or router6)
