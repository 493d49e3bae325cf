"""batctl's JSON verbs (mj oj nj tlj tgj gwj clj bbj dcj mfj hj; hj for one hard interface,
vj for one VLAN), printed as batctl 2023 prints them from netlink.

batctl parses each netlink message into an array indexed by attribute type and prints the
attributes it has a name for in that index order (not in the order the kernel put them),
as `"name":value` with no spaces; a dump is one array (`[` objects joined by `,` `]` and a
newline), a GET one object and a newline. The daemon's rows are keyed by batctl's
attribute names; the order, the value types and the text come from ATTRIBUTES here, so a
row's dict order does not matter. A key batctl has no name for is not printed (as batctl
skips an attribute without a printer); an absent key is an attribute the kernel did not put.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from .commands import client_for
from .tables import norm_mac

# --- values --------------------------------------------------------------------------------


def _text(value) -> str:
    """batctl's sanitize_string: " and \\ escaped, anything not printable as \\xNN."""
    out = []
    for ch in str(value):
        if ch in '"\\':
            out.append("\\" + ch)
        elif not (" " <= ch <= "~"):
            out.extend("\\x%02x" % b for b in ch.encode())
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _bits(names: tuple[tuple[str, int], ...]) -> Callable[[object], str]:
    """A flags word as batctl's nested object: `{"a": true,"b": false,...,"raw": N}`
    (a space after the colon inside it, none after the commas)."""
    def fmt(value) -> str:
        flags = int(value)
        return "{" + "".join('"%s": %s,' % (name, "true" if flags & bit else "false") for name, bit in names) + \
            '"raw": %u}' % flags
    return fmt


_TT_FLAGS = (("del", 0x0001), ("roam", 0x0002), ("wifi", 0x0010), ("isolated", 0x0020), ("nopurge", 0x0100),
             ("new", 0x0200), ("pending", 0x0400), ("temp", 0x0800))
# batctl 2023 knows five of the TVLV's flags (BATADV_MCAST_HAVE_MC_PTYPE_CAPA is newer)
_MCAST_FLAGS = (("all_unsnoopables", 0x01), ("want_all_ipv4", 0x02), ("want_all_ipv6", 0x04),
                ("want_no_rtr_ipv4", 0x08), ("want_no_rtr_ipv6", 0x10))
_MCAST_FLAGS_PRIV = (("bridged", 0x01), ("querier_ipv4_exists", 0x02), ("querier_ipv6_exists", 0x04),
                     ("querier_ipv4_shadowing", 0x08), ("querier_ipv6_shadowing", 0x10))
_LOG_LEVEL = (("batman", 0x01), ("routes", 0x02), ("tt", 0x04), ("bla", 0x08), ("dat", 0x10), ("nc", 0x20),
              ("mcast", 0x40), ("tp", 0x80))


def _number(value) -> str:
    return "%u" % int(value)


def _signed(value) -> str:  # a VID as BATADV_PRINT_VID gives it: -1 untagged
    return "%d" % int(value)


def _bool(value) -> str:
    return "true" if value else "false"


def _mac(value) -> str:
    return '"%s"' % norm_mac(value)


def _gw_mode(value) -> str:
    return '"%s"' % (value if value in ("off", "client", "server") else "unknown")


FLAG = "flag"  # a netlink flag: present (printed as true) or absent, never false

