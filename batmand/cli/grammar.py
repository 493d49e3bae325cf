"""batctl's command grammar (main.c of batctl 2023): the global options, the selectors that
pick a scope (meshif IFACE [vid VID], vlan VLANDEV, hardif IFACE, a bare interface name),
and which commands each scope has. The commands themselves are argparse subcommands
(commands.py and friends); this module only decides which one runs, for which mesh.

    batctl [-h] [-v] [-m MESHIF] [meshif IFACE [vid VID] | vlan VLANDEV | hardif IFACE | IFACE] COMMAND ...
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from batmand import __version__

from .client import SOCKET_ENV

BATCTL_VERSION = "2023.3"  # the batctl whose grammar and output we follow
DEFAULT_MESHIF = "bat0"
MAX_VID = 4095

# scopes (batctl's command types): which selector makes a command reachable
GLOBAL, MESH, VLAN, HARDIF = "global", "mesh", "vlan", "hardif"
SCOPES_WITHOUT_SELECTOR = (GLOBAL, MESH)  # no selector: batctl's SUBCOMMAND, _MIF, DEBUGTABLE, JSON_MIF


class GrammarError(Exception):
    """batctl's "Error - ..." before a command runs; `usage` says whether the usage follows."""

    def __init__(self, message: str, usage: bool = True):
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True)
class Command:
    name: str
    abbr: str
    scope: str
    section: str  # the usage's section: "commands", "debug tables", "JSON queries", "batmand"
    usage: str = ""
    target: str = ""  # the argparse subcommand; default: the name
    hidden: bool = False  # batctl keeps multicast_mode but leaves it out of the usage

    @property
    def subcommand(self) -> str:
        return self.target or self.name


