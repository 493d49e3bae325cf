"""Kernel nodes: the Linux kernel's batman-adv as a netns-lab node.

A kernel node is a small QEMU VM that boots Debian's kernel with its batman-adv module and
batctl (the image of kernel_image.py). The lab wires it like any other node: its namespace
P-N holds the veth ends of its links, and for link i a TAP `kt<i>` (the VM's NIC eth<i>,
virtio-net, no offloads) and a bridge `kb<i>` joining that TAP to the veth:

    VM eth<i> ==virtio== kt<i> --[bridge kb<i>]-- e-<peer>  ~~veth~~  e-<N> in P-<peer>

so loss (nft ingress on the veth), rate (tbf on the veth) and link up/down act on kernel
nodes exactly as on batmand nodes. QEMU runs inside the namespace (so `down(prefix)` kills
it with everything else there) and records its PID; only that PID is ever signalled.

Guest: bat0 with every NIC (BATMAN_IV unless routing_algo says BATMAN_V; per-NIC settings
for B.A.T.M.A.N. V from [hardif.<the link's veth>] as for batmand), NIC i has MAC
02:ba:HH:HH:HH:0<i+1> (HH = the node's host number, so the primary NIC's MAC is the
originator address), bat0 has 02:bb:HH:HH:HH:00, bridge loop avoidance is off (unless the
config turns it on), the NIC MTU is the link's, bat0 gets the lab's mesh addresses, and
settings the kernel also has (orig_interval_ms, hop_penalty, aggregation, ...) are taken
from the node's [batmand] config.

A LAN NIC (topology `kernel = { lan = true }`, for bridge loop avoidance): one more NIC, not a
mesh interface, MAC 02:bc:HH:HH:HH:00, MTU 1500. In the guest it is bridged with bat0
(br0 = bat0 + that NIC, no STP, no forward delay, no multicast snooping); the lab's IPv4
address goes on br0 instead of bat0, and br0, bat0 and the NIC have IPv6 off from the
start, so the guest's host sends nothing it is not asked to (its start-up multicast would
otherwise be the first frame BLA sees). On the host it is the TAP `ktl` in a bridge `kbl`
of the node's namespace, with nothing else in it: the test plugs its LAN in there (a veth
to the LAN's namespace, made a port of kbl), as it plugs a batmand gateway's lan0 into br0:

    VM eth<n> (br0 port) ==virtio== ktl --[bridge kbl]-- (the test's veth to its LAN)

(An image built before LAN NICs existed ignores them: wait_ready() says so, rebuild it with
scripts/kernel-node-setup.sh.)

Commands run in the guest over a second serial port (a unix socket on the host, one command
at a time per VM) under busybox sh: `KernelVM.run(script)` returns the exit status, stdout
and stderr. Files of node N: <run_dir>/vm.json (what was started), vm.pid, ctl.sock,
ctl.lock; the lab's <lab_dir>/N.log (QEMU's own output) and N.console.log (the guest's
console: kernel messages and /init's progress).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import math
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import kernel_image, net

READY_RE = re.compile(r"BM-READY uptime=(\S+) problems=(\d+)")
BOOT_TIMEOUT = float(os.environ.get("BATMAND_KERNEL_NODE_BOOT_TIMEOUT", "90"))
MEMORY_MB = 256
VM_MEMORY_NEED_MB = 320  # host memory one VM takes (RSS ~ 280 MiB) plus some slack
DEFAULT_EXEC_TIMEOUT = 120.0
CHANNEL_GRACE = 15.0  # the host waits this much longer than the guest's own time limit
ACK_TIMEOUT = 3.0  # no "got" from the guest this long after a request: send it again
KERNEL_CMDLINE = "console=ttyS0 quiet panic=-1 mitigations=off rodata=off"

# [batmand] keys the kernel has too: key -> (batctl meshif setting, how to write the value)
_SETTINGS = {
    "orig_interval_ms": ("orig_interval", int),
    "hop_penalty": ("hop_penalty", int),
    "aggregation": ("aggregation", lambda v: int(bool(v))),
    "ap_isolation": ("ap_isolation", lambda v: int(bool(v))),
    "bonding": ("bonding", lambda v: int(bool(v))),
    "fragmentation": ("fragmentation", lambda v: int(bool(v))),
    "distributed_arp_table": ("distributed_arp_table", lambda v: int(bool(v))),
    "multicast_mode": ("multicast_forceflood", lambda v: int(not v)),
    "bridge_loop_avoidance": ("bridge_loop_avoidance", lambda v: int(bool(v))),
}
ALGOS = ("BATMAN_IV", "BATMAN_V")
HARDIF_SETTINGS = ("throughput_override", "elp_interval", "hop_penalty")  # batctl hardif IF SETTING VALUE


class KernelNodeError(RuntimeError):
    """A kernel node could not be started or reached; the message says why and where to look."""


# --- can they run here? ----------------------------------------------------------------------


def _mem_available_mb() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def kernel_nodes_available(count: int = 1) -> tuple[bool, str]:
    """Whether `count` kernel nodes can run on this machine, and why (not)."""
    if os.geteuid() != 0:
        return False, "kernel nodes need root (TAP devices, network namespaces)"
    if shutil.which(kernel_image.QEMU) is None:
        return False, f"{kernel_image.QEMU} is not installed (scripts/setup.sh installs qemu-system-x86)"
    if not os.path.exists("/dev/net/tun"):
        return False, "/dev/net/tun is missing (no TAP devices)"
    cache = kernel_image.cache_dir()
    image = kernel_image.load_image(cache)
    if image is None:
        why = ""
        with contextlib.suppress(OSError):
            why = (cache / "build-error.txt").read_text().strip()
        return False, (f"no kernel-node image in {cache} "
                       f"({'its build failed: ' + why if why else 'run scripts/kernel-node-setup.sh'})")
    accel = kernel_image.load_accel(cache)
    if accel is None:
        return False, f"QEMU was not probed yet ({cache}/accel.json missing): run scripts/kernel-node-setup.sh"
    if not accel.get("accel"):
        return False, f"QEMU cannot boot the guest here: KVM {accel.get('kvm')}; TCG {accel.get('tcg')}"
    need = count * VM_MEMORY_NEED_MB
    have = _mem_available_mb()
    if have < need:
        return False, f"{count} kernel node(s) need ~{need} MiB of memory, {have} MiB available"
    return True, (f"kernel {image.kernel_release}, batman-adv {image.batman_adv_version}, "
                  f"batctl {image.versions.get('batctl')}, QEMU {accel['accel'].upper()}")


# --- configuration ------------------------------------------------------------------------------


def node_macs(host: int, nics: int) -> tuple[list[str], str]:
    """(NIC MACs, bat0 MAC) of the kernel node with this host number: 02:ba:HH:HH:HH:0i and
    02:bb:HH:HH:HH:00, so node 3's originator address is 02:ba:00:00:03:01."""
    if not 0 < host < 1 << 24:
        raise KernelNodeError(f"host number {host} does not fit a MAC address")
    mid = ":".join(f"{b:02x}" for b in host.to_bytes(3, "big"))
    return [f"02:ba:{mid}:{i + 1:02x}" for i in range(nics)], f"02:bb:{mid}:00"


