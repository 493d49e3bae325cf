"""What multicast the hosts behind bat0 listen to, for the core's multicast optimisations:
the IPv4 and IPv6 groups of bat0 (or of the bridge it is a port of), as the kernel reads
them from the device (in_device / inet6_dev mc lists), here from /proc/net/igmp and
/proc/net/igmp6 of our network namespace, newest first as the kernel lists them.

When bat0 is a bridge port the querier state and the bridge's MDB would come from
netlink; we do not read them yet and say "no querier", which makes us ask for all
multicast of both families (the kernel's answer when it knows of no querier): more
traffic toward us, never less than the hosts want."""

from __future__ import annotations

import os

from batmand.core.multicast import HostGroups


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


def host_groups(device: str) -> HostGroups:
    bridge = bridge_of(device)
    dev = bridge or device
    return HostGroups(ipv4=_ipv4_groups(dev), ipv6=_ipv6_groups(dev), bridged=bridge is not None,
                      router4=_forwarding("ipv4", dev), router6=_forwarding("ipv6", dev))
