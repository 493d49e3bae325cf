"""The configurations bench/dataplane.py measures, and how each one is built.

Two-node lab: namespaces A and B joined by one veth pair. Three-node line: A - M - B
with one veth pair on each side of M (A and B have no direct link; M forwards).
Addresses are taken from 198.18.0.0/15 (the benchmarking range) and exist only inside
the run's namespaces:

    198.18.0.0/24   underlay between A and B (two-node), or between A and M (line)
    198.18.2.0/24   underlay between M and B (line, kernel-routed reference)
    198.18.1.0/24   the overlay: bat0 / tap0 / vx0 (A .1, B .2, M .3)

Every tunnel carries a 1500-byte inner MTU; the veth MTU is raised by the
encapsulation's overhead (batmand 1560 as the project's labs use, vxlan 1550, tinc and
fastd 1600, the naive forwarder 1524).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import harness as h

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.join(ROOT, ".venv", "bin")
NAIVE_FWD = os.path.normpath(os.path.join(ROOT, "..", "shared", "peer-bench", "naive_fwd.py"))

UNDER = {"A": "198.18.0.1", "B": "198.18.0.2"}
OVER = {"A": "198.18.1.1", "B": "198.18.1.2", "M": "198.18.1.3"}
LINE_KERNEL = {"A": "198.18.0.1", "MA": "198.18.0.2", "MB": "198.18.2.1", "B": "198.18.2.2"}
OFFLOADS_OFF = ("gro=off", "tso=off", "csum_offload=off")
ORIG_INTERVAL = "orig_interval_ms=200"


@dataclass
class Spec:
    """One configuration: topology, what forwards, and the batmand options if it is ours."""
    name: str
    topo: str                   # "pair" or "line3"
    kind: str                   # "kernel", "peer" (tinc/fastd/naive) or "batmand"
    build: str                  # name of the builder below
    workers: int | None = None  # batmand --workers
    offloads: bool = True       # batmand offloads (gro/tso/csum) on = daemon default
    flows_test: bool = False    # run the many-flows share test (batmand with N workers)
    about: str = ""
    settings: tuple = ()        # more batmand --set KEY=VALUE


def specs(n_workers: int) -> dict[str, Spec]:
    """All configurations, in the default order. N = n_workers (os.cpu_count())."""
    out: list[Spec] = [
        Spec("veth-direct", "pair", "kernel", "direct", about="A and B on one veth pair, no tunnel"),
        Spec("kernel-vxlan", "pair", "kernel", "vxlan", about="kernel VXLAN over the same veth"),
        Spec("tinc-switch", "pair", "peer", "tinc", about="tinc 1.0, Mode switch, tap, Cipher/Digest none"),
        Spec("fastd-null", "pair", "peer", "fastd", about="fastd, mode tap, method null"),
        Spec("python-naive", "pair", "peer", "naive",
             about="../shared/peer-bench/naive_fwd.py --loop select (one frame per syscall)"),
    ]
    for w, label in ((0, "w0"), (1, "w1"), (n_workers, "wN")):
        for off in (False, True):
            suffix = "-nooffload" if off else ""
            out.append(Spec(f"batmand-{label}{suffix}", "pair", "batmand", "batmand", workers=w,
                            offloads=not off, flows_test=(label == "wN"),
                            about=f"batmand --workers {w}" + (", --set " + " --set ".join(OFFLOADS_OFF) if off else "")))
    out.append(Spec("batmand-w0-nogro", "pair", "batmand", "batmand", workers=0, settings=("gro=off",),
                    about="batmand --workers 0, --set gro=off (TSO and checksum offload on)"))
    out.append(Spec("batmand-w0-notso", "pair", "batmand", "batmand", workers=0, settings=("tso=off",),
                    about="batmand --workers 0, --set tso=off (the host segments; GRO and checksum offload on)"))
    out.append(Spec("batmand-w0-nocsum", "pair", "batmand", "batmand", workers=0, settings=("csum_offload=off",),
                    about="batmand --workers 0, --set csum_offload=off (checksums finished in Python)"))
    for w, label in ((0, "w0"), (n_workers, "wN")):
        out.append(Spec(f"batmand-{label}-userspace", "pair", "batmand", "batmand", workers=w,
                        settings=("kernel_forward=off",),
                        about=f"batmand --workers {w}, --set kernel_forward=off (every frame through the daemon)"))
    out.append(Spec("batmand-wN-v3", "pair", "batmand", "batmand", workers=n_workers, settings=("rx_ring=v3",),
                    about=f"batmand --workers {n_workers}, --set rx_ring=v3 (TPACKET_V3 block rings)"))
    out += [
        Spec("line3-kernel", "line3", "kernel", "line_kernel", about="A - M - B plain veths, M routes (ip_forward)"),
        # A veth passes TSO frames on whole, so M above forwards 64 KB frames; a batman-adv
        # link (the kernel module's or ours) carries MTU segments, which these two make A cut
        Spec("veth-direct-segmented", "pair", "kernel", "direct_segmented",
             about="veth-direct, A's veth without TSO: the stack cuts MTU segments"),
        Spec("line3-kernel-segmented", "line3", "kernel", "line_kernel_segmented",
             about="line3-kernel, A's veth without TSO: M forwards MTU segments"),
        Spec("line3-batmand-w0", "line3", "batmand", "batmand", workers=0, about="A - M - B, batmand --workers 0"),
        Spec("line3-batmand-wN", "line3", "batmand", "batmand", workers=n_workers, flows_test=True,
             about=f"A - M - B, batmand --workers {n_workers}"),
        Spec("line3-batmand-w0-userspace", "line3", "batmand", "batmand", workers=0, settings=("kernel_forward=off",),
             about="A - M - B, batmand --workers 0, --set kernel_forward=off"),
    ]
    return {s.name: s for s in out}


@dataclass
class Net:
    """A built configuration, ready for the tests."""
    spec: Spec
    ns: dict[str, str]                                 # node -> namespace
    target: str                                        # B's address the tests aim at
    overlay_dev: str | None = None                     # device carrying the target address in A and B
    veths: dict[str, list[str]] = field(default_factory=dict)
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)
    sockets: dict[str, str] = field(default_factory=dict)  # batmand control sockets
    underlay_mtu: int = 1500
    overlay_mtu: int | None = None
    notes: dict = field(default_factory=dict)          # what the set-up verified, config files


class Ctx:
    """Per-run state: scratch directory, log directory, keys made once per run."""

    def __init__(self, workdir: str, logdir: str, python: str):
        self.workdir, self.logdir, self.python = workdir, logdir, python
        self.tinc_dir: str | None = None
        self.fastd_keys: dict[str, tuple[str, str]] | None = None
        self.tag = ""  # "<config>-r<rep>", names the logs of one build

    def logfile(self, what: str) -> str:
        return os.path.join(self.logdir, f"{self.tag}-{what}.log")


# ------------------------------------------------------------------ underlays
def pair_underlay(mtu: int, addresses: bool = True) -> tuple[dict[str, str], dict[str, list[str]]]:
    ns = {"A": h.add_ns("A"), "B": h.add_ns("B")}
    # created inside A with its peer inside B: it never exists in the root namespace
    h.run(["ip", "-n", ns["A"], "link", "add", "v0", "mtu", str(mtu), "type", "veth",
           "peer", "name", "v1", "mtu", str(mtu), "netns", ns["B"]])
    veths = {"A": ["v0"], "B": ["v1"]}
    for node in "AB":
        dev = veths[node][0]
        if addresses:
            h.run(["ip", "-n", ns[node], "addr", "add", UNDER[node] + "/24", "dev", dev])
        h.run(["ip", "-n", ns[node], "link", "set", dev, "up"])
    return ns, veths


def line_underlay(mtu: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    ns = {"A": h.add_ns("A"), "M": h.add_ns("M"), "B": h.add_ns("B")}
    h.run(["ip", "-n", ns["A"], "link", "add", "v0", "mtu", str(mtu), "type", "veth",
           "peer", "name", "m0", "mtu", str(mtu), "netns", ns["M"]])
    h.run(["ip", "-n", ns["M"], "link", "add", "m1", "mtu", str(mtu), "type", "veth",
           "peer", "name", "v1", "mtu", str(mtu), "netns", ns["B"]])
    veths = {"A": ["v0"], "M": ["m0", "m1"], "B": ["v1"]}
    for node, devs in veths.items():
        for dev in devs:
            h.run(["ip", "-n", ns[node], "link", "set", dev, "up"])
    return ns, veths


def overlay_up(ns: dict[str, str], dev: str, nodes=("A", "B"), timeout: float = 15.0,
               daemons: dict[str, subprocess.Popen] | None = None) -> None:
    """Wait for dev (made by a daemon) in each node, give it the node's overlay address."""
    for node in nodes:
        def ready(node=node):
            p = (daemons or {}).get(node)
            if p is not None and p.poll() is not None:
                raise RuntimeError(f"{node}: daemon exited with status {p.returncode} before creating {dev}: "
                                   f"{h.tail(p.logfile, 8)}")
            return h.link_exists(ns[node], dev)
        if not h.wait_until(ready, timeout):
            raise RuntimeError(f"{dev} did not appear in {ns[node]} within {timeout:g} s")
        h.run(["ip", "-n", ns[node], "addr", "add", OVER[node] + "/24", "dev", dev])
        h.run(["ip", "-n", ns[node], "link", "set", dev, "up"])


