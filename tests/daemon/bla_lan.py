"""One LAN behind several backbone gateways, batmand or kernel nodes, for the bridge loop
avoidance tests (tests/daemon/test_bla_lab.py, tests/interop/test_bla.py) and for recording
the kernel's claim frames (tests/interop/record_bla_capture.py); a gateway may be a kernel
node with a LAN NIC (topology `kernel = { lan = true }`, see kernel_node.py):

    <P>-g (batmand): br0 = bat0 + lan0 --.
                                          <P>-lan: bridge "lan" = p-<g>... + p-h --- <P>-h: eth0 10.77.0.200
    <P>-k (kernel):  kbl = ktl + lan0 ---'          (the VM bridges its LAN NIC, behind ktl, with bat0)
    every other node: its host address on bat0

Everything is made inside the lab's prefix, so the lab's teardown removes it. IPv6 is off
in every namespace (and on the kernel nodes' br0 and its ports), so the hosts send nothing
but what the test sends. Batmand nodes get fixed hard-interface MACs (02:b1:a0:00:NN:0j,
or the test's), so the group ids are known in advance."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import select
import socket
import subprocess
import threading
import time

from batmand.capture import write_pcap
from batmand.core.bla_frames import MAGIC
from batmand.lab import Lab, net
from batmand.lab.lab import ifmac
from batmand.wire import Bcast, WireError, decode_frame
from tests.daemon.labs import wait_for
from tests.interop.matrix import kernel_json, ok
from tests.netns import entered

LAN_HOST_IP = "10.77.0.200"
PORT = 9  # discard
MARK = b"BLA-LAB-"  # every payload the test sends starts with it
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
_tokens = itertools.count()


def primary_mac(node: str, j: int = 1) -> str:
    """Fixed hard-interface MACs (j = 1 is the primary): the group id is known in advance."""
    return f"02:b1:a0:00:{int(node[1:]):02x}:{j:02x}"


def token(what: str) -> bytes:
    return MARK + f"{next(_tokens)}-{what}".encode()


class Sniffer:
    """Every frame carrying MARK on the given interfaces of several namespaces, both
    directions (ETH_P_ALL packet sockets, read by a thread). Interfaces that disappear
    (a stopped daemon's bat0) are dropped."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, bool, bytes]] = []  # (where "ns-key:ifname", outgoing, raw)
        self._socks: dict[socket.socket, str] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, ns: str, ifname: str, where: str) -> None:
        with entered(ns):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        sock.bind((ifname, ETH_P_ALL))
        sock.setblocking(False)
        with self._lock:
            self._socks[sock] = where

    def start(self) -> "Sniffer":
        self._thread = threading.Thread(target=self._run, name="bla-sniffer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._halt.is_set():
            with self._lock:
                socks = list(self._socks)
            ready, _, _ = select.select(socks, [], [], 0.05)
            for sock in ready:
                self._drain(sock)

    def _drain(self, sock: socket.socket) -> None:
        while True:
            try:
                raw, addr = sock.recvfrom(65535)
            except BlockingIOError:
                return
            except OSError:  # the interface went away
                with self._lock:
                    self._socks.pop(sock, None)
                sock.close()
                return
            if MARK in raw:
                with self._lock:
                    self.frames.append((self._socks[sock], addr[2] == PACKET_OUTGOING, raw))

    def stop(self) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for sock in list(self._socks):
            sock.close()

    def copies(self, tok: bytes, where: str, outgoing: bool = False) -> list[bytes]:
        with self._lock:
            return [raw for w, out, raw in self.frames if w == where and out == outgoing and tok in raw]

    def bcast_origs(self, tok: bytes, node: str, ifnames: list[str]) -> list[str]:
        """The originators of the BCASTs carrying `tok` that arrived at `node`."""
        origs = []
        for ifname in ifnames:
            for raw in self.copies(tok, f"{node}:{ifname}"):
                with contextlib.suppress(WireError):
                    packet = decode_frame(raw).packet
                    if isinstance(packet, Bcast):
                        origs.append(str(packet.orig))
        return origs

    def summary(self, tok: bytes) -> str:
        with self._lock:
            return "\n".join(f"  {w} {'out' if out else 'in '} {len(raw)} bytes" for w, out, raw in self.frames
                             if tok in raw) or "  (nowhere)"


LAN_VETH = "lan0"  # in each gateway's namespace, toward the LAN's bridge
_MAC_RE = r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}"
_BBT_ROW = re.compile(rf"^({_MAC_RE}) on\s+(-?\d+)\s+([\d.]+)s \(0x([0-9a-f]{{4}})\)$")


