"""What the daemon reads about hard interfaces from sysfs (netlink state: netlink.py)."""

from __future__ import annotations


def sysfs_int(ifname: str, attribute: str) -> int | None:
    """A number from /sys/class/net/IFNAME/ATTRIBUTE (e.g. "mtu", "statistics/tx_dropped"),
    None when the interface or the attribute is gone or not a number."""
    try:
        with open(f"/sys/class/net/{ifname}/{attribute}") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def link_speed(ifname: str) -> tuple[int | None, bool]:
    """(Mbit/s or None, full duplex) as ethtool reports it, read from sysfs."""
    speed = sysfs_int(ifname, "speed")
    try:
        with open(f"/sys/class/net/{ifname}/duplex") as f:
            duplex = f.read().strip() == "full"
    except OSError:
        duplex = False
    return (speed if speed and speed > 0 else None), duplex
