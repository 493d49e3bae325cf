"""The kernel fast path: the data plane's Forward, DELIVER and Encapsulate decisions
(decision.decide_mesh, decide_host) taken in the kernel by small eBPF programs
(kernel_programs) on the hard interfaces' ingress and bat0's egress, so unicast between
known clients moves at the kernel module's cost instead of a trip through the daemon.
Delivered frames and the TCP the host sends pass through a hidden veth pair of ours (the
Passage), where the stack merges (GRO) and cuts (GSO) a TCP flow's segments as it does
for the kernel module's bat0. This module keeps the programs' maps in step with what the
data plane is told (the same set_ports and apply calls), and the programs attached.

The programs take exactly what the data plane would take without the core, and leave
everything else to the daemon unchanged, which decides as before. Needs tcx (Linux 6.6)
and the right to load programs (CAP_BPF and CAP_NET_ADMIN); without them the daemon
moves every frame itself, as it always did. A map that cannot hold the table leaves
those entries (routes, clients) to the daemon; any other refusal by the kernel detaches
everything, because no program is better than a wrong one."""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys

from batmand.core.forwarding import FROM_HOST, TO_HOST, SlowPath
from batmand.wire.fastpath import UNICAST_PREFIX_LEN
from batmand.wire.mac import Mac

from . import ebpf, veth
from . import kernel_programs as kp

log = logging.getLogger("batmand")

MAX_ROUTES = 65536  # originators (the core bounds its table far below)
MAX_LOCAL = 65536  # MAC addresses of our clients
MAX_CLIENTS = 65536  # other originators' clients
MAX_WATCHED = 65536  # sources BLA claimed for us, senders on the host the core watches
MAX_RULES = 256  # the slow path's L4 rules
PASSAGE_MTU = 65535  # a GRO-merged frame, or a frame with our header still on
_DIRECTIONS = {TO_HOST: kp.TO_HOST_DIR, FROM_HOST: kp.FROM_HOST_DIR}


