"""Settings of one mesh interface and of its hard interfaces, and the schema they are
checked against.

Every field is declared with `setting(default, allowed, ...)`: the default is the kernel's
(research notes §4); `allowed` is the kernel's range where it has one (sysfs and netlink),
else ours; `live` settings take effect while running (SIGHUP, the control socket), the
others after a restart. The limits are ours: the kernel has none for most tables a peer
can fill. batmand.daemon.options adds the daemon's own keys and is the one registry that
the TOML loader, `--set`, the control socket, batmanctl and the sample config use.

A key of a kernel feature batmand does not have yet carries `feature=` (what it is called):
every entry point refuses it, naming the key and the kernel's default (its declared
default, which it gets once the feature exists). The feature's module removes the marker."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field

INT_MAX = 2**31 - 1  # the kernel caps its millisecond intervals here
U32_MAX = 2**32 - 1
JITTER_MS = 20  # BATADV_JITTER
LOG_LEVELS = ("batman", "routes", "tt", "bla", "dat", "mcast", "tp")  # batctl's order


class SettingError(ValueError):
    """A refused value; the message names the key and what it allows."""


# --- what a setting allows ------------------------------------------------------------------
# parse() turns a TOML value, a command-line word or a JSON value into the setting's value,
# or raises ValueError with a message that the caller prefixes with the key.


@dataclass(frozen=True)
class Range:
    lo: int | float
    hi: int | float
    unit: str = ""
    real: bool = False  # a float (seconds), not an integer

    def parse(self, raw):
        if self.real:
            value = _real(raw)
        else:
            if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                raise ValueError(f"expected an integer, got {raw!r}")
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"expected an integer, got {raw!r}") from None
        if not self.lo <= value <= self.hi:
            raise ValueError(f"{_number(value)} is out of range ({self.describe()})")
        return value

    def describe(self) -> str:
        text = f"{_number(self.lo)}..{_number(self.hi)}"
        return f"{text} {self.unit}" if self.unit else text


def _number(value) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**63 else f"{value:g}"


def _real(raw) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"expected a number, got {raw!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {raw!r}")
    return value


@dataclass(frozen=True)
class Throughput(Range):
    """kbit/s, written as batctl does: a number (kbit), or with kbit/mbit/gbit. The kernel
    keeps it as a u32 in 100 kbit/s units."""

    lo: int = 0
    hi: int = U32_MAX * 100
    unit: str = "kbit/s"

    def parse(self, raw):
        if isinstance(raw, bool):
            raise ValueError(f"expected a throughput, got {raw!r}")
        match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(kbit|mbit|gbit)?\s*", str(raw).lower())
        if not match:
            raise ValueError(f"expected a throughput (e.g. 500kbit, 100mbit, 1gbit), got {raw!r}")
        factor = {"kbit": 1, "mbit": 1000, "gbit": 1_000_000, None: 1}[match[2]]
        return super().parse(int(float(match[1]) * factor))

    def describe(self) -> str:
        return f"{super().describe()}, also as mbit or gbit"


@dataclass(frozen=True)
class SelClass(Range):
    """The gateway selection class in the kernel's units: an integer (IV: TQ points; V: 100
    kbit/s), or for V a throughput with its unit as batctl writes it ("5mbit"). The routing
    algorithm bounds it further (IV: 255)."""

    lo: int = 1
    hi: int = U32_MAX

    def parse(self, raw):
        if raw is None:
            return None  # the routing algorithm's default
        if isinstance(raw, str) and re.search(r"[kmg]bit\s*$", raw.strip().lower()):
            kbit = Throughput().parse(raw)
            return super().parse(kbit // 100)
        return super().parse(raw)

    def describe(self) -> str:
        return f"{super().describe()}, or a throughput such as 5mbit (B.A.T.M.A.N. V)"


@dataclass(frozen=True)
class Flag:
    def parse(self, raw) -> bool:
        if isinstance(raw, bool):
            return raw
        word = str(raw).strip().lower()
        if word in ("1", "true", "yes", "on", "enable", "enabled"):
            return True
        if word in ("0", "false", "no", "off", "disable", "disabled"):
            return False
        raise ValueError(f"expected a boolean ({self.describe()}), got {raw!r}")

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Choice:
    values: tuple[str, ...]

    def parse(self, raw) -> str:
        if not isinstance(raw, str) or raw not in self.values:
            raise ValueError(f"{raw!r} is not allowed ({self.describe()})")
        return raw

    def describe(self) -> str:
        return "one of " + ", ".join(self.values)


@dataclass(frozen=True)
class Levels:
    """batctl loglevel words: "none", "all", or some of `names` (kept in their order)."""

    names: tuple[str, ...]

    def parse(self, raw) -> str:
        words = str(raw).split() if isinstance(raw, str) else None
        if not words or any(w not in ("none", "all", *self.names) for w in words):
            raise ValueError(f"{raw!r} is not allowed ({self.describe()})")
        if "all" in words:
            return "all"
        chosen = [n for n in self.names if n in words]
        return " ".join(chosen) or "none"

    def describe(self) -> str:
        return "none, all, or any of " + " ".join(self.names)


@dataclass(frozen=True)
class Text:
    """A string that matches `pattern` (whole); `optional`: also unset (None)."""

    pattern: str
    description: str
    optional: bool = False
    max_bytes: int | None = None

    def parse(self, raw):
        if raw is None and self.optional:
            return None
        if not isinstance(raw, str) or not re.fullmatch(self.pattern, raw) or \
                (self.max_bytes is not None and len(raw.encode()) > self.max_bytes):
            raise ValueError(f"{raw!r} is not allowed ({self.describe()})")
        return raw

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True)
class ListOf:
    item: Text | Range

    def parse(self, raw) -> list:
        items = raw if isinstance(raw, list) else [x for x in str(raw).split(",") if x]
        return [self.item.parse(x.strip() if isinstance(x, str) else x) for x in items]

    def describe(self) -> str:
        return f"a list, each {self.item.describe()}"


# the kernel's dev_valid_name: 1..15 bytes, not "." or "..", no "/", ":" or white space
IFNAME = Text(r"(?!\.\.?$)[^/:\s]{1,15}", "an interface name (1..15 characters)")
FLAG = Flag()


# --- the schema entries ---------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    allowed: Range | Flag | Choice | Levels | Text | ListOf
    live: bool = True  # False: read at start only; a change takes effect after a restart
    help: str = ""
    batctl: tuple[str, str] | None = None  # batctl's command and abbreviation (batmanctl has them)
    example: str | None = None  # the sample config's value, when the default cannot be written in TOML
    section: str | None = None  # the sample config starts a paragraph with this line
    feature: str | None = None  # not implemented yet: the kernel feature the key belongs to


def setting(default=None, allowed=None, *, factory=None, live: bool = True, help: str = "",
            batctl: tuple[str, str] | None = None, example: str | None = None, section: str | None = None,
            feature: str | None = None):
    """A dataclass field that is a setting (see Spec)."""
    metadata = {"setting": Spec(allowed, live, help, batctl, example, section, feature)}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One key of the schema: where it lives (scope) and what it allows."""

    name: str
    scope: str  # "mesh" (MeshConfig), "hardif" (HardifConfig), "daemon" (Options)
    default: object
    spec: Spec

    @property
    def allowed(self):
        return self.spec.allowed

    @property
    def live(self) -> bool:
        return self.spec.live

    @property
    def implemented(self) -> bool:
        return self.spec.feature is None

    def not_implemented(self, label: str | None = None) -> str:
        """Why a key of a feature batmand lacks is refused, whatever its value."""
        default = ("enabled" if self.default else "disabled") if isinstance(self.default, bool) else self.default
        return (f"{label or self.name}: batmand does not implement {self.spec.feature} yet "
                f"(the kernel's default is {default})")

    def parse(self, raw, label: str | None = None):
        """The value, or SettingError naming the key (or `label`) and what is allowed; a key
        that is not implemented is refused whatever its value (users would believe it)."""
        if not self.implemented:
            raise SettingError(self.not_implemented(label))
        try:
            return self.spec.allowed.parse(raw)
        except ValueError as exc:
            raise SettingError(f"{label or self.name}: {exc}") from None