def is_claim_frame(raw: bytes) -> bool:
    """An untagged ARP frame with BLA's magic in its target hardware address."""
    return len(raw) >= 42 and raw[12:14] == b"\x08\x06" and raw[32:35] == MAGIC


class ClaimCapture:
    """The claim frames each gateway puts on the LAN: a packet socket on every gateway's
    port of the LAN bridge (ETH_P_ALL: a bridge port's frames never reach the sockets of one
    protocol), incoming frames only (each frame once, at the port of the gateway that sent
    it). frames: [(time.time(), gateway, raw)]."""

    def __init__(self, lan_ns: str, gateways: list[str]) -> None:
        self.frames: list[tuple[float, str, bytes]] = []
        self._socks: dict[socket.socket, str] = {}
        for g in gateways:
            with entered(lan_ns):
                sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sock.bind((f"p-{g}", ETH_P_ALL))
            sock.setblocking(False)
            self._socks[sock] = g
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bla-claims", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            ready, _, _ = select.select(list(self._socks), [], [], 0.05)
            for sock in ready:
                while True:
                    try:
                        raw, addr = sock.recvfrom(2048)
                    except (BlockingIOError, OSError):
                        break
                    if addr[2] != PACKET_OUTGOING and is_claim_frame(raw):
                        with self._lock:
                            self.frames.append((time.time(), self._socks[sock], raw))

    def sent_by(self, gateway: str) -> list[bytes]:
        with self._lock:
            return [raw for _, g, raw in self.frames if g == gateway]

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)
        for sock in self._socks:
            sock.close()

    def write(self, path: str) -> int:
        """The frames so far as a classic pcap (their arrival times); returns how many."""
        with self._lock:
            frames = list(self.frames)
        write_pcap(path, [raw for _, _, raw in frames], [t for t, _, _ in frames])
        return len(frames)


