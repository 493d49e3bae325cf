"""A lab: the namespaces, links, clients and daemons of one topology under one prefix.

Names (prefix P, node N, peer M, client C):
- namespace of a node or client:         P-N, P-C
- in N, the veth toward M:               e-M   (e-M-2, e-M-3 for further parallel links)
- in N, the bridge (only with clients):  br0, with ports c-C (toward client C) and bat0
- in C, the veth toward its node:        eth0
- daemon files:                          <lab_root>/P/N.toml (config), N.log (stdout+stderr);
                                         the control socket and seqno state are batmand's
                                         defaults (@batmand/bat0 in the node's namespace,
                                         /var/lib/batmand/bat0.<originator>.state), so the
                                         lab runs batmand as a user would
- kernel node N (a VM, kernel_node.py):  in P-N, per link i the TAP kt<i> and the bridge kb<i>
                                         (ports kt<i> and the link's veth); with kernel.lan the
                                         LAN NIC's TAP ktl in the bridge kbl; <lab_root>/P/N.log
                                         (QEMU), N.console.log (guest console), <run_root>/P/N/
                                         vm.json, vm.pid, ctl.sock (command channel)
- lab state (for the CLI and `down`):    <lab_root>/P/state.json

Kernel nodes and batmand nodes are driven alike: start_daemons() boots a kernel node's VM,
stop_daemons() stops it, exec() runs the command in the guest (busybox userland, batctl,
iperf3; `netns_exec` runs on the host side in the node's namespace instead), batmanctl()
runs batctl there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from batmand.daemon import protocol, state

from . import kernel_node as kn
from . import net
from .topology import (
    BRIDGE, CLIENT_IFNAME, CLIENT_MTU, Topology, TopologyError, dumps_toml, format_rate, from_dict, load, parse_rate, to_dict,
)

DEFAULT_LAB_ROOT = Path(os.environ.get("BATMAND_LAB_DIR", "/tmp/batmand-lab"))
DEFAULT_RUN_ROOT = Path(os.environ.get("BATMAND_LAB_RUN_DIR", "/run/batmand-lab"))
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_]{1,40}$")
STATE_FILE = "state.json"
DEFAULT_STATE_DIR = "/var/lib/batmand"  # batmand's default state directory


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


def ifmac(ns: str, ifname: str) -> str:
    for i in net.interfaces(ns):
        if i["name"] == ifname:
            return i["mac"]
    raise LabError(f"{ns}: no interface {ifname}")


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
        self.vms: dict[str, kn.KernelVM] = {}  # kernel nodes' VMs (started or attached)

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
    def daemon_nodes(self) -> list[str]:
        """Nodes that run batmand."""
        return [n for n, node in self.topology.nodes.items() if node.kind != "kernel"]

    @property
    def kernel_nodes(self) -> list[str]:
        """Nodes that run the kernel's batman-adv in a VM."""
        return [n for n, node in self.topology.nodes.items() if node.kind == "kernel"]

    def is_kernel(self, node: str) -> bool:
        self.ns(node)
        return node in self.topology.nodes and self.topology.nodes[node].kind == "kernel"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(n) for n in [*self.topology.nodes, *self.topology.clients]]

    def control_socket(self, node: str) -> str:
        """The node's control endpoint: batmand's default, an abstract name of the node's
        own network namespace (the same name in every node)."""
        self.ns(node)
        return protocol.default_socket_path(self.topology.meshif)

    def state_path(self, node: str) -> Path:
        """Where a node's daemon keeps its seqnos (batmand's default, by originator)."""
        return Path(state.state_path(DEFAULT_STATE_DIR, self.topology.meshif, bytes.fromhex(
            self.originator(node).replace(":", ""))))

    def control_ready(self, node: str) -> bool:
        """The node's daemon listens on its control endpoint (read from its namespace's
        /proc/net/unix, which lists that namespace's sockets)."""
        pid = self.pids.get(node)
        return pid is not None and net.unix_listening(pid, self.control_socket(node))

    def config_path(self, node: str) -> Path:
        return self.lab_dir / f"{node}.toml"

    def log_path(self, node: str) -> Path:
        return self.lab_dir / f"{node}.log"

    def console_path(self, node: str) -> Path:
        """A kernel node's guest console (kernel messages, /init's progress)."""
        return self.lab_dir / f"{node}.console.log"

    def address(self, name: str, family: int = 4, prefixlen: bool = False) -> str:
        """Mesh address of a node or client: 10.77.0.N / fd77::N by default."""
        self.ns(name)
        return self.topology.address(name, family, prefixlen)

    # --- build and tear down ----------------------------------------------------------

    def up(self) -> "Lab":
        """Create namespaces, links (MTU, loss, rate), clients and the daemon config files.
        Starts no daemon (start_daemons, configure_mesh_addresses). On failure, everything
        built so far is removed again."""
        leftovers = net.list_namespaces(self.prefix)
        if leftovers:
            raise LabError(f"lab {self.prefix} already exists ({', '.join(leftovers)}); "
                           f"remove it with `python -m batmand.lab down --prefix {self.prefix}`")
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
            if node.kind == "kernel":
                try:
                    lan = topo.kernel_lan(node.name)
                    kn.plumb(self.ns(node.name), topo.kernel_wiring(node.name) + ([(None, *lan)] if lan else []))
                except kn.KernelNodeError as exc:
                    raise LabError(str(exc)) from None
            else:
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
        for vm in self.vms.values():
            if vm.proc is not None:
                with contextlib.suppress(Exception):
                    vm.proc.wait(timeout=1)
        self._procs.clear()
        self.vms.clear()
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
        for node in lab.kernel_nodes:
            vm = kn.KernelVM.attach(lab.run_dir / node)
            if vm is not None:
                lab.vms[node] = vm
        return lab

    # --- daemons (and kernel nodes' VMs) -----------------------------------------------

    def daemon_command(self, node: str) -> list[str]:
        """The command line of a node's daemon (run inside the node's namespace)."""
        self.ns(node)
        argv = [*self.daemon_argv, "-m", self.topology.meshif]
        for ifname in self.topology.hard_interfaces(node):
            argv += ["-i", ifname]
        return argv + ["--config", str(self.config_path(node))]

    def batmanctl_command(self, node: str, *args: str) -> list[str]:
        """batmanctl as run inside the node's namespace (it finds that namespace's daemon)."""
        self.ns(node)
        return [*self.batmanctl_argv, *args]

    def kernel_config(self, node: str) -> kn.KernelNodeConfig:
        """What a kernel node's VM is started with (NICs, MACs, addresses, settings)."""
        topo = self.topology
        spec = topo.nodes[node]
        wiring = topo.kernel_wiring(node)
        macs, mesh_mac = kn.node_macs(spec.host, len(wiring))
        lan = topo.kernel_lan(node)
        try:
            algo, settings, _ = kn.mesh_settings(topo.daemon_config(node))
            hardif = kn.hardif_settings(topo.daemon_config(node), [veth for veth, _, _, _ in wiring])
        except (kn.KernelNodeError, ValueError) as exc:
            raise LabError(f"{node}: {exc}") from None
        return kn.KernelNodeConfig(
            name=node, netns=self.ns(node), run_dir=str(self.run_dir / node), log=str(self.log_path(node)),
            console=str(self.console_path(node)),
            nics=[kn.Nic(tap, mac, mtu) for (_, tap, _, mtu), mac in zip(wiring, macs)], mesh_mac=mesh_mac,
            lan=kn.Nic(lan[0], kn.lan_mac(spec.host), lan[2]) if lan else None,
            ipv4=topo.address(node, 4, prefixlen=True), ipv6=None if lan else topo.address(node, 6, prefixlen=True),
            algo=algo, settings=settings, hardif=hardif, setup=spec.kernel.get("setup", ""),
            memory_mb=spec.kernel.get("memory_mb", kn.MEMORY_MB),
        )

    def vm(self, node: str) -> kn.KernelVM:
        """A kernel node's VM (LabError if the node is no kernel node or was never started)."""
        if not self.is_kernel(node):
            raise LabError(f"{node} is not a kernel node")
        vm = self.vms.get(node) or kn.KernelVM.attach(self.run_dir / node)
        if vm is None:
            raise LabError(f"{node}: the kernel node's VM was not started")
        self.vms[node] = vm
        return vm

    def start_daemons(self, nodes: list[str] | None = None, *, wait: bool = True, timeout: float = 10.0) -> None:
        """Start batmand in each node (stdout and stderr to the node's log), and boot the VM
        of each kernel node (they boot in parallel, in the background). With wait, return
        once every control socket exists and every VM is ready; a daemon or VM that exits or
        is not ready in time (timeout; at least kernel_node.BOOT_TIMEOUT for VMs) raises
        LabError with the end of its log."""
        nodes = self.nodes if nodes is None else nodes
        kernel = [n for n in nodes if self.is_kernel(n)]
        for node in nodes:
            if self.daemon_running(node):
                what = "its VM" if node in kernel else "batmand"
                raise LabError(f"{node}: {what} already runs (pid {self.pids[node]})")
        if kernel:
            ok, why = kn.kernel_nodes_available(len(kernel))
            if not ok:
                raise LabError(f"cannot start kernel node(s) {', '.join(kernel)}: {why}")
        for node in kernel:  # first: they take longest
            vm = kn.KernelVM(self.kernel_config(node))
            _, _, ignored = kn.mesh_settings(self.topology.daemon_config(node))
            if ignored:
                with open(self.log_path(node), "a") as log:
                    log.write(f"--- lab: a kernel node has no setting(s) {', '.join(sorted(ignored))}: ignored\n")
            try:
                vm.boot()
            except (kn.KernelNodeError, OSError) as exc:
                raise LabError(f"{node}: cannot start the VM: {exc}") from None
            self.vms[node] = vm
            self.pids[node] = vm.pid
        for node in nodes:
            if node in kernel:
                continue
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
        pending = [n for n in nodes if not self.is_kernel(n)]
        while pending:
            if any(not self.daemon_running(n) for n in pending):
                # report the first one in node order that failed: give the others a moment
                # to fail too (daemons started together often fail together)
                settle = time.monotonic() + 0.5
                while time.monotonic() < settle and any(
                        self.daemon_running(n) and not self.control_ready(n) for n in pending):
                    time.sleep(0.02)
                node = next(n for n in pending if not self.daemon_running(n))
                raise LabError(f"{node}: batmand exited{self._exit_status(node)}; "
                               f"log {self.log_path(node)}:\n{_tail(self.log_path(node))}")
            for node in list(pending):
                if self.control_ready(node):
                    pending.remove(node)
            if pending and time.monotonic() > deadline:
                node = pending[0]
                raise LabError(f"{node}: batmand does not listen on {self.control_socket(node)} "
                               f"within {timeout:g}s; log {self.log_path(node)}:\n{_tail(self.log_path(node))}")
            if pending:
                time.sleep(0.05)
        vm_deadline = time.monotonic() + max(timeout, kn.BOOT_TIMEOUT)
        for node in [n for n in nodes if self.is_kernel(n)]:
            try:
                self.vm(node).wait_ready(max(0.1, vm_deadline - time.monotonic()))
            except kn.KernelNodeError as exc:
                raise LabError(str(exc)) from None

    def _exit_status(self, node: str) -> str:
        proc = self._procs.get(node)
        if proc is not None and proc.poll() is not None:
            return f" with status {proc.returncode}"
        return ""

    def daemon_running(self, node: str) -> bool:
        """batmand runs in the node, or (kernel node) its VM runs."""
        if self.is_kernel(node):
            vm = self.vms.get(node) or kn.KernelVM.attach(self.run_dir / node)
            return vm is not None and vm.alive()
        pid = self.pids.get(node)
        if pid is None:
            return False
        proc = self._procs.get(node)
        if proc is not None:
            return proc.poll() is None
        return net.pid_in_namespace(pid, self.ns(node))

    def stop_daemons(self, nodes: list[str] | None = None, timeout: float | None = None) -> None:
        """SIGTERM the daemons and VMs, SIGKILL those still running after timeout."""
        nodes = self.nodes if nodes is None else nodes
        timeout = self.stop_timeout if timeout is None else timeout
        for node in [n for n in nodes if self.is_kernel(n)]:
            vm = self.vms.pop(node, None) or kn.KernelVM.attach(self.run_dir / node)
            if vm is not None:
                vm.stop(timeout)
            self.pids.pop(node, None)
        nodes = [n for n in nodes if not self.is_kernel(n)]
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
        give the node its mesh addresses (on br0 with clients, else on bat0); bring it up.
        (Kernel nodes are skipped: their guest does this itself.)"""
        topo = self.topology
        nodes = [n for n in (self.nodes if nodes is None else nodes) if not self.is_kernel(n)]
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
        """Everything running: the kernel nodes' VMs boot while batmand starts in the other
        nodes and their bat0s get addresses; returns when the VMs are ready too."""
        self.start_daemons(wait=False)
        self.wait_daemons(self.daemon_nodes, timeout=timeout)
        self.configure_mesh_addresses(timeout=timeout)
        self.wait_daemons(self.kernel_nodes, timeout=timeout)

    def boot_times(self) -> dict[str, float | None]:
        """Seconds from QEMU's start to the guest's READY, per kernel node."""
        return {n: (self.vms[n].boot_seconds if n in self.vms else None) for n in self.kernel_nodes}

    # --- running things in nodes ----------------------------------------------------

    def exec(self, node: str, argv: list[str] | str, *, check: bool = False, timeout: float | None = None,
             input: str | None = None, capture: bool = True) -> subprocess.CompletedProcess:
        """Run a command in a node's (or client's) namespace; text output captured.
        On a kernel node the command runs in the guest (over the VM's command channel;
        busybox userland, batctl, iperf3, alfred); `timeout` is enforced there (default 120 s)."""
        argv = argv.split() if isinstance(argv, str) else list(argv)
        if node in self.topology.nodes and self.is_kernel(node):
            return self._guest(node, shlex.join(argv), argv, check=check, timeout=timeout, input=input,
                               capture=capture)
        return self.netns_exec(node, argv, check=check, timeout=timeout, input=input, capture=capture)

    def shell(self, node: str, script: str, **kwargs) -> subprocess.CompletedProcess:
        """Run a shell script: in a kernel node's guest (busybox sh), else `sh -c` in the
        node's namespace. Same keywords as exec()."""
        if node in self.topology.nodes and self.is_kernel(node):
            return self._guest(node, script, ["sh", "-c", script], **kwargs)
        return self.netns_exec(node, ["sh", "-c", script], **kwargs)

    def netns_exec(self, node: str, argv: list[str], *, check: bool = False, timeout: float | None = None,
                   input: str | None = None, capture: bool = True) -> subprocess.CompletedProcess:
        """Run a command on the host in a node's namespace (for a kernel node: where its TAPs
        and bridges are, not in the guest)."""
        return subprocess.run(net.in_namespace(self.ns(node), list(argv)), check=check, timeout=timeout, input=input,
                              capture_output=capture, text=True)

    def _guest(self, node: str, script: str, argv: list[str], *, check: bool = False, timeout: float | None = None,
               input: str | None = None, capture: bool = True) -> subprocess.CompletedProcess:
        try:
            res = self.vm(node).run(script, timeout, input.encode() if input is not None else None)
        except kn.KernelNodeError as exc:
            raise LabError(str(exc)) from None
        out, err = res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace")
        if res.timed_out:
            raise subprocess.TimeoutExpired(argv, timeout if timeout is not None else kn.DEFAULT_EXEC_TIMEOUT,
                                            output=out, stderr=err)
        if not capture:
            sys.stdout.write(out)
            sys.stdout.flush()
            sys.stderr.write(err)
            sys.stderr.flush()
            out = err = None
        if check and res.returncode != 0:
            raise subprocess.CalledProcessError(res.returncode, argv, out, err)
        return subprocess.CompletedProcess(argv, res.returncode, out, err)

    def spawn(self, node: str, argv: list[str], **popen_kwargs):
        """Start a command in a node's namespace in the background (e.g. iperf3 -s);
        down() kills whatever is left in the namespace. On a kernel node it runs in the
        guest and a kernel_node.GuestJob (poll, wait, kill, communicate) is returned."""
        if node in self.topology.nodes and self.is_kernel(node):
            try:
                return kn.GuestJob(self.vm(node), list(argv))
            except kn.KernelNodeError as exc:
                raise LabError(str(exc)) from None
        return subprocess.Popen(net.in_namespace(self.ns(node), list(argv)), **popen_kwargs)

    def batmanctl(self, node: str, *args: str, check: bool = False, timeout: float | None = 30.0
                  ) -> subprocess.CompletedProcess:
        """batmanctl against a node's daemon; on a kernel node, batctl in the guest."""
        if self.is_kernel(node):
            return self.exec(node, ["batctl", *args], check=check, timeout=timeout)
        return self.exec(node, self.batmanctl_command(node, *args), check=check, timeout=timeout)

    def originator(self, node: str) -> str:
        """The node's originator address: the MAC of its primary hard interface."""
        if self.is_kernel(node):
            return kn.node_macs(self.topology.nodes[node].host, 1)[0][0]
        primary = self.topology.hard_interfaces(node)[0]
        return ifmac(self.ns(node), primary)

    def mesh_mac(self, node: str) -> str:
        """The MAC of the node's bat0 (its own translation-table entry)."""
        if self.is_kernel(node):
            return kn.node_macs(self.topology.nodes[node].host, 1)[1]
        return ifmac(self.ns(node), self.topology.meshif)

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
                if self.is_kernel(name):
                    entry["console"] = str(self.console_path(name))
                    vm = self.vms.get(name) or kn.KernelVM.attach(self.run_dir / name)
                    if vm is not None and entry["daemon_running"]:
                        entry["daemon_pid"] = vm.pid
                        entry["boot_seconds"] = vm.boot_seconds
                        entry["rss_kib"] = vm.rss_kib()
                    entry["originator"] = self.originator(name)
                else:
                    entry["control_socket"] = self.control_socket(name)
                if originators and entry["daemon_running"]:
                    try:
                        proc = self.batmanctl(name, "o", timeout=10)
                        entry["originators"] = (proc.stdout + proc.stderr).rstrip()
                    except (LabError, subprocess.TimeoutExpired) as exc:
                        entry["originators"] = f"({exc})"
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
        elif n["kind"] == "kernel":
            if n.get("daemon_running"):
                rss = f", RSS {n['rss_kib'] >> 10} MiB" if n.get("rss_kib") else ""
                boot = f", ready in {n['boot_seconds']:g}s" if n.get("boot_seconds") else ""
                head += f"  kernel batman-adv VM pid {n['daemon_pid']}{boot}{rss}, originator {n['originator']}"
            else:
                head += "  kernel node, VM not running"
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
            out.append(f"--- {n['name']}: {'batctl' if n['kind'] == 'kernel' else 'batmanctl'} o")
            out.append(n["originators"])
    return "\n".join(out)


def down(prefix: str, *, lab_root: str | Path = DEFAULT_LAB_ROOT, run_root: str | Path = DEFAULT_RUN_ROOT,
         keep_logs: bool = False, timeout: float = 3.0) -> list[str]:
    """Remove a lab by its prefix, also after a crash: the kernel nodes' VMs and every
    process in a namespace <prefix>-* are terminated (SIGTERM, then SIGKILL after timeout),
    the namespaces are deleted (with them the veths, TAPs and bridges), and so are the lab's
    run and log directories (logs kept with keep_logs).
    Returns the namespaces removed."""
    check_prefix(prefix)
    kn.stop_all(Path(run_root) / prefix, timeout)  # kernel nodes' QEMUs, by their recorded PIDs
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