def settings_of(cls, scope: str) -> dict[str, Setting]:
    """The settings declared in a dataclass, in declaration order."""
    out = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = Setting(f.name, scope, default, spec)
    return out


# --- one mesh interface ---------------------------------------------------------------------

_MS = "ms"


@dataclass
class MeshConfig:
    routing_algo: str = setting("BATMAN_IV", Choice(("BATMAN_IV", "BATMAN_V")), live=False,
                                help="routing algorithm (batctl ra)")
    orig_interval_ms: int = setting(1000, Range(2 * JITTER_MS, INT_MAX, _MS), batctl=("orig_interval", "it"),
                                    help="OGM interval (batctl it); at least twice jitter_ms")
    hop_penalty: int = setting(30, Range(0, 255), batctl=("hop_penalty", "hp"),
                               help="penalty of every hop, mesh wide (batctl hp)")
    aggregation: bool = setting(True, FLAG, batctl=("aggregation", "ag"), help="OGM aggregation (batctl ag)")
    fragmentation: bool = setting(True, FLAG, batctl=("fragmentation", "f"), help="fragmentation (batctl f)")
    # gateway mode (core/gateway.py): batctl gw sets these three together
    gw_mode: str = setting("off", Choice(("off", "client", "server")), batctl=("gw_mode", "gw"),
                           help="gateway mode: off, client (select a gateway for DHCP) or server (announce one)")
    # None: the routing algorithm's default (IV 20 TQ points, V 50 = 5 Mbit/s), filled in by
    # the daemon; its upper bound is the algorithm's too (IV 255)
    gw_sel_class: int | None = setting(None, SelClass(), example="20",
                                       help="gateway selection class: IV 1 (TQ and bandwidth), 2 (stable), 3 (fast "
                                            "switch) or 4..255 (switch at that many TQ points better; default 20); "
                                            "V the throughput gain to switch (default 5mbit)")
    gw_bandwidth_down: int = setting(10_000, Throughput(), help="download bandwidth a gateway server announces")
    gw_bandwidth_up: int = setting(2_000, Throughput(), help="upload bandwidth a gateway server announces")
    # the kernel's features batmand does not have yet, with the kernel's defaults
    # (batadv_meshif_init_late); refused until their module exists and removes `feature`
    ap_isolation: bool = setting(False, FLAG, batctl=("ap_isolation", "ap"), help="AP isolation (batctl ap)",
                                 feature="AP isolation")
    bonding: bool = setting(False, FLAG, batctl=("bonding", "b"), help="bonding (batctl b)", feature="bonding")
    distributed_arp_table: bool = setting(True, FLAG, batctl=("distributed_arp_table", "dat"),
                                          help="distributed ARP table (batctl dat)")
    multicast_mode: bool = setting(True, FLAG, batctl=("multicast_mode", "mm"),
                                   help="multicast optimisations for our hosts' frames (batctl mm); off floods them")
    multicast_fanout: int = setting(16, Range(0, U32_MAX), batctl=("multicast_fanout", "mo"),
                                    help="at most this many unicast copies of a multicast frame, else a flood")
    bridge_loop_avoidance: bool = setting(True, FLAG, batctl=("bridge_loop_avoidance", "bl"),
                                          help="bridge loop avoidance (batctl bl)")
    loglevel: str = setting("none", Levels(LOG_LEVELS), batctl=("loglevel", "ll"), help="debug log (batctl ll)",
                            feature="the debug log")
    # ETH_MIN_MTU..ETH_DATA_LEN: the kernel's range before jumbo frames, which our rings assume
    mtu: int = setting(1500, Range(68, 1500), live=False, help="soft interface MTU")
    # the kernel creates a VLAN when one is added to bat0 (a VLAN device on it, or a VLAN
    # filtering bridge it is a port of); a TAP hears of the devices only (netlink)
    vlans: list = setting(factory=list, allowed=ListOf(Range(1, 4094)),
                          help="802.1Q VLANs of bat0 besides the VLAN devices on it (a VLAN-filtering bridge's); "
                               "host frames on other VLANs are refused, as the kernel refuses them")

    # timeouts (kernel: main.h constants; the ranges are ours)
    # forwarded OGMs wait up to jitter/2 ms (prandom_u32_max(BATADV_JITTER / 2)): at least 1 ms;
    # at most half the default elp_interval, which every interval must keep (check_rules)
    jitter_ms: int = setting(JITTER_MS, Range(2, 250, _MS), help="OGM and ELP send-time jitter")
    purge_timeout_ms: int = setting(200_000, Range(1_000, INT_MAX, _MS),
                                    help="neighbours time out after this, originators after twice this")
    tt_local_timeout_ms: int = setting(600_000, Range(1_000, INT_MAX, _MS), help="local clients not seen for this")
    tt_roam_timeout_ms: int = setting(600_000, Range(1_000, INT_MAX, _MS), help="roaming clients")
    tt_temp_timeout_ms: int = setting(600_000, Range(1_000, INT_MAX, _MS), help="temporary clients (from broadcasts)")
    tt_request_timeout_ms: int = setting(3_000, Range(100, INT_MAX, _MS), help="unanswered TT requests are resent")
    # work periods: zero would spin the timer
    tt_work_period_ms: int = setting(5_000, Range(100, INT_MAX, _MS), help="TT purge period")
    orig_work_period_ms: int = setting(1_000, Range(100, INT_MAX, _MS), help="originator purge period")
    reset_protection_ms: int = setting(30_000, Range(0, INT_MAX, _MS), help="seqno reset protection window")
    dat_timeout_ms: int = setting(300_000, Range(1_000, INT_MAX, _MS), help="distributed ARP table entries not "
                                  "refreshed for this (BATADV_DAT_ENTRY_TIMEOUT)")
    frag_timeout_ms: int = setting(10_000, Range(100, INT_MAX, _MS), help="incomplete fragment chains are dropped")

    # limits on what peers can make us store (ours; counted when they bite). At least one
    # entry: a table of none would lock the mesh out for good.
    max_originators: int = setting(5_000, Range(1, 1_000_000), help="originators kept")
    max_neighbours_per_originator: int = setting(64, Range(1, 10_000), help="neighbours kept per originator")
    max_hardif_neighbours: int = setting(1_000, Range(1, 100_000), help="neighbours kept per hard interface")
    max_global_tt_entries: int = setting(100_000, Range(1, 10_000_000), help="clients of other nodes kept")
    max_global_tt_entries_per_originator: int = setting(2_000, Range(1, 1_000_000), help="... per originator")
    # senders of broadcasts and 4addr frames nobody announced yet have their own budget, oldest
    # evicted first, so that spoofed broadcasts (flooded on to every node) never take an
    # announced client's place; a real sender is announced within a few OGM intervals, so this
    # covers 10,000 new senders per few seconds at a tenth of the global table's memory
    max_temporary_tt_entries: int = setting(10_000, Range(1, 10_000_000),
                                            help="temporary clients kept (learnt from broadcasts)")
    max_dat_entries: int = setting(10_000, Range(1, 10_000_000),
                                   help="distributed ARP table entries kept (the least recently refreshed go)")
    # a mesh peer can make us claim any source and a LAN host can invent backbone gateways in
    # our group (the kernel has no limit); beyond these, traffic still flows, unclaimed
    max_bla_claims: int = setting(4_096, Range(1, 1_000_000), help="bridge loop avoidance claims kept")
    max_bla_backbones: int = setting(256, Range(1, 100_000), help="other backbone gateways kept")
    max_pending_tt_requests: int = setting(1_000, Range(1, 100_000), help="TT requests waiting for an answer or a route")
    max_forward_queue: int = setting(256, Range(1, 65_536),
                                     help="forwarded OGMs waiting to go out (BATADV_BATMAN_QUEUE_LEN)")
    max_bcast_queue: int = setting(256, Range(1, 65_536), help="broadcasts waiting to go out (BATADV_BCAST_QUEUE_LEN)")
    max_local_tt_entries: int = setting(1_600, Range(1, 1_600), help="a full-table response must fit packet_size_max")
    icmp_replies_per_second: int = setting(1_000, Range(0, 1_000_000), help="0: never answer")
    # at least one complete packet of the largest size (16 fragments of 1280 bytes)
    max_fragment_bytes: int = setting(2 * 1024 * 1024, Range(64 * 1024, 1024**3, "bytes"),
                                      help="all incomplete fragment chains together")

    @property
    def orig_interval(self) -> float:
        return self.orig_interval_ms / 1000.0

    @property
    def purge_timeout(self) -> float:
        return self.purge_timeout_ms / 1000.0


