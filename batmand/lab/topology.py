"""Lab topologies: the TOML file format, validated into plain dataclasses.

```toml
[lab]
name = "line3"            # informative; defaults to the file's stem
mtu = 1560                # default MTU of every link
meshif = "bat0"           # the daemon's soft interface
ipv4 = "10.77.0.0/24"     # mesh subnets: node k (1-based, file order) gets host k,
ipv6 = "fd77::/64"        # client k gets host 100 + k; `id = N` on a node/client overrides
                          # (IPv6 host N is written with N's decimal digits: fd77::101)

[batmand]                 # written as each node's daemon config file (flat batmand keys)
orig_interval_ms = 1000

[[node]]
name = "n1"               # <= 13 characters: interfaces are named e-<peer> / c-<client>
kind = "batmand"          # default; "kernel": the Linux kernel's batman-adv in a QEMU VM
interfaces = ["stub0"]    # optional extra hard interfaces connected to nothing (ifb), after the links
batmand = { hop_penalty = 60 }   # optional per-node overrides of [batmand]
kernel = { memory_mb = 256, setup = "batctl meshif bat0 dat 0", lan = true }   # kernel nodes only
                          # (optional): guest RAM, shell commands run in the guest once bat0 is up,
                          # a LAN NIC bridged with bat0 in the guest (kernel_node.py; the host side
                          # is the bridge kbl in the node's namespace, for a test to plug a LAN into)

[[link]]
a = "n1"
b = "n2"
mtu = 1560                # optional, else [lab] mtu
loss = 5                  # percent, both directions; loss_ab (a->b) / loss_ba override it
rate = "10mbit"           # tbf on both ends' egress; rate_ab / rate_ba override it
ifname_a = "e-n2"         # optional: the interface names (default e-<peer>)

[[client]]
name = "c1"
node = "n1"               # bridged (br0) behind this node, together with its bat0
```

Kernel nodes (see kernel_node.py) take from the node's [batmand] config what the kernel has
too (routing_algo, orig_interval_ms, hop_penalty, aggregation, ap_isolation, bonding,
fragmentation, distributed_arp_table, multicast_mode, bridge_loop_avoidance; the rest is
ignored) and have neither `interfaces` nor clients; they need at least one link.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MTU = 1560
DEFAULT_MESHIF = "bat0"
DEFAULT_IPV4 = "10.77.0.0/24"
DEFAULT_IPV6 = "fd77::/64"
CLIENT_HOST_BASE = 100
CLIENT_MTU = 1500
BRIDGE = "br0"
CLIENT_IFNAME = "eth0"  # the client namespace's side of its veth

NODE_KINDS = ("batmand", "kernel")
IFNAMSIZ = 15
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,12}$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
# tc's units: bit/kbit/mbit/gbit are bits per second, bps/kbps/mbps/gbps bytes per second
_RATE_UNITS = {
    "": 1, "bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9,
    "bps": 8, "kbps": 8 * 10**3, "mbps": 8 * 10**6, "gbps": 8 * 10**9,
}
RESERVED_IFNAMES = {"lo", BRIDGE}
KERNEL_TAP = "kt{}"  # kernel node, link i: the VM's TAP and the bridge joining it to the link's veth
KERNEL_BRIDGE = "kb{}"
KERNEL_LAN_TAP, KERNEL_LAN_BRIDGE = "ktl", "kbl"  # kernel node with kernel.lan: its LAN NIC's TAP and bridge

SHIPPED_DIR = Path(__file__).resolve().parent.parent.parent / "netns-lab" / "topologies"


class TopologyError(ValueError):
    """A topology file that cannot be built; the message says where and why."""


def parse_rate(value: str | int | None) -> int | None:
    """tc-style rate ("10mbit", "500kbit", "1mbps", or bits/s as an int) -> bits/s."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TopologyError(f"rate: expected e.g. \"10mbit\", got {value!r}")
    if isinstance(value, (int, float)):
        bits = int(value)
    else:
        m = _RATE_RE.match(str(value))
        if not m or m.group(2).lower() not in _RATE_UNITS:
            raise TopologyError(f"rate: expected e.g. \"10mbit\", \"500kbit\" or \"2mbps\", got {value!r}")
        bits = int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])
    if not 8 <= bits <= 8 * (2**32 - 1):
        raise TopologyError(f"rate: {value!r} is outside 8bit .. 34gbit")
    return bits


