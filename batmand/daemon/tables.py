"""The listings batmanctl shows: the core's dumps (batctl's JSON keys), with what only the
daemon knows added (interface indexes)."""

from __future__ import annotations

from batmand import __version__
from batmand.core.mesh import Mesh


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
