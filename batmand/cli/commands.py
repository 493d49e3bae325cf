"""The batmanctl commands that talk to the daemon, with batctl's names, options and output
(grammar.py decides which one runs for which mesh).

Debug tables: originators|o (-t, -i), neighbors|n, translocal|tl, transglobal|tg (-u, -m),
gateways|gwl, dat_cache|dc, claimtable|cl, backbonetable|bbt, mcast_flags|mf, statistics|s,
dataplane|dp (all with -w [interval], -H, -n, --json). Settings: every batctl setting of the
mesh, of a hard interface (hardif IFACE hp|et|to) and of a VLAN; the ones batmand lacks say
so. Tools: interface|if (add, del, create, destroy), routing_algo|ra, ping|p,
traceroute|tr, translate|t. batctl's JSON verbs (mj, oj, ..., hardif_json,
vlan_json) are in json_verbs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Callable

from batmand.core import ping
from batmand.core.config import HARDIF_SETTINGS
from batmand.daemon import options

from . import grammar, meshes, tables
from .client import Client, ControlError, DaemonError, socket_path
from .hosts import is_valid_unicast, load_bat_hosts, resolve_destination

CLEAR_SCREEN = "\033[2J\033[0;0f"  # batctl's watch mode: clear, cursor to 0,0
PING_COUNT_FOREVER = ping.COUNT.hi  # batctl's largest -c; no -c pings until Ctrl-C
PING_TTL = 50
TRACEROUTE_TIMEOUT = 2  # seconds per probe, as batctl traceroute

sleep = time.sleep  # the watch loop's pause (tests replace it)


class UsageError(ControlError):
    """Bad arguments: batctl's "Error - ..." cases; exit status 1."""


# ---------------------------------------------------------------------------------------
# plumbing


def client_for(args) -> Client:
    return Client(socket_path(args.meshif, getattr(args, "socket", None)), args.meshif)


def emit(lines) -> None:
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _names(args) -> dict[str, str] | None:
    """The bat-hosts names; None with -n (batctl prints some lines differently then)."""
    return None if getattr(args, "no_names", False) else load_bat_hosts()


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}") from None
    if value != value or value < 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
    return value


def _add_table_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", dest="watch", nargs="?", type=_nonnegative_float, const=1.0, default=None,
                   metavar="INTERVAL", help="watch: clear the screen and refresh every INTERVAL seconds (default 1)")
    p.add_argument("-H", dest="no_header", action="store_true", help="don't show the header")
    p.add_argument("-n", dest="no_names", action="store_true", help="don't replace MAC addresses with bat-hosts names")
    p.add_argument("--json", action="store_true", help="print the daemon's rows as JSON")


def _watch(args, render: Callable[[], tuple[list[str], int]]) -> int:
    """Print once, or in watch mode clear and reprint every interval until Ctrl-C."""
    if args.watch is None:
        lines, status = render()
        emit(lines)
        return status
    try:
        while True:
            lines, _ = render()
            sys.stdout.write(CLEAR_SCREEN)
            emit(lines)
            sleep(args.watch)
    except KeyboardInterrupt:
        return 0


# ---------------------------------------------------------------------------------------
# debug tables with the info header: o, n, tl, tg


@dataclass(frozen=True)
class Table:
    name: str
    abbr: str
    cmd: str  # the daemon's command
    help: str
    line: Callable
    column_header: Callable[[str], str]  # algo -> header line
    needs_algo: bool = False  # o and n pick their format by the routing algorithm
    extra: Callable | None = None  # info -> what the info line appends (tl: ", TTVN: n")
    tt_filters: bool = False  # -u / -m
    max_age: bool = False  # -t
    title: Callable[[str], str] | None = None  # meshif -> a line between the info line and the columns
    others_only: bool = False  # bbt: the text leaves our own rows out (its JSON has them)


