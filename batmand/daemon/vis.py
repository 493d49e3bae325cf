"""The batadv-vis view of this node: alfred's vis v1 record (data type 1, version 1) built
from the mesh's tables, its bytes, and batadv-vis's DOT and JSON renderings. No I/O
(the alfred socket is daemon/alfred.py).

What goes in is what `batadv-vis -s` takes from the kernel (alfred's vis/vis.c,
vis_update_data): the active hard interfaces; one entry per originator that is its own
best next hop (a one-hop neighbour) with the TQ of that route; one entry per local TT
client (ifindex 255, quality 0). Two choices differ from it, on purpose:
- the primary interface is listed first (the kernel lists them in ifindex order): the
  client names a node's cluster, its "primary" and its TT edges after ifaces[0], and our
  peers know us by the primary's MAC (the originator address);
- B.A.T.M.A.N. V: the kernel's originator dump has no TQ, so batadv-vis -s publishes no
  neighbours at all there. We list the neighbours of each interface (batctl n). The
  format has one byte of quality and no room for a throughput, so each link goes in with
  quality 255 (the client shows metric 1.000) and the throughput is only in the local view
  (`batmanctl topology --jsondoc`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

VIS_TYPE = 1  # alfred data type (VIS_PACKETTYPE)
VIS_VERSION = 1  # VIS_PACKETVERSION
TT_IFINDEX = 255  # an entry that is a local client, not a neighbour
MAX_IFACES = 254  # compile_vis_data's limits
MAX_ENTRIES = 255
V_QUALITY = 255  # B.A.T.M.A.N. V neighbour links (see above)
UPDATE_INTERVAL = 10.0  # seconds between two pushes of batadv-vis -s

_HEAD = struct.Struct("!6sBB")  # struct vis_v1: mac, iface_n, entries_n
_ENTRY = struct.Struct("!6sBB")  # struct vis_entry: mac, ifindex, qual
ZERO_MAC = "00:00:00:00:00:00"


class VisError(ValueError):
    """A vis v1 record that does not parse."""


def _mac_bytes(mac: str) -> bytes:
    raw = bytes.fromhex(mac.replace(":", ""))
    if len(raw) != 6:
        raise VisError(f"not a MAC address: {mac!r}")
    return raw


def _mac_str(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


@dataclass(frozen=True)
class Entry:
    mac: str
    ifindex: int  # into Record.ifaces; TT_IFINDEX: a local client
    qual: int  # TQ (1..255) for a neighbour, 0 for a client
    # the local view only, never encoded: what the link is measured in
    metric: dict = field(default_factory=dict, compare=False)

    @property
    def is_client(self) -> bool:
        return self.ifindex == TT_IFINDEX


@dataclass(frozen=True)
class Record:
    ifaces: list[str]  # MACs; [0] is the primary
    entries: list[Entry]
    mac: str = ZERO_MAC  # vis_v1.mac: batadv-vis -s leaves it zero and its client never reads it

    def to_json(self) -> dict:
        return {"mac": self.mac, "ifaces": list(self.ifaces),
                "entries": [{"mac": e.mac, "ifindex": e.ifindex, "qual": e.qual, **e.metric} for e in self.entries]}

    @classmethod
    def from_json(cls, data: dict) -> "Record":
        entries = [Entry(e["mac"], int(e["ifindex"]), int(e["qual"]),
                         {k: v for k, v in e.items() if k not in ("mac", "ifindex", "qual")})
                   for e in data.get("entries", [])]
        return cls(list(data.get("ifaces", [])), entries, data.get("mac", ZERO_MAC))


def build(mesh, now: float) -> Record:
    """This node's record from the core's listings (the rows batmanctl shows)."""
    active = [row for row in mesh.interface_rows() if row["active"]]
    primary = mesh.primary.name if mesh.primary is not None else None
    active.sort(key=lambda row: row["hard_ifname"] != primary)  # stable: the primary first
    names = [row["hard_ifname"] for row in active][:MAX_IFACES]
    ifaces = [row["mac"] for row in active][:MAX_IFACES]
    entries = _iv_links(mesh, now, names) if mesh.algo.metric_key == "tq" else _v_links(mesh, now, names)
    seen = set()
    for row in mesh.tt.local_rows(now):
        mac = row["tt_address"]
        if mac not in seen:  # one per MAC, whatever its VLANs
            seen.add(mac)
            entries.append(Entry(mac, TT_IFINDEX, 0))
    return Record(ifaces, entries[:MAX_ENTRIES])


def _iv_links(mesh, now: float, names: list[str]) -> list[Entry]:
    """batadv-vis -s's rule: each originator that is its own best next hop. Every interface
    of an IV node is an originator of its own (its OGMs carry its MAC), so a neighbour
    reached on its second interface is listed by that interface's MAC: a node of its
    cluster in the picture."""
    entries = []
    for row in mesh.originator_rows(now):
        if not row["best"] or row["orig_address"] != row["neigh_address"]:
            continue  # a route through another node, or not the one in use
        if row["hard_ifname"] not in names or row["tq"] < 1:
            continue  # an interface that is not active (the kernel's dump skips it too)
        entries.append(Entry(row["orig_address"], names.index(row["hard_ifname"]), row["tq"],
                             {"tq": row["tq"], "hard_ifname": row["hard_ifname"]}))
    return entries


def _v_links(mesh, now: float, names: list[str]) -> list[Entry]:
    """B.A.T.M.A.N. V: the neighbours heard on each interface (batctl n). A V node's OGMs all
    carry its primary address, so the originator rule would lose every neighbour met on a
    secondary interface; each neighbour is listed by the MAC of its interface on the link."""
    entries = []
    for row in mesh.neighbour_rows(now):
        if row["hard_ifname"] in names:
            entries.append(Entry(row["neigh_address"], names.index(row["hard_ifname"]), V_QUALITY,
                                 {"throughput": row.get("throughput", 0), "hard_ifname": row["hard_ifname"]}))
    return entries


# --- bytes ------------------------------------------------------------------------------------


def encode(record: Record) -> bytes:
    """struct vis_v1, then the interfaces, then the entries (alfred's vis/vis.h)."""
    if not 1 <= len(record.ifaces) <= MAX_IFACES or len(record.entries) > MAX_ENTRIES:
        raise VisError(f"{len(record.ifaces)} interfaces and {len(record.entries)} entries "
                       f"(1..{MAX_IFACES} and at most {MAX_ENTRIES})")
    out = [_HEAD.pack(_mac_bytes(record.mac), len(record.ifaces), len(record.entries))]
    out += [_mac_bytes(mac) for mac in record.ifaces]
    out += [_ENTRY.pack(_mac_bytes(e.mac), e.ifindex, e.qual) for e in record.entries]
    return b"".join(out)


def decode(payload: bytes) -> Record:
    """The inverse of encode; the length must match exactly, as batadv-vis's client checks."""
    if len(payload) < _HEAD.size:
        raise VisError(f"{len(payload)} bytes: shorter than the vis v1 header")
    mac, iface_n, entries_n = _HEAD.unpack_from(payload)
    size = _HEAD.size + 6 * iface_n + _ENTRY.size * entries_n
    if len(payload) != size:
        raise VisError(f"{len(payload)} bytes, but {iface_n} interfaces and {entries_n} entries make {size}")
    pos = _HEAD.size
    ifaces = [_mac_str(payload[pos + 6 * i:pos + 6 * i + 6]) for i in range(iface_n)]
    pos += 6 * iface_n
    entries = []
    for i in range(entries_n):
        emac, ifindex, qual = _ENTRY.unpack_from(payload, pos + _ENTRY.size * i)
        entries.append(Entry(_mac_str(emac), ifindex, qual))
    return Record(ifaces, entries, _mac_str(mac))


# --- batadv-vis's renderings ------------------------------------------------------------------
# Line for line what its client prints for the same records (vis_dot_*, vis_json_*,
# vis_jsondoc_*), entries it would reject (bad ifindex, quality 0) left out as it does.


def _links(record: Record):
    """(router MAC, entry) for the neighbour entries the client accepts."""
    for e in record.entries:
        if not e.is_client and e.ifindex < len(record.ifaces) and e.qual:
            yield record.ifaces[e.ifindex], e


def _metric(qual: int) -> str:
    return f"{255.0 / qual:.3f}"


def dot(records: list[Record]) -> str:
    lines = ["digraph {"]
    for r in records:
        if not r.ifaces:
            continue
        lines.append(f'\tsubgraph "cluster_{r.ifaces[0]}" {{')
        lines += [f'\t\t"{mac}"{" [peripheries=2]" if i else ""}' for i, mac in enumerate(r.ifaces)]
        lines.append("\t}")
        for e in r.entries:
            if e.is_client:
                lines.append(f'\t"{r.ifaces[0]}" -> "{e.mac}" [label="TT"]')
            elif e.ifindex < len(r.ifaces) and e.qual:
                lines.append(f'\t"{r.ifaces[e.ifindex]}" -> "{e.mac}" [label="{_metric(e.qual)}"]')
    lines.append("}")
    return "\n".join(lines) + "\n"


def json_lines(records: list[Record]) -> str:
    """batadv-vis -f json: one JSON object per line (not one document)."""
    lines = []
    for r in records:
        if not r.ifaces:
            continue
        primary = r.ifaces[0]
        lines.append(f'{{ "primary" : "{primary}" }}')
        lines += [f'{{ "secondary" : "{mac}", "of" : "{primary}" }}' for mac in r.ifaces[1:]]
        for e in r.entries:
            if e.is_client:
                lines.append(f'{{ "router" : "{primary}", "gateway" : "{e.mac}", "label" : "TT" }}')
            elif e.ifindex < len(r.ifaces) and e.qual:
                lines.append(f'{{ "router" : "{r.ifaces[e.ifindex]}", "neighbor" : "{e.mac}", '
                             f'"label" : "{_metric(e.qual)}" }}')
    return "".join(line + "\n" for line in lines)


def jsondoc(records: list[Record], version: str) -> dict:
    """batadv-vis -f jsondoc as a value; a local entry's metric (tq or throughput, and the
    interface) is added to its neighbour object."""
    vis = []
    for r in records:
        if not r.ifaces:
            continue
        node: dict = {"primary": r.ifaces[0]}
        if len(r.ifaces) > 1:
            node["secondary"] = r.ifaces[1:]
        node["neighbors"] = [{"router": router, "neighbor": e.mac, "metric": _metric(e.qual), **e.metric}
                             for router, e in _links(r)]
        node["clients"] = [e.mac for e in r.entries if e.is_client]
        vis.append(node)
    return {"source_version": version, "algorithm": 4, "vis": vis}