def lan_mac(host: int) -> str:
    """The LAN NIC's MAC of the kernel node with this host number: 02:bc:HH:HH:HH:00."""
    return "02:bc" + node_macs(host, 0)[1][5:]


def mesh_settings(config: dict) -> tuple[str, list[tuple[str, str]], list[str]]:
    """From a node's batmand config: (routing algorithm, batctl meshif settings, keys the
    kernel node ignores). Bridge loop avoidance is off unless the config turns it on: the
    kernel's default (on) holds back broadcasts for the first ~30 s."""
    algo = str(config.get("routing_algo", "BATMAN_IV")).upper()
    if algo not in ALGOS:
        raise KernelNodeError(f"routing_algo must be one of {', '.join(ALGOS)}, got {algo!r}")
    settings = {"bridge_loop_avoidance": "0"}
    ignored = []
    for key, value in config.items():
        if key in ("routing_algo", "hardif"):
            continue
        if key in _SETTINGS:
            name, conv = _SETTINGS[key]
            settings[key] = str(conv(value))
        else:
            ignored.append(key)
    return algo, [(_SETTINGS[k][0], v) for k, v in settings.items()], ignored


def kbit(value) -> int:
    """A throughput as batmand reads it (a number is kbit/s; "100mbit", "1.5gbit", "800kbit")."""
    text = str(value).strip().lower()
    for unit, factor in (("gbit", 1_000_000), ("mbit", 1000), ("kbit", 1)):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(float(text))