# ------------------------------------------------------------------ kernel references
def build_direct(ctx: Ctx, spec: Spec) -> Net:
    ns, veths = pair_underlay(1500)
    return Net(spec, ns, UNDER["B"], "v0", veths, underlay_mtu=1500)


def build_vxlan(ctx: Ctx, spec: Spec) -> Net:
    ns, veths = pair_underlay(1550)
    for node, other in (("A", "B"), ("B", "A")):
        h.run(["ip", "-n", ns[node], "link", "add", "vx0", "mtu", "1500", "type", "vxlan", "id", "42",
               "local", UNDER[node], "remote", UNDER[other], "dstport", "4789", "dev", veths[node][0]])
    overlay_up(ns, "vx0")
    return Net(spec, ns, OVER["B"], "vx0", veths, underlay_mtu=1550, overlay_mtu=1500)


def build_line_kernel(ctx: Ctx, spec: Spec) -> Net:
    ns, veths = line_underlay(1500)
    a, m, b = ns["A"], ns["M"], ns["B"]
    h.run(["ip", "-n", a, "addr", "add", LINE_KERNEL["A"] + "/24", "dev", "v0"])
    h.run(["ip", "-n", m, "addr", "add", LINE_KERNEL["MA"] + "/24", "dev", "m0"])
    h.run(["ip", "-n", m, "addr", "add", LINE_KERNEL["MB"] + "/24", "dev", "m1"])
    h.run(["ip", "-n", b, "addr", "add", LINE_KERNEL["B"] + "/24", "dev", "v1"])
    h.run(["ip", "-n", a, "route", "add", "198.18.2.0/24", "via", LINE_KERNEL["MA"]])
    h.run(["ip", "-n", b, "route", "add", "198.18.0.0/24", "via", LINE_KERNEL["MB"]])
    h.run(h.in_ns(m, ["sysctl", "-qw", "net.ipv4.ip_forward=1"]))
    return Net(spec, ns, LINE_KERNEL["B"], "v0", veths, underlay_mtu=1500)


