"""Daemon options: command line, TOML file per mesh interface, kernel defaults.

Every key of the TOML file can also be given on the command line (`--set key=value`);
the command line wins. SETTINGS is the schema of every key: the daemon's own (Options,
below) and the mesh's (batmand.core.config.MeshConfig); HARDIF_SETTINGS those of each
hard interface ([hardif.IFACE]). Every value is checked here, against its range and the
rules between keys, before anything is created: a bad one is refused naming the key."""

from __future__ import annotations

import argparse
import grp
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field

from batmand.core.config import (FLAG, HARDIF_SETTINGS, IFNAME, MESH_SETTINGS, Choice, ListOf, MeshConfig, Range,
                                 Setting, SettingError, Text, check_rules, setting, settings_of)

from batmand.core.algorithm import ALGORITHMS
from batmand.core.gateway import resolve_sel_class
from batmand.core import mesh as _mesh  # noqa: F401 - registers the routing algorithms

from batmand import __version__

from .protocol import default_socket_path

MAX_WORKERS = 64
LOG_FILE_BYTES = 512 * 1024  # --log-file: a daemon started in the background must not fill /run


class Workers(Range):
    """0 (inline) to MAX_WORKERS processes, or "auto": one per CPU."""

    def parse(self, raw):
        if isinstance(raw, str) and raw.strip().lower() == "auto":
            return auto_workers()
        return super().parse(raw)

    def describe(self) -> str:
        return f"{super().describe()}, or auto"


def auto_workers() -> int:
    return min(os.cpu_count() or 1, MAX_WORKERS)


class UnicastMac(Text):
    def parse(self, raw):
        if raw == "":
            return None
        value = super().parse(raw)
        if value is not None and (int(value[:2], 16) & 1 or not int(value.replace(":", ""), 16)):
            raise ValueError(f"{raw!r} is not allowed ({self.describe()})")
        return value


class ListenAddress(Text):
    """HOST:PORT with HOST an IP literal (IPv6 in brackets) or empty (every address); ""
    is off. No host names: the daemon starts without asking DNS."""

    def parse(self, raw):
        value = super().parse(raw)
        if value:
            listen_address(value)
        return value