class Maps(kp.Maps):
    def __init__(self) -> None:
        self._all: list[ebpf.Map] = []
        try:
            self.routes = self._new(ebpf.MAP_HASH, kp.KEY.size, kp.ROUTE.size, MAX_ROUTES, "batmand_routes")
            self.local = self._new(ebpf.MAP_HASH, kp.KEY.size, kp.LOCAL.size, MAX_LOCAL, "batmand_local")
            self.clients = self._new(ebpf.MAP_HASH, kp.KEY.size, kp.CLIENT.size, MAX_CLIENTS, "batmand_clients")
            self.watched = self._new(ebpf.MAP_HASH, kp.KEY.size, 8, MAX_WATCHED, "batmand_watched")
            self.from_host = self._new(ebpf.MAP_HASH, kp.KEY.size, 1, MAX_WATCHED, "batmand_fromhost")
            self.rules = self._new(ebpf.MAP_HASH, kp.RULE.size, 1, MAX_RULES, "batmand_rules")
            self.config = self._new(ebpf.MAP_ARRAY, 4, kp.CONFIG.size, 1, "batmand_config")
            self.stats = self._new(ebpf.MAP_PERCPU_ARRAY, 4, kp.STATS.size, 1, "batmand_stats")
        except OSError:
            self.close()
            raise

    def _new(self, kind: int, key_size: int, value_size: int, entries: int, name: str) -> ebpf.Map:
        # hash maps take kernel memory per entry, not for max_entries up front
        table = ebpf.Map(kind, key_size, value_size, entries, name,
                         flags=ebpf.NO_PREALLOC if kind == ebpf.MAP_HASH else 0)
        self._all.append(table)
        return table

    def counters(self) -> list[int]:
        """The per-CPU counters summed."""
        total = [0] * (kp.STATS.size // 8)
        for value in self.stats.lookup(b"\0\0\0\0") or ():
            total = [a + b for a, b in zip(total, kp.STATS.unpack(value))]
        return total

    def close(self) -> None:
        for table in self._all:
            table.close()


class Passage:
    """Where the kernel path's frames pass between its stages (kernel_programs): a veth
    pair of the daemon's, `<bat0>-kseg` and `<bat0>-kgro`, up, without IP addresses (the
    host sends next to nothing into it, and the programs drop what it does send).
    - Delivered frames come into kseg from a hard interface's program and lose our
      header there; TCP crosses to kgro, whose GRO (while the `gro` setting is on) merges
      a flow's segments, then goes into bat0; the rest goes into bat0 from kseg.
    - TCP the host sends, with our header in front, goes out of kseg, which has no TSO:
      the stack cuts GSO frames there, each segment behind a copy of our header, and
      kgro hands each to the hard interface of its route.
    A veth pair outlives a daemon killed hard: the next start takes the old one away."""

    def __init__(self, soft: str, maps: Maps, gro: bool) -> None:
        from pyroute2.ethtool.ioctl import IoctlEthtool  # (only where the kernel path runs)

        self.names = (soft[:10] + "-kseg", soft[:10] + "-kgro")
        self.fds: list[int] = []
        for name in self.names:
            veth.delete(name)  # left by a daemon killed hard
        # one address for both ends, which the programs drop frames from: the host's own
        own = bytes([0x02]) + os.urandom(5)
        veth.add_pair(*self.names, str(Mac(own)), PASSAGE_MTU)  # (a veth checks the MTU: frames here are longer)
        try:
            self.ifindex, peer = (socket.if_nametoindex(n) for n in self.names)
            soft_index = socket.if_nametoindex(soft)
            for name, flag, on in ((self.names[0], "tcp-segmentation-offload", False),
                                   (self.names[1], "generic-receive-offload", gro)):
                tool = IoctlEthtool(name)
                try:
                    tool.set_offload_flag(flag, on)
                finally:
                    tool.close()
            for program, index, name in (
                    (kp.strip_program(self.ifindex, soft_index, own, gro, maps.stats), self.ifindex, "batmand_strip"),
                    (kp.passage_program(soft_index, own, maps), peer, "batmand_pass")):
                self.fds.append(ebpf.load_program(program, name))
                self.fds.append(ebpf.attach_ingress(self.fds[-1], index))
            for name in self.names:
                veth.set_up(name)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            ebpf.close(fd)
        self.fds = []
        try:
            veth.delete(self.names[0])
        except OSError as exc:  # (the next start removes it)
            log.warning("could not remove %s: %s", self.names[0], exc)


def _install(table: ebpf.Map, installed: set, key: bytes, value: bytes | None, member) -> None:
    """key -> value in the map (None: out of it), `member` kept in `installed` while it
    is there. A full map leaves the entry out: the daemon moves those frames."""
    if value is not None:
        try:
            table.update(key, value)
            installed.add(member)
            return
        except OSError as exc:
            if exc.errno != errno.E2BIG:
                raise
    if member in installed:
        table.delete(key)
        installed.discard(member)


def _error(exc: Exception) -> str:
    """The first line of the kernel's (or pyroute2's) answer: a verifier's log follows it."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


class KernelForward:
    """The maps and programs of the kernel fast path, kept in step with the data plane."""

    def __init__(self, soft: str | None = None, gro: bool = True) -> None:
        """`soft`: the soft interface, to deliver to and send from (None: forward only);
        `gro`: merge a TCP flow's segments for it (the `gro` setting)."""
        self.origs: dict = {}  # the forwarding table's routes toward originators
        self.ports: dict[str, tuple[bytes, int, int]] = {}  # name -> (mac, mtu, ifindex)
        self.wifi = False
        self.primary: bytes | None = None
        self.soft_up = False  # bat0 administratively up (else the daemon delivers, and counts the drops)
        self.soft_mtu = 0  # bat0's MTU: a route that holds it and our header carries TCP in the kernel
        self.taps = False  # a packet socket listens on bat0 (it would not see what the kernel sends)
        self.links: dict[str, tuple[int, int]] = {}  # hard interface -> (program fd, link fd)
        self.error: str | None = None  # why nothing is attached
        self.deliver_error: str | None = None  # why nothing is delivered, for good
        self.send_error: str | None = None  # why nothing is sent, for good
        self.maps: Maps | None = None
        self.passage: Passage | None = None
        self.soft_index = 0
        self._send_fds: tuple = ()  # bat0's egress program and link
        self._installed: set = set()  # originators in the routes map
        self._clients: set = set()  # keys in the clients map
        self._ours: dict[bytes, tuple] = {}  # keys of our clients in state ours -> (mac, vid)
        self._slow = SlowPath()
        self._rules: set[bytes] = set()  # in the rules map
        self._watched: dict[bytes, tuple] = {}  # in the watched map: key -> (mac, vid)
        self._from_host: set[bytes] = set()  # in the from_host map
        # (offset of the time in the value: 0 watched, 8 local; key) -> the last time a program marked it
        self._seen: dict[tuple, int] = {}
        self._before = [0] * (kp.STATS.size // 8)  # counters of maps closed by a reset
        try:
            self.maps = Maps()
        except OSError as exc:
            self._unavailable(exc)
            return
        if soft is None:
            self.deliver_error = self.send_error = "no soft interface"
        else:
            self._start_soft(soft, gro)
        self._write_config()

    def _start_soft(self, soft: str, gro: bool) -> None:
        try:
            self.passage = Passage(soft, self.maps, gro)
        except Exception as exc:  # (OSError, or pyroute2's NetlinkError and EthtoolError)
            self.deliver_error = _error(exc)
            log.info("delivery in the kernel is not available (%s): the daemon delivers every frame",
                     self.deliver_error)
        try:
            self.soft_index = socket.if_nametoindex(soft)
            passage = self.passage.ifindex if self.passage else None
            prog = ebpf.load_program(kp.send_program(self.maps, passage), "batmand_send")
            try:
                self._send_fds = (prog, ebpf.attach_egress(prog, self.soft_index))
            except OSError:
                ebpf.close(prog)
                raise
        except OSError as exc:
            self.send_error = _error(exc)
            log.info("sending in the kernel is not available (%s): the daemon sends every frame", self.send_error)

    def _unavailable(self, exc: OSError) -> None:
        self.error = _error(exc)
        log.info("the kernel fast path is not available (%s): the daemon moves every frame", self.error)
        self.close()

    @property
    def active(self) -> bool:
        return self.error is None

    # --- what the data plane is told ------------------------------------------------------------

    def set_ports(self, ports: dict[str, tuple[bytes, int]], primary: bytes | None, wifi: bool) -> None:
        if not self.active:
            return
        known = {}
        for name, (mac, mtu) in ports.items():
            try:
                known[name] = (bytes(mac), mtu, socket.if_nametoindex(name))
            except OSError:
                continue  # gone already: the daemon hears of it next
        # while the primary interface is down, nothing addressed to our originator is ours
        primary = primary if any(mac == primary for mac, _mtu in ports.values()) else None
        try:
            if (primary, wifi) != (self.primary, self.wifi):
                self.primary, self.wifi = primary, wifi
                self._write_config()
            if known == self.ports and self.links.keys() == known.keys():
                return  # (a link event that changed nothing of ours: no rewrite of every route)
            # gone, a new MAC, or the same name on a new interface: no route may point there
            # any more when its program goes (it is attached afresh if still ours)
            stale = [n for n in self.links if n not in known or known[n][::2] != self.ports[n][::2]]
            if stale:
                self.ports = {n: v for n, v in known.items() if n not in stale}
                self._sync_routes(self.origs)
                for name in stale:
                    self._detach(name)
            self.ports = known
            for name, (mac, _mtu, ifindex) in known.items():
                if name not in self.links:
                    self._attach(name, mac, ifindex)
            self._sync_routes(self.origs)
        except OSError as exc:
            self._unavailable(exc)

    def set_soft(self, up: bool, mtu: int) -> None:
        """bat0's state: administratively up, and its MTU."""
        if self.active and (up, mtu) != (self.soft_up, self.soft_mtu):
            self.soft_up, self.soft_mtu = up, mtu
            self._write_config()

    def watch_taps(self, packet_sockets: str | None = None) -> None:
        """Whether a packet socket listens on bat0 (or on every interface), from
        /proc/net/packet: sending in the kernel stops while one does, so that tcpdump on
        bat0 sees what the host sends (a frame redirected at bat0's egress never reaches
        its taps)."""
        if not self.active or self.soft_index == 0:
            return
        if packet_sockets is None:
            try:
                with open("/proc/net/packet") as f:
                    packet_sockets = f.read()
            except OSError:
                return
        taps = False
        for line in packet_sockets.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 4 and fields[3] != "0000" and int(fields[4]) in (0, self.soft_index):
                taps = True
                break
        if taps != self.taps:
            self.taps = taps
            self._write_config()

    def apply(self, update) -> None:
        if not self.active:
            return  # (for good: nothing to keep in step)
        for orig, route in update.origs.items():
            if route is None:
                self.origs.pop(orig, None)
            else:
                self.origs[orig] = route
        try:
            for (mac, vid), state in update.local_clients.items():
                key = kp.KEY.pack(bytes(mac), vid)
                if state is None:
                    self.maps.local.delete(key)
                else:
                    self.maps.local.update(key, kp.LOCAL.pack(kp.LOCAL_OURS if state is True else kp.LOCAL_LEAVING, 0))
                if state is True:
                    self._ours[key] = (mac, vid)
                else:
                    self._ours.pop(key, None)
                    self._seen.pop((8, key), None)
            self._sync_clients(update.clients)
            self._sync_routes(update.origs)
            if update.slow_path is not None and update.slow_path != self._slow:
                self._set_slow_path(update.slow_path)
        except OSError as exc:  # the kernel refused a change: better no program than a wrong one
            self._unavailable(exc)

    def _sync_clients(self, clients: dict) -> None:
        for (mac, vid), client in clients.items():
            key = kp.KEY.pack(bytes(mac), vid)
            value = None if client is None else kp.CLIENT.pack(bytes(client.orig), client.roam)
            _install(self.maps.clients, self._clients, key, value, key)

    def _sync_routes(self, origs) -> None:
        """Write the routes toward `origs` as the table has them now."""
        for orig in origs:
            _install(self.maps.routes, self._installed, kp.KEY.pack(bytes(orig), 0), self._entry(orig), orig)

    def _entry(self, orig) -> bytes | None:
        route = self.origs.get(orig)
        if route is None:
            return None
        out = self.ports.get(route.iface)
        if out is None:
            return None
        mac, mtu, ifindex = out
        return kp.ROUTE.pack(ifindex, mtu, bytes(route.next_hop), mac, route.ttvn)

    def _set_slow_path(self, slow: SlowPath) -> None:
        """The core's slow-path rules as the programs read them: each change widens what
        goes to the core before it narrows it (new entries first)."""
        self._slow = slow
        rules = {kp.RULE.pack(r.ethertype.to_bytes(2, "big"), r.ip_proto, _DIRECTIONS[r.direction],
                              r.dst_port is not None, (r.dst_port or 0).to_bytes(2, "big"))
                 for r in slow.rules if r.ip_proto is not None and r.ethertype in (0x0800, 0x86DD)}
        for key in rules - self._rules:
            self.maps.rules.update(key, b"\x01")
        for key in self._rules - rules:
            self.maps.rules.delete(key)
        self._rules = rules
        from_host = {kp.KEY.pack(bytes(mac), vid) for mac, vid in slow.from_host_sources}
        for key in from_host - self._from_host:
            try:
                self.maps.from_host.update(key, b"\x01")
            except OSError as exc:
                if exc.errno != errno.E2BIG:
                    raise
                break  # full: not all of them watched, so nothing sent (_send_blocked)
            self._from_host.add(key)
        for key in self._from_host - from_host:
            self.maps.from_host.delete(key)
            self._from_host.discard(key)
        watched = {kp.KEY.pack(bytes(mac), vid): (mac, vid) for mac, vid in slow.to_host_sources or ()}
        for key in [k for k in self._watched if k not in watched]:
            self.maps.watched.delete(key)
            del self._watched[key]
            self._seen.pop((0, key), None)
        for key, source in watched.items():
            if key not in self._watched:
                try:
                    self.maps.watched.update(key, bytes(8))
                except OSError as exc:
                    if exc.errno != errno.E2BIG:
                        raise
                    break  # full: not all of them watched, so nothing delivered (_deliver_blocked)
                self._watched[key] = source
        self._write_config()

    # --- when the kernel may deliver and send ------------------------------------------------------

    def _deliver_blocked(self) -> str | None:
        """Why the daemon must deliver every frame for us now (None: the kernel may)."""
        slow = self._slow
        if not self.active:
            return self.error
        if self.passage is None:
            return self.deliver_error or "closed"
        if not self.soft_up:
            return "the soft interface is down"
        if self.primary is None:
            return "no primary interface"
        if slow.clients or slow.from_last_hops:
            return "the core watches clients or last hops"
        if slow.to_host_sources is not None and len(self._watched) < len(slow.to_host_sources):
            return "more watched sources than the kernel's map holds"
        return None

    def _send_blocked(self) -> str | None:
        if not self.active:
            return self.error
        if not self._send_fds:
            return self.send_error or "closed"
        if self.taps:
            return "a packet socket listens on the soft interface"
        if self._slow.clients:
            return "the core watches clients"
        if len(self._from_host) < len(self._slow.from_host_sources):
            return "more watched senders than the kernel's map holds"
        return None

    def _write_config(self) -> None:
        if self.maps is None:
            return
        slow = self._slow
        flags = [0, 0]
        for rule in slow.rules:
            if rule.ip_proto is None and rule.ethertype in (0x0800, 0x86DD):
                flags[_DIRECTIONS[rule.direction]] |= 1 if rule.ethertype == 0x0800 else 2
        l4 = [any(r[3] == d for r in self._rules) for d in (kp.TO_HOST_DIR, kp.FROM_HOST_DIR)]
        config = kp.CONFIG.pack(self.primary or bytes(6), self._deliver_blocked() is None,
                                slow.to_host_sources is not None, not self.wifi, self._send_blocked() is None,
                                bool(self._from_host), *l4, *flags,
                                self.soft_mtu + UNICAST_PREFIX_LEN if self.soft_mtu else 0,
                                self.passage.ifindex if self.passage else 0)
        self.maps.config.update(b"\0\0\0\0", config)

    def take_seen(self) -> dict:
        """Our clients the host sent from and the watched sources delivered, by the
        kernel since the last call: (mac, vid) -> time (time.monotonic's clock)."""
        seen = {}
        if self.maps is None:
            return seen
        for table, entries, off in ((self.maps.watched, self._watched, 0), (self.maps.local, self._ours, 8)):
            for key, source in entries.items():
                value = table.lookup(key)
                if value is None:
                    continue
                when = int.from_bytes(value[off:off + 8], sys.byteorder)
                if when and when != self._seen.get((off, key)):
                    self._seen[(off, key)] = when
                    seen[source] = max(when / 1e9, seen.get(source, 0.0))
        return seen

    # --- programs ---------------------------------------------------------------------------------

    def _attach(self, name: str, mac: bytes, ifindex: int) -> None:
        prog = ebpf.load_program(kp.mesh_program(mac, self.maps), "batmand_mesh")
        try:
            link = ebpf.attach_ingress(prog, ifindex)
        except OSError:
            ebpf.close(prog)
            raise
        self.links[name] = (prog, link)
        log.debug("interface %s: the kernel fast path", name)

    def _detach(self, name: str) -> None:
        fds = self.links.pop(name, None)
        for fd in fds or ():
            ebpf.close(fd)

    # --- what batmanctl shows -------------------------------------------------------------------------

    def _counters(self) -> list[int]:
        if self.maps is None:
            return list(self._before)
        return [a + b for a, b in zip(self._before, self.maps.counters())]

    def counters(self) -> dict:
        """What the kernel forwarded, delivered and sent for us, as `batctl s` counts them
        (the daemon's own come on top)."""
        c = self._counters()
        return {"forward": c[0], "forward_bytes": c[1], "rx": c[2], "rx_bytes": c[3], "tx": c[4], "tx_bytes": c[5]}

    def status(self) -> dict:
        return {"interfaces": sorted(self.links), "routes": len(self._installed), "clients": len(self._clients),
                "error": self.error, "deliver": self._deliver_blocked() or "on",
                "send": self._send_blocked() or "on", "dropped": self._counters()[6]}

    def close(self) -> None:
        for name in list(self.links):
            self._detach(name)
        for fd in self._send_fds:
            ebpf.close(fd)
        self._send_fds = ()
        if self.passage is not None:
            self.passage.close()
            self.passage = None
        if self.maps is not None:
            self._before = self._counters()
            self.maps.close()
            self.maps = None
        self._installed.clear()