def hardif_settings(config: dict, nic_ifnames: list[str]) -> list[tuple[int, str, str]]:
    """The config's per-hard-interface settings ([hardif.<ifname>] throughput_override,
    elp_interval, hop_penalty), for the guest NIC that stands for each host-side interface
    name: [(NIC index, setting, value)]."""
    out = []
    for ifname, table in (config.get("hardif") or {}).items():
        if ifname not in nic_ifnames or not isinstance(table, dict):
            continue
        for key, value in table.items():
            if key not in HARDIF_SETTINGS:
                raise KernelNodeError(f"hardif.{ifname}: a kernel node has no setting {key!r}")
            text = f"{kbit(value)}kbit" if key == "throughput_override" else str(int(value))
            out.append((nic_ifnames.index(ifname), key, text))
    return out


@dataclass
class Nic:
    tap: str  # the TAP in the node's namespace
    mac: str
    mtu: int


@dataclass
class KernelNodeConfig:
    name: str
    netns: str
    run_dir: str  # vm.json, vm.pid, ctl.sock, ctl.lock
    log: str  # QEMU's stdout/stderr
    console: str  # the guest's ttyS0
    nics: list[Nic]
    mesh_mac: str
    lan: Nic | None = None  # the LAN NIC (bridged with bat0 in the guest), if any
    ipv4: str | None = None  # "10.77.0.2/24" on bat0 (on br0 with a LAN NIC)
    ipv6: str | None = None
    algo: str = "BATMAN_IV"
    settings: list[tuple[str, str]] = field(default_factory=list)  # batctl meshif bat0 SETTING VALUE
    hardif: list[tuple[int, str, str]] = field(default_factory=list)  # batctl hardif <NIC i> SETTING VALUE
    setup: str = ""  # shell commands run in the guest once bat0 is up
    memory_mb: int = MEMORY_MB
    accel: str | None = None  # None: what the probe found

    def guest_config(self) -> str:
        """The shell fragment /init sources (passed base64 on the kernel command line)."""
        values = {
            "NODE": self.name, "ALGO": self.algo,
            "NICS": " ".join(f"{n.mac}/{n.mtu}" for n in self.nics),
            "MESH_MAC": self.mesh_mac, "LAN_NIC": f"{self.lan.mac}/{self.lan.mtu}" if self.lan else "",
            "ADDR4": self.ipv4 or "", "ADDR6": self.ipv6 or "",
            "MESH_SETTINGS": "\n".join(f"{k} {v}" for k, v in self.settings),
            "HARDIF_SETTINGS": "\n".join(f"{i} {k} {v}" for i, k, v in self.hardif),
            "SETUP": self.setup,
        }
        return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())

    @classmethod
    def from_dict(cls, data: dict) -> "KernelNodeConfig":
        data = dict(data)
        data["nics"] = [Nic(**n) for n in data["nics"]]
        data["lan"] = Nic(**data["lan"]) if data.get("lan") else None
        data["settings"] = [tuple(s) for s in data.get("settings", [])]
        data["hardif"] = [tuple(s) for s in data.get("hardif", [])]
        return cls(**data)


# --- plumbing in the node's namespace --------------------------------------------------------------