TABLES = (
    Table("originators", "o", "originators", "originator table", tables.originator_line, tables.originators_header,
          needs_algo=True, max_age=True),
    Table("neighbors", "n", "neighbors", "one-hop neighbours", tables.neighbor_line, tables.neighbors_header,
          needs_algo=True),
    Table("translocal", "tl", "transtable_local", "local translation table", tables.translocal_line,
          lambda algo: tables.TRANSLOCAL_HEADER, extra=tables.translocal_extra, tt_filters=True),
    Table("transglobal", "tg", "transtable_global", "global translation table", tables.transglobal_line,
          lambda algo: tables.TRANSGLOBAL_HEADER, tt_filters=True),
    Table("gateways", "gwl", "gateways", "gateways (* selected)", tables.gateway_line, tables.gateways_header,
          needs_algo=True),
    Table("dat_cache", "dc", "dat_cache", "distributed ARP table cache", tables.dat_cache_line,
          lambda algo: tables.DAT_CACHE_HEADER, title=tables.dat_cache_title),
    Table("claimtable", "cl", "bla_claims", "bridge loop avoidance claims", tables.claim_line,
          lambda algo: tables.CLAIM_HEADER, extra=tables.bla_extra),
    Table("backbonetable", "bbt", "bla_backbones", "bridge loop avoidance backbone gateways (not ours)",
          tables.backbone_line, lambda algo: tables.BACKBONE_HEADER, extra=tables.bla_extra, others_only=True),
)


def render_table(table: Table, client: Client, args, names) -> tuple[list[str], int]:
    request = {"outif": args.outif} if getattr(args, "outif", None) else None
    if args.json:
        return [dumps(_filter_rows(table, client.request(table.cmd, request), args))], 0
    info = None
    if not args.no_header or table.needs_algo:
        info = client.request("mesh_info") or {}
        if tables.is_disabled(info):
            # batctl: the info line says so and the kernel refuses the dump
            return ([] if args.no_header else [tables.info_line(info, args.meshif)]), 1
    rows = _filter_rows(table, client.request(table.cmd, request), args)
    lines = []
    if not args.no_header:
        extra = table.extra(info) if table.extra is not None else ""
        column = table.column_header(info.get("algo", ""))
        if table.title is not None:
            column = table.title(info.get("meshif") or args.meshif) + "\n" + column
        lines += tables.header_lines(info, column, args.meshif, extra)
    lines += [table.line(row, names) for row in rows if not (table.others_only and row.get("bla_own"))]
    return lines, 0


def _filter_rows(table: Table, rows, args) -> list:
    rows = list(rows or [])
    if table.tt_filters and (args.unicast_only or args.multicast_only):
        rows = tables.tt_filter(rows, args.unicast_only, args.multicast_only)
    if table.max_age and args.max_age is not None:
        rows = [r for r in rows if int(r.get("last_seen_msecs") or 0) / 1000.0 <= args.max_age]
    return rows


def run_table(args) -> int:
    table: Table = args.table
    if table.tt_filters and args.unicast_only and args.multicast_only:
        raise UsageError("'-u' and '-m' are exclusive options")
    client = client_for(args)
    names = {} if args.json else _names(args)
    return _watch(args, lambda: render_table(table, client, args, names))


# ---------------------------------------------------------------------------------------
# if, s, ra


def render_interfaces(client: Client, args) -> tuple[list[str], int]:
    rows = client.request("interfaces") or []
    if args.json:
        return [dumps(rows)], 0
    return tables.interfaces_lines(rows), 0


INTERFACE_ACTIONS = {"add": "a", "a": "a", "del": "d", "d": "d", "create": "c", "c": "c", "destroy": "D", "D": "D"}


def _create_params(words: list[str]) -> str | None:
    """interface create [routing_algo|ra ALGO]: the algorithm, or None for the selected one."""
    algo = None
    i = 0
    while i < len(words):
        if words[i] not in ("routing_algo", "ra"):
            raise UsageError(f"unknown parameter '{words[i]}'")
        if i + 1 >= len(words):
            raise UsageError(f"missing parameter for '{words[i]}'")
        algo, i = words[i + 1], i + 2
    return algo