def _segmented(net: Net) -> Net:
    """A's veth without TSO: GSO frames are cut into MTU segments before they cross it."""
    h.run(h.in_ns(net.ns["A"], ["ethtool", "-K", "v0", "tso", "off"]))
    return net


def build_direct_segmented(ctx: Ctx, spec: Spec) -> Net:
    return _segmented(build_direct(ctx, spec))


def build_line_kernel_segmented(ctx: Ctx, spec: Spec) -> Net:
    return _segmented(build_line_kernel(ctx, spec))


# ------------------------------------------------------------------ tinc 1.0
def _tinc_conf(name: str, connect: str | None) -> str:
    lines = [f"Name = {name}", "Mode = switch", "DeviceType = tap", "Device = /dev/net/tun",
             "Interface = tap0", "AddressFamily = ipv4", "PMTUDiscovery = no", "ClampMSS = no"]
    if connect:
        lines.append(f"ConnectTo = {connect}")
    return "\n".join(lines) + "\n"


def _tinc_host(address: str) -> str:
    return f"Address = {address}\nPort = 655\nCipher = none\nDigest = none\nCompression = 0\n"


def tinc_keys(ctx: Ctx) -> str:
    """Both nodes' configuration directories with fresh RSA keys (once per run)."""
    if ctx.tinc_dir:
        return ctx.tinc_dir
    base = os.path.join(ctx.workdir, "tinc")
    for name, node, connect in (("a", "A", "b"), ("b", "B", None)):
        d = os.path.join(base, name)
        os.makedirs(os.path.join(d, "hosts"))
        with open(os.path.join(d, "tinc.conf"), "w") as f:
            f.write(_tinc_conf(name, connect))
        with open(os.path.join(d, "hosts", name), "w") as f:
            f.write(_tinc_host(UNDER[node]))
        h.run(["tincd", "-c", d, "-K2048"], stdin="")  # appends the public key to hosts/<name>
    shutil.copy(os.path.join(base, "a", "hosts", "a"), os.path.join(base, "b", "hosts", "a"))
    shutil.copy(os.path.join(base, "b", "hosts", "b"), os.path.join(base, "a", "hosts", "b"))
    ctx.tinc_dir = base
    return base


