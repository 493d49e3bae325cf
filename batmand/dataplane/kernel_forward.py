"""Forwarding in the kernel: the data plane's Forward decisions (decision.decide_mesh) for
plain UNICAST frames, taken by a small eBPF program on each hard interface's ingress
before the frame reaches our receive rings, so a node in the middle of a path moves
frames at the kernel module's cost instead of a trip through the daemon.

The program forwards exactly what decide_mesh would forward, from a copy of the same
table: a UNICAST frame (compat 15) addressed to the interface, from a unicast sender,
whose destination originator we route, with TTL >= 2, a TTVN not older than the one we
know, an inner frame that is not batman-adv (behind one 802.1Q tag at most) for no client
of ours, and that fits the outgoing interface. It rewrites the outer addresses to the
next hop and the outgoing interface, lowers the TTL by one, counts the frame and bytes
as the kernel's forward counters do, and redirects it. Anything else goes on to the
daemon unchanged, which decides as before. Not while a hard interface is Wi-Fi (the
daemon then forwards depending on the incoming interface).

Needs tcx (Linux 6.6) and the right to load programs (CAP_BPF and CAP_NET_ADMIN);
without them the daemon forwards everything itself, as it always did."""

from __future__ import annotations

import errno
import logging
import socket
import struct
import sys

from batmand.wire.constants import COMPAT_VERSION, ETH_P_8021Q, ETH_P_BATMAN, VLAN_HAS_TAG, PacketType
from batmand.wire.fastpath import DEST_OFF, INNER_OFF, TTL_OFF, TTVN_OFF

from . import ebpf
from .ebpf import R0, R1, R2, R3, R6, R7, R8, R9, R10

log = logging.getLogger("batmand")

MAX_ROUTES = 65536  # originators (the core bounds its table far below)
MAX_LOCAL = 65536  # MAC addresses of our clients
_KEY = struct.Struct("=6sH")  # a map key: a MAC address and a VID as the table keys clients (0 for originators)
# an originator's route: out ifindex, out MTU, next-hop MAC, out MAC, TTVN
_ROUTE = struct.Struct("=II6s6sB3x")
_STATS = struct.Struct("=QQ")  # forwarded frames, bytes (whole frames, as the kernel's forward_bytes)
_V_IFINDEX, _V_MTU, _V_ADDRESSES, _V_TTVN = 0, 4, 8, 20  # the addresses: next hop, then out MAC
_SKB_LEN, _SKB_VLAN_PRESENT, _SKB_DATA, _SKB_DATA_END = 0, 20, 76, 80  # struct __sk_buff
_ETH_LEN = 14
_INNER_TYPE = INNER_OFF + 12  # the inner frame's ethertype, or its 802.1Q tag


def _host16(value: int) -> int:
    """A 16-bit field in network order as the program's load sees it."""
    return int.from_bytes(value.to_bytes(2, "big"), sys.byteorder)