def run_interface(args) -> int:
    """batctl interface: list; add|del IFACE...; create [ra ALGO]; destroy (meshes.py)."""
    words = list(args.words)
    if not words:
        client = client_for(args)
        return _watch(args, lambda: render_interfaces(client, args))
    action = INTERFACE_ACTIONS.get(words[0])
    if action is None:
        raise UsageError(f"unknown argument specified: {words[0]}")
    rest = words[1:]
    if action == "c":
        try:
            meshes.create(args.meshif, _create_params(rest), args.socket)
        except meshes.MeshError as exc:
            raise UsageError(f"failed to add create batman-adv interface: {exc}") from None
        return 0
    if action == "D":
        if rest:
            raise UsageError(f"extra parameter after '{words[0]}'")
        try:
            meshes.destroy(args.meshif, args.socket)
        except meshes.MeshError as exc:
            raise UsageError(f"failed to destroy batman-adv interface: {exc}") from None
        return 0
    if not rest:
        raise UsageError(f"missing interface name(s) after '{words[0]}'")
    if not meshes.is_running(args.meshif, args.socket):
        if action == "a" and not args.M:
            try:
                meshes.create(args.meshif, None, args.socket)
            except meshes.MeshError as exc:
                raise UsageError(f"failed to create batman-adv interface: {exc}") from None
        else:
            raise UsageError("failed to find batman-adv interface: No such device")
    client = client_for(args)
    before = len(client.request("interfaces") or [])
    cmd, verb = ("if_add", "add") if action == "a" else ("if_del", "delete")
    result = None
    for ifname in rest:
        try:
            result = client.request(cmd, {"ifname": ifname})
        except DaemonError as exc:
            raise UsageError(f"failed to {verb} interface {ifname}: {exc}") from None
    if args.json and result is not None:
        emit([dumps(result)])
    if action == "d" and not args.M and before > 0 and not (result if result is not None else [1]):
        print(f"Warning: {args.meshif} has no interfaces and can be destroyed with: "
              f"batctl meshif {args.meshif} interface destroy", file=sys.stderr)
    return 0


def run_statistics(args) -> int:
    client = client_for(args)

    def render():
        stats = client.request("statistics") or {}
        return ([dumps(stats)] if args.json else tables.statistics_lines(stats)), 0

    return _watch(args, render)


def run_dataplane(args) -> int:
    client = client_for(args)

    def render():
        status = client.request("dataplane") or {}
        return ([dumps(status)] if args.json else tables.dataplane_lines(status)), 0

    return _watch(args, render)


def routing_algos(args) -> dict:
    """batctl ra: each running mesh's algorithm, the one the next created mesh gets, all."""
    active = {}
    for meshif in grammar.meshes_to_ask(args.meshif, args.socket):
        try:
            info = Client(socket_path(meshif, args.socket), meshif).request("mesh_info") or {}
        except ControlError:
            continue
        active[meshif] = info.get("algo", "")
    return {"active": active, "selected": meshes.selected_algorithm(), "available": meshes.available_algorithms()}


def run_routing_algo(args) -> int:
    if args.algo:
        try:
            meshes.select_algorithm(args.algo)
        except meshes.MeshError as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:
            raise UsageError(f"can't write {meshes.SELECTED_ALGO_FILE}: {exc.strerror}") from None
        return 0

    def render():
        ra = routing_algos(args)
        return ([dumps(ra)] if args.json else tables.routing_algos_lines(ra)), 0

    return _watch(args, render)


# ---------------------------------------------------------------------------------------
# settings


def _c_ulong(text: str) -> int:
    try:
        return grammar.strtoul(text)
    except ValueError:
        raise UsageError(f"the supplied argument is invalid: {text}") from None


def _parse_uint(setting, label: str) -> Callable[[str], int]:
    """batctl's number syntax, then the daemon's range for the key (one schema)."""
    def parse(text: str) -> int:
        try:
            return setting.parse(_c_ulong(text), label=label)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return parse


def _parse_bool(text: str) -> int:
    word = text.strip().lower()
    if word in ("0", "disable", "disabled"):
        return 0
    if word in ("1", "enable", "enabled"):
        return 1
    raise UsageError(f"the supplied argument is invalid: {text} "
                     "(allowed: 0, disable, disabled, 1, enable, enabled)")


@dataclass(frozen=True)
class Setting:
    name: str
    abbr: str
    help: str
    parse: Callable[[str], int]
    boolean: bool = False
    refused: str | None = None  # not implemented yet: why (the schema's message)


