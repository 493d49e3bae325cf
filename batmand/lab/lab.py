"""A lab: the namespaces, links, clients and daemons of one topology under one prefix.

Names (prefix P, node N, peer M, client C):
- namespace of a node or client:         P-N, P-C
- in N, the veth toward M:               e-M   (e-M-2, e-M-3 for further parallel links)
- in N, the bridge (only with clients):  br0, with ports c-C (toward client C) and bat0
- in C, the veth toward its node:        eth0
- daemon files:                          <lab_root>/P/N.toml (config), N.log (stdout+stderr),
                                         <run_root>/P/N/bat0.sock (control socket)
- lab state (for the CLI and `down`):    <lab_root>/P/state.json
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import net
from .topology import (
    BRIDGE, CLIENT_IFNAME, CLIENT_MTU, Topology, TopologyError, dumps_toml, format_rate, from_dict, load, parse_rate, to_dict,
)

DEFAULT_LAB_ROOT = Path(os.environ.get("BATMAND_LAB_DIR", "/tmp/batmand-lab"))
DEFAULT_RUN_ROOT = Path(os.environ.get("BATMAND_LAB_RUN_DIR", "/run/batmand-lab"))
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_]{1,40}$")
STATE_FILE = "state.json"
SUN_PATH_MAX = 107


class LabError(RuntimeError):
    """The lab could not do what was asked; the message says what and where to look."""


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise LabError(f"lab prefix {prefix!r} must be 1-40 characters [A-Za-z0-9_] (no '-': "
                       "namespaces are <prefix>-<node>)")
    return prefix


def _venv_tool(name: str) -> list[str]:
    """A console script of this installation: next to the running interpreter (the venv),
    else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return [str(candidate)]
    found = shutil.which(name)
    return [found] if found else [name]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