class BlaLan:
    """A lab plus its LAN: `gateways` bridged into it, the lab's other nodes mesh nodes with
    their host address on bat0. build() makes it and starts the daemons and VMs."""

    def __init__(self, lab: Lab, gateways: list[str], macs: dict[str, str] | None = None) -> None:
        self.lab = lab
        self.gateways = list(gateways)
        self.lan = f"{lab.prefix}-lan"
        self.host = f"{lab.prefix}-h"
        self._macs = dict(macs or {})  # batmand node -> its primary MAC, instead of _primary(node)
        self.orig: dict[str, str] = {}

    def _primary(self, node: str, j: int) -> str:
        if j == 1 and node in self._macs:
            return self._macs[node]
        return primary_mac(node, j)

    def build(self, timeout: float = 120) -> None:
        lab = self.lab
        for ns in (self.lan, self.host):
            net.create_namespace(ns)
        for ns in [*lab.namespaces, self.lan, self.host]:
            subprocess.run(net.in_namespace(ns, ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                                                 "net.ipv6.conf.default.disable_ipv6=1"]), check=True)
        for node in lab.daemon_nodes:
            for j, ifname in enumerate(lab.topology.hard_interfaces(node), 1):
                lab.netns_exec(node, ["ip", "link", "set", ifname, "address", self._primary(node, j)], check=True)
        net.add_bridge(self.lan, "lan")
        net.add_veth(self.host, "eth0", self.lan, "p-h", 1500)
        net.set_master(self.lan, "p-h", "lan")
        net.add_address(self.host, "eth0", f"{LAN_HOST_IP}/{lab.topology.ipv4.prefixlen}")
        for g in self.gateways:
            ns = lab.ns(g)
            net.add_veth(ns, LAN_VETH, self.lan, f"p-{g}", 1500)
            net.set_master(self.lan, f"p-{g}", "lan")
            if lab.is_kernel(g):
                net.set_master(ns, LAN_VETH, lab.topology.kernel_lan(g)[1])
            else:
                net.add_bridge(ns, "br0")
                net.set_master(ns, LAN_VETH, "br0")
        lab.start_daemons(wait=False)
        lab.wait_daemons(lab.daemon_nodes, timeout=10)
        for node in lab.daemon_nodes:
            ns = lab.ns(node)
            deadline = time.monotonic() + 10
            while not net.link_exists(ns, "bat0"):
                assert time.monotonic() < deadline, f"{node}: no bat0"
                time.sleep(0.05)
            if node in self.gateways:
                net.set_master(ns, "bat0", "br0")
            else:
                net.add_address(ns, "bat0", lab.address(node, 4, prefixlen=True))
            net.set_up(ns, "bat0")
        lab.wait_daemons(lab.kernel_nodes, timeout=timeout)
        self.orig = {n: lab.originator(n) for n in lab.nodes}
        self.host_mac = ifmac(self.host, "eth0")

    @property
    def mesh_nodes(self) -> list[str]:
        return [n for n in self.lab.nodes if n not in self.gateways]

    def sniff(self) -> Sniffer:
        """Frames carrying the tests' mark: at the LAN's ports and host, on the mesh nodes'
        bat0 and hard interfaces, on batmand gateways' bat0."""
        s = Sniffer()
        for g in self.gateways:
            s.add(self.lan, f"p-{g}", f"lan:p-{g}")
            if not self.lab.is_kernel(g):
                s.add(self.lab.ns(g), "bat0", f"{g}:bat0")
        s.add(self.host, "eth0", "h:eth0")
        for n in self.mesh_nodes:
            for ifname in ("bat0", *self.lab.topology.hard_interfaces(n)):
                s.add(self.lab.ns(n), ifname, f"{n}:{ifname}")
        return s.start()

    def broadcast(self, where: str, tok: bytes) -> None:
        """A UDP broadcast (10.77.0.255) from the LAN host ("h") or a mesh node's host."""
        ns = self.host if where == "h" else self.lab.ns(where)
        with entered(ns):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.sendto(tok, (str(self.lab.topology.ipv4.broadcast_address), PORT))

    def ping(self, where: str, dst: str, count: int = 1) -> subprocess.CompletedProcess:
        ns = self.host if where == "h" else self.lab.ns(where)
        return subprocess.run(net.in_namespace(ns, ["ping", "-n", "-c", str(count), "-i", "0.2", "-W", "2", dst]),
                              capture_output=True, text=True, timeout=30)

    # --- the two sides' tables, in one form -----------------------------------------------------

    def _ctl(self, node: str, *args: str) -> str:
        return ok(self.lab.batmanctl(node, *args))

    def claims(self, g: str) -> list[dict]:
        """g's claim table as batctl's clj rows (bla_own only when own): the kernel's
        `batctl clj`, our `batmanctl cl --json`."""
        if self.lab.is_kernel(g):
            return kernel_json(self.lab, g, "clj")
        return json.loads(self._ctl(g, "cl", "--json") or "[]")

    def backbone_table(self, g: str) -> list[dict]:
        """g's backbone table with its own entries (batctl bbj, batmanctl bbt --json)."""
        if self.lab.is_kernel(g):
            return kernel_json(self.lab, g, "bbj")
        return json.loads(self._ctl(g, "bbt", "--json") or "[]")

    def backbones(self, g: str) -> dict[str, int]:
        """{backbone: CRC} of the rows `bbt` prints on g (batctl and batmanctl: the others only)."""
        rows = {}
        for line in self._ctl(g, "bbt").splitlines():
            m = _BBT_ROW.match(line)
            if m:
                rows[m[1]] = int(m[4], 16)
        return rows

    def claimed_by(self, client: str) -> str | None:
        """The gateway every gateway lists as the owner of the client's one claim (own on
        that one only, the same VID everywhere), else None."""
        rows = {g: [r for r in self.claims(g) if r["bla_address"] == client] for g in self.gateways}
        if any(len(r) != 1 for r in rows.values()):
            return None
        if len({(r[0]["bla_backbone"], r[0]["bla_vid"]) for r in rows.values()}) != 1:
            return None
        backbone = rows[self.gateways[0]][0]["bla_backbone"]
        owner = next((g for g in self.gateways if self.orig[g] == backbone), None)
        if owner is None or any(bool(rows[g][0].get("bla_own")) != (g == owner) for g in self.gateways):
            return None
        return owner

    def claim(self, node: str, timeout: float = 30) -> str:
        """The mesh node's host pings the LAN host until the gateways agree on who claims it;
        returns that gateway."""
        client = self.lab.mesh_mac(node)

        def claimed():
            self.ping(node, LAN_HOST_IP)
            return self.claimed_by(client)

        deadline = time.monotonic() + timeout
        while (owner := claimed()) is None:
            assert time.monotonic() < deadline, f"no agreed claim for {node}'s host {client} after {timeout} s"
            time.sleep(0.5)
        return owner

    def entered_from(self, sniffer: Sniffer, tok: bytes, node: str) -> set[str]:
        """The nodes whose BCAST carrying tok reached the mesh node."""
        origs = set(sniffer.bcast_origs(tok, node, self.lab.topology.hard_interfaces(node)))
        return {n for n, o in self.orig.items() if o in origs}

    def hold(self, sniffer: Sniffer, node: str, timeout: float = 45) -> tuple[set[str], dict[str, float]]:
        """The LAN host's first broadcast makes the gateways backbone gateways (nothing holds
        it back yet); then each holds the LAN's multicast back until its own new entry is in
        sync. Returns where the first one entered the mesh (seen at the mesh node) and, per
        gateway, how long after it the gateway passed the LAN's broadcasts again (probes
        every 0.5 s)."""
        first = token("first")
        self.broadcast("h", first)
        t_first = time.monotonic()
        time.sleep(1)
        entered = self.entered_from(sniffer, first, node)
        probes: list[tuple[float, bytes]] = []
        passed: dict[str, float] = {}
        while set(passed) != set(self.gateways):
            assert time.monotonic() - t_first < timeout, f"the LAN's broadcasts pass only {sorted(passed)}"
            tok = token("probe")
            self.broadcast("h", tok)
            probes.append((time.monotonic(), tok))
            time.sleep(0.5)
            for sent, t in probes:
                for g in self.entered_from(sniffer, t, node) & set(self.gateways):
                    passed.setdefault(g, sent - t_first)
        return entered, passed

    def takeover(self, sniffer: Sniffer, owner: str, node: str, timeout: float) -> float:
        """Stop the gateway `owner` and broadcast from the mesh node's host every 0.7 s until
        one reaches the LAN host (another gateway took the claim over); none may get there
        before. Returns the seconds that took."""
        self.lab.stop_daemons([owner])
        t_stop = time.monotonic()
        sent: list[bytes] = []

        def reached() -> bytes | None:
            tok = token("takeover")
            sent.append(tok)
            self.broadcast(node, tok)
            time.sleep(0.3)
            return next((t for t in sent if sniffer.copies(t, "h:eth0")), None)

        arrived, _ = wait_for(reached, timeout=timeout, step=0.7)
        took = time.monotonic() - t_stop
        time.sleep(0.5)
        assert not any(sniffer.copies(t, "h:eth0") for t in sent[:sent.index(arrived)]), \
            "a broadcast reached the LAN while the stopped gateway's claim stood"
        return took

    def group(self, g: str) -> int:
        """The group id in the header line of g's `cl` (and `bbt`: both must say the same)."""
        found = set()
        for cmd in ("cl", "bbt"):
            m = re.search(r"group id: 0x([0-9a-f]{4})\]", self._ctl(g, cmd))
            assert m, f"{g}: no group id in {cmd}'s header"
            found.add(int(m[1], 16))
        assert len(found) == 1, f"{g}: cl and bbt print different group ids {found}"
        return found.pop()