def _commands() -> tuple[Command, ...]:
    c, t, j = "commands", "debug tables", "JSON queries"
    return (
        # settings and tools, in batctl's usage order
        Command("aggregation", "ag", MESH, c, "[0|1]             \tdisplay or modify aggregation setting"),
        Command("ap_isolation", "ap", MESH, c, "[0|1]             \tdisplay or modify ap_isolation setting"),
        Command("ap_isolation", "ap", VLAN, c, "[0|1]             \tdisplay or modify ap_isolation setting for vlan "
                "device or id", target="vlan:ap_isolation"),
        Command("bisect_iv", "bisect_iv", GLOBAL, c, "<file1> .. <fileN>\tanalyze given batman iv log files for "
                "routing stability"),
        Command("bonding", "b", MESH, c, "[0|1]             \tdisplay or modify bonding setting"),
        Command("bridge_loop_avoidance", "bl", MESH, c, "[0|1]             \tdisplay or modify "
                "bridge_loop_avoidance setting"),
        Command("distributed_arp_table", "dat", MESH, c, "[0|1]             \tdisplay or modify "
                "distributed_arp_table setting"),
        Command("elp_interval", "et", HARDIF, c, "[interval]        \tdisplay or modify elp_interval setting",
                target="hardif:elp_interval"),
        Command("event", "e", GLOBAL, c, "                  \tdisplay events from batman-adv"),
        Command("fragmentation", "f", MESH, c, "[0|1]             \tdisplay or modify fragmentation setting"),
        Command("gw_mode", "gw", MESH, c, "[mode]            \tdisplay or modify the gateway mode"),
        Command("hop_penalty", "hp", MESH, c, "[penalty]         \tdisplay or modify hop_penalty setting"),
        Command("hop_penalty", "hp", HARDIF, c, "[penalty]         \tdisplay or modify hop_penalty setting",
                target="hardif:hop_penalty"),
        Command("interface", "if", MESH, c, "[add|del iface(s)]\tdisplay or modify the interface settings"),
        Command("isolation_mark", "mark", MESH, c, "[mark]            \tdisplay or modify isolation_mark setting"),
        Command("loglevel", "ll", MESH, c, "[level]           \tdisplay or modify the log level"),
        Command("multicast_fanout", "mo", MESH, c, "[fanout]          \tdisplay or modify multicast_fanout setting"),
        Command("multicast_forceflood", "mff", MESH, c, "[0|1]             \tdisplay or modify "
                "multicast_forceflood setting"),
        Command("multicast_mode", "mm", MESH, c, hidden=True),
        Command("network_coding", "nc", MESH, c, "[0|1]             \tdisplay or modify network_coding setting"),
        Command("orig_interval", "it", MESH, c, "[interval]        \tdisplay or modify orig_interval setting"),
        Command("ping", "p", MESH, c, "<destination>     \tping another batman adv host via layer 2"),
        Command("routing_algo", "ra", GLOBAL, c, "[mode]            \tdisplay or modify the routing algorithm"),
        Command("statistics", "s", MESH, c, "                  \tprint mesh statistics"),
        Command("tcpdump", "td", GLOBAL, c, "<interface>       \ttcpdump layer 2 traffic on the given interface"),
        Command("throughputmeter", "tp", MESH, c, "<destination>     \tstart a throughput measurement"),
        Command("throughput_override", "to", HARDIF, c, "[mbit]            \tdisplay or modify "
                "throughput_override setting", target="hardif:throughput_override"),
        Command("traceroute", "tr", MESH, c, "<destination>     \ttraceroute another batman adv host via layer 2"),
        Command("translate", "t", MESH, c, "<destination>     \ttranslate a destination to the originator "
                "responsible for it"),
        # debug tables
        Command("backbonetable", "bbt", MESH, t),
        Command("claimtable", "cl", MESH, t),
        Command("dat_cache", "dc", MESH, t),
        Command("gateways", "gwl", MESH, t),
        Command("mcast_flags", "mf", MESH, t),
        Command("neighbors", "n", MESH, t),
        Command("originators", "o", MESH, t),
        Command("transglobal", "tg", MESH, t),
        Command("translocal", "tl", MESH, t),
        # JSON queries
        Command("bla_backbone_json", "bbj", MESH, j),
        Command("bla_claim_json", "clj", MESH, j),
        Command("dat_cache_json", "dcj", MESH, j),
        Command("gateways_json", "gwj", MESH, j),
        Command("hardif_json", "hj", HARDIF, j),
        Command("hardifs_json", "hj", MESH, j),
        Command("mcast_flags_json", "mfj", MESH, j),
        Command("mesh_json", "mj", MESH, j),
        Command("neighbors_json", "nj", MESH, j),
        Command("originators_json", "oj", MESH, j),
        Command("transtable_global_json", "tgj", MESH, j),
        Command("transtable_local_json", "tlj", MESH, j),
        Command("vlan_json", "vj", VLAN, j),
        # batmand's own
        Command("dataplane", "dp", MESH, "batmand", "                  \tdata-plane workers, their share and drops"),
        Command("topology", "topology", MESH, "batmand", "[--json|--dot|--png FILE]\tthe local view of the mesh"),
        Command("install-batctl", "install-batctl", GLOBAL, "batmand",
                "[--dir DIR]       \tinstall this grammar as `batctl` (where no batctl is installed)"),
    )


COMMANDS = _commands()


def lookup(word: str, scopes: tuple[str, ...]) -> Command | None:
    for command in COMMANDS:
        if command.scope in scopes and word in (command.name, command.abbr):
            return command
    return None


def is_command_name(word: str) -> bool:
    return any(word in (c.name, c.abbr) for c in COMMANDS)


# ---------------------------------------------------------------------------------------
# what the host knows of interfaces (batctl asks rtnetlink; we read /sys and /proc)

SYS_NET = "/sys/class/net"


def netdev_exists(name: str) -> bool:
    return bool(name) and "/" not in name and os.path.exists(os.path.join(SYS_NET, name))


def vlan_device(name: str) -> tuple[str, int] | None:
    """(lower device, vid) of an 802.1Q device, from /proc/net/vlan (the 8021q module's view,
    loaded whenever a VLAN device exists)."""
    try:
        with open(f"/proc/net/vlan/{name}") as f:
            text = f.read()
    except OSError:
        return None
    vid = re.search(r"VID:\s*(\d+)", text)
    lower = re.search(r"Device:\s*(\S+)", text)
    if not vid or not lower:
        return None
    return lower.group(1), int(vid.group(1))


