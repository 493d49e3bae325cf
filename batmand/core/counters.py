"""Traffic counters (batctl s names) and drop-reason counters."""

from __future__ import annotations

import collections

# names as the kernel's ethtool stats of bat0 (mesh-interface.c)
TRAFFIC_COUNTERS = (
    "tx", "tx_bytes", "tx_dropped", "rx", "rx_bytes", "forward", "forward_bytes", "mgmt_tx", "mgmt_tx_bytes",
    "mgmt_rx", "mgmt_rx_bytes", "frag_tx", "frag_tx_bytes", "frag_rx", "frag_rx_bytes", "frag_fwd",
    "frag_fwd_bytes", "tt_request_tx", "tt_request_rx", "tt_response_tx", "tt_response_rx", "tt_roam_adv_tx",
    "tt_roam_adv_rx", "mcast_tx", "mcast_tx_bytes", "mcast_tx_local", "mcast_tx_local_bytes", "mcast_rx",
    "mcast_rx_bytes", "mcast_rx_local", "mcast_rx_local_bytes", "mcast_fwd", "mcast_fwd_bytes", "dat_get_tx",
    "dat_get_rx", "dat_put_tx", "dat_put_rx", "dat_cached_reply_tx",
)


class Counters(collections.Counter):
    """A Counter with the batctl traffic counters present (at 0) from the start and
    `drop_<reason>` keys that appear when a drop happens."""

    def __init__(self) -> None:
        super().__init__({name: 0 for name in TRAFFIC_COUNTERS})

    def drop(self, reason: str) -> None:
        self["drop_" + reason] += 1

    def add(self, name: str, nbytes: int) -> None:
        self[name] += 1
        self[name + "_bytes"] += nbytes
