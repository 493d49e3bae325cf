"""Daemon options: command line, TOML file per mesh interface, kernel defaults.

Every key of the TOML file can also be given on the command line (`--set key=value`);
the command line wins. Mesh settings are the fields of batmand.core.config.MeshConfig."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field

from batmand.core.config import MeshConfig

from .protocol import default_socket_path

DAEMON_KEYS = {"interfaces", "workers", "control_socket", "meshif", "mac", "state_dir", "control_group",
               "control_max_request", "gro", "tso", "csum_offload", "rx_ring"}
RX_RINGS = ("v2", "v3")
HARDIF_KEYS = {"elp_interval", "throughput_override", "hop_penalty"}


@dataclass
class Options:
    meshif: str = "bat0"
    interfaces: list[str] = field(default_factory=list)
    control_socket: str | None = None
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # data-plane processes; 0 = inline
    gro: bool = True  # coalesce TCP segments delivered to the host into GSO frames
    tso: bool = True  # take TSO super-frames from the host and segment them in the data plane
    csum_offload: bool = True  # leave partial checksums to the kernel (TAP and PACKET_VNET_HDR)
    rx_ring: str = "v2"  # PACKET_MMAP receive ring: v2 (per-frame wake-up) or v3 (blocks)
    mac: str | None = None  # soft interface MAC; random locally administered when unset
    state_dir: str | None = None  # seqnos kept across restarts ("" disables; default below)
    control_group: str = ""  # a group allowed to use the control socket (mode 0660)
    control_max_request: int = 65536  # bytes per control request line
    mesh: MeshConfig = field(default_factory=MeshConfig)
    # per hard interface: {"eth0": {"throughput_override": kbit/s, "elp_interval": ms, "hop_penalty": n}}
    hardif: dict = field(default_factory=dict)
    argv: list | None = None  # the command line, to read the configuration again on SIGHUP

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


class OptionsError(ValueError):
    pass


def _convert(name: str, raw, current):
    """Coerce a TOML or command-line value to the type of the default."""
    if isinstance(current, bool):
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on", "enabled"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off", "disabled"):
            return False
        raise OptionsError(f"{name}: expected a boolean, got {raw!r}")
    if isinstance(current, int):
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise OptionsError(f"{name}: expected an integer, got {raw!r}") from None
    if isinstance(current, list):
        return list(raw) if isinstance(raw, list) else [x for x in str(raw).split(",") if x]
    return raw if raw is None else str(raw)


def _apply(options: Options, values: dict, source: str) -> None:
    mesh_fields = {f.name: f for f in dataclasses.fields(MeshConfig)}
    for key, raw in values.items():
        if key == "hardif" and isinstance(raw, dict):
            for ifname, settings in raw.items():
                for name, value in (settings or {}).items():
                    _apply_hardif(options, ifname, name, value, source)
        elif key.startswith("hardif.") and key.count(".") == 2:
            _, ifname, name = key.split(".")
            _apply_hardif(options, ifname, name, raw, source)
        elif key == "workers" and str(raw).lower() == "auto":
            options.workers = os.cpu_count() or 1
        elif key in DAEMON_KEYS:
            current = getattr(options, key)
            value = _convert(key, raw, current if current is not None else "")
            setattr(options, key, value)
        elif key in mesh_fields:
            setattr(options.mesh, key, _convert(key, raw, getattr(options.mesh, key)))
        else:
            raise OptionsError(f"{source}: unknown setting {key!r}")


def parse_throughput(value) -> int:
    """kbit/s from batctl's throughput syntax: a number (kbit), or with kbit/mbit/gbit.
    Also used by batmanctl; raises ValueError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)?\s*", str(value).lower())
    if not match:
        raise ValueError(f"invalid throughput: {value} (e.g. 500kbit, 100mbit, 1gbit)")
    factor = {"kbit": 1, "mbit": 1000, "gbit": 1_000_000, None: 1}[match[2]]
    return int(float(match[1]) * factor)


def _apply_hardif(options: Options, ifname: str, name: str, value, source: str) -> None:
    if name not in HARDIF_KEYS:
        raise OptionsError(f"{source}: unknown hard-interface setting {name!r} (for {ifname})")
    try:
        number = parse_throughput(value) if name == "throughput_override" else int(value)
    except (TypeError, ValueError):
        raise OptionsError(f"{source}: {ifname}.{name}: not a number: {value!r}") from None
    options.hardif.setdefault(ifname, {})[name] = number


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
    p.add_argument("--routing-algo", choices=["BATMAN_IV", "BATMAN_V"], help="routing algorithm")
    p.add_argument("--state-dir", metavar="DIR", help="where seqnos are kept across restarts")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any configuration key")
    return p


def load(argv: list[str] | None = None) -> Options:
    args = parser().parse_args(argv)
    options = _load(args)
    options.argv = list(argv) if argv is not None else None
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
    if not 0 <= options.workers <= 64:
        raise OptionsError(f"workers: expected 0 (inline) to 64, got {options.workers}")
    if options.rx_ring not in RX_RINGS:
        raise OptionsError(f"rx_ring: expected one of {', '.join(RX_RINGS)}, got {options.rx_ring!r}")
    return options