def format_rate(bits: int | None) -> str:
    if not bits:
        return "-"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


def _loss(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise TopologyError(f"{where}: loss is a percentage 0..100, got {value!r}")
    return float(value)


@dataclass
class Node:
    name: str
    kind: str = "batmand"
    host: int = 0  # host number in the mesh subnets
    interfaces: list[str] = field(default_factory=list)  # extra hard interfaces (ifb: connected to nothing)
    batmand: dict = field(default_factory=dict)  # per-node config overrides
    kernel: dict = field(default_factory=dict)  # kernel nodes: memory_mb, setup, lan


@dataclass
class Link:
    a: str
    b: str
    ifname_a: str  # interface in a's namespace (toward b)
    ifname_b: str  # interface in b's namespace (toward a)
    mtu: int = DEFAULT_MTU
    loss_ab: float = 0.0  # percent of frames a -> b dropped (at b's ingress)
    loss_ba: float = 0.0
    rate_ab: int | None = None  # bits/s, tbf on a's egress
    rate_ba: int | None = None

    def ends(self):
        """(node, ifname, peer node, peer ifname) for both ends."""
        return ((self.a, self.ifname_a, self.b, self.ifname_b), (self.b, self.ifname_b, self.a, self.ifname_a))

    def ifname_in(self, node: str) -> str:
        if node == self.a:
            return self.ifname_a
        if node == self.b:
            return self.ifname_b
        raise KeyError(node)


@dataclass
class Client:
    name: str
    node: str
    host: int = 0
    ifname: str = ""  # the bridge port in the node's namespace: c-<client>


@dataclass
class Topology:
    name: str
    nodes: dict[str, Node]
    links: list[Link]
    clients: dict[str, Client]
    batmand: dict = field(default_factory=dict)
    mtu: int = DEFAULT_MTU
    meshif: str = DEFAULT_MESHIF
    ipv4: ipaddress.IPv4Network = field(default_factory=lambda: ipaddress.IPv4Network(DEFAULT_IPV4))
    ipv6: ipaddress.IPv6Network = field(default_factory=lambda: ipaddress.IPv6Network(DEFAULT_IPV6))
    source: str | None = None  # file it was read from
    raw: dict = field(default_factory=dict)  # the parsed TOML, to rebuild it (lab state file)

    # --- derived ---------------------------------------------------------------------

    def node_links(self, node: str) -> list[Link]:
        return [link for link in self.links if node in (link.a, link.b)]

    def hard_interfaces(self, node: str) -> list[str]:
        """The daemon's -i list: link interfaces in file order, then the node's extras.
        The first is the primary interface."""
        return [link.ifname_in(node) for link in self.node_links(node)] + list(self.nodes[node].interfaces)

    def kernel_wiring(self, node: str) -> list[tuple[str, str, str, int]]:
        """A kernel node's (veth, TAP, bridge, MTU) per link, in link order: the VM's NIC i
        is TAP i."""
        return [(link.ifname_in(node), KERNEL_TAP.format(i), KERNEL_BRIDGE.format(i), link.mtu)
                for i, link in enumerate(self.node_links(node))]

    def kernel_lan(self, node: str) -> tuple[str, str, int] | None:
        """A kernel node's LAN NIC (kernel.lan): (TAP, bridge, MTU) in its namespace, or None.
        Nothing is plugged into the bridge: a test connects it to its LAN."""
        spec = self.nodes[node]
        return (KERNEL_LAN_TAP, KERNEL_LAN_BRIDGE, CLIENT_MTU) if spec.kind == "kernel" and spec.kernel.get("lan") \
            else None

    def node_clients(self, node: str) -> list[Client]:
        return [c for c in self.clients.values() if c.node == node]

    def mesh_ifname(self, node: str) -> str:
        """Where the node's mesh addresses live: br0 when clients are bridged behind it
        (bat0 is then a bridge port), else the soft interface itself."""
        return BRIDGE if self.node_clients(node) else self.meshif

    def daemon_config(self, node: str) -> dict:
        """A batmand node's settings. Bridge loop avoidance is off unless the topology turns
        it on, as for kernel nodes: its default (on) holds back broadcasts for the first ~30 s."""
        return {"bridge_loop_avoidance": False, **self.batmand, **self.nodes[node].batmand}

    def find_link(self, a: str, b: str) -> tuple[Link, bool]:
        """The (first) link between a and b, and whether a is its `a` end."""
        for link in self.links:
            if (link.a, link.b) == (a, b):
                return link, True
            if (link.a, link.b) == (b, a):
                return link, False
        raise TopologyError(f"no link between {a} and {b}")

    def address(self, name: str, family: int = 4, prefixlen: bool = False) -> str:
        host = self.nodes[name].host if name in self.nodes else self.clients[name].host
        net = self.ipv4 if family == 4 else self.ipv6
        addr = net.network_address + (host if family == 4 else ipv6_host(host))
        return f"{addr}/{net.prefixlen}" if prefixlen else str(addr)


def ipv6_host(host: int) -> int:
    """Host numbers read the same in both families: 10.77.0.101 <-> fd77::101."""
    return int(str(host), 16) if host <= 9999 else host


def _check_keys(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise TopologyError(
            f"{where}: name {value!r} must be 1-13 characters [A-Za-z0-9_] starting with a letter or digit "
            "(interfaces are named e-<peer> and c-<client>, at most 15 characters)"
        )
    return value


def _ifname(value, where: str) -> str:
    if not isinstance(value, str) or not _IFNAME_RE.match(value) or len(value) > IFNAMSIZ:
        raise TopologyError(f"{where}: interface name {value!r} must be 1-15 characters [A-Za-z0-9_.-]")
    return value


def _mtu(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 68 <= value <= 65535:
        raise TopologyError(f"{where}: mtu must be an integer 68..65535, got {value!r}")
    return value


def from_dict(data: dict, name: str = "lab", source: str | None = None) -> Topology:
    """Validate a parsed topology (the TOML structure) into a Topology."""
    raw = copy.deepcopy(data)
    _check_keys(data, {"lab", "batmand", "node", "link", "client"}, "topology")
    lab = data.get("lab", {})
    _check_keys(lab, {"name", "mtu", "meshif", "ipv4", "ipv6"}, "[lab]")
    mtu = _mtu(lab.get("mtu", DEFAULT_MTU), "[lab]")
    meshif = _ifname(lab.get("meshif", DEFAULT_MESHIF), "[lab] meshif")
    try:
        ipv4 = ipaddress.IPv4Network(lab.get("ipv4", DEFAULT_IPV4))
        ipv6 = ipaddress.IPv6Network(lab.get("ipv6", DEFAULT_IPV6))
    except ValueError as exc:
        raise TopologyError(f"[lab]: bad mesh subnet: {exc}") from None
    batmand = data.get("batmand", {})
    if not isinstance(batmand, dict):
        raise TopologyError("[batmand] must be a table")

    nodes: dict[str, Node] = {}
    for i, entry in enumerate(data.get("node", []), 1):
        where = f"[[node]] #{i}"
        _check_keys(entry, {"name", "kind", "id", "interfaces", "batmand", "kernel"}, where)
        if "name" not in entry:
            raise TopologyError(f"{where}: name is required")
        nname = _name(entry["name"], where)
        where = f"node {nname}"
        if nname in nodes:
            raise TopologyError(f"{where}: defined twice")
        kind = entry.get("kind", "batmand")
        if kind not in NODE_KINDS:
            raise TopologyError(f"{where}: kind must be one of {', '.join(NODE_KINDS)}, got {kind!r}")
        extras = entry.get("interfaces", [])
        if not isinstance(extras, list):
            raise TopologyError(f"{where}: interfaces must be a list of interface names")
        extras = [_ifname(x, where) for x in extras]
        overrides = entry.get("batmand", {})
        if not isinstance(overrides, dict):
            raise TopologyError(f"{where}: batmand must be a table")
        kernel = entry.get("kernel", {})
        if not isinstance(kernel, dict):
            raise TopologyError(f"{where}: kernel must be a table")
        _check_keys(kernel, {"memory_mb", "setup", "lan"}, f"{where}: kernel")
        if kernel and kind != "kernel":
            raise TopologyError(f"{where}: a kernel table needs kind = \"kernel\"")
        if "memory_mb" in kernel and (isinstance(kernel["memory_mb"], bool) or not isinstance(kernel["memory_mb"], int)
                                      or not 96 <= kernel["memory_mb"] <= 4096):
            raise TopologyError(f"{where}: kernel.memory_mb must be an integer 96..4096")
        if not isinstance(kernel.get("setup", ""), str):
            raise TopologyError(f"{where}: kernel.setup must be a string of shell commands")
        if not isinstance(kernel.get("lan", False), bool):
            raise TopologyError(f"{where}: kernel.lan must be true or false")
        if kind == "kernel" and extras:
            raise TopologyError(f"{where}: kernel nodes have no extra interfaces (only their links' NICs)")
        nodes[nname] = Node(nname, kind, entry.get("id", i), extras, overrides, dict(kernel))
    if not nodes:
        raise TopologyError("topology has no [[node]]")

    links: list[Link] = []
    pair_count: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(data.get("link", []), 1):
        where = f"[[link]] #{i}"
        _check_keys(entry, {"a", "b", "mtu", "loss", "loss_ab", "loss_ba", "rate", "rate_ab", "rate_ba",
                            "ifname_a", "ifname_b"}, where)
        a, b = entry.get("a"), entry.get("b")
        for end in (a, b):
            if end not in nodes:
                raise TopologyError(f"{where}: unknown node {end!r} (nodes: {', '.join(nodes)})")
        if a == b:
            raise TopologyError(f"{where}: a link needs two different nodes, got {a!r} twice")
        where = f"link {a}-{b}"
        key = tuple(sorted((a, b)))
        n = pair_count[key] = pair_count.get(key, 0) + 1
        suffix = "" if n == 1 else f"-{n}"
        ifa = _ifname(entry.get("ifname_a", f"e-{b}{suffix}"), where)
        ifb = _ifname(entry.get("ifname_b", f"e-{a}{suffix}"), where)
        both_loss = _loss(entry.get("loss", 0), where)
        both_rate = parse_rate(entry.get("rate"))
        try:
            rate_ab = parse_rate(entry.get("rate_ab", both_rate))
            rate_ba = parse_rate(entry.get("rate_ba", both_rate))
        except TopologyError as exc:
            raise TopologyError(f"{where}: {exc}") from None
        links.append(Link(
            a, b, ifa, ifb,
            mtu=_mtu(entry.get("mtu", mtu), where),
            loss_ab=_loss(entry.get("loss_ab", both_loss), where),
            loss_ba=_loss(entry.get("loss_ba", both_loss), where),
            rate_ab=rate_ab, rate_ba=rate_ba,
        ))

    for nname, node in nodes.items():
        if node.kind == "kernel" and not any(nname in (link.a, link.b) for link in links):
            raise TopologyError(f"node {nname}: a kernel node needs at least one link (its VM's bat0 is made of them)")

    clients: dict[str, Client] = {}
    for i, entry in enumerate(data.get("client", []), 1):
        where = f"[[client]] #{i}"
        _check_keys(entry, {"name", "node", "id"}, where)
        cname = _name(entry.get("name"), where)
        where = f"client {cname}"
        if cname in nodes or cname in clients:
            raise TopologyError(f"{where}: name already used by a node or client")
        if entry.get("node") not in nodes:
            raise TopologyError(f"{where}: node {entry.get('node')!r} is not a node of this topology")
        if nodes[entry["node"]].kind == "kernel":
            raise TopologyError(f"{where}: clients behind kernel nodes are not supported (node {entry['node']})")
        clients[cname] = Client(cname, entry["node"], entry.get("id", CLIENT_HOST_BASE + i), f"c-{cname}")

    topo = Topology(
        name=lab.get("name", name), nodes=nodes, links=links, clients=clients, batmand=dict(batmand),
        mtu=mtu, meshif=meshif, ipv4=ipv4, ipv6=ipv6, source=source, raw=raw,
    )
    _check_names(topo)
    return topo


def _check_names(topo: Topology) -> None:
    hosts: dict[int, str] = {}
    for name, host in [(n.name, n.host) for n in topo.nodes.values()] + [(c.name, c.host) for c in topo.clients.values()]:
        if isinstance(host, bool) or not isinstance(host, int):
            raise TopologyError(f"{name}: id must be an integer, got {host!r}")
        for net, h in ((topo.ipv4, host), (topo.ipv6, ipv6_host(host) if host > 0 else host)):
            if not 0 < h < net.num_addresses - 1:
                raise TopologyError(f"{name}: host number {host} does not fit the mesh subnet {net}")
        if host in hosts:
            raise TopologyError(f"{name}: host number {host} already used by {hosts[host]}")
        hosts[host] = name
    for node in topo.nodes:
        seen = {topo.meshif: "the mesh interface", **{r: "reserved" for r in RESERVED_IFNAMES}}
        names = [(link.ifname_in(node), f"link {link.a}-{link.b}") for link in topo.node_links(node)]
        names += [(x, "interfaces") for x in topo.nodes[node].interfaces]
        names += [(c.ifname, f"client {c.name}") for c in topo.node_clients(node)]
        if topo.nodes[node].kind == "kernel":
            vm_ifnames = [(tap, bridge) for _, tap, bridge, _ in topo.kernel_wiring(node)]
            if topo.kernel_lan(node):
                vm_ifnames.append(topo.kernel_lan(node)[:2])
            for tap, bridge in vm_ifnames:
                seen.setdefault(tap, "the VM's TAP")
                seen.setdefault(bridge, "the VM's bridge")
        for ifname, what in names:
            if ifname in seen:
                raise TopologyError(
                    f"node {node}: interface name {ifname!r} ({what}) clashes with {seen[ifname]}; "
                    "set ifname_a / ifname_b on the link"
                )
            seen[ifname] = what


def load(path: str | Path) -> Topology:
    """Read a topology file; a bare name ("line3") means a shipped topology."""
    path = resolve(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: {exc}") from None
    try:
        return from_dict(data, name=path.stem, source=str(path))
    except TopologyError as exc:
        raise TopologyError(f"{path}: {exc}") from None


def resolve(path: str | Path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    shipped = SHIPPED_DIR / (p.name if p.suffix == ".toml" else f"{p.name}.toml")
    if p.parent == Path(".") and shipped.exists():
        return shipped
    raise TopologyError(f"topology {str(path)!r} not found (shipped: {', '.join(shipped_names())})")


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.toml"))


def dumps_toml(values: dict, _path: str = "") -> str:
    """A small TOML writer for daemon config files: scalars, lists and nested tables."""
    lines: list[str] = []
    tables: list[tuple[str, dict]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for key, table in tables:
        path = f"{_path}.{_toml_key(key)}" if _path else _toml_key(key)
        out += f"\n[{path}]\n" + dumps_toml(table, path)
    return out


def _toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else _toml_value(key)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def to_dict(topo: Topology) -> dict:
    """The topology as a TOML-shaped dict (explicit interface names and host numbers),
    with the links' current loss and rate: from_dict(to_dict(t)) rebuilds t."""
    links = []
    for link in topo.links:
        entry = {"a": link.a, "b": link.b, "ifname_a": link.ifname_a, "ifname_b": link.ifname_b,
                 "mtu": link.mtu, "loss_ab": link.loss_ab, "loss_ba": link.loss_ba}
        if link.rate_ab:
            entry["rate_ab"] = link.rate_ab
        if link.rate_ba:
            entry["rate_ba"] = link.rate_ba
        links.append(entry)
    return {
        "lab": {"name": topo.name, "mtu": topo.mtu, "meshif": topo.meshif,
                "ipv4": str(topo.ipv4), "ipv6": str(topo.ipv6)},
        "batmand": dict(topo.batmand),
        "node": [{"name": n.name, "kind": n.kind, "id": n.host, "interfaces": list(n.interfaces),
                  "batmand": dict(n.batmand), **({"kernel": dict(n.kernel)} if n.kernel else {})}
                 for n in topo.nodes.values()],
        "link": links,
        "client": [{"name": c.name, "node": c.node, "id": c.host} for c in topo.clients.values()],
    }
