"""The listings batmanctl shows, built from the protocol core's state (rows keyed like
batctl's JSON). Pure functions of the core and the current time."""

from __future__ import annotations

from batmand import __version__
from batmand.core.mesh import Mesh
from batmand.wire import VLAN_HAS_TAG
from batmand.wire.constants import TtClientFlags as F


def _msecs(now: float, then: float) -> int:
    return max(0, int(round((now - then) * 1000)))


def _vid(vid: int) -> int:
    return vid & 0x0FFF if vid & VLAN_HAS_TAG else -1


def mesh_info(mesh: Mesh, meshif: str) -> dict:
    primary = mesh.primary
    return {"version": f"batmand-{__version__}", "algo": mesh.algo.name, "meshif": meshif,
            "meshif_mac": str(mesh.soft_mac), "primary_if": primary.name if primary else None,
            "primary_mac": str(primary.mac) if primary else None, "ttvn": mesh.tt.ttvn}


def interfaces(mesh: Mesh, ifindex: dict) -> list[dict]:
    return [{"hard_ifname": i.name, "hard_ifindex": ifindex.get(i.name, 0), "active": i.active,
             "mac": str(i.mac), "mtu": i.mtu} for i in mesh.ifaces]


def originators(mesh: Mesh, now: float, ifindex: dict) -> list[dict]:
    rows = []
    for orig_node in mesh.originators.nodes.values():
        best = orig_node.router()
        for neigh in orig_node.neighbours.values():
            info = neigh.ifinfo_get(None)
            if info is None:
                continue
            row = {"orig_address": str(orig_node.orig), "neigh_address": str(neigh.addr),
                   "hard_ifname": neigh.if_incoming.name, "hard_ifindex": ifindex.get(neigh.if_incoming.name, 0),
                   "last_seen_msecs": _msecs(now, orig_node.last_seen), "best": neigh is best}
            if mesh.algo.name == "BATMAN_V":
                row["throughput"] = info.throughput * 100  # kbit/s, as the kernel reports it
            else:
                row["tq"] = info.tq_avg
            rows.append(row)
    return rows


def neighbors(mesh: Mesh, now: float, ifindex: dict) -> list[dict]:
    rows = []
    for iface in mesh.ifaces:
        for n in iface.neighbours.values():
            row = {"neigh_address": str(n.addr), "hard_ifname": iface.name,
                   "hard_ifindex": ifindex.get(iface.name, 0), "last_seen_msecs": _msecs(now, n.last_seen)}
            if mesh.algo.name == "BATMAN_V":
                row["throughput"] = n.throughput * 100  # kbit/s
            rows.append(row)
    return rows


def transtable_local(mesh: Mesh, now: float) -> list[dict]:
    tt = mesh.tt
    return [{"tt_address": str(e.addr), "tt_vid": _vid(e.vid), "tt_flags": int(e.flags),
             "last_seen_msecs": 0 if e.flags & F.NOPURGE else _msecs(now, e.last_seen),
             "tt_crc32": tt.local_crcs.get(e.vid, 0)} for e in tt.local.values()]


def transtable_global(mesh: Mesh) -> list[dict]:
    rows = []
    for (addr, vid), entry in mesh.tt.global_.items():
        best = mesh.tt.best_orig(addr, vid)
        for orig, orig_entry in entry.origs.items():
            orig_node = mesh.originators.get(orig)
            rows.append({"tt_address": str(addr), "tt_vid": _vid(vid),
                         "tt_flags": int((entry.flags & ~0xFF) | (entry.flags & (F.ROAM | F.TEMP)) | orig_entry.flags),
                         # as the kernel's netlink dump: TT_TTVN is the entry's, TT_LAST_TTVN
                         # the originator's current version
                         "tt_ttvn": orig_entry.ttvn, "orig_address": str(orig),
                         "tt_last_ttvn": orig_node.last_ttvn if orig_node else 0,
                         "tt_crc32": orig_node.tt_crcs.get(vid, 0) if orig_node else 0, "best": orig == best})
    return rows


def statistics(mesh: Mesh, datapath_counters) -> dict:
    stats = dict(mesh.counters)
    for key, value in datapath_counters.items():
        stats[key] = stats.get(key, 0) + value
    return stats