def build_tinc(ctx: Ctx, spec: Spec) -> Net:
    base = tinc_keys(ctx)
    ns, veths = pair_underlay(1600)
    daemons = {}
    for node, name in (("A", "a"), ("B", "b")):
        daemons[node] = h.spawn(h.in_ns(ns[node], ["tincd", "-c", os.path.join(base, name), "-D",
                                                   f"--pidfile={ctx.workdir}/tinc-{name}.pid"]),
                                ctx.logfile(f"tinc-{node}"))
    overlay_up(ns, "tap0", daemons=daemons)
    net = Net(spec, ns, OVER["B"], "tap0", veths, daemons, underlay_mtu=1600, overlay_mtu=1500)
    net.notes["config_files"] = {"tinc.conf (a)": _tinc_conf("a", "b"),
                                 "hosts/a": _tinc_host(UNDER["A"]) + "(RSA public key from tincd -K2048)"}
    return net


def tinc_verify(net: Net) -> str | None:
    """SIGUSR2 makes tincd dump its nodes into its log: cipher/digest 0 show no crypto."""
    p = net.daemons["A"]
    os.kill(p.pid, signal.SIGUSR2)
    time.sleep(0.3)
    lines = [line.strip() for line in h.tail(p.logfile, 60).splitlines() if line.strip().startswith("b at ")]
    return lines[-1] if lines else None


# ------------------------------------------------------------------ fastd
def _fastd_conf(node: str, other: str, secret: str, peer_key: str) -> str:
    return (f'log level info;\nmode tap;\ninterface "tap0";\nmethod "null";\n'
            f"bind {UNDER[node]}:10000;\nsecret \"{secret}\";\nmtu 1500;\n"
            f'peer "{other}" {{\n    key "{peer_key}";\n    remote {UNDER[other]}:10000;\n}}\n')


def fastd_keys(ctx: Ctx) -> dict[str, tuple[str, str]]:
    if ctx.fastd_keys:
        return ctx.fastd_keys
    keys = {}
    for node in "AB":
        secret = h.run(["fastd", "--generate-key", "--machine-readable"]).stdout.strip()
        public = h.run(["fastd", "-c", "-", "--show-key", "--machine-readable"],
                       stdin=f'secret "{secret}";\n').stdout.strip()
        keys[node] = (secret, public)
    ctx.fastd_keys = keys
    return keys


