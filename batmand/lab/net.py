"""Namespaces, links and processes of a lab: pyroute2 for netlink, `nft` for the loss rules.

Every function takes the namespace by name and opens (and closes) its own netlink socket:
an open socket in a namespace keeps the namespace alive after it was removed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

NETNS_DIR = "/run/netns"
NFT_TABLE = "lab"  # one `table netdev lab` per namespace holds every loss rule of that namespace
LOSS_SCALE = 10000  # numgen random mod 10000: loss in 0.01 % steps
TBF_LATENCY = "50ms"


class NetError(RuntimeError):
    """A network operation of the lab failed; the message names the namespace and interface."""


# --- namespaces -----------------------------------------------------------------------


def list_namespaces(prefix: str | None = None) -> list[str]:
    names = sorted(netns.listnetns())
    return [n for n in names if prefix is None or n.startswith(prefix + "-")]


def namespace_exists(name: str) -> bool:
    return os.path.exists(os.path.join(NETNS_DIR, name))


def create_namespace(name: str) -> None:
    if namespace_exists(name):
        raise NetError(f"network namespace {name} already exists")
    netns.create(name)
    with ipr(name) as ip:
        ip.link("set", index=_index(ip, name, "lo"), state="up")


def remove_namespace(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        netns.remove(name)


@contextlib.contextmanager
def ipr(ns: str):
    with IPRoute(netns=ns, flags=0) as ip:
        yield ip


def _index(ip, ns: str, ifname: str) -> int:
    found = ip.link_lookup(ifname=ifname)
    if not found:
        raise NetError(f"{ns}: no interface {ifname}")
    return found[0]


# --- processes ------------------------------------------------------------------------


def _ns_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def namespace_pids(name: str) -> list[int]:
    """PIDs of the processes inside a namespace (what `ip netns pids` prints)."""
    key = _ns_key(os.path.join(NETNS_DIR, name))
    if key is None:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _ns_key(f"/proc/{entry}/ns/net") == key:
            pids.append(int(entry))
    return pids


def pid_in_namespace(pid: int, name: str) -> bool:
    key = _ns_key(os.path.join(NETNS_DIR, name))
    return key is not None and _ns_key(f"/proc/{pid}/ns/net") == key and not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def pid_alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it counts as gone)."""
    return os.path.exists(f"/proc/{pid}") and not _is_zombie(pid)


def _gone(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)  # reap our own children
        if done:
            return True
    return not pid_alive(pid)


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait until the processes exited; returns those still alive after timeout."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not _gone(p)]
    return alive