class Lab:
    """Build with up(), tear down with down(); as a context manager it builds on enter and
    always tears down on exit, also when the body raises (then the logs are kept, and the
    exception gets a note saying where)."""

    def __init__(
        self,
        topology: Topology | str | Path,
        prefix: str,
        *,
        lab_root: str | Path = DEFAULT_LAB_ROOT,
        run_root: str | Path = DEFAULT_RUN_ROOT,
        daemon: list[str] | None = None,
        batmanctl: list[str] | None = None,
        keep_logs: bool | None = None,
        stop_timeout: float = 5.0,
    ) -> None:
        self.prefix = check_prefix(prefix)
        self.topology = topology if isinstance(topology, Topology) else load(topology)
        self.lab_root = Path(lab_root)
        self.run_root = Path(run_root)
        self.lab_dir = self.lab_root / prefix
        self.run_dir = self.run_root / prefix
        self.daemon_argv = list(daemon) if daemon else _venv_tool("batmand")
        self.batmanctl_argv = list(batmanctl) if batmanctl else _venv_tool("batmanctl")
        self.keep_logs = keep_logs  # None: keep them only when the context body raised
        self.stop_timeout = stop_timeout
        self.pids: dict[str, int] = {}
        self.down_links: set[tuple[str, str]] = set()
        self._procs: dict[str, subprocess.Popen] = {}

    # --- names ------------------------------------------------------------------------

    def ns(self, name: str) -> str:
        """Namespace of a node or client."""
        if name not in self.topology.nodes and name not in self.topology.clients:
            raise LabError(f"no node or client {name!r} in lab {self.prefix} "
                           f"(nodes: {', '.join(self.topology.nodes)}; clients: {', '.join(self.topology.clients) or '-'})")
        return f"{self.prefix}-{name}"

    @property
    def nodes(self) -> list[str]:
        return list(self.topology.nodes)

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(n) for n in [*self.topology.nodes, *self.topology.clients]]

    def control_socket(self, node: str) -> str:
        return str(self.run_dir / node / f"{self.topology.meshif}.sock")

    def config_path(self, node: str) -> Path:
        return self.lab_dir / f"{node}.toml"

    def log_path(self, node: str) -> Path:
        return self.lab_dir / f"{node}.log"

    def address(self, name: str, family: int = 4, prefixlen: bool = False) -> str:
        """Mesh address of a node or client: 10.77.0.N / fd77::N by default."""
        self.ns(name)
        return self.topology.address(name, family, prefixlen)

    # --- build and tear down ----------------------------------------------------------

    def up(self) -> "Lab":
        """Create namespaces, links (MTU, loss, rate), clients and the daemon config files.
        Starts no daemon (start_daemons, configure_mesh_addresses). On failure, everything
        built so far is removed again."""
        kernel = [n.name for n in self.topology.nodes.values() if n.kind == "kernel"]
        if kernel:
            raise NotImplementedError(
                f"kind = \"kernel\" nodes (the batman-adv kernel module in a VM) are not implemented yet: {', '.join(kernel)}")
        leftovers = net.list_namespaces(self.prefix)
        if leftovers:
            raise LabError(f"lab {self.prefix} already exists ({', '.join(leftovers)}); "
                           f"remove it with `python -m batmand.lab down --prefix {self.prefix}`")
        for node in self.nodes:
            if len(self.control_socket(node)) > SUN_PATH_MAX:
                raise LabError(f"control socket path too long for a unix socket: {self.control_socket(node)}")
        shutil.rmtree(self.lab_dir, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.lab_dir.mkdir(parents=True)
        self.save_state()
        try:
            self._build()
        except BaseException:
            down(self.prefix, lab_root=self.lab_root, run_root=self.run_root, keep_logs=False)
            raise
        return self

    def _build(self) -> None:
        topo = self.topology
        for name in [*topo.nodes, *topo.clients]:
            net.create_namespace(self.ns(name))
        for link in topo.links:
            net.add_veth(self.ns(link.a), link.ifname_a, self.ns(link.b), link.ifname_b, link.mtu)
            self._apply_link(link)
        for node in topo.nodes.values():
            for ifname in node.interfaces:
                net.add_stub(self.ns(node.name), ifname, topo.mtu)
            self.run_dir.joinpath(node.name).mkdir(parents=True, exist_ok=True)
            self.config_path(node.name).write_text(dumps_toml(topo.daemon_config(node.name)))
        for node in topo.nodes:
            if topo.node_clients(node):
                net.add_bridge(self.ns(node), BRIDGE)
        for client in topo.clients.values():
            node_ns, client_ns = self.ns(client.node), self.ns(client.name)
            mtu = int(topo.daemon_config(client.node).get("mtu", CLIENT_MTU))
            net.add_veth(client_ns, CLIENT_IFNAME, node_ns, client.ifname, mtu)
            net.set_master(node_ns, client.ifname, BRIDGE)
            for family in (4, 6):
                net.add_address(client_ns, CLIENT_IFNAME, topo.address(client.name, family, prefixlen=True))

    def _apply_link(self, link) -> None:
        net.set_loss(self.ns(link.b), link.ifname_b, link.loss_ab)
        net.set_loss(self.ns(link.a), link.ifname_a, link.loss_ba)
        if link.rate_ab:
            net.set_rate(self.ns(link.a), link.ifname_a, link.rate_ab, link.mtu)
        if link.rate_ba:
            net.set_rate(self.ns(link.b), link.ifname_b, link.rate_ba, link.mtu)

    def down(self, keep_logs: bool | None = None) -> list[str]:
        """Stop the daemons (gracefully first), kill whatever else runs in the lab's
        namespaces, remove them and the lab's directories (the logs too, unless keep_logs)."""
        with contextlib.suppress(Exception):
            self.stop_daemons()
        removed = down(self.prefix, lab_root=self.lab_root, run_root=self.run_root,
                       keep_logs=bool(keep_logs if keep_logs is not None else self.keep_logs))
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._procs.clear()
        self.pids.clear()
        return removed

    def __enter__(self) -> "Lab":
        return self.up()

    def __exit__(self, exc_type, exc, tb) -> None:
        keep = self.keep_logs if self.keep_logs is not None else exc is not None
        self.down(keep_logs=keep)
        if exc is not None and keep and hasattr(exc, "add_note"):
            exc.add_note(f"batmand lab {self.prefix}: logs kept in {self.lab_dir} "
                         f"(remove with `python -m batmand.lab down --prefix {self.prefix}`)")

    # --- state (for the CLI: another process attaches to a running lab) ----------------

    def save_state(self) -> None:
        state = {
            "prefix": self.prefix,
            "source": self.topology.source,
            "topology": to_dict(self.topology),
            "pids": self.pids,
            "down_links": sorted(self.down_links),
            "daemon": self.daemon_argv,
            "batmanctl": self.batmanctl_argv,
            "run_root": str(self.run_root),
        }
        tmp = self.lab_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.lab_dir / STATE_FILE)

    @classmethod
    def attach(cls, prefix: str, *, lab_root: str | Path = DEFAULT_LAB_ROOT, **kwargs) -> "Lab":
        """The Lab object of a lab that another process built (from its state file)."""
        check_prefix(prefix)
        path = Path(lab_root) / prefix / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise LabError(f"no lab {prefix} (cannot read {path}: {exc})") from None
        topo = from_dict(state["topology"], source=state.get("source"))
        kwargs.setdefault("daemon", state.get("daemon"))
        kwargs.setdefault("batmanctl", state.get("batmanctl"))
        kwargs.setdefault("run_root", state.get("run_root", DEFAULT_RUN_ROOT))
        lab = cls(topo, prefix, lab_root=lab_root, **kwargs)
        lab.pids = {k: int(v) for k, v in state.get("pids", {}).items()}
        lab.down_links = {tuple(x) for x in state.get("down_links", [])}
        return lab

    # --- daemons ----------------------------------------------------------------------

    def daemon_command(self, node: str) -> list[str]:
        """The command line of a node's daemon (run inside the node's namespace)."""
        self.ns(node)
        argv = [*self.daemon_argv, "-m", self.topology.meshif]
        for ifname in self.topology.hard_interfaces(node):
            argv += ["-i", ifname]
        return argv + ["--config", str(self.config_path(node)), "--control-socket", self.control_socket(node)]

    def batmanctl_command(self, node: str, *args: str) -> list[str]:
        return [*self.batmanctl_argv, "--socket", self.control_socket(node), *args]

    def start_daemons(self, nodes: list[str] | None = None, *, wait: bool = True, timeout: float = 10.0) -> None:
        """Start batmand in each node (stdout and stderr to the node's log). With wait, return
        once every control socket exists; a daemon that exits or is not ready within timeout
        raises LabError with the end of its log."""
        nodes = self.nodes if nodes is None else nodes
        for node in nodes:
            if self.daemon_running(node):
                raise LabError(f"{node}: batmand already runs (pid {self.pids[node]})")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.control_socket(node))
            Path(self.control_socket(node)).parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path(node), "ab") as log:
                log.write(f"--- lab: {' '.join(self.daemon_command(node))}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    net.in_namespace(self.ns(node), self.daemon_command(node)),
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True,  # survives the CLI that started it; not hit by ^C
                )
            self._procs[node] = proc
            self.pids[node] = proc.pid
        self.save_state()
        if wait:
            self.wait_daemons(nodes, timeout=timeout)

    def wait_daemons(self, nodes: list[str] | None = None, timeout: float = 10.0) -> None:
        nodes = self.nodes if nodes is None else nodes
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while pending:
            for node in list(pending):
                if not self.daemon_running(node):
                    raise LabError(f"{node}: batmand exited{self._exit_status(node)}; "
                                   f"log {self.log_path(node)}:\n{_tail(self.log_path(node))}")
                if os.path.exists(self.control_socket(node)):
                    pending.remove(node)
            if pending and time.monotonic() > deadline:
                node = pending[0]
                raise LabError(f"{node}: batmand made no control socket {self.control_socket(node)} "
                               f"within {timeout:g}s; log {self.log_path(node)}:\n{_tail(self.log_path(node))}")
            if pending:
                time.sleep(0.05)

    def _exit_status(self, node: str) -> str:
        proc = self._procs.get(node)
        if proc is not None and proc.poll() is not None:
            return f" with status {proc.returncode}"
        return ""

    def daemon_running(self, node: str) -> bool:
        pid = self.pids.get(node)
        if pid is None:
            return False
        proc = self._procs.get(node)
        if proc is not None:
            return proc.poll() is None
        return net.pid_in_namespace(pid, self.ns(node))

    def stop_daemons(self, nodes: list[str] | None = None, timeout: float | None = None) -> None:
        """SIGTERM the daemons, SIGKILL those still running after timeout."""
        nodes = self.nodes if nodes is None else nodes
        timeout = self.stop_timeout if timeout is None else timeout
        pids = [self.pids[n] for n in nodes if self.daemon_running(n)]
        net.terminate(pids, timeout)
        for node in nodes:
            proc = self._procs.pop(node, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=1)
            self.pids.pop(node, None)
        if self.lab_dir.exists():
            self.save_state()

    def configure_mesh_addresses(self, nodes: list[str] | None = None, timeout: float = 10.0) -> None:
        """Wait for each daemon's soft interface, then: with clients, make it a port of br0;
        give the node its mesh addresses (on br0 with clients, else on bat0); bring it up."""
        topo = self.topology
        nodes = self.nodes if nodes is None else nodes
        deadline = time.monotonic() + timeout
        for node in nodes:
            ns = self.ns(node)
            while not net.link_exists(ns, topo.meshif):
                if node in self.pids and not self.daemon_running(node):
                    raise LabError(f"{node}: batmand exited before creating {topo.meshif}; "
                                   f"log {self.log_path(node)}:\n{_tail(self.log_path(node))}")
                if time.monotonic() > deadline:
                    running = "runs" if self.daemon_running(node) else "is not running"
                    raise LabError(f"{node}: no {topo.meshif} in {ns} after {timeout:g}s (batmand {running}; "
                                   f"log {self.log_path(node)})")
                time.sleep(0.05)
            if topo.node_clients(node):
                net.set_master(ns, topo.meshif, BRIDGE)
            mesh_if = topo.mesh_ifname(node)
            for family in (4, 6):
                net.add_address(ns, mesh_if, topo.address(node, family, prefixlen=True))
            net.set_up(ns, topo.meshif)
            net.set_up(ns, mesh_if)

    def start(self, timeout: float = 10.0) -> None:
        """start_daemons() and configure_mesh_addresses()."""
        self.start_daemons(timeout=timeout)
        self.configure_mesh_addresses(timeout=timeout)

    # --- running things in nodes ----------------------------------------------------

    def exec(self, node: str, argv: list[str] | str, *, check: bool = False, timeout: float | None = None,
             input: str | None = None, capture: bool = True) -> subprocess.CompletedProcess:
        """Run a command in a node's (or client's) namespace; text output captured."""
        argv = argv.split() if isinstance(argv, str) else list(argv)
        return subprocess.run(net.in_namespace(self.ns(node), argv), check=check, timeout=timeout, input=input,
                              capture_output=capture, text=True)

    def spawn(self, node: str, argv: list[str], **popen_kwargs) -> subprocess.Popen:
        """Start a command in a node's namespace in the background (e.g. iperf3 -s);
        down() kills whatever is left in the namespace."""
        return subprocess.Popen(net.in_namespace(self.ns(node), list(argv)), **popen_kwargs)

    def batmanctl(self, node: str, *args: str, check: bool = False, timeout: float | None = 30.0
                  ) -> subprocess.CompletedProcess:
        return self.exec(node, self.batmanctl_command(node, *args), check=check, timeout=timeout)

    # --- changing links at run time ----------------------------------------------------

    def set_loss(self, a: str, b: str, percent: float, direction: str = "both") -> None:
        """Loss on the link a-b: direction "both", "ab" (frames a->b) or "ba"."""
        if not 0 <= percent <= 100:
            raise LabError(f"loss is a percentage 0..100, got {percent}")
        if direction not in ("both", "ab", "ba"):
            raise LabError(f"direction is both, ab or ba, got {direction!r}")
        link, forward = self.topology.find_link(a, b)
        ab, ba = ("loss_ab", "loss_ba") if forward else ("loss_ba", "loss_ab")
        if direction in ("both", "ab"):
            setattr(link, ab, float(percent))
        if direction in ("both", "ba"):
            setattr(link, ba, float(percent))
        net.set_loss(self.ns(link.b), link.ifname_b, link.loss_ab)
        net.set_loss(self.ns(link.a), link.ifname_a, link.loss_ba)
        self.save_state()

    def set_rate(self, a: str, b: str, rate: str | int | None, direction: str = "both") -> None:
        """Rate limit (tbf) on the link a-b; None removes it."""
        bits = parse_rate(rate)
        link, forward = self.topology.find_link(a, b)
        ab, ba = ("rate_ab", "rate_ba") if forward else ("rate_ba", "rate_ab")
        if direction not in ("both", "ab", "ba"):
            raise LabError(f"direction is both, ab or ba, got {direction!r}")
        if direction in ("both", "ab"):
            setattr(link, ab, bits)
        if direction in ("both", "ba"):
            setattr(link, ba, bits)
        net.set_rate(self.ns(link.a), link.ifname_a, link.rate_ab, link.mtu)
        net.set_rate(self.ns(link.b), link.ifname_b, link.rate_ba, link.mtu)
        self.save_state()

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Both veth ends of a-b administratively down or up (a pulled cable; for "out of
        radio range" with the interfaces still up, use set_loss(a, b, 100))."""
        link, _ = self.topology.find_link(a, b)
        net.set_up(self.ns(link.a), link.ifname_a, up)
        net.set_up(self.ns(link.b), link.ifname_b, up)
        key = (link.a, link.b)
        (self.down_links.discard if up else self.down_links.add)(key)
        self.save_state()

    # --- looking at it ------------------------------------------------------------------

    def status(self, originators: bool = True) -> dict:
        """What `show` prints: nodes (namespace, daemon, interfaces), links, clients and,
        for each running daemon, `batmanctl o`."""
        topo = self.topology
        existing = set(net.list_namespaces(self.prefix))
        nodes = []
        for name in [*topo.nodes, *topo.clients]:
            ns = self.ns(name)
            entry: dict = {"name": name, "netns": ns, "exists": ns in existing,
                           "kind": "client" if name in topo.clients else topo.nodes[name].kind}
            if ns in existing:
                entry["interfaces"] = [i for i in net.interfaces(ns) if i["name"] != "lo"]
                entry["loss"] = net.loss_counters(ns)
            if name in topo.nodes:
                entry["daemon_pid"] = self.pids.get(name)
                entry["daemon_running"] = self.daemon_running(name)
                entry["log"] = str(self.log_path(name))
                entry["control_socket"] = self.control_socket(name)
                if originators and entry["daemon_running"]:
                    proc = self.batmanctl(name, "o", timeout=10)
                    entry["originators"] = (proc.stdout + proc.stderr).rstrip()
            else:
                entry["node"] = topo.clients[name].node
            entry["address"] = [topo.address(name, 4, True), topo.address(name, 6, True)]
            nodes.append(entry)
        links = [{
            "a": link.a, "b": link.b, "ifname_a": link.ifname_a, "ifname_b": link.ifname_b, "mtu": link.mtu,
            "loss_ab": link.loss_ab, "loss_ba": link.loss_ba, "rate_ab": link.rate_ab, "rate_ba": link.rate_ba,
            "up": (link.a, link.b) not in self.down_links,
        } for link in topo.links]
        return {"prefix": self.prefix, "topology": topo.name, "source": topo.source, "lab_dir": str(self.lab_dir),
                "nodes": nodes, "links": links}

    def show(self, originators: bool = True) -> str:
        return format_status(self.status(originators))


def format_status(st: dict) -> str:
    out = [f"lab {st['prefix']}: topology {st['topology']} ({st['source'] or 'built in code'}), "
           f"files in {st['lab_dir']}"]
    out.append("nodes:")
    for n in st["nodes"]:
        head = f"  {n['name']:<8} netns {n['netns']}"
        if not n["exists"]:
            out.append(head + "  (missing)")
            continue
        if n["kind"] == "client":
            head += f"  client behind {n['node']}"
        elif n.get("daemon_running"):
            head += f"  batmand pid {n['daemon_pid']}"
        else:
            head += "  batmand not running"
        out.append(head)
        for i in n.get("interfaces", []):
            state = "up" if i["up"] else "down"
            if i["up"] and not i["carrier"]:
                state += ",no-carrier"
            extra = f" master {i['master']}" if i["master"] else ""
            loss = n["loss"].get(i["name"])
            if loss and loss["percent"]:
                extra += f" ingress-loss {loss['percent']:g}% (dropped {loss['dropped_packets']})"
            addrs = " ".join(a for a in i["addresses"] if not a.startswith("fe80:"))
            out.append(f"    {i['name']:<10} {i['kind'] or '':<7} mtu {i['mtu']:<5} {state}{extra}"
                       + (f"  {addrs}" if addrs else ""))
    out.append("links:")
    for link in st["links"]:
        rate = ""
        if link["rate_ab"] or link["rate_ba"]:
            rate = f"  rate {format_rate(link['rate_ab'])}/{format_rate(link['rate_ba'])}"
        out.append(f"  {link['a']}:{link['ifname_a']} <-> {link['b']}:{link['ifname_b']}  mtu {link['mtu']}  "
                   f"loss {link['loss_ab']:g}%/{link['loss_ba']:g}% (a->b/b->a){rate}"
                   + ("" if link["up"] else "  DOWN"))
    for n in st["nodes"]:
        if "originators" in n:
            out.append(f"--- {n['name']}: batmanctl o")
            out.append(n["originators"])
    return "\n".join(out)


def down(prefix: str, *, lab_root: str | Path = DEFAULT_LAB_ROOT, run_root: str | Path = DEFAULT_RUN_ROOT,
         keep_logs: bool = False, timeout: float = 3.0) -> list[str]:
    """Remove a lab by its prefix, also after a crash: every process in a namespace
    <prefix>-* is terminated (SIGTERM, then SIGKILL after timeout), the namespaces are
    deleted, and so are the lab's run and log directories (logs kept with keep_logs).
    Returns the namespaces removed."""
    check_prefix(prefix)
    namespaces = net.list_namespaces(prefix)
    pids = [pid for ns in namespaces for pid in net.namespace_pids(ns)]
    net.terminate(pids, timeout)
    for ns in namespaces:
        net.remove_namespace(ns)
    shutil.rmtree(Path(run_root) / prefix, ignore_errors=True)
    lab_dir = Path(lab_root) / prefix
    if not keep_logs:
        shutil.rmtree(lab_dir, ignore_errors=True)
    return namespaces


def list_labs(lab_root: str | Path = DEFAULT_LAB_ROOT) -> dict[str, list[str]]:
    """{prefix: [namespaces]} for every lab with namespaces or files left."""
    labs: dict[str, list[str]] = {}
    root = Path(lab_root)
    if root.is_dir():
        for d in root.iterdir():
            if (d / STATE_FILE).exists() and _PREFIX_RE.match(d.name):
                labs.setdefault(d.name, [])
    for ns in net.list_namespaces():
        prefix, sep, _ = ns.partition("-")
        if sep and prefix in labs:
            labs[prefix].append(ns)
    return labs


__all__ = ["Lab", "LabError", "TopologyError", "down", "list_labs", "format_status"]