def _setting(s) -> Setting:
    name, abbr = s.spec.batctl
    boolean = isinstance(s.default, bool)
    parse = _parse_bool if boolean else _parse_uint(s, name)
    if not s.implemented:
        return Setting(name, abbr, f"{s.spec.help}: not implemented in batmand yet", parse, boolean,
                       s.not_implemented(name))
    allowed = "0|1" if boolean else s.allowed.describe()
    return Setting(name, abbr, f"{s.spec.help}: {allowed} (default {int(s.default) if boolean else s.default})",
                   parse, boolean)


def _refuse_unimplemented(setting: Setting) -> None:
    """Reading or setting a key batmand lacks fails here, before the daemon is asked (it would
    refuse the same way): batctl's read fails too on a kernel built without the feature."""
    if setting.refused:
        raise UsageError(setting.refused)


# the daemon's settings that batctl has a command for (loglevel and gw_mode have their own, below)
SETTINGS = tuple(_setting(s) for s in options.SETTINGS.values()
                 if s.spec.batctl and s.name not in ("loglevel", "gw_mode"))
LOGLEVEL = _setting(options.SETTINGS["loglevel"])


def run_setting(args) -> int:
    setting: Setting = args.setting
    _refuse_unimplemented(setting)
    if len(args.values) > 1:
        raise UsageError("incorrect number of arguments (expected 1)")
    client = client_for(args)
    if not args.values:
        value = client.request("get", {"setting": setting.name})
        emit([dumps(value) if args.json else tables.setting_line(value, setting.boolean)])
        return 0
    client.request("set", {"setting": setting.name, "value": setting.parse(args.values[0])})
    return 0


def run_hardif(args) -> int:
    """batctl hardif IFACE hp|et|to [VALUE]."""
    schema = HARDIF_SETTINGS[args.hardif_setting]
    setting = schema.name
    if len(args.values) > 1:
        raise UsageError("incorrect number of arguments (expected 1)")
    client = client_for(args)
    request = {"ifname": args.hardif, "setting": setting}
    if not args.values:
        value = client.request("hardif_get", request)
        if setting == "throughput_override":
            emit([f"{value // 1000}.{value % 1000 // 100} MBit"])
        else:
            emit([str(value)])
        return 0
    if setting == "throughput_override":
        try:
            value = schema.parse(args.values[0])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        value = _parse_uint(schema, setting)(args.values[0])
    client.request("hardif_set", {**request, "value": value})
    return 0


def run_refused(args) -> int:
    """A batctl command that cannot mean anything for batmand: say why."""
    raise UsageError(args.why)


# batctl's commands batmand refuses, and why
REFUSED = {
    "isolation_mark": "isolation_mark: batmand cannot see packet marks (the kernel matches the skb mark that "
                      "nftables or tc set; frames reach a userspace daemon through the TAP device without it)",
    "network_coding": "network_coding: batman-adv removed network coding (2025.4); batmand does not implement it",
    "bisect_iv": "bisect_iv: it reads the kernel's batman IV debug log (debugfs), which batmand does not write",
}


def loglevel_value(words: list[str]) -> str:
    """batctl's level words as the daemon's value: "none", "all" or names in batctl order."""
    chosen = set()
    for word in words:
        if word == "none":
            return "none"
        if word == "all":
            return "all"
        if word not in tables.LOG_LEVELS:
            raise UsageError(f"unknown log level: {word} (levels: none all {' '.join(tables.LOG_LEVELS)})")
        chosen.add(word)
    return " ".join(name for name in tables.LOG_LEVELS if name in chosen)


def run_loglevel(args) -> int:
    _refuse_unimplemented(LOGLEVEL)
    client = client_for(args)
    if not args.levels:
        value = client.request("get", {"setting": "loglevel"})
        emit([dumps(value)] if args.json else tables.loglevel_lines(value))
        return 0
    client.request("set", {"setting": "loglevel", "value": loglevel_value(args.levels)})
    return 0


# ---------------------------------------------------------------------------------------
# gw_mode, event

GW_MODES = ("off", "client", "server")