def build_fastd(ctx: Ctx, spec: Spec) -> Net:
    keys = fastd_keys(ctx)
    ns, veths = pair_underlay(1600)
    daemons = {}
    for node, other in (("A", "B"), ("B", "A")):
        conf = os.path.join(ctx.workdir, f"fastd-{node}.conf")
        with open(conf, "w") as f:
            f.write(_fastd_conf(node, other, keys[node][0], keys[other][1]))
        daemons[node] = h.spawn(h.in_ns(ns[node], ["fastd", "-c", conf]), ctx.logfile(f"fastd-{node}"))
    overlay_up(ns, "tap0", daemons=daemons)
    net = Net(spec, ns, OVER["B"], "tap0", veths, daemons, underlay_mtu=1600, overlay_mtu=1500)
    net.notes["config_files"] = {"fastd A": _fastd_conf("A", "B", "(fastd --generate-key)", "(B's public key)")}
    return net


def fastd_verify(net: Net) -> str | None:
    lines = [line.strip() for line in h.tail(net.daemons["A"].logfile, 60).splitlines() if "established" in line]
    return lines[-1] if lines else None


# ------------------------------------------------------------------ the naive forwarder (external program)
def build_naive(ctx: Ctx, spec: Spec) -> Net:
    if not os.path.exists(NAIVE_FWD):
        raise RuntimeError(f"{NAIVE_FWD} not found (the naive forwarder is run from ../shared/peer-bench)")
    ns, veths = pair_underlay(1524)
    macs = {node: h.mac_of(ns[node], veths[node][0]) for node in "AB"}
    daemons = {}
    for node, other in (("A", "B"), ("B", "A")):
        daemons[node] = h.spawn(h.in_ns(ns[node], [ctx.python, NAIVE_FWD, "--tap", "tap0", "--dev", veths[node][0],
                                                   "--peer-mac", macs[other], "--loop", "select"]),
                                ctx.logfile(f"naive-{node}"))
    overlay_up(ns, "tap0", daemons=daemons)
    return Net(spec, ns, OVER["B"], "tap0", veths, daemons, underlay_mtu=1524, overlay_mtu=1500)


def naive_packet_stats(net: Net) -> dict[str, dict[str, int]]:
    """naive_fwd prints its raw socket's PACKET_STATISTICS (received, dropped since the last
    read) on SIGUSR1. Returns {node: {"packets": n, "drops": n}} for the nodes that answered."""
    offsets = {}
    for node, p in net.daemons.items():
        offsets[node] = os.path.getsize(p.logfile)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(0.3)
    out = {}
    for node, p in net.daemons.items():
        with open(p.logfile, errors="replace") as f:
            f.seek(offsets[node])
            text = f.read()
        packets = drops = 0
        found = False
        for line in text.splitlines():
            if line.startswith("pstats "):
                kv = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                packets += int(kv.get("packets", 0))
                drops += int(kv.get("drops", 0))
                found = True
        if found:
            out[node] = {"packets": packets, "drops": drops}
    return out


# ------------------------------------------------------------------ batmand
def batmand_exe() -> str:
    exe = os.path.join(VENV_BIN, "batmand")
    return exe if os.path.exists(exe) else (shutil.which("batmand") or "batmand")


def batmanctl_exe() -> str:
    exe = os.path.join(VENV_BIN, "batmanctl")
    return exe if os.path.exists(exe) else (shutil.which("batmanctl") or "batmanctl")


def batmand_argv(spec: Spec, devs: list[str], sock: str) -> list[str]:
    argv = [batmand_exe(), "-m", "bat0"]
    for dev in devs:
        argv += ["-i", dev]
    argv += ["--control-socket", sock, "--state-dir", "", "--workers", str(spec.workers)]
    for kv in spec.settings:
        argv += ["--set", kv]
    if not spec.offloads:
        for kv in OFFLOADS_OFF:
            argv += ["--set", kv]
    return argv + ["--set", ORIG_INTERVAL]