def program(port_mac: bytes, routes: ebpf.Map, local: ebpf.Map, stats: ebpf.Map) -> bytes:
    """The ingress program of the hard interface whose MAC is `port_mac`."""
    p = ebpf.Program()
    p.alu_reg(R6, "=", R1)  # the skb
    p.load(R7, R6, _SKB_DATA, 4)
    p.load(R8, R6, _SKB_DATA_END, 4)
    p.load(R1, R6, _SKB_VLAN_PRESENT, 4)
    p.jump_if(R1, "!=", 0, "next")  # a tag the hardware took off: not for this interface's handler
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", INNER_OFF + _ETH_LEN)  # outer Ethernet, our header, the inner Ethernet header
    p.jump_if_reg(R1, ">", R8, "next")
    p.load(R1, R7, 12, 2)
    p.jump_if(R1, "!=", _host16(ETH_P_BATMAN), "next")
    p.load(R1, R7, _ETH_LEN, 2)  # packet type and version
    p.jump_if(R1, "!=", _host16(PacketType.UNICAST << 8 | COMPAT_VERSION), "next")
    p.load(R1, R7, TTL_OFF, 1)
    p.jump_if(R1, "<", 2, "next")  # the daemon drops it, counting
    p.load(R1, R7, 6, 1)
    p.jump_if(R1, "&", 1, "next")  # a multicast sender
    p.load(R1, R7, 0, 4)  # addressed to this interface
    p.load_imm64(R2, int.from_bytes(port_mac[:4], sys.byteorder))
    p.jump_if_reg(R1, "!=", R2, "next")
    p.load(R1, R7, 4, 2)
    p.jump_if(R1, "!=", int.from_bytes(port_mac[4:6], sys.byteorder), "next")
    p.load(R1, R7, _INNER_TYPE, 2)  # batman-adv inside: the daemon's (it drops it)
    p.jump_if(R1, "==", _host16(ETH_P_BATMAN), "next")
    p.alu(R3, "=", 0)  # the client's VID as the table keys it: 0 untagged
    p.jump_if(R1, "!=", _host16(ETH_P_8021Q), "untagged")
    p.alu_reg(R1, "=", R7)
    p.alu(R1, "+", _INNER_TYPE + 6)
    p.jump_if_reg(R1, ">", R8, "next")
    p.load(R1, R7, _INNER_TYPE + 4, 2)
    p.jump_if(R1, "==", _host16(ETH_P_BATMAN), "next")
    p.load(R3, R7, _INNER_TYPE + 2, 2)
    p.byte_swap16(R3)
    p.alu(R3, "&", 0x0FFF)
    p.jump_if(R3, "==", 0, "untagged")
    p.alu(R3, "|", VLAN_HAS_TAG)
    p.label("untagged")
    # for a client of ours the daemon applies the TTVN rules (a roaming client is rerouted)
    _key(p, INNER_OFF, R3)
    _lookup(p, local)
    p.jump_if(R0, "!=", 0, "next")
    p.alu(R3, "=", 0)
    _key(p, DEST_OFF, R3)
    _lookup(p, routes)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R9, "=", R0)
    p.load(R1, R7, TTVN_OFF, 1)  # older than the route's TTVN (seq_before): the daemon's
    p.load(R2, R9, _V_TTVN, 1)
    p.alu_reg(R1, "-", R2)
    p.alu(R1, "<<", 56)
    p.alu(R1, "s>>", 56)
    p.jump_if(R1, "s<", 0, "next")
    p.load(R1, R6, _SKB_LEN, 4)  # too long for the way out: the daemon fragments it
    p.alu(R1, "-", _ETH_LEN)
    p.load(R2, R9, _V_MTU, 4)
    p.jump_if_reg(R1, ">", R2, "next")
    for off, size in ((0, 4), (4, 2), (6, 2), (8, 4)):  # next hop, then the out interface's MAC
        p.load(R1, R9, _V_ADDRESSES + off, size)
        p.store(R7, off, R1, size)
    p.load(R1, R7, TTL_OFF, 1)
    p.alu(R1, "-", 1)
    p.store(R7, TTL_OFF, R1, 1)
    p.store_imm(R10, -8, 0, 4)  # the counters (per CPU: no atomics needed)
    _lookup(p, stats)
    p.jump_if(R0, "==", 0, "send")
    p.load(R1, R0, 0, 8)
    p.alu(R1, "+", 1)
    p.store(R0, 0, R1, 8)
    p.load(R1, R6, _SKB_LEN, 4)
    p.load(R2, R0, 8, 8)
    p.alu_reg(R2, "+", R1)
    p.store(R0, 8, R2, 8)
    p.label("send")
    p.load(R1, R9, _V_IFINDEX, 4)
    p.alu(R2, "=", 0)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()
    p.label("next")
    p.alu(R0, "=", ebpf.TC_NEXT)
    p.exit()
    return p.assemble()


def _key(p: ebpf.Program, off: int, vid: int) -> None:
    """The 6-byte address at packet offset `off` and register `vid` as a map key at r10-8."""
    p.load(R1, R7, off, 4)
    p.store(R10, -8, R1, 4)
    p.load(R1, R7, off + 4, 2)
    p.store(R10, -4, R1, 2)
    p.store(R10, -2, vid, 2)


def _lookup(p: ebpf.Program, table: ebpf.Map) -> None:
    """r0 = the value at key r10-8, or 0."""
    p.load_imm64(R1, table.fd, map_fd=True)
    p.alu_reg(R2, "=", R10)
    p.alu(R2, "+", -8)
    p.call(ebpf.HELPER_MAP_LOOKUP)