def batctl_throughput(text: str, description: str) -> int:
    """batctl's parse_throughput: digits, optionally ending in kbit (the default unit) or
    mbit (any case), in 100 kbit/s units as the kernel takes them."""
    unit, digits = "kbit", text
    if len(text) > 4 and text[-4:].lower() in ("kbit", "mbit"):
        unit, digits = text[-4:].lower(), text[:-4]
    if not digits.isdigit() or not digits.isascii():
        raise UsageError(f"Invalid throughput speed for {description}: {text}")
    value = int(digits) * 10 if unit == "mbit" else int(digits) // 100
    if value > 2**32 - 1:
        raise UsageError(f"Throughput speed for {description} too large: {text}")
    return value


def gw_settings(words: list[str], algo: str) -> list[list]:
    """batctl gw MODE [sel_class|bandwidth] as the settings it changes, in the kernel's order
    (bandwidths, mode, class); bandwidths go to the daemon in kbit/s. As batctl, a server's
    bandwidth without "/UP" leaves the upload bandwidth as it is."""
    if len(words) not in (1, 2):
        raise UsageError("incorrect number of arguments (expected 1/2)")
    mode = words[0]
    if mode not in GW_MODES:
        raise UsageError(f"the supplied argument is invalid: {mode} (allowed: off, client, server)")
    bandwidths, sel_class = [], []
    if len(words) == 2:
        arg = words[1]
        if mode == "off":
            raise UsageError(f'unexpected argument for mode "off": {arg}')
        if mode == "client" and algo == "BATMAN_V":
            sel_class = [["gw_sel_class", batctl_throughput(arg, "sel_class")]]
        elif mode == "client":
            try:
                sel_class = [["gw_sel_class", _c_ulong(arg)]]
            except UsageError:
                raise UsageError(f'unexpected argument for mode "client": {arg}') from None
        else:
            down, slash, up = arg.partition("/")
            bandwidths = [["gw_bandwidth_down", batctl_throughput(down, "download gateway speed") * 100]]
            if slash:
                bandwidths.append(["gw_bandwidth_up", batctl_throughput(up, "upload gateway speed") * 100])
    return bandwidths + [["gw_mode", mode]] + sel_class


def run_gw_mode(args) -> int:
    client = client_for(args)
    state = client.request("gw") or {}
    if not args.words:
        emit([dumps(state) if args.json else tables.gw_mode_line(state)])
        return 0
    client.request("set_many", {"settings": gw_settings(list(args.words), state.get("algo", ""))})
    return 0


def run_multicast_forceflood(args) -> int:
    """batctl multicast_forceflood|mff: the kernel's inverse of multicast_mode (netlink has
    one value; forceflood on = the optimisations off)."""
    if len(args.values) > 1:
        raise UsageError("incorrect number of arguments (expected 1)")
    client = client_for(args)
    if not args.values:
        mode = client.request("get", {"setting": "multicast_mode"})
        emit([dumps(int(not mode)) if args.json else tables.setting_line(not mode, True)])
        return 0
    client.request("set", {"setting": "multicast_mode", "value": 1 - _parse_bool(args.values[0])})
    return 0


def run_mcast_flags(args) -> int:
    """batctl mcast_flags: our flags, the bridge and querier state, and each originator's."""
    client = client_for(args)
    names = {} if args.json else _names(args)

    def render():
        answer = client.request("mcast_flags") or {}
        rows = answer.get("rows") or []
        if args.json:
            return [dumps([tables.mcast_flags_json(r) for r in rows])], 0
        lines = []
        if not args.no_header:
            info = client.request("mesh_info") or {}
            if tables.is_disabled(info):
                return [tables.info_line(info, args.meshif)], 1
            lines += [tables.info_line(info, args.meshif)] + tables.mcast_header_lines(answer.get("own") or {})
        return lines + [tables.mcast_flags_line(r, names) for r in rows], 0

    return _watch(args, render)


# ---------------------------------------------------------------------------------------
# translate, ping, traceroute


def resolve(client: Client, dest: str, names, translate: bool = True) -> str:
    """DEST (bat-hosts name, MAC, IP or host name) -> MAC -> originator. As batctl's
    translate_mac, a MAC the daemon knows no originator for (it answers an error) stays
    as it is; only a missing daemon is an error."""
    mac = resolve_destination(dest, names)
    if mac is None:
        raise UsageError("mac address of the ping destination could not be resolved "
                         f"and is not a bat-host name: {dest}")
    if not translate or not is_valid_unicast(mac):
        return mac
    try:
        result = client.request("translate", {"target": mac})
    except DaemonError:
        return mac
    orig = result.get("orig_address") if isinstance(result, dict) else result
    return tables.norm_mac(orig) if orig else mac


