"""Settings of one mesh interface. Defaults equal the kernel's (research notes §4);
the limits are ours: the kernel has none for most tables a peer can fill."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MeshConfig:
    routing_algo: str = "BATMAN_IV"
    orig_interval_ms: int = 1000  # batctl it
    hop_penalty: int = 30  # batctl hp (mesh wide)
    aggregation: bool = True  # batctl ag
    ap_isolation: bool = False  # batctl ap
    bonding: bool = False
    fragmentation: bool = True
    distributed_arp_table: bool = True
    multicast_mode: bool = True
    bridge_loop_avoidance: bool = False
    loglevel: str = "none"
    mtu: int = 1500  # soft interface MTU

    # timeouts (kernel: main.h)
    jitter_ms: int = 20
    purge_timeout_ms: int = 200_000  # neighbour; originators time out after twice this
    tt_local_timeout_ms: int = 600_000
    tt_roam_timeout_ms: int = 600_000
    tt_temp_timeout_ms: int = 600_000
    tt_request_timeout_ms: int = 3_000
    tt_work_period_ms: int = 5_000
    orig_work_period_ms: int = 1_000
    reset_protection_ms: int = 30_000
    frag_timeout_ms: int = 10_000

    # limits on what peers can make us store (ours; counted when they bite)
    max_originators: int = 5_000
    max_neighbours_per_originator: int = 64
    max_hardif_neighbours: int = 1_000
    max_global_tt_entries: int = 100_000
    max_global_tt_entries_per_originator: int = 2_000
    max_pending_tt_requests: int = 1_000
    max_forward_queue: int = 256  # BATADV_BATMAN_QUEUE_LEN: forwarded OGMs waiting to go out
    max_bcast_queue: int = 256  # BATADV_BCAST_QUEUE_LEN
    max_local_tt_entries: int = 1_600  # a full-table response must fit packet_size_max
    icmp_replies_per_second: int = 1_000
    max_fragment_bytes: int = 2 * 1024 * 1024  # all incomplete fragment chains together

    @property
    def orig_interval(self) -> float:
        return self.orig_interval_ms / 1000.0

    @property
    def purge_timeout(self) -> float:
        return self.purge_timeout_ms / 1000.0
