"""DHCP for the gateway tests: a server on an interface of a node (dnsmasq in a host
namespace, busybox udhcpd in a kernel node's guest), a client that returns the lease it got
(busybox udhcpc, on the host or in the guest), and a capture that counts the batman-adv
frames a link carries by packet type, so that a test can tell how the DHCP crossed the mesh.

Servers and captures are context managers that stop what they started (by PID) on exit,
also when the test fails; a client that gets no lease raises DhcpTimeout with its output."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import re
import select
import shlex
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from batmand.wire import ETH_P_BATMAN, PacketType, WireError, decode_frame
from tests.daemon.daemons import stop as stop_process
from tests.netns import entered, in_netns

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
DHCP_SERVER_PORTS = (67, 547)  # IPv4, IPv6: what the kernel's gateway code calls DHCP_TO_SERVER
DHCP_CLIENT_PORTS = (68, 546)
_ids = itertools.count()

# udhcpc's event script: print the lease on one line and configure nothing, so that a test
# can take leases on an interface that keeps its lab addresses
UDHCPC_SCRIPT = """#!/bin/sh
case "$1" in
    bound|renew) echo "LEASE ip=$ip serverid=$serverid subnet=$subnet router=$router lease=$lease" ;;
esac
exit 0
"""
_LEASE_RE = re.compile(r"^LEASE ip=(\S*) serverid=(\S*) subnet=(\S*) router=(\S*) lease=(\S*)$", re.M)


class DhcpError(AssertionError):
    """A DHCP server that would not start, or a client that got no lease."""


class DhcpTimeout(DhcpError):
    """The client sent its discovers and got no lease."""


@dataclass(frozen=True)
class Lease:
    ip: str
    server_id: str  # the DHCP server identifier (option 54): which server gave it
    subnet: str
    router: str
    lease_s: int | None
    output: str = field(default="", compare=False, repr=False)  # the client's stdout and stderr


def _parse_lease(out: str, where: str) -> Lease:
    m = _LEASE_RE.search(out)
    if not m:
        raise DhcpTimeout(f"{where}: no DHCP lease; udhcpc said:\n{out.strip() or '(nothing)'}")
    return Lease(m[1], m[2], m[3], m[4], int(m[5]) if m[5].isdigit() else None, out)


def udhcpc_argv(ifname: str, script: str, tries: int, timeout_s: int, broadcast: bool) -> list[str]:
    """busybox udhcpc in the foreground (-f), once: exit with the lease (-q) or without (-n)
    after `tries` discovers `timeout_s` apart."""
    return ["udhcpc", "-i", ifname, "-s", script, "-n", "-q", "-f", "-t", str(tries), "-T", str(timeout_s),
            *(["-B"] if broadcast else [])]


def _await_listening(server, exited, what: str, timeout: float, step: float) -> None:
    """Until `server` listens on UDP 67; DhcpError when it exited first (exited() says how)
    or does not listen within `timeout` (it is stopped then)."""
    deadline = time.monotonic() + timeout
    while not server.listening():
        how = exited()
        if how is not None:
            raise DhcpError(f"{what} exited with {how}")
        if time.monotonic() > deadline:
            server.stop()
            raise DhcpError(f"{what} does not listen on UDP 67 after {timeout:g} s")
        time.sleep(step)


# --- on the host: dnsmasq and udhcpc in a namespace ------------------------------------------------


class Dnsmasq:
    """dnsmasq as a DHCP server only, in the foreground in a namespace; its files in workdir."""

    def __init__(self, ns: str, ifname: str, first: str, last: str, workdir: Path, *,
                 netmask: str = "255.255.255.0", lease_time: str = "2m", name: str | None = None) -> None:
        self.ns, self.ifname, self.first, self.last = ns, ifname, first, last
        name = name or f"dnsmasq-{next(_ids)}"
        self.dir = Path(workdir)
        self.leasefile = self.dir / f"{name}.leases"
        self.pidfile = self.dir / f"{name}.pid"
        self.log = self.dir / f"{name}.log"  # dnsmasq's own log (--log-dhcp: every message)
        self.output = self.dir / f"{name}.out"  # its stdout and stderr (start-up errors)
        self.argv = [
            DNSMASQ, "--keep-in-foreground", "--conf-file=/dev/null", "--port=0",  # no DNS
            "--no-resolv", "--no-hosts", f"--interface={ifname}", "--bind-interfaces",
            f"--dhcp-range={first},{last},{netmask},{lease_time}", "--dhcp-authoritative",
            "--no-ping",  # no ICMP probe of an address before offering it: it holds the offer ~3 s
            f"--dhcp-leasefile={self.leasefile}", f"--pid-file={self.pidfile}",
            f"--log-facility={self.log}", "--log-dhcp",
            "--user=root", "--group=root",  # the per-test directory is root's: no change of user
        ]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "Dnsmasq":
        self.dir.mkdir(parents=True, exist_ok=True)
        self.leasefile.touch()
        with open(self.output, "w") as out:
            # `ip netns exec` execs in place: the Popen's pid is dnsmasq's own
            self.proc = subprocess.Popen(in_netns(self.ns, self.argv), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)
        def exited():
            if self.proc.poll() is None:
                return None
            return f"{self.proc.returncode}: {self.output.read_text().strip()} {self._log_text().strip()}"
        _await_listening(self, exited, f"dnsmasq in {self.ns}", timeout, 0.05)
        return self

    def listening(self) -> bool:
        out = subprocess.run(in_netns(self.ns, ["ss", "-Hnlu", "sport", "=", ":67"]), capture_output=True, text=True)
        return bool(out.stdout.strip())

    def stop(self, timeout: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_process(proc, timeout)

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def messages(self, kind: str = "") -> list[str]:
        """The DHCP messages it logged ("DHCPDISCOVER(bat0) 02:..."), those of one kind if
        given (DISCOVER, OFFER, REQUEST, ACK ...)."""
        lines = re.findall(r"\b(DHCP[A-Z]+(?:\([^)]*\))?\s.*)$", self._log_text(), re.M)
        return [line for line in lines if line.startswith("DHCP" + kind)]

    def leases(self) -> dict[str, str]:
        """MAC -> IP of the leases it handed out (its lease file: expiry MAC IP name client-id)."""
        out = {}
        for line in self.leasefile.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and ":" in parts[1]:
                out[parts[1]] = parts[2]
        return out

    def __enter__(self) -> "Dnsmasq":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def dnsmasq(ns: str, ifname: str, first: str, last: str, workdir: Path, **kwargs) -> Dnsmasq:
    """A DHCP server handing out first..last on ifname in ns; use as `with dnsmasq(...) as s:`."""
    return Dnsmasq(ns, ifname, first, last, workdir, **kwargs)


def udhcpc(ns: str, ifname: str, workdir: Path, *, tries: int = 5, timeout_s: int = 1,
           broadcast: bool = False) -> Lease:
    """One DHCP exchange on ifname in ns (busybox udhcpc); the lease, or DhcpTimeout."""
    script = Path(workdir) / "udhcpc.script"
    if not script.exists():
        script.write_text(UDHCPC_SCRIPT)
        script.chmod(0o755)
    argv = [BUSYBOX, *udhcpc_argv(ifname, str(script), tries, timeout_s, broadcast)]
    try:
        proc = subprocess.run(in_netns(ns, argv), capture_output=True, text=True, timeout=tries * timeout_s + 15)
    except subprocess.TimeoutExpired as exc:  # it ends itself after its tries: this is a hang
        raise DhcpTimeout(f"{ns}: udhcpc on {ifname} did not end: {exc.stdout!r} {exc.stderr!r}") from None
    return _parse_lease(proc.stdout + proc.stderr, f"{ns}: udhcpc on {ifname} ({tries} tries)")


# --- in a kernel node's guest: udhcpd and udhcpc (busybox applets of the image) -------------------


class GuestUdhcpd:
    """busybox udhcpd in the foreground in a kernel node's guest (a lab GuestJob), its
    config and lease file in the guest's /tmp. The server id is the interface's address."""

    def __init__(self, lab, node: str, ifname: str, first: str, last: str, *,
                 netmask: str = "255.255.255.0", lease_s: int = 120) -> None:
        self.lab, self.node, self.ifname, self.first, self.last = lab, node, ifname, first, last
        base = f"/tmp/udhcpd-{next(_ids)}"
        self.conf, self.leasefile, self.pidfile = f"{base}.conf", f"{base}.leases", f"{base}.pid"
        self.config = "\n".join([
            f"start {first}", f"end {last}", f"interface {ifname}", f"lease_file {self.leasefile}",
            f"pidfile {self.pidfile}", "auto_time 1",  # leases written every second (dumpleases reads them)
            f"option subnet {netmask}", f"option lease {lease_s}", "max_leases 50", "",
        ])
        self.job = None

    def start(self, timeout: float = 10.0) -> "GuestUdhcpd":
        self.lab.shell(self.node, f"cat > {self.conf} <<'EOF'\n{self.config}EOF\ntouch {self.leasefile}", check=True)
        # -a 100: a short ARP probe of an address before offering it (the default waits 2 s)
        self.job = self.lab.spawn(self.node, ["udhcpd", "-f", "-a", "100", self.conf])
        def exited():
            if self.job.poll() is None:
                return None
            out, err = self.job.output()
            return f"{self.job.returncode}: {out}{err}"
        _await_listening(self, exited, f"udhcpd in {self.node}", timeout, 0.2)
        return self

    def listening(self) -> bool:
        out = self.lab.exec(self.node, ["netstat", "-lnu"]).stdout
        return bool(re.search(r":67\s", out))

    def stop(self) -> None:
        job, self.job = self.job, None
        if job is not None and job.poll() is None:
            job.kill()

    def output(self) -> str:
        """What udhcpd printed so far."""
        if self.job is None:
            return ""
        out, err = self.job.output()
        return out + err

    def leases(self) -> dict[str, str]:
        """MAC -> IP (busybox dumpleases)."""
        out = self.lab.exec(self.node, ["dumpleases", "-f", self.leasefile]).stdout
        return {m[1]: m[2] for m in re.finditer(r"^([0-9a-f:]{17})\s+(\d+\.\d+\.\d+\.\d+)", out, re.M)}

    def __enter__(self) -> "GuestUdhcpd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def guest_udhcpc(lab, node: str, ifname: str, *, tries: int = 5, timeout_s: int = 1,
                 broadcast: bool = False) -> Lease:
    """One DHCP exchange in a kernel node's guest; the lease, or DhcpTimeout."""
    script = "/tmp/udhcpc.script"
    lab.shell(node, f"cat > {script} <<'EOF'\n{UDHCPC_SCRIPT}EOF\nchmod 755 {script}", check=True)
    argv = udhcpc_argv(ifname, script, tries, timeout_s, broadcast)
    # the guest enforces the time limit; udhcpc ends itself after its tries
    proc = lab.shell(node, shlex.join(argv) + " 2>&1", timeout=tries * timeout_s + 15)
    return _parse_lease(proc.stdout + proc.stderr, f"{node}: udhcpc on {ifname} ({tries} tries)")


