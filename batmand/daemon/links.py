"""What the daemon needs to know about hard interfaces, from netlink (pyroute2).

pyroute2's synchronous IPRoute runs an event loop of its own and uvloop cannot host its
netlink endpoint, so every query runs in a short-lived worker thread."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pyroute2 import IPRoute

_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netlink")


@dataclass
class LinkInfo:
    name: str
    index: int
    mac: bytes
    mtu: int
    up: bool


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


def link_info(ifname: str) -> LinkInfo | None:
    return _executor.submit(_link_info, ifname).result()


def set_up(ifname: str) -> None:
    _executor.submit(_set_up, ifname).result()


def _link_info(ifname: str) -> LinkInfo | None:
    with IPRoute() as ipr:
        links = ipr.link_lookup(ifname=ifname)
        if not links:
            return None
        (link,) = ipr.link("get", index=links[0])
    mac = bytes.fromhex(link.get_attr("IFLA_ADDRESS").replace(":", ""))
    return LinkInfo(ifname, link["index"], mac, link.get_attr("IFLA_MTU"), bool(link["flags"] & 1))


def _set_up(ifname: str) -> None:
    with IPRoute() as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if index:
            ipr.link("set", index=index[0], state="up")