def running_meshes() -> list[str]:
    """The mesh interfaces that have a batmand in this network namespace: the abstract control
    sockets @batmand/<meshif> (the locks end in .lock), as /proc/net/unix lists them."""
    found = []
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) >= 8 and parts[-1].startswith("@batmand/"):
                    name = parts[-1][len("@batmand/"):]
                    if name and not name.endswith(".lock") and name not in found:
                        found.append(name)
    except OSError:
        pass
    return sorted(found)


def meshes_to_ask(meshif: str, socket: str | None) -> list[str]:
    """The mesh interfaces a namespace-wide command (event, ra, finding a hardif's mesh) asks:
    the one an explicit socket (--socket, $BATMAND_SOCKET) names, else every running one."""
    if socket or os.environ.get(SOCKET_ENV):
        return [meshif]
    return running_meshes()


# ---------------------------------------------------------------------------------------
# the parse


@dataclass
class Invocation:
    """What the command line asks for: a command in a scope, for a mesh."""

    command: Command | None = None
    rest: list[str] = field(default_factory=list)
    meshif: str = DEFAULT_MESHIF
    vid: int | None = None
    hardif: str | None = None
    socket: str | None = None
    show_help: bool = False
    show_version: bool = False
    warnings: list[str] = field(default_factory=list)


def strtoul(text: str) -> int:
    """strtoul(text, &end, 0) taking the whole string: 0x.. hex, 0.. octal, else decimal;
    ValueError otherwise (batctl's number syntax)."""
    t = text.strip()
    if not t.isascii() or not t.isalnum():  # int() would also take "1_000", "+5", "٣"
        raise ValueError(text)
    if t.lower().startswith("0x"):
        value = int(t[2:], 16)
    elif len(t) > 1 and t.startswith("0"):
        value = int(t[1:], 8)
    else:
        value = int(t, 10)
    if value < 0:
        raise ValueError(text)
    return value


def parse_vid(text: str) -> int:
    """batctl's translate_vid: strtoul base 0, at most 4095."""
    try:
        value = strtoul(text)
    except ValueError:
        raise GrammarError("unparsable vid") from None
    if value > MAX_VID:
        raise GrammarError(f"too large vid (max {MAX_VID})")
    return value