# --- either kind of lab node -------------------------------------------------------------------------


def dhcp_server(lab, node: str, first: str, last: str, workdir: Path, ifname: str = "bat0"):
    """A DHCP server for first..last on a lab node's interface: dnsmasq on a batmand node,
    udhcpd in a kernel node's guest. A context manager."""
    if lab.is_kernel(node):
        return GuestUdhcpd(lab, node, ifname, first, last)
    return Dnsmasq(lab.ns(node), ifname, first, last, workdir, name=f"dnsmasq-{node}-{next(_ids)}")


def dhcp_lease(lab, node: str, workdir: Path, ifname: str = "bat0", **kwargs) -> Lease:
    """A lease taken on a lab node's interface (udhcpc on the host or in the guest)."""
    if lab.is_kernel(node):
        return guest_udhcpc(lab, node, ifname, **kwargs)
    return udhcpc(lab.ns(node), ifname, workdir, **kwargs)


# --- what the links carry ------------------------------------------------------------------------------

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
# classic BPF: ldh [12]; jeq #ETH_P_BATMAN, accept, drop (no VLAN tag on a hard interface)
_BATMAN_ONLY = [(0x28, 0, 0, 12), (0x15, 0, 1, ETH_P_BATMAN), (0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)]


@dataclass
class Captured:
    """One batman-adv frame seen on a hard interface."""

    ifname: str
    outgoing: bool  # sent by this namespace (else received)
    packet_type: int  # of its first packet (a raw byte when it did not decode)
    packet: object | None  # the decoded first packet (Unicast4Addr has dest, src, subtype)
    inner_proto: int | None = None  # the ethertype of the inner frame, if any
    udp: tuple[int, int] | None = None  # (source port, destination port) of an inner IP UDP datagram

    @property
    def dhcp_to_server(self) -> bool:
        return self.udp is not None and self.udp[1] in DHCP_SERVER_PORTS

    @property
    def dhcp_to_client(self) -> bool:
        return self.udp is not None and self.udp[0] in DHCP_SERVER_PORTS

    @property
    def dhcp(self) -> bool:
        return self.dhcp_to_server or self.dhcp_to_client