def listen_address(value: str) -> tuple[str | None, int]:
    """(host, port) of a metrics_listen value; host None: every address. ValueError if bad."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{value!r} has no port 1..65535 (expected HOST:PORT, [IPV6]:PORT or :PORT)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not isinstance(_ip(host, value), ipaddress.IPv6Address):
            raise ValueError(f"{value!r}: only an IPv6 address goes in brackets")
    elif host:
        if not isinstance(_ip(host, value), ipaddress.IPv4Address):
            raise ValueError(f"{value!r}: write an IPv6 address in brackets ([::1]:PORT)")
    return host or None, int(port)


def _ip(host: str, value: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{value!r}: {host!r} is not an IP address (host names are not looked up)") from None


class GroupName(Text):
    def parse(self, raw):
        value = super().parse(raw)
        if value:
            try:
                grp.getgrnam(value)
            except KeyError:
                raise ValueError(f"group {value!r} does not exist") from None
        return value


_DATA_PLANE = 'The data plane (see README, "The data plane"):'


@dataclass
class Options:
    meshif: str = setting("bat0", IFNAME, live=False, help="the mesh (soft) interface")
    interfaces: list[str] = setting(allowed=ListOf(IFNAME), factory=list, example='["eth0"]',
                                    help="hard interfaces; the first is the primary")
    control_socket: str | None = setting(None, Text(r"[^\0]*", "a path or @NAME, at most 107 bytes", optional=True,
                                                    max_bytes=107), live=False, example='"@batmand/bat0"',
                                         help="default: @batmand/<meshif>, one per network namespace")
    state_dir: str | None = setting(None, Text(r"(/[^\0]*)?", 'an absolute path ("" keeps no state)', optional=True),
                                    live=False, example='"/var/lib/batmand"', help="seqnos kept across restarts")
    control_group: str = setting("", GroupName(r"[^\s:]*", 'an existing group, or ""'), live=False,
                                 help="a group that may use the control socket")
    control_max_request: int = setting(65536, Range(1024, 16 * 1024 * 1024, "bytes"), live=False,
                                       help="the longest control request line")
    event_hook: str | None = setting(None, Text(r"/[^\0]*", "an absolute path of an executable", optional=True),
                                     live=False, example='"/etc/batmand/event-hook"',
                                     help="run on each uevent (gateway add/change/del) with BATTYPE, BATACTION, "
                                          "BATDATA and INTERFACE in its environment, as hotplug scripts get them")
    # batadv-vis -s for this node (daemon/alfred.py); off, as batadv-vis -s is something one runs deliberately
    alfred_vis: bool = setting(False, FLAG, help="publish our batadv-vis record (interfaces, neighbours, clients) "
                                                 "into alfred, for batadv-vis on any node")
    alfred_socket: str = setting("/var/run/alfred.sock", Text(r"/[^\0]*", "an absolute path, at most 107 bytes",
                                                              max_bytes=107),
                                 help="alfred's unix socket (alfred -u)")
    alfred_vis_interval_ms: int = setting(10_000, Range(1_000, 3_600_000, "ms"),
                                          help="how often the record is pushed (batadv-vis -s: every 10 s)")
    metrics_listen: str = setting("", ListenAddress(r"\S*", 'HOST:PORT, [IPV6]:PORT, :PORT (every address), '
                                                                'or "" (off)'), live=False, example='"127.0.0.1:9140"',
                                  help="serve Prometheus metrics over HTTP at /metrics (off by default)")
    mac: str | None = setting(None, UnicastMac(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}", "a unicast MAC address",
                                               optional=True), live=False, example='"02:00:00:00:00:01"',
                              help="soft interface MAC (default: a random locally administered one)")
    workers: int = setting(allowed=Workers(0, MAX_WORKERS), factory=auto_workers, live=False, example='"auto"',
                           section=_DATA_PLANE, help="worker processes, one per CPU; 0 runs the data plane inline")
    gro: bool = setting(True, FLAG, live=False, help="coalesce TCP segments delivered to the host into GSO frames "
                                                       "(in the workers, and by GRO on the kernel path)")
    tso: bool = setting(True, FLAG, live=False,
                        help="accept TSO super-frames from the host, segment them in the workers")
    csum_offload: bool = setting(True, FLAG, live=False,
                                 help="leave partial checksums to the kernel (TAP and the hard interfaces)")
    kernel_forward: bool = setting(True, FLAG, live=False,
                                   help="move plain unicast in the kernel (eBPF on the hard interfaces' ingress "
                                        "and the soft interface's egress, Linux 6.6+): forward it through this "
                                        "node, deliver it to the host and send it from the host (TCP cut into "
                                        "segments by the stack, through a hidden veth pair <meshif>-kseg / -kgro), "
                                        "instead of in the daemon")
    rx_ring: str = setting("v2", Choice(("v2", "v3")), live=False,
                           help="PACKET_MMAP receive ring: v2 (a wake-up per burst) or v3 (block timer)")
    # not settings: what the keys above fill in
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # per hard interface, the keys given: {"eth0": {"throughput_override": kbit/s, "elp_interval": ms, ...}}
    hardif: dict = field(default_factory=dict)
    argv: list | None = None  # the command line, to read the configuration again on SIGHUP
    log_file: str | None = None  # --log-file: a bounded log instead of stderr (batmanctl interface create)

    @property
    def socket_path(self) -> str:
        return self.control_socket or default_socket_path(self.meshif)

    @property
    def state_directory(self) -> str:
        """/var/lib/batmand, or next to a control socket relocated to a file path. The files
        in it are named by mesh interface and originator, so nodes never share one."""
        if self.state_dir is not None:
            return self.state_dir
        if self.control_socket and not self.control_socket.startswith("@"):
            return os.path.dirname(self.control_socket)
        return "/var/lib/batmand"


DAEMON_SETTINGS = settings_of(Options, "daemon")
SETTINGS: dict[str, Setting] = {**DAEMON_SETTINGS, **MESH_SETTINGS}
assert len(SETTINGS) == len(DAEMON_SETTINGS) + len(MESH_SETTINGS), "a daemon key shadows a mesh key"
# batctl's names for the keys that have another one (orig_interval is orig_interval_ms)
BATCTL_NAMES = {s.spec.batctl[0]: s for s in SETTINGS.values() if s.spec.batctl}


class OptionsError(ValueError):
    pass


def lookup(name) -> Setting | None:
    """A key by its name or batctl's."""
    return SETTINGS.get(name) or BATCTL_NAMES.get(name) if isinstance(name, str) else None


def value_of(options: Options, setting: Setting):
    return getattr(options.mesh if setting.scope == "mesh" else options, setting.name)


def store(options: Options, setting: Setting, value) -> None:
    setattr(options.mesh if setting.scope == "mesh" else options, setting.name, value)