def terminate(pids, timeout: float) -> list[int]:
    """SIGTERM, then SIGKILL whatever still runs after timeout. Returns the killed ones."""
    pids = [p for p in pids if p != os.getpid()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    alive = wait_gone(pids, timeout)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(alive, 2.0)
    return alive


def in_namespace(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def unix_listening(pid: int, endpoint: str) -> bool:
    """A unix socket named `endpoint` ("@name" for an abstract one, else a path) listens in
    the network namespace of process `pid` (its /proc/PID/net/unix lists that namespace's
    sockets; a listening one has __SO_ACCEPTCON, flag 0x10000)."""
    try:
        with open(f"/proc/{pid}/net/unix") as f:
            lines = f.readlines()[1:]
    except OSError:
        return False
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7] == endpoint and int(fields[3], 16) & 0x10000:
            return True
    return False


# --- links ----------------------------------------------------------------------------


def add_veth(ns_a: str, if_a: str, ns_b: str, if_b: str, mtu: int) -> None:
    """A veth pair, if_a in ns_a and if_b in ns_b, both up with the given MTU."""
    with ipr(ns_a) as ip:
        try:
            ip.link("add", ifname=if_a, kind="veth", mtu=mtu, peer={"ifname": if_b, "net_ns_fd": ns_b, "mtu": mtu})
        except NetlinkError as exc:
            raise NetError(f"{ns_a}: cannot create veth {if_a} <-> {ns_b}:{if_b}: {exc}") from None
        ip.link("set", index=_index(ip, ns_a, if_a), state="up")
    set_up(ns_b, if_b)


def add_stub(ns: str, ifname: str, mtu: int) -> None:
    """An Ethernet interface connected to nothing (what it sends is dropped). This
    kernel has no `dummy` driver; `ifb` behaves the same for this purpose."""
    with ipr(ns) as ip:
        try:
            ip.link("add", ifname=ifname, kind="ifb", mtu=mtu)
        except NetlinkError as exc:
            raise NetError(f"{ns}: cannot create interface {ifname}: {exc}") from None
        ip.link("set", index=_index(ip, ns, ifname), state="up")


def add_bridge(ns: str, ifname: str) -> None:
    """A plain bridge: no STP, no multicast snooping (frames are flooded, as across a mesh)."""
    with ipr(ns) as ip:
        ip.link("add", ifname=ifname, kind="bridge", br_stp_state=0, br_mcast_snooping=0, br_forward_delay=0)
        ip.link("set", index=_index(ip, ns, ifname), state="up")


def set_master(ns: str, ifname: str, master: str) -> None:
    with ipr(ns) as ip:
        ip.link("set", index=_index(ip, ns, ifname), master=_index(ip, ns, master))


def set_up(ns: str, ifname: str, up: bool = True) -> None:
    with ipr(ns) as ip:
        ip.link("set", index=_index(ip, ns, ifname), state="up" if up else "down")


def link_exists(ns: str, ifname: str) -> bool:
    with ipr(ns) as ip:
        return bool(ip.link_lookup(ifname=ifname))


def add_address(ns: str, ifname: str, cidr: str) -> None:
    """Add an address (IPv6 without duplicate address detection, usable at once);
    an address already there is fine."""
    address, _, plen = cidr.partition("/")
    kwargs = {"flags": IFA_F_NODAD} if ":" in address else {}
    with ipr(ns) as ip:
        try:
            ip.addr("add", index=_index(ip, ns, ifname), address=address, prefixlen=int(plen), **kwargs)
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise NetError(f"{ns}: cannot add {cidr} to {ifname}: {exc}") from None


def del_address(ns: str, ifname: str, cidr: str) -> None:
    address, _, plen = cidr.partition("/")
    with ipr(ns) as ip:
        with contextlib.suppress(NetlinkError):
            ip.addr("del", index=_index(ip, ns, ifname), address=address, prefixlen=int(plen))


def interfaces(ns: str) -> list[dict]:
    """Every interface of a namespace: name, index, kind, mtu, up, carrier, master, mac, addresses."""
    with ipr(ns) as ip:
        links = ip.get_links()
        addrs = ip.get_addr()
    by_index = {link["index"]: link.get_attr("IFLA_IFNAME") for link in links}
    out = []
    for link in links:
        info = link.get_attr("IFLA_LINKINFO")
        out.append({
            "name": link.get_attr("IFLA_IFNAME"),
            "index": link["index"],
            "kind": info.get_attr("IFLA_INFO_KIND") if info else None,
            "mtu": link.get_attr("IFLA_MTU"),
            "up": bool(link["flags"] & 1),
            "carrier": bool(link.get_attr("IFLA_CARRIER")),
            "master": by_index.get(link.get_attr("IFLA_MASTER")),
            "mac": link.get_attr("IFLA_ADDRESS"),
            "addresses": [
                f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in addrs if a["index"] == link["index"]
            ],
        })
    return out


# --- rate (tbf) -----------------------------------------------------------------------


def set_rate(ns: str, ifname: str, bits: int | None, mtu: int) -> None:
    """Token bucket on the interface's egress; None removes it."""
    with ipr(ns) as ip:
        index = _index(ip, ns, ifname)
        with contextlib.suppress(NetlinkError):
            ip.tc("del", index=index, handle="1:", parent=0xFFFFFFFF)
        if bits:
            # 20 ms worth of tokens, but always a few full frames (GSO skbs get segmented)
            burst = max(bits // 8 // 50, 4 * (mtu + 14))
            try:
                ip.tc("add", "tbf", index=index, handle="1:", rate=f"{bits}bit", burst=burst, latency=TBF_LATENCY)
            except NetlinkError as exc:
                raise NetError(f"{ns}: cannot set rate {bits}bit on {ifname}: {exc}") from None


def get_rate(ns: str, ifname: str) -> int | None:
    """The tbf rate on an interface in bits/s, or None."""
    with ipr(ns) as ip:
        for q in ip.get_qdiscs(index=_index(ip, ns, ifname)):
            if q.get_attr("TCA_KIND") == "tbf":
                parms = q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
                return parms["rate"] * 8
    return None


# --- loss (nftables netdev ingress) -----------------------------------------------------


def _nft(ns: str, script: str | None = None, args: list[str] | None = None) -> str:
    if shutil.which("nft") is None:
        raise NetError("nft not found: packet loss needs nftables (apt-get install nftables)")
    argv = ["nft"] + (args if args is not None else ["-f", "-"])
    proc = subprocess.run(in_namespace(ns, argv), input=script, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetError(f"{ns}: nft failed: {proc.stderr.strip()}\n{script or ''}")
    return proc.stdout


def loss_chain(ifname: str) -> str:
    return "in_" + re.sub(r"[^A-Za-z0-9_]", "_", ifname)


def set_loss(ns: str, ifname: str, percent: float) -> None:
    """Drop `percent` of the frames arriving on ifname, at netdev ingress (before any
    packet socket bound to an ethertype sees them; ETH_P_ALL taps like tcpdump still do)."""
    chain = loss_chain(ifname)
    script = (
        f"table netdev {NFT_TABLE} {{\n"
        f"  chain {chain} {{\n"
        f'    type filter hook ingress device "{ifname}" priority 0; policy accept;\n'
        f"  }}\n"
        f"}}\n"
        f"flush chain netdev {NFT_TABLE} {chain}\n"
    )
    threshold = round(percent * LOSS_SCALE / 100)
    if threshold >= LOSS_SCALE:
        script += f"add rule netdev {NFT_TABLE} {chain} counter drop\n"
    elif threshold > 0:
        script += f"add rule netdev {NFT_TABLE} {chain} numgen random mod {LOSS_SCALE} < {threshold} counter drop\n"
    _nft(ns, script)


def loss_counters(ns: str) -> dict[str, dict]:
    """{ifname: {"percent": p, "dropped_packets": n, "dropped_bytes": n}} from the live ruleset."""
    if shutil.which("nft") is None:
        return {}
    proc = subprocess.run(in_namespace(ns, ["nft", "-j", "list", "table", "netdev", NFT_TABLE]),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {}
    with ipr(ns) as ip:  # nft 1.0.6 leaves the chain's device out of its JSON: map names back
        chains = {loss_chain(link.get_attr("IFLA_IFNAME")): link.get_attr("IFLA_IFNAME") for link in ip.get_links()}
    out: dict[str, dict] = {}
    for item in json.loads(proc.stdout).get("nftables", []):
        if "rule" in item:
            rule = item["rule"]
            entry = {"percent": 100.0, "dropped_packets": 0, "dropped_bytes": 0}  # unless a numgen match
            for expr in rule.get("expr", []):
                if "match" in expr and isinstance(expr["match"].get("right"), int):
                    entry["percent"] = expr["match"]["right"] * 100 / LOSS_SCALE
                if "counter" in expr:
                    entry["dropped_packets"] = expr["counter"]["packets"]
                    entry["dropped_bytes"] = expr["counter"]["bytes"]
            out[chains.get(rule["chain"], rule["chain"])] = entry
    return out