@dataclass
class HardifConfig:
    """Settings of one hard interface (batctl hardif IFACE ...; [hardif.IFACE] in the file)."""

    elp_interval: int = setting(500, Range(2 * JITTER_MS, INT_MAX, _MS), batctl=("elp_interval", "et"),
                                help="ELP interval (B.A.T.M.A.N. V); at least twice jitter_ms")
    throughput_override: int = setting(0, Throughput(), batctl=("throughput_override", "to"),
                                       help="link throughput for B.A.T.M.A.N. V; 0 estimates it")
    hop_penalty: int = setting(0, Range(0, 255), batctl=("hop_penalty", "hp"), help="penalty for this interface")


MESH_SETTINGS = settings_of(MeshConfig, "mesh")
HARDIF_SETTINGS = settings_of(HardifConfig, "hardif")


def check_rules(mesh: MeshConfig, elp_intervals: dict[str, int], changed: str | None = None) -> None:
    """The rules between keys; SettingError names the key that breaks one (`changed`, when a
    single key is being set). Own OGMs and ELPs go out every interval +- jitter: the kernel
    keeps every interval at least twice its jitter (orig_interval and elp_interval >= 2 *
    BATADV_JITTER), so that a send time never lies before the previous one.
    `elp_intervals`: label -> value, for every hard interface (configured or running)."""
    jitter = mesh.jitter_ms
    intervals = {"orig_interval_ms": mesh.orig_interval_ms, **elp_intervals}
    if changed == "jitter_ms":
        label, smallest = min(intervals.items(), key=lambda item: item[1])
        if smallest < 2 * jitter:
            raise SettingError(f"jitter_ms: {jitter} is out of range (2..{smallest // 2} ms: {label} is "
                               f"{smallest}, and intervals must be at least twice the jitter)")
        return
    for label, value in intervals.items():
        if value < 2 * jitter:
            raise SettingError(f"{label}: {value} is out of range ({2 * jitter}..{INT_MAX} ms: at least twice "
                               f"jitter_ms = {jitter})")