def build_batmand(ctx: Ctx, spec: Spec) -> Net:
    ns, veths = pair_underlay(1560, addresses=False) if spec.topo == "pair" else line_underlay(1560)
    sockdir = os.path.join(ctx.workdir, "sock")
    os.makedirs(sockdir, exist_ok=True)
    net = Net(spec, ns, OVER["B"], "bat0", veths, underlay_mtu=1560, overlay_mtu=1500)
    for node in ns:
        sock = os.path.join(sockdir, f"{node}.sock")
        if os.path.exists(sock):
            os.unlink(sock)
        net.sockets[node] = sock
        net.daemons[node] = h.spawn(h.in_ns(ns[node], batmand_argv(spec, veths[node], sock)),
                                    ctx.logfile(f"batmand-{node}"))
    overlay_up(ns, "bat0", nodes=tuple(ns), daemons=net.daemons)

    def pings():
        for node, p in net.daemons.items():
            if p.poll() is not None:
                raise RuntimeError(f"{node}: batmand exited with status {p.returncode}: {h.tail(p.logfile, 8)}")
        return h.run(h.in_ns(ns["A"], ["ping", "-n", "-c1", "-W1", OVER["B"]]), check=False,
                     record=False).returncode == 0
    t0 = time.monotonic()
    if not h.wait_until(pings, 40, step=0.2):
        raise RuntimeError("A could not ping B over bat0 within 40 s")
    net.notes["mesh_ready_s"] = round(time.monotonic() - t0, 2)
    return net


def batmanctl(sock: str, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
    return subprocess.run([batmanctl_exe(), "--socket", sock, *args], capture_output=True, text=True,
                          timeout=timeout)


def batmand_verify(net: Net) -> str | None:
    r = batmanctl(net.sockets["A"], "o", "--json")
    if r.returncode != 0:
        return f"batmanctl o failed: {(r.stderr or r.stdout).strip()[-200:]}"
    try:
        rows = json.loads(r.stdout)
    except json.JSONDecodeError:
        return r.stdout.strip()[-200:]
    origs = sorted({row.get("orig_address") for row in rows if isinstance(row, dict)} - {None})
    return f"A knows {len(origs)} originator(s): {', '.join(origs)}"


def dataplane_stats(socks: dict[str, str]) -> tuple[dict[str, dict | None], str | None]:
    """`batmanctl dataplane --json` of every node, asked in parallel. Returns ({node:
    document or None}, the first error). The command is new: any failure gives None."""
    procs = {node: subprocess.Popen([batmanctl_exe(), "--socket", s, "dataplane", "--json"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node, s in socks.items()}
    out, error = {}, None
    for node, p in procs.items():
        try:
            so, se = p.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out[node], error = None, error or f"{node}: batmanctl dataplane timed out"
            continue
        doc = None
        if p.returncode == 0:
            try:
                doc = json.loads(so)
            except json.JSONDecodeError:
                pass
        if not isinstance(doc, dict):
            error = error or f"{node}: batmanctl dataplane --json: exit {p.returncode}: {(se or so).strip()[-300:]}"
            doc = None
        out[node] = doc
    return out, error


BUILDERS = {"direct": build_direct, "vxlan": build_vxlan, "line_kernel": build_line_kernel,
            "direct_segmented": build_direct_segmented, "line_kernel_segmented": build_line_kernel_segmented,
            "tinc": build_tinc, "fastd": build_fastd, "naive": build_naive, "batmand": build_batmand}
VERIFIERS = {"tinc": tinc_verify, "fastd": fastd_verify, "batmand": batmand_verify}


def required_tools(spec: Spec) -> list[str]:
    return {"tinc": ["tincd"], "fastd": ["fastd"]}.get(spec.build, [])


def python_for_naive() -> str:
    exe = os.path.join(VENV_BIN, "python")
    return exe if os.path.exists(exe) else sys.executable