def _sysctl_in(ns: str, assignments: dict[str, str]) -> None:
    script = "".join(f"echo {v} > /proc/sys/{k.replace('.', '/')}\n" for k, v in assignments.items())
    proc = subprocess.run(net.in_namespace(ns, ["sh", "-c", script]), capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelNodeError(f"{ns}: sysctl failed: {proc.stderr.strip()}")


def plumb(ns: str, links: list[tuple[str | None, str, str, int]]) -> None:
    """For each (veth, tap, bridge, mtu): a persistent TAP and a bridge joining it to the
    veth (veth None: the bridge holds the TAP alone, for a test to add a port). Nothing of
    it speaks itself: IPv6 is off on all three, the bridge has no STP and no multicast
    snooping (it floods, as a radio would)."""
    # new interfaces in this namespace (TAPs, bridges) start with IPv6 off
    _sysctl_in(ns, {"net.ipv6.conf.default.disable_ipv6": "1",
                    **{f"net.ipv6.conf.{veth}.disable_ipv6": "1" for veth, _, _, _ in links if veth}})
    for veth, tap, bridge, mtu in links:
        proc = subprocess.run(["ip", "-n", ns, "tuntap", "add", "dev", tap, "mode", "tap"], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise KernelNodeError(f"{ns}: cannot create TAP {tap}: {proc.stderr.strip()}")
        with net.ipr(ns) as ip:
            ip.link("add", ifname=bridge, kind="bridge", br_stp_state=0, br_mcast_snooping=0, br_forward_delay=0,
                    mtu=mtu)
            br = ip.link_lookup(ifname=bridge)[0]
            tap_index = ip.link_lookup(ifname=tap)[0]
            ip.link("set", index=tap_index, mtu=mtu, master=br)
            if veth:
                ip.link("set", index=ip.link_lookup(ifname=veth)[0], master=br)
            ip.link("set", index=tap_index, state="up")
            ip.link("set", index=br, state="up")


def delete_taps(ns: str, taps: list[str]) -> None:
    for tap in taps:
        with contextlib.suppress(Exception), net.ipr(ns) as ip:
            found = ip.link_lookup(ifname=tap)
            if found:
                ip.link("del", index=found[0])


# --- the VM ----------------------------------------------------------------------------------------


def _pid_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _rss_kib(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _tail(path: str | Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no file)"
    return "\n".join(text[-lines:]) or "(empty)"


@dataclass
class GuestResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    seconds: float = 0.0


class KernelVM:
    """One kernel node's VM. `boot()` starts QEMU and returns; `wait_ready()` waits for
    /init's READY line; `run()` executes a shell script in the guest; `stop()` ends it."""

    def __init__(self, config: KernelNodeConfig, image: kernel_image.Image | None = None) -> None:
        self.config = config
        self.run_dir = Path(config.run_dir)
        self._image = image
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.started: float | None = None  # wall clock
        self.boot_seconds: float | None = None
        self.guest_uptime: float | None = None

    # --- files
    @property
    def socket_path(self) -> str:
        return str(self.run_dir / "ctl.sock")

    @property
    def pid_path(self) -> Path:
        return self.run_dir / "vm.pid"

    @property
    def state_path(self) -> Path:
        return self.run_dir / "vm.json"

    def image(self) -> kernel_image.Image:
        if self._image is None:
            self._image = kernel_image.load_image()
            if self._image is None:
                raise KernelNodeError(f"no kernel-node image in {kernel_image.cache_dir()}: "
                                      "run scripts/kernel-node-setup.sh")
        return self._image

    def qemu_command(self) -> list[str]:
        c = self.config
        image = self.image()
        accel = c.accel or (kernel_image.load_accel(image.cache) or {}).get("accel") or "tcg"
        conf = base64.b64encode(c.guest_config().encode()).decode()
        append = f"{KERNEL_CMDLINE} bm.conf={conf}"
        if len(append) > 2000:
            raise KernelNodeError(f"{c.name}: guest configuration too long for the kernel command line "
                                  f"({len(append)} characters; shorten the setup commands)")
        argv = [kernel_image.QEMU, "-name", c.name, "-M", "pc", *kernel_image.accel_args(accel),
                "-m", str(c.memory_mb), "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
                "-no-reboot", "-pidfile", str(self.pid_path),
                "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", append,
                "-chardev", f"file,id=console,path={c.console}", "-serial", "chardev:console",
                "-chardev", f"socket,id=channel,path={self.socket_path},server=on,wait=off",
                "-serial", "chardev:channel"]
        for i, nic in enumerate([*c.nics, *([c.lan] if c.lan else [])]):
            argv += ["-netdev", f"tap,id=nic{i},ifname={nic.tap},script=no,downscript=no,vnet_hdr=off",
                     "-device", f"virtio-net-pci,netdev=nic{i},mac={nic.mac},romfile="]
        return argv

    def boot(self) -> None:
        """Start QEMU in the node's namespace; returns at once (wait_ready waits)."""
        if self.alive():
            raise KernelNodeError(f"{self.config.name}: the VM already runs (pid {self.pid})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in (self.pid_path, Path(self.socket_path), Path(self.config.console)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        argv = self.qemu_command()
        with open(self.config.log, "ab") as log:
            log.write(f"--- lab: {shlex.join(net.in_namespace(self.config.netns, argv))}\n".encode())
            log.flush()
            self.started = time.time()
            self.proc = subprocess.Popen(net.in_namespace(self.config.netns, argv), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pid = self.proc.pid  # `ip netns exec` execs QEMU: same process
        self.boot_seconds = self.guest_uptime = None
        self.save()

    def save(self) -> None:
        state = {"config": asdict(self.config), "pid": self.pid, "started": self.started,
                 "boot_seconds": self.boot_seconds, "guest_uptime": self.guest_uptime}
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_path)

    @classmethod
    def attach(cls, run_dir: str | Path) -> "KernelVM | None":
        """The VM whose files are in run_dir (started by another process), or None."""
        try:
            state = json.loads((Path(run_dir) / "vm.json").read_text())
        except (OSError, ValueError):
            return None
        vm = cls(KernelNodeConfig.from_dict(state["config"]))
        vm.pid = state.get("pid")
        vm.started = state.get("started")
        vm.boot_seconds = state.get("boot_seconds")
        vm.guest_uptime = state.get("guest_uptime")
        return vm

    def alive(self) -> bool:
        """QEMU runs and is ours (its command line names our channel socket)."""
        if self.pid is None:
            return False
        if self.proc is not None and self.proc.poll() is not None:
            return False
        return net.pid_alive(self.pid) and self.socket_path in _pid_cmdline(self.pid)

    def rss_kib(self) -> int | None:
        return _rss_kib(self.pid) if self.alive() else None

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> float:
        """Wait for the guest's READY line; returns the boot time in seconds (QEMU start to
        ready). Raises KernelNodeError when QEMU exits, the guest reports problems, or time
        runs out."""
        c = self.config
        deadline = time.monotonic() + timeout
        while True:
            text = ""
            with contextlib.suppress(OSError):
                text = Path(c.console).read_text(errors="replace")
            m = READY_RE.search(text)
            if m:
                if self.boot_seconds is None:
                    self.boot_seconds = round(time.time() - (self.started or time.time()), 2)
                    self.guest_uptime = float(m.group(1))
                    self.save()
                if int(m.group(2)):
                    problems = "\n".join(line for line in text.splitlines() if "PROBLEM" in line)
                    raise KernelNodeError(f"{c.name}: the guest reported problems while setting up:\n{problems}\n"
                                          f"(console: {c.console})")
                if c.lan and "LAN: br0 = bat0 + " not in text:
                    raise KernelNodeError(f"{c.name}: the guest made no br0 for its LAN NIC: the image's /init "
                                          "predates LAN NICs (rebuild it: scripts/kernel-node-setup.sh)")
                return self.boot_seconds
            if not self.alive():
                status = f" with status {self.proc.returncode}" if self.proc is not None and \
                    self.proc.poll() is not None else ""
                raise KernelNodeError(f"{c.name}: QEMU exited{status} before the guest was ready\n"
                                      f"--- {c.log}:\n{_tail(c.log)}\n--- {c.console}:\n{_tail(c.console)}")
            if time.monotonic() > deadline:
                raise KernelNodeError(f"{c.name}: the guest was not ready after {timeout:g}s\n"
                                      f"--- {c.console}:\n{_tail(c.console)}")
            time.sleep(0.05)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM QEMU (SIGKILL after timeout). The TAPs stay: they belong to the lab's
        wiring, and a new boot() attaches to them again."""
        if self.alive():
            net.terminate([self.pid], timeout)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=1)
        for stale in (self.pid_path, Path(self.socket_path), self.run_dir / "ctl.lock"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        self.pid = None
        self.proc = None
        if self.state_path.exists():
            self.save()

    # --- the command channel
    def run(self, script: str, timeout: float | None = None, stdin: bytes | None = None) -> GuestResult:
        """Run a shell script (busybox sh) in the guest. The guest kills it after `timeout`
        seconds (then timed_out is set); stdout and stderr come back as bytes."""
        c = self.config
        if not self.alive():
            raise KernelNodeError(f"{c.name}: the VM is not running")
        limit = max(1, math.ceil(timeout if timeout is not None else DEFAULT_EXEC_TIMEOUT))
        req = secrets.token_hex(4)
        payload = base64.b64encode(script.encode()).decode()
        data = base64.b64encode(stdin).decode() if stdin else "-"
        t0 = time.monotonic()
        deadline = t0 + limit + CHANNEL_GRACE
        with open(self.run_dir / "ctl.lock", "w") as lock:
            while True:  # one command at a time per VM, also across processes
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise KernelNodeError(f"{c.name}: the command channel stayed busy") from None
                    time.sleep(0.02)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                try:
                    sock.connect(self.socket_path)
                except OSError as exc:
                    raise KernelNodeError(f"{c.name}: cannot connect to {self.socket_path}: {exc}") from None
                # a newline first ends whatever an aborted client may have left half-written
                request = f"\nRUN {req} {limit} {payload} {data}\n".encode()
                sock.sendall(request)
                return self._read_answer(sock, req, request, deadline, t0)

    def _read_answer(self, sock: socket.socket, req: str, request: bytes, deadline: float, t0: float) -> GuestResult:
        out: list[str] = []
        err: list[str] = []
        section = None
        buf = b""
        acked = False
        resend_at = time.monotonic() + ACK_TIMEOUT
        while True:
            now = time.monotonic()
            if now >= deadline:
                return GuestResult(-1, "".join(out).encode(), b"guest did not answer in time\n", True, now - t0)
            if not acked and now >= resend_at:
                # no "got" yet: the guest is busy with an abandoned command, or the request
                # was lost; sending it again is safe (the guest runs an ID only once)
                sock.sendall(request)
                resend_at = now + ACK_TIMEOUT
                with contextlib.suppress(OSError), open(self.config.log, "a") as log:
                    log.write(f"--- lab: no acknowledgement of request {req} after {now - t0:.1f}s, sent again\n")
            sock.settimeout(max(0.05, min(deadline - now, resend_at - now if not acked else 1.0)))
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                raise KernelNodeError(f"{self.config.name}: the command channel closed (did the VM stop?)")
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace").strip("\r")
                if line.startswith("@@"):
                    words = line[2:].split()
                    if len(words) < 2 or words[0] != req:
                        section = None  # the answer to some earlier, abandoned request
                    elif words[1] == "got":
                        acked = True
                    elif words[1] == "out":
                        section = out
                    elif words[1] == "err":
                        section = err
                    elif words[1] == "end":
                        return GuestResult(int(words[2]), base64.b64decode("".join(out)),
                                           base64.b64decode("".join(err)), len(words) > 3 and words[3] == "timeout",
                                           time.monotonic() - t0)
                elif section is not None:
                    section.append(line)

    def exec(self, argv: list[str], timeout: float | None = None, stdin: bytes | None = None) -> GuestResult:
        """Run one command (its words are shell-quoted)."""
        return self.run(shlex.join(argv), timeout, stdin)


class GuestJob:
    """A command running in the background in a guest (what Lab.spawn returns for a kernel
    node), shaped like subprocess.Popen: poll(), wait(timeout), communicate(timeout),
    terminate(), kill(), returncode. It runs in its own session (setsid), so kill() ends
    its children too; its output goes to files in the guest's /run/bm."""

    def __init__(self, vm: KernelVM, argv: list[str]) -> None:
        self.vm = vm
        self.args = argv
        self.returncode: int | None = None
        self.dir = f"/run/bm/job.{secrets.token_hex(4)}"
        body = f"{shlex.join(argv)}; echo $? > {self.dir}/status"
        res = vm.run(f"mkdir -p {self.dir}\nsetsid sh -c {shlex.quote(body)} > {self.dir}/out 2> {self.dir}/err "
                     f"< /dev/null &\necho $!", 15)
        try:
            self.pid = int(res.stdout.split()[-1])
        except (IndexError, ValueError):
            raise KernelNodeError(f"{vm.config.name}: could not start {shlex.join(argv)}: "
                                  f"{res.stderr.decode(errors='replace')}") from None

    def poll(self) -> int | None:
        if self.returncode is None:
            res = self.vm.run(f"cat {self.dir}/status 2>/dev/null && exit\n"
                              f"[ -r /proc/{self.pid}/stat ] && ! grep -q ') [ZX] ' /proc/{self.pid}/stat && exit\n"
                              "echo gone", 15)
            word = res.stdout.decode().strip()
            if word == "gone":
                self.returncode = -signal.SIGKILL  # ended without a status: killed
            elif word:
                self.returncode = int(word)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.2)
        return self.returncode

    def output(self) -> tuple[str, str]:
        """stdout and stderr so far."""
        out = self.vm.run(f"cat {self.dir}/out", 60).stdout.decode(errors="replace")
        err = self.vm.run(f"cat {self.dir}/err", 60).stdout.decode(errors="replace")
        return out, err

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.output()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            self.vm.run(f"kill -{int(sig)} -{self.pid} 2>/dev/null || kill -{int(sig)} {self.pid} 2>/dev/null", 15)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# --- clean-up by lab ------------------------------------------------------------------------------


def stop_all(run_dir: str | Path, timeout: float = 3.0) -> list[int]:
    """Stop every VM recorded under a lab's run directory (<run_root>/<prefix>/*/vm.json),
    by its recorded PID and only if that process is still our QEMU. Returns the PIDs."""
    vms = [vm for d in sorted(Path(run_dir).glob("*/")) if (vm := KernelVM.attach(d)) is not None and vm.alive()]
    pids = [vm.pid for vm in vms]
    net.terminate(pids, timeout)
    return pids