def parse(argv: list[str], hardif_mesh=None) -> Invocation:
    """The global options, the selector and the command word of `argv`. hardif_mesh(ifname, inv)
    names the mesh a hard interface belongs to (None: not in one); the caller asks the daemons."""
    inv = Invocation()
    meshif_given = False
    i = 0
    # the global options stop at the first word that is not one (getopt's "+hm:v")
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg in ("-h", "--help"):
            inv.show_help = True
            return inv
        if arg in ("-v", "--version"):
            inv.show_version = True
            return inv
        if arg in ("-m", "--meshif") or arg.startswith("-m") or arg.startswith("--meshif="):
            if arg in ("-m", "--meshif"):
                if i + 1 >= len(argv):
                    raise GrammarError(f"option '{arg}' needs a mesh interface as argument")
                value, i = argv[i + 1], i + 2
            else:
                value, i = arg.split("=", 1)[1] if arg.startswith("--") else arg[2:], i + 1
            if meshif_given:
                raise GrammarError("multiple mesh interfaces specified")
            meshif_given = True
            if arg.startswith("-m"):
                inv.warnings.append("Warning - option -m was deprecated and will be removed in the future")
            inv.meshif = value
            continue
        if arg == "--socket" or arg.startswith("--socket="):
            if arg == "--socket":
                if i + 1 >= len(argv):
                    raise GrammarError("option '--socket' needs a path as argument")
                inv.socket, i = argv[i + 1], i + 2
            else:
                inv.socket, i = arg.split("=", 1)[1], i + 1
            continue
        raise GrammarError(f"unrecognised option '{arg}'")

    words = argv[i:]
    scopes: tuple[str, ...] = SCOPES_WITHOUT_SELECTOR
    # -m (or the default) naming a VLAN device on a mesh: that VLAN (batctl translates it)
    if meshif_given:
        vlan = vlan_device(inv.meshif)
        if vlan is not None:
            inv.meshif, inv.vid = vlan
            scopes = (VLAN,)

    if len(words) >= 2 and words[0] == "meshif":
        inv.meshif, words, scopes = words[1], words[2:], (MESH,)
        if len(words) >= 2 and words[0] == "vid":
            inv.vid, words, scopes = parse_vid(words[1]), words[2:], (VLAN,)
    elif len(words) >= 2 and words[0] == "vlan":
        vlan = vlan_device(words[1])
        if vlan is None:
            reason = "Invalid argument" if netdev_exists(words[1]) else "No such device"
            raise GrammarError(f"invalid vlan device {words[1]}: {reason}")
        (inv.meshif, inv.vid), words, scopes = vlan, words[2:], (VLAN,)
    elif len(words) >= 2 and words[0] == "hardif":
        mesh = hardif_mesh(words[1], inv) if hardif_mesh else None
        if mesh is None:
            reason = "Link has been severed" if netdev_exists(words[1]) else "No such device"
            raise GrammarError(f"invalid hardif {words[1]}: {reason}")
        inv.meshif, inv.hardif, words, scopes = mesh, words[1], words[2:], (HARDIF,)
    elif words and not is_command_name(words[0]) and netdev_exists(words[0]):
        # a bare interface name: its kind picks the scope (batctl guesses the same way)
        name = words[0]
        vlan = vlan_device(name)
        mesh = None if vlan else (hardif_mesh(name, inv) if hardif_mesh else None)
        if vlan is not None:
            (inv.meshif, inv.vid), scopes = vlan, (VLAN,)
        elif name in running_meshes():
            inv.meshif, scopes = name, (MESH,)
        elif mesh is not None:
            inv.meshif, inv.hardif, scopes = mesh, name, (HARDIF,)
        if scopes != SCOPES_WITHOUT_SELECTOR:
            words = words[1:]

    if not words:
        raise GrammarError("no command specified")
    command = lookup(words[0], scopes)
    if command is None:
        raise GrammarError(f"no valid command or debug table/JSON specified: {words[0]}")
    inv.command, inv.rest = command, words[1:]
    return inv


# ---------------------------------------------------------------------------------------
# usage and version


def usage(prog: str) -> str:
    """batctl's print_usage, with batmand's own commands in a section of their own."""
    lines = [f"Usage: {prog} [options] command|debug table|debug json [parameters]",
             "options:",
             f" \t-h print this help (or '{prog} <command|debug table|debug json> -h' for the parameter help)",
             " \t-v print version"]
    prefixes = {GLOBAL: [""], MESH: ["meshif <netdev> "], VLAN: ["vlan <vdev> ", "meshif <netdev> vid <vid> "],
                HARDIF: ["hardif <netdev> "]}
    titles = {"commands": "commands:",
              "debug tables": "debug tables:                                   \tdisplay the corresponding debug table",
              "JSON queries": "JSON queries:                                   \tdisplay results of netlink query "
                              "as JSON",
              "batmand": "batmand's own:"}
    for section, title in titles.items():
        lines += ["", title]
        for command in COMMANDS:
            if command.section != section or command.hidden:
                continue
            names = command.name if command.abbr == command.name else f"{command.name}|{command.abbr}"
            for prefix in prefixes[command.scope]:
                lines.append(" \t%-43s%s" % (prefix + names, command.usage))
    return "\n".join(lines) + "\n"


def version_line(prog: str) -> str:
    if prog == "batctl":
        return f"batctl {BATCTL_VERSION} [batman-adv: batmand {__version__}]"
    return f"{prog} {__version__} (batctl {BATCTL_VERSION} grammar; batman-adv compat 15)"