def inner_udp(h_proto: int, payload: bytes) -> tuple[int, int] | None:
    """(sport, dport) of a UDP datagram in an IPv4 or IPv6 packet (no extension headers)."""
    if h_proto == 0x0800 and len(payload) >= 20 and payload[0] >> 4 == 4 and payload[9] == 17:
        off = (payload[0] & 0xF) * 4
    elif h_proto == 0x86DD and len(payload) >= 40 and payload[0] >> 4 == 6 and payload[6] == 17:
        off = 40
    else:
        return None
    if len(payload) < off + 4:
        return None
    return struct.unpack_from("!HH", payload, off)


def _classify(ifname: str, outgoing: bool, raw: bytes) -> Captured:
    try:
        frame = decode_frame(raw)
    except WireError:
        return Captured(ifname, outgoing, raw[14] if len(raw) > 14 else -1, None)
    packet = frame.packets[0] if frame.packets else None
    ptype = packet.packet_type if packet is not None else (raw[14] if len(raw) > 14 else -1)
    inner = frame.inner
    if inner is None:
        return Captured(ifname, outgoing, ptype, packet)
    return Captured(ifname, outgoing, ptype, packet, inner.h_proto, inner_udp(inner.h_proto, inner.payload))


class BatmanCapture:
    """The batman-adv frames (ethertype 0x4305) on interfaces of a namespace, both
    directions, while the block runs: an ETH_P_ALL packet socket per interface (a socket
    bound to the ethertype would miss outgoing frames), a BPF filter that passes only
    batman-adv, and a thread that decodes what arrives."""

    def __init__(self, ns: str, ifnames: list[str]) -> None:
        self.ns, self.ifnames = ns, list(ifnames)
        self.frames: list[Captured] = []
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._socks: dict[socket.socket, str] = {}
        self._thread: threading.Thread | None = None
        code = b"".join(struct.pack("HBBI", *insn) for insn in _BATMAN_ONLY)
        self._filter = ctypes.create_string_buffer(code)  # kept alive while the sockets are

    def start(self) -> "BatmanCapture":
        prog = struct.pack("HL", len(_BATMAN_ONLY), ctypes.addressof(self._filter))
        with entered(self.ns):  # sockets made here stay in the namespace
            for ifname in self.ifnames:
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
                sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
                sock.bind((ifname, ETH_P_ALL))
                sock.setblocking(False)
                self._socks[sock] = ifname
        self._thread = threading.Thread(target=self._run, name=f"capture-{self.ns}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.is_set():
            ready, _, _ = select.select(list(self._socks), [], [], 0.05)
            for sock in ready:
                self._drain(sock)

    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                raw, addr = sock.recvfrom(65535)
            except BlockingIOError:
                return
            except OSError:  # the interface went away (a link set down is not this)
                return
            captured = _classify(self._socks[sock], addr[2] == PACKET_OUTGOING, raw)
            with self._lock:
                self.frames.append(captured)

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for sock in self._socks:
            with contextlib.suppress(OSError):
                self._drain(sock)  # what arrived after the last select
            sock.close()
        self._socks.clear()

    def __enter__(self) -> "BatmanCapture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- reading it ----------------------------------------------------------------------------

    def select(self, *, ifname: str | None = None, outgoing: bool | None = None, packet_type: int | None = None,
               dhcp: bool | None = None) -> list[Captured]:
        with self._lock:
            frames = list(self.frames)
        return [f for f in frames
                if (ifname is None or f.ifname == ifname) and (outgoing is None or f.outgoing == outgoing)
                and (packet_type is None or f.packet_type == packet_type) and (dhcp is None or f.dhcp == dhcp)]

    def counts(self, **criteria) -> Counter:
        """Frames by packet type (PacketType members where known), of those matching."""
        out: Counter = Counter()
        for f in self.select(**criteria):
            try:
                out[PacketType(f.packet_type)] += 1
            except ValueError:
                out[f.packet_type] += 1
        return out

    def dhcp_summary(self) -> str:
        """One line per frame that carried DHCP, for assertion messages."""
        lines = []
        for f in self.select(dhcp=True):
            try:
                name = PacketType(f.packet_type).name
            except ValueError:
                name = hex(f.packet_type)
            dest = getattr(f.packet, "dest", None)
            lines.append(f"{f.ifname} {'out' if f.outgoing else 'in'} {name} udp {f.udp}"
                         + (f" dest {dest}" if dest is not None else ""))
        return "\n".join(lines) or "(no DHCP frames)"


def capture(ns: str, ifnames: list[str]) -> BatmanCapture:
    """`with capture(ns, ["e-g1"]) as cap:` ... `cap.counts(outgoing=True, dhcp=True)`."""
    return BatmanCapture(ns, ifnames)


def send_raw(ns: str, ifname: str, frame: bytes) -> None:
    """One Ethernet frame sent from ifname in ns, as the host stack would send it."""
    with entered(ns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
    with sock:
        sock.bind((ifname, 0))
        sock.send(frame)


def dhcpv4_discover(src_mac: str, xid: int = 0x1234) -> bytes:
    """A broadcast DHCPDISCOVER from src_mac (0.0.0.0:68 -> 255.255.255.255:67), as a frame."""
    mac = bytes.fromhex(src_mac.replace(":", ""))
    bootp = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, 0, xid, 0, 0x8000, bytes(4), bytes(4), bytes(4),
                        bytes(4), mac.ljust(16, b"\0"), bytes(64), bytes(128))
    bootp += bytes([99, 130, 83, 99, 53, 1, 1, 255])  # magic cookie, DHCP message type DISCOVER, end
    udp = struct.pack("!HHHH", 68, 67, 8 + len(bootp), 0) + bootp
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, bytes(4), b"\xff" * 4)
    ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
    return b"\xff" * 6 + mac + b"\x08\x00" + ip + udp


