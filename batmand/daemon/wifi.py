"""Wi-Fi station data for the B.A.T.M.A.N. V link estimate, from nl80211 (pyroute2's IW):
the expected throughput (minstrel) or, failing that, the TX bitrate of each station.

Only interfaces that are wireless are asked. This machine has no cfg80211, so the netlink
query itself is exercised where Wi-Fi exists; the conversion is tested on its own."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from batmand.core.hardif import WifiStation
from batmand.wire import Mac

# pyroute2's IW is synchronous and a driver can take seconds to answer: it runs in a
# thread of its own, so the event loop (OGM and ELP timers) never waits for it
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nl80211")

log = logging.getLogger("batmand.wifi")


def is_wireless(ifname: str) -> bool:
    base = f"/sys/class/net/{ifname}/"
    return os.path.exists(base + "wireless") or os.path.exists(base + "phy80211")


def station_from_info(info: dict) -> WifiStation:
    """nl80211 STA_INFO (as a dict of attribute name -> value / nested dict) -> WifiStation.
    EXPECTED_THROUGHPUT is in kbit/s; RATE_INFO_BITRATE32/BITRATE in 100 kbit/s."""
    expected = info.get("NL80211_STA_INFO_EXPECTED_THROUGHPUT")
    rate = info.get("NL80211_STA_INFO_TX_BITRATE") or {}
    bitrate = rate.get("NL80211_RATE_INFO_BITRATE32") or rate.get("NL80211_RATE_INFO_BITRATE")
    return WifiStation(expected_throughput_kbps=expected or None, tx_bitrate_100kbps=bitrate or None)


def _as_dict(nla) -> dict:
    out = {}
    for name, value in getattr(nla, "get", lambda *_: None)("attrs") or []:
        out[name] = _as_dict(value) if hasattr(value, "get") and not isinstance(value, (str, bytes, int)) else value
    return out


def _stations(ifindex: int) -> dict:
    from pyroute2.iwutil import IW

    result = {}
    with IW() as iw:
        for msg in iw.get_stations(ifindex):
            mac = msg.get_attr("NL80211_ATTR_MAC")
            info = msg.get_attr("NL80211_ATTR_STA_INFO")
            if mac and info is not None:
                result[Mac(mac)] = station_from_info(_as_dict(info))
    return result


def _stations_or_none(ifindex: int) -> dict:
    try:
        return _stations(ifindex)
    except Exception as exc:  # noqa: BLE001 - no cfg80211, driver quirks: fall back to the default
        log.debug("nl80211 station dump failed: %s", exc)
        return {}


def query_stations(loop: asyncio.AbstractEventLoop, ifindex: int) -> asyncio.Future:
    """{neighbour MAC: WifiStation} of a wireless interface, later: a future the event loop
    does not wait for (empty when nl80211 cannot be asked)."""
    return loop.run_in_executor(_executor, _stations_or_none, ifindex)