def run_translate(args) -> int:
    client = client_for(args)
    orig = resolve(client, args.dest, load_bat_hosts())
    emit([dumps({"orig_address": orig}) if args.json else orig])
    return 0


def run_ping(args) -> int:
    client = client_for(args)
    names = load_bat_hosts()
    mac = resolve(client, args.dest, names, translate=not args.no_translate)
    printer = tables.PingPrinter(args.dest, mac, args.record_route, names)
    request = {"dst": mac, "count": args.count or PING_COUNT_FOREVER,
               "interval": args.interval if args.interval is not None else args.timeout,
               "timeout": args.timeout, "ttl": PING_TTL, "record_route": args.record_route}
    stream = client.stream("ping", request)
    emit([tables.ping_header(args.dest, mac, args.record_route)])
    summary = None
    try:
        for event in stream:
            emit(printer.event_lines(event))
        summary = stream.result if isinstance(stream.result, dict) else None
    except KeyboardInterrupt:
        stream.close()
    if summary and summary.get("transmitted") is not None:
        transmitted, received = int(summary["transmitted"]), int(summary.get("received") or 0)
    else:
        transmitted, received = printer.events, len(printer.rtts)
    emit(tables.ping_statistics_lines(args.dest, transmitted, received, printer.rtts, summary))
    return 0 if received else 1


def run_traceroute(args) -> int:
    client = client_for(args)
    names = {} if args.no_names else load_bat_hosts()
    mac = resolve(client, args.dest, names, translate=not args.no_translate)
    stream = client.stream("traceroute", {"dst": mac, "timeout": TRACEROUTE_TIMEOUT})
    emit([tables.traceroute_header(args.dest, mac)])
    hop, probes = None, []

    def flush():
        if hop is not None and probes:
            emit([tables.traceroute_hop_line(hop, probes, names)])

    try:
        for event in stream:
            if event.get("type", "probe") != "probe":
                continue
            if event.get("kind") == "unreachable":
                stream.close()
                emit(["%s: Destination Host Unreachable" % args.dest])
                return 1
            if event.get("hop") != hop:
                flush()
                hop, probes = event.get("hop"), []
            probes.append(event)
            if len(probes) >= tables.TRACEROUTE_PROBES:
                flush()
                hop, probes = None, []
        flush()
    except KeyboardInterrupt:
        stream.close()
        return 130
    result = stream.result if isinstance(stream.result, dict) else {}
    return 0 if result.get("reached") else 1


# ---------------------------------------------------------------------------------------
# argparse