# batctl's names for the attributes (genl_json.c's table) in attribute-number order; the
# kernel's units (bandwidths in 100 kbit/s, throughput of o/n in kbit/s, intervals in ms)
ATTRIBUTES: tuple[tuple[str, object], ...] = (
    ("version", _text), ("algo_name", _text), ("mesh_ifindex", _number), ("mesh_ifname", _text),
    ("mesh_address", _mac), ("hard_ifindex", _number), ("hard_ifname", _text), ("hard_address", _mac),
    ("orig_address", _mac), ("tpmeter_result", _number), ("tpmeter_test_time", _number),
    ("tpmeter_bytes", _number), ("tpmeter_cookie", _number), ("active", FLAG), ("tt_address", _mac),
    ("tt_ttvn", _number), ("tt_last_ttvn", _number), ("tt_crc32", _number), ("tt_vid", _signed),
    ("tt_flags", _bits(_TT_FLAGS)), ("best", FLAG), ("last_seen_msecs", _number), ("neigh_address", _mac),
    ("tq", _number), ("throughput", _number), ("bandwidth_up", _number), ("bandwidth_down", _number),
    ("router", _mac), ("bla_own", FLAG), ("bla_address", _mac), ("bla_vid", _signed), ("bla_backbone", _mac),
    ("bla_crc", _number), ("dat_cache_ip4address", _text), ("dat_cache_hwaddress", _mac),
    ("dat_cache_vid", _signed), ("mcast_flags", _bits(_MCAST_FLAGS)),
    ("mcast_flags_priv", _bits(_MCAST_FLAGS_PRIV)), ("vlanid", _number), ("aggregated_ogms_enabled", _bool),
    ("ap_isolation_enabled", _bool), ("isolation_mark", _number), ("isolation_mask", _number),
    ("bonding_enabled", _bool), ("bridge_loop_avoidance_enabled", _bool), ("distributed_arp_table_enabled", _bool),
    ("fragmentation_enabled", _bool), ("gw_bandwidth_down", _number), ("gw_bandwidth_up", _number),
    ("gw_mode", _gw_mode), ("gw_sel_class", _number), ("hop_penalty", _number), ("log_level", _bits(_LOG_LEVEL)),
    ("multicast_forceflood_enabled", _bool), ("network_coding_enabled", _bool), ("orig_interval", _number),
    ("elp_interval", _number), ("throughput_override", _number), ("multicast_fanout", _number),
)
KEY_ORDER = tuple(name for name, _ in ATTRIBUTES)


def json_object(row: dict) -> str:
    """One netlink message's attributes as batctl prints them."""
    parts = []
    for name, fmt in ATTRIBUTES:
        value = row.get(name)
        if value is None:
            continue
        if fmt is FLAG:
            if value:
                parts.append('"%s":true' % name)
            continue
        parts.append('"%s":%s' % (name, fmt(value)))
    return "{" + ",".join(parts) + "}"


def json_dump(rows) -> str:
    """A dump: one array and a newline (batctl's `[`, the objects, `]` by puts)."""
    return "[" + ",".join(json_object(r) for r in rows or []) + "]\n"


def json_get(row: dict) -> str:
    return json_object(row) + "\n"


# --- the verbs -------------------------------------------------------------------------------


def _dump(cmd: str, rows: Callable | None = None) -> Callable:
    def render(client, args) -> str:
        answer = client.request(cmd)
        return json_dump(rows(answer) if rows else answer)
    return render


def _hardif(client, args) -> str:
    return json_get(client.request("hardif", {"ifname": args.hardif}))


def _vlan(client, args) -> str:
    return json_get(client.request("vlan", {"vid": args.vid}))


@dataclass(frozen=True)
class JsonVerb:
    name: str
    abbr: str
    scope: str  # "mesh", "hardif" (one hard interface: args.hardif) or "vlan" (args.vid)
    render: Callable  # (client, args) -> the text batctl prints


JSON_VERBS = (
    JsonVerb("mesh_json", "mj", "mesh", lambda client, args: json_get(client.request("mesh"))),
    JsonVerb("originators_json", "oj", "mesh", _dump("originators")),
    JsonVerb("neighbors_json", "nj", "mesh", _dump("neighbors")),
    JsonVerb("transtable_local_json", "tlj", "mesh", _dump("transtable_local")),
    JsonVerb("transtable_global_json", "tgj", "mesh", _dump("transtable_global")),
    JsonVerb("gateways_json", "gwj", "mesh", _dump("gateways")),
    JsonVerb("bla_claim_json", "clj", "mesh", _dump("bla_claims")),
    JsonVerb("bla_backbone_json", "bbj", "mesh", _dump("bla_backbones")),
    JsonVerb("dat_cache_json", "dcj", "mesh", _dump("dat_cache")),
    JsonVerb("mcast_flags_json", "mfj", "mesh", _dump("mcast_flags", lambda answer: (answer or {}).get("rows"))),
    JsonVerb("hardifs_json", "hj", "mesh", _dump("hardifs")),
    JsonVerb("hardif_json", "hj", "hardif", _hardif),
    JsonVerb("vlan_json", "vj", "vlan", _vlan),
)


def run(args) -> int:
    sys.stdout.write(args.json_verb.render(client_for(args), args))
    sys.stdout.flush()
    return 0


def add_parsers(subparsers) -> None:
    """The verbs as subcommands; grammar.py picks one by scope and fills in args.hardif (hardif
    IFACE hj) or args.vid (vlan DEV vj, meshif X vid VID vj)."""
    for verb in JSON_VERBS:
        p = subparsers.add_parser(verb.name, help=f"batctl's {verb.name} ({verb.scope})")
        p.set_defaults(func=run, json_verb=verb)
