"""The listings batmanctl shows: the core's dumps (batctl's JSON keys), with what only the
daemon knows added (interface indexes)."""

from __future__ import annotations

import socket

from batmand import __version__
from batmand.core.mesh import Mesh

from .links import sysfs_int


def _with_ifindex(rows: list[dict], ifindex: dict) -> list[dict]:
    for row in rows:
        row["hard_ifindex"] = ifindex.get(row["hard_ifname"], 0)
    return rows


def mesh_info(mesh: Mesh, meshif: str) -> dict:
    primary = mesh.primary
    return {"version": f"batmand-{__version__}", "algo": mesh.algo.name, "meshif": meshif,
            "meshif_mac": str(mesh.soft_mac), "primary_if": primary.name if primary else None,
            "primary_mac": str(primary.mac) if primary else None, "ttvn": mesh.tt.ttvn, "bla_crc": mesh.bla.group}


def interfaces(mesh: Mesh, ifindex: dict) -> list[dict]:
    return _with_ifindex(mesh.interface_rows(), ifindex)


def hardifs(mesh: Mesh, meshif: str, ifindex: dict) -> list[dict]:
    """batctl hj: one row per hard interface with the kernel's GET_HARDIF attributes
    (throughput_override in its 100 kbit/s units; ours is kept in kbit/s)."""
    mesh_ifindex = _ifindex(meshif)
    return [{"mesh_ifindex": mesh_ifindex, "mesh_ifname": meshif, "hard_ifindex": ifindex.get(i.name, 0),
             "hard_ifname": i.name, "hard_address": str(i.mac), "active": i.active,
             "hop_penalty": i.settings.hop_penalty, "elp_interval": i.settings.elp_interval,
             "throughput_override": i.settings.throughput_override // 100} for i in mesh.ifaces]


def mesh_attrs(mesh: Mesh, meshif: str, ifindex: dict) -> dict:
    """batctl mj: the kernel's GET_MESH attributes (batadv_netlink_mesh_fill), in its units:
    intervals in ms, gateway bandwidths in 100 kbit/s. The settings batmand lacks
    (ap_isolation, bonding, isolation_mark/mask, log_level, network_coding) are left out, as
    a kernel built without a feature leaves its attribute out."""
    config, primary, mcast = mesh.config, mesh.primary, mesh.multicast.state()
    gw = mesh.gateway.state()
    priv = 0
    if mcast.get("bridged"):
        priv = 0x01 | (0x02 if mcast.get("querier4") else 0) | (0x04 if mcast.get("querier6") else 0) \
            | (0x08 if mcast.get("shadowing4") else 0) | (0x10 if mcast.get("shadowing6") else 0)
    attrs = {"version": f"batmand-{__version__}", "algo_name": mesh.algo.name, "mesh_ifindex": _ifindex(meshif),
             "mesh_ifname": meshif, "mesh_address": str(mesh.soft_mac), "tt_ttvn": mesh.tt.ttvn,
             "bla_crc": mesh.bla.group, "mcast_flags": int(mcast.get("mcast_flags") or 0), "mcast_flags_priv": priv}
    if primary is not None and primary.active:
        attrs |= {"hard_ifindex": ifindex.get(primary.name, 0), "hard_ifname": primary.name,
                  "hard_address": str(primary.mac)}
    return attrs | {
        "aggregated_ogms_enabled": bool(config.aggregation),
        "bridge_loop_avoidance_enabled": bool(config.bridge_loop_avoidance),
        "distributed_arp_table_enabled": bool(config.distributed_arp_table),
        "fragmentation_enabled": bool(config.fragmentation),
        "gw_bandwidth_down": gw["gw_bandwidth_down"], "gw_bandwidth_up": gw["gw_bandwidth_up"],
        "gw_mode": gw["gw_mode"], "gw_sel_class": gw["gw_sel_class"], "hop_penalty": config.hop_penalty,
        "multicast_forceflood_enabled": not config.multicast_mode, "orig_interval": config.orig_interval_ms,
        "multicast_fanout": config.multicast_fanout}


def vlan_attrs(mesh: Mesh, meshif: str, vid: int) -> dict | None:
    """batctl vj: GET_VLAN of one of the soft interface's VLANs (None: no such VLAN)."""
    if vid not in mesh.vlans():
        return None
    return {"mesh_ifindex": _ifindex(meshif), "mesh_ifname": meshif, "vlanid": vid}


def _ifindex(ifname: str) -> int:
    try:
        return socket.if_nametoindex(ifname)
    except OSError:
        return 0


def originators(mesh: Mesh, now: float, ifindex: dict, outif=None) -> list[dict]:
    return _with_ifindex(mesh.originator_rows(now, outif), ifindex)


def neighbors(mesh: Mesh, now: float, ifindex: dict) -> list[dict]:
    return _with_ifindex(mesh.neighbour_rows(now), ifindex)


def gateways(mesh: Mesh, ifindex: dict) -> list[dict]:
    return _with_ifindex(mesh.gateway.rows(), ifindex)


def transtable_local(mesh: Mesh, now: float) -> list[dict]:
    return mesh.tt.local_rows(now)


def transtable_global(mesh: Mesh) -> list[dict]:
    return mesh.tt.global_rows()


def statistics(mesh: Mesh, datapath_counters) -> dict:
    stats = dict(mesh.counters)
    for key, value in datapath_counters.items():
        stats[key] = stats.get(key, 0) + value
    return stats


def statistics_now(service) -> dict:
    """batctl s as the daemon has it now: the core's counters, the data plane's (as last
    reported: workers report twice a second), and what the packet sockets lost."""
    dataplane = service.dataplane
    stats = statistics(service.mesh, dataplane_counters(service))
    # frames lost at the packet sockets (the control process's and the data plane's rings)
    stats["drop_socket_buffer"] = (sum(s.statistics()[1] for s in service.sockets.values())
                                   + dataplane.status()["drops"]["socket"])
    for sock in service.sockets.values():  # e.g. ENETDOWN, once per interface going down
        for name, count in sock.errors.items():
            stats[f"rx_socket_error_{name}"] = stats.get(f"rx_socket_error_{name}", 0) + count
    return stats


def dataplane_now(service) -> dict:
    """Per-worker counters and drops by place (socket rings, TAP queue, daemon)."""
    status = service.dataplane.status()
    status["mode"] = "inline" if not status["workers"] else f"{len(status['workers'])} workers"
    # tap: frames the host could not queue to the TAP (no worker read them in time);
    # tap_write: frames for the host whose TAP write failed (the host's backlog was full)
    status["drops"]["tap"] = sysfs_int(service.softif.name, "statistics/tx_dropped") or 0
    status["drops"]["tap_write"] += service.softif.write_dropped
    status["counters"] = service.dataplane.counters()
    forwarder = service.kernel_forward
    status["kernel_forward"] = dict(forwarder.status(), **forwarder.counters()) if forwarder else None
    return status


def dataplane_counters(service) -> dict:
    """The data plane's counters with what the kernel forwarded and delivered for it."""
    counters = service.dataplane.counters()
    if service.kernel_forward is not None:
        for key, value in service.kernel_forward.counters().items():
            counters[key] = counters.get(key, 0) + value
    return counters


def table_sizes(mesh: Mesh) -> dict[str, int]:
    """The entries of each table batmanctl lists (by key: a client of tg once, however many
    originators announce it)."""
    return {"originators": len(mesh.originators.nodes), "neighbours": sum(len(i.neighbours) for i in mesh.ifaces),
            "tt_local": len(mesh.tt.local), "tt_global": len(mesh.tt.global_), "dat": len(mesh.dat.cache),
            "bla_claims": len(mesh.bla.claims), "bla_backbones": len(mesh.bla.backbones),
            "mcast": len(mesh.multicast.peers), "gateways": len(mesh.gateway.gateways)}


def table_limits(mesh: Mesh) -> dict[str, int]:
    """The limits of the tables that have one as a whole (neighbours are limited per hard
    interface and originator)."""
    config = mesh.config
    return {"originators": config.max_originators, "tt_local": config.max_local_tt_entries,
            "tt_global": config.max_global_tt_entries, "dat": config.max_dat_entries,
            "bla_claims": config.max_bla_claims, "bla_backbones": config.max_bla_backbones}