def dhcpv6_solicit(src_mac: str, xid: int = 0x123456) -> bytes:
    """A DHCPv6 SOLICIT from src_mac's link-local address to ff02::1:2 port 547, as a frame
    (the UDP checksum is left 0: only the mesh's handling of it is under test)."""
    mac = bytes.fromhex(src_mac.replace(":", ""))
    eui = bytes([mac[0] ^ 2]) + mac[1:3] + b"\xff\xfe" + mac[3:]
    src = b"\xfe\x80" + bytes(6) + eui
    dst = bytes.fromhex("ff020000000000000000000000010002")
    body = bytes([1]) + xid.to_bytes(3, "big") + struct.pack("!HHHH", 1, 10, 3, 1) + mac  # client id: DUID-LL
    udp = struct.pack("!HHHH", 546, 547, 8 + len(body), 0) + body
    ip6 = struct.pack("!IHBB16s16s", 6 << 28, len(udp), 17, 1, src, dst)
    return bytes.fromhex("333300010002") + mac + b"\x86\xdd" + ip6 + udp


def _ip_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


__all__ = ["BatmanCapture", "Captured", "DhcpError", "DhcpTimeout", "Dnsmasq", "GuestUdhcpd", "Lease", "capture",
           "dhcp_lease", "dhcp_server", "dhcpv4_discover", "dhcpv6_solicit", "dnsmasq", "guest_udhcpc",
           "inner_udp", "send_raw", "udhcpc"]