class KernelForward:
    """Keeps the kernel's copy of the forwarding table (routes toward originators, our
    clients) and the programs on the hard interfaces in step with what the data plane
    is given: the same set_ports and apply calls."""

    def __init__(self) -> None:
        self.origs: dict = {}  # the forwarding table's routes toward originators (its clients are not needed)
        self.ports: dict[str, tuple[bytes, int, int]] = {}  # name -> (mac, mtu, ifindex)
        self.wifi = False
        self.links: dict[str, tuple[int, int]] = {}  # name -> (program fd, link fd)
        self.error: str | None = None  # why nothing is attached
        self.routes = self.local = self.stats = None
        self._installed: set = set()  # originators in the routes map
        self._before = (0, 0)  # counters of maps closed by a reset
        try:
            self.routes = ebpf.Map(ebpf.MAP_HASH, _KEY.size, _ROUTE.size, MAX_ROUTES, "batmand_routes",
                                   flags=ebpf.NO_PREALLOC)
            self.local = ebpf.Map(ebpf.MAP_HASH, _KEY.size, 1, MAX_LOCAL, "batmand_local", flags=ebpf.NO_PREALLOC)
            self.stats = ebpf.Map(ebpf.MAP_PERCPU_ARRAY, 4, _STATS.size, 1, "batmand_fwd_stats")
        except OSError as exc:
            self._unavailable(exc)

    def _unavailable(self, exc: OSError) -> None:
        self.error = str(exc).splitlines()[0]
        log.info("forwarding in the kernel is not available (%s): the daemon forwards every frame", self.error)
        self.close()

    @property
    def active(self) -> bool:
        return self.error is None

    # --- what the data plane is told ------------------------------------------------------------

    def set_ports(self, ports: dict[str, tuple[bytes, int]], wifi: bool) -> None:
        if not self.active:
            return
        known = {}
        for name, (mac, mtu) in ports.items():
            try:
                known[name] = (bytes(mac), mtu, socket.if_nametoindex(name))
            except OSError:
                continue  # gone already: the daemon hears of it next
        if known == self.ports and wifi == self.wifi and self.links.keys() == known.keys():
            return  # (a link event that changed nothing of ours: no rewrite of every route)
        # gone, a new MAC, or the same name on a new interface: no route may point there
        # any more when its program goes (it is attached afresh if still ours)
        stale = [n for n in self.links if n not in known or known[n][::2] != self.ports[n][::2]]
        try:
            if stale:
                self.ports = {n: v for n, v in known.items() if n not in stale}
                self._sync_routes(self.origs)
                for name in stale:
                    self._detach(name)
            self.ports, self.wifi = known, wifi
            for name, (mac, _mtu, ifindex) in known.items():
                if name not in self.links:
                    self._attach(name, mac, ifindex)
            self._sync_routes(self.origs)
        except OSError as exc:
            self._unavailable(exc)

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
                if state is None:
                    self.local.delete(_KEY.pack(bytes(mac), vid))
                else:
                    self.local.update(_KEY.pack(bytes(mac), vid), b"\x01")
            self._sync_routes(update.origs)
        except OSError as exc:  # the kernel refused a change: better no program than a wrong one
            self._unavailable(exc)

    def _sync_routes(self, origs) -> None:
        """Write the routes toward `origs` as the table has them now."""
        for orig in origs:
            entry = self._entry(orig)
            key = _KEY.pack(bytes(orig), 0)
            if entry is not None:
                try:
                    self.routes.update(key, entry)
                    self._installed.add(orig)
                    continue
                except OSError as exc:
                    if exc.errno != errno.E2BIG:
                        raise
                    # the map is full: the daemon forwards toward this one
            if orig in self._installed:
                self.routes.delete(key)
                self._installed.discard(orig)

    def _entry(self, orig) -> bytes | None:
        route = self.origs.get(orig)
        if route is None or self.wifi:
            return None
        out = self.ports.get(route.iface)
        if out is None:
            return None
        mac, mtu, ifindex = out
        return _ROUTE.pack(ifindex, mtu, bytes(route.next_hop), mac, route.ttvn)

    # --- programs ---------------------------------------------------------------------------------

    def _attach(self, name: str, mac: bytes, ifindex: int) -> None:
        prog = ebpf.load_program(program(mac, self.routes, self.local, self.stats), "batmand_fwd")
        try:
            link = ebpf.attach_ingress(prog, ifindex)
        except OSError:
            ebpf.close(prog)
            raise
        self.links[name] = (prog, link)
        log.debug("interface %s: forwarding in the kernel", name)

    def _detach(self, name: str) -> None:
        fds = self.links.pop(name, None)
        for fd in fds or ():
            ebpf.close(fd)

    # --- what batmanctl shows -------------------------------------------------------------------------

    def counters(self) -> dict:
        """forward, forward_bytes: what the kernel forwarded for us (the daemon's own come on top)."""
        frames, nbytes = self._before
        if self.stats is not None:
            for value in self.stats.lookup(b"\0\0\0\0") or ():
                f, b = _STATS.unpack(value)
                frames, nbytes = frames + f, nbytes + b
        return {"forward": frames, "forward_bytes": nbytes}

    def status(self) -> dict:
        return {"interfaces": sorted(self.links), "routes": len(self._installed), "error": self.error}

    def close(self) -> None:
        for name in list(self.links):
            self._detach(name)
        if self.stats is not None:
            counters = self.counters()
            self._before = counters["forward"], counters["forward_bytes"]
        for table in (self.routes, self.local, self.stats):
            if table is not None:
                table.close()
        self.routes = self.local = self.stats = None
        self._installed.clear()