def _ping_arg(allowed, integer: bool = False) -> Callable[[str], float]:
    """A ping option checked against the range the daemon takes (batmand.core.ping)."""
    def parse(text: str):
        if integer and not text.strip().lstrip("-").isdigit():  # batctl's -c and -t are whole numbers
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
        try:
            return allowed.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def add_parsers(subparsers) -> None:
    for table in TABLES:
        p = subparsers.add_parser(table.name, aliases=[table.abbr], help=table.help)
        _add_table_options(p)
        if table.max_age:
            p.add_argument("-t", dest="max_age", type=_nonnegative_float, metavar="SECS",
                           help="don't print originators not seen for SECS seconds")
            p.add_argument("-i", dest="outif", metavar="IFACE",
                           help="the originator table for this outgoing interface")
        if table.tt_filters:
            p.add_argument("-u", dest="unicast_only", action="store_true", help="unicast MAC addresses only")
            p.add_argument("-m", dest="multicast_only", action="store_true", help="multicast MAC addresses only")
        p.set_defaults(func=run_table, table=table)

    p = subparsers.add_parser("interface", aliases=["if"], help="list hard interfaces; add/del IFACE...")
    _add_table_options(p)
    p.add_argument("-M", action="store_true", help="don't create the mesh interface on add (manual mode)")
    p.add_argument("words", nargs="*", metavar="add|del IFACE", help="add or del followed by interfaces")
    p.set_defaults(func=run_interface)

    p = subparsers.add_parser("statistics", aliases=["s"], help="traffic and drop counters")
    _add_table_options(p)
    p.set_defaults(func=run_statistics)

    p = subparsers.add_parser("dataplane", aliases=["dp"], help="data-plane workers, their share and drops")
    _add_table_options(p)
    p.set_defaults(func=run_dataplane)

    p = subparsers.add_parser("routing_algo", aliases=["ra"], help="routing algorithms")
    _add_table_options(p)
    p.add_argument("algo", nargs="?", help=argparse.SUPPRESS)
    p.set_defaults(func=run_routing_algo)

    for setting in SETTINGS:
        p = subparsers.add_parser(setting.name, aliases=[setting.abbr], help=setting.help)
        p.add_argument("values", nargs="*", metavar="VALUE", help="new value (none: print the current one)")
        p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
        p.set_defaults(func=run_setting, setting=setting)

    p = subparsers.add_parser("gw_mode", aliases=["gw"], help="gateway mode: off | client [sel_class] | "
                                                            "server [down[/up]] (none: print the current one)")
    p.add_argument("words", nargs="*", metavar="MODE [ARG]")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_gw_mode)

    p = subparsers.add_parser("multicast_forceflood", aliases=["mff"],
                              help="flood our hosts' multicast (the inverse of multicast_mode): 0|1")
    p.add_argument("values", nargs="*", metavar="VALUE", help="new value (none: print the current one)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_multicast_forceflood)

    p = subparsers.add_parser("mcast_flags", aliases=["mf"], help="multicast flags, ours and each originator's")
    _add_table_options(p)
    p.set_defaults(func=run_mcast_flags)

    for schema in HARDIF_SETTINGS.values():
        p = subparsers.add_parser(f"hardif:{schema.name}", help=f"hardif IFACE {schema.spec.batctl[0]}: {schema.spec.help}")
        p.add_argument("values", nargs="*", metavar="VALUE", help="new value (none: print the current one)")
        p.set_defaults(func=run_hardif, hardif_setting=schema.name)

    for name, why in REFUSED.items():
        p = subparsers.add_parser(name, help=why)
        p.add_argument("words", nargs="*", help=argparse.SUPPRESS)
        p.set_defaults(func=run_refused, why=why)

    p = subparsers.add_parser("vlan:ap_isolation", help="ap_isolation of one VLAN")
    p.add_argument("values", nargs="*", metavar="VALUE", help="new value (none: print the current one)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_setting, setting=next(s for s in SETTINGS if s.name == "ap_isolation"))

    p = subparsers.add_parser("loglevel", aliases=["ll"], help=LOGLEVEL.help)
    p.add_argument("levels", nargs="*", metavar="LEVEL",
                   help="none all batman routes tt bla dat mcast tp (none: print the current levels)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run_loglevel)

    p = subparsers.add_parser("ping", aliases=["p"], help="ping another batman-adv node via layer 2")
    p.add_argument("-c", dest="count", type=_ping_arg(ping.COUNT, integer=True),
                   help="ping packet count (default: until Ctrl-C)")
    p.add_argument("-i", dest="interval", type=_ping_arg(ping.INTERVAL), help="interval in seconds")
    p.add_argument("-t", dest="timeout", type=_ping_arg(ping.TIMEOUT, integer=True), default=1,
                   help="timeout in seconds (default 1)")
    p.add_argument("-R", dest="record_route", action="store_true", help="record route")
    p.add_argument("-T", dest="no_translate", action="store_true",
                   help="don't try to translate the MAC to its originator")
    p.add_argument("dest", metavar="mac|bat-host|host_name|IP_address")
    p.set_defaults(func=run_ping)

    p = subparsers.add_parser("traceroute", aliases=["tr"], help="traceroute another batman-adv node via layer 2")
    p.add_argument("-n", dest="no_names", action="store_true", help="don't convert addresses to bat-host names")
    p.add_argument("-T", dest="no_translate", action="store_true",
                   help="don't try to translate the MAC to its originator")
    p.add_argument("dest", metavar="mac|bat-host|host_name|IP_address")
    p.set_defaults(func=run_traceroute)

    p = subparsers.add_parser("translate", aliases=["t"], help="the originator responsible for a destination")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("dest", metavar="mac|bat-host|host_name|IP_address")
    p.set_defaults(func=run_translate)