def elp_intervals(hardif: dict) -> dict[str, int]:
    """The configured elp_interval of each hard interface, for check_rules."""
    return {f"hardif.{ifname}.elp_interval": values["elp_interval"]
            for ifname, values in hardif.items() if "elp_interval" in values}


def _apply(options: Options, values: dict, source: str) -> None:
    for key, raw in values.items():
        if key == "hardif":
            if not isinstance(raw, dict) or not all(isinstance(t, dict) for t in raw.values()):
                raise OptionsError(f"{source}: hardif: expected one table per interface ([hardif.eth0])")
            for ifname, table in raw.items():
                for name, value in table.items():
                    _apply_hardif(options, ifname, name, value, source)
        elif key.startswith("hardif."):
            parts = key.split(".")
            if len(parts) != 3:
                raise OptionsError(f"{source}: expected hardif.IFACE.KEY, got {key!r}")
            _apply_hardif(options, parts[1], parts[2], raw, source)
        else:
            setting = SETTINGS.get(key)
            if setting is None:
                raise OptionsError(f"{source}: unknown setting {key!r}")
            try:
                store(options, setting, setting.parse(raw))
            except SettingError as exc:
                raise OptionsError(f"{source}: {exc}") from None


def _apply_hardif(options: Options, ifname: str, name: str, raw, source: str) -> None:
    setting = HARDIF_SETTINGS.get(name)
    if setting is None:
        raise OptionsError(f"{source}: unknown hard-interface setting {name!r} (for {ifname}; "
                           f"known: {', '.join(HARDIF_SETTINGS)})")
    try:
        IFNAME.parse(ifname)
    except ValueError as exc:
        raise OptionsError(f"{source}: hardif: {exc}") from None
    try:
        value = setting.parse(raw, label=f"hardif.{ifname}.{name}")
    except SettingError as exc:
        raise OptionsError(f"{source}: {exc}") from None
    options.hardif.setdefault(ifname, {})[name] = value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batmand", description="batman-adv (compat 15) mesh daemon")
    p.add_argument("-m", "--meshif", help="mesh (soft) interface to create (default bat0)")
    p.add_argument("-i", "--interface", action="append", default=[], metavar="IFACE",
                   help="hard interface to attach (repeatable; the first is the primary)")
    p.add_argument("--config", metavar="FILE", help="TOML file (default /etc/batmand/<meshif>.toml if present)")
    p.add_argument("--control-socket", metavar="PATH", help="control socket: a file path, or @NAME for an abstract name "
                        "(default @batmand/<meshif>, one per network namespace)")
    p.add_argument("--workers", help="data-plane worker processes: a number, or auto (the default: one per CPU); "
                                     "0 runs the data plane inline")
    p.add_argument("--routing-algo", choices=MESH_SETTINGS["routing_algo"].allowed.values, help="routing algorithm")
    p.add_argument("--state-dir", metavar="DIR", help="where seqnos are kept across restarts")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any configuration key")
    p.add_argument("--log-file", metavar="PATH", help=f"log to PATH, kept under {LOG_FILE_BYTES // 1024} KiB "
                   "(one older file PATH.1 besides), instead of to stderr")
    p.add_argument("--version", action="version", version=f"batmand {__version__} (batman-adv compat 15)")
    return p


def load(argv: list[str] | None = None) -> Options:
    args = parser().parse_args(argv)
    options = _load(args)
    options.argv = list(argv) if argv is not None else None
    options.log_file = args.log_file
    return options


def _load(args) -> Options:
    options = Options()
    meshif = args.meshif or "bat0"
    path = args.config or f"/etc/batmand/{meshif}.toml"
    if args.config or os.path.exists(path):
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except OSError as exc:
            raise OptionsError(f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise OptionsError(f"{path}: {exc}") from None
        _apply(options, values, path)
    cli: dict = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise OptionsError(f"--set needs KEY=VALUE, got {item!r}")
        cli[key.strip()] = value.strip()
    if args.meshif:
        cli["meshif"] = args.meshif
    if args.interface:
        cli["interfaces"] = args.interface
    if args.control_socket:
        cli["control_socket"] = args.control_socket
    if args.workers is not None:
        cli["workers"] = args.workers
    if args.routing_algo:
        cli["routing_algo"] = args.routing_algo
    if args.state_dir is not None:
        cli["state_dir"] = args.state_dir
    _apply(options, cli, "command line")
    try:
        check_rules(options.mesh, elp_intervals(options.hardif))
        resolve_sel_class(options.mesh, ALGORITHMS[options.mesh.routing_algo])
    except SettingError as exc:
        raise OptionsError(str(exc)) from None
    return options
