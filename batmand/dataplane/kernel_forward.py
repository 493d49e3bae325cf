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

from batmand.core.forwarding import TO_HOST, SlowPath
from batmand.wire.constants import COMPAT_VERSION, ETH_P_8021Q, ETH_P_BATMAN, VLAN_HAS_TAG, PacketType
from batmand.wire.fastpath import DEST_OFF, INNER_OFF, TTL_OFF, TTVN_OFF, UNICAST_PREFIX_LEN

from . import ebpf
from .ebpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10

log = logging.getLogger("batmand")

MAX_ROUTES = 65536  # originators (the core bounds its table far below)
MAX_LOCAL = 65536  # MAC addresses of our clients
MAX_WATCHED = 65536  # sources BLA claimed for us
MAX_RULES = 256  # the slow path's L4 rules
_KEY = struct.Struct("=6sH")  # a map key: a MAC address and a VID as the table keys clients (0 for originators)
# an originator's route: out ifindex, out MTU, next-hop MAC, out MAC, TTVN
_ROUTE = struct.Struct("=II6s6sB3x")
_V_IFINDEX, _V_MTU, _V_ADDRESSES, _V_TTVN = 0, 4, 8, 20  # the addresses: next hop, then out MAC
LOCAL_OURS, LOCAL_LEAVING = 1, 2  # a client's state in the local map: ours; deleted or roamed away
# delivery's settings: our originator, delivery on, BLA's watched sources, L4 rules, every
# IPv4 / IPv6 frame for the core, the delivery device's ifindex
_CONFIG = struct.Struct("=6sBBBBBxI")
_C_PRIMARY, _C_DELIVER, _C_WATCH, _C_L4, _C_SLOW4, _C_SLOW6, _C_DEVICE = 0, 6, 7, 8, 9, 10, 12
_RULE = struct.Struct("=2sBB2s2x")  # ethertype, IP protocol, 0 (any port) or 1 (this port), port
# per CPU: forwarded frames and bytes (whole frames, as the kernel's forward_bytes),
# delivered frames and bytes (inner frames, as rx_bytes), frames the second stage dropped
_STATS = struct.Struct("=QQQQQ")
_S_FORWARD, _S_DELIVER, _S_STRIP_FAILED = 0, 16, 32
# struct __sk_buff
_SKB_LEN, _SKB_VLAN_PRESENT, _SKB_DATA, _SKB_DATA_END, _SKB_GSO_SIZE = 0, 20, 76, 80, 176
_ETH_LEN = 14
_INNER_TYPE = INNER_OFF + 12  # the inner frame's ethertype, or its 802.1Q tag
_L3 = INNER_OFF + _ETH_LEN  # an untagged inner frame's IP header
_ETH_P_IP, _ETH_P_IPV6 = 0x0800, 0x86DD


def _host16(value: int) -> int:
    """A 16-bit field in network order as the program's load sees it."""
    return int.from_bytes(value.to_bytes(2, "big"), sys.byteorder)


def program(port_mac: bytes, maps: "Maps") -> bytes:
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
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, maps.config)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R9, "=", R0)
    p.load(R1, R9, _C_DELIVER, 1)
    p.jump_if(R1, "==", 0, "route")
    for off, size in ((0, 4), (4, 2)):  # for our originator: delivered, never forwarded
        p.load(R1, R7, DEST_OFF + off, size)
        p.load(R2, R9, _C_PRIMARY + off, size)
        p.jump_if_reg(R1, "!=", R2, "route")
    _deliver(p, maps)
    p.label("route")
    p.load(R1, R7, _INNER_TYPE, 2)
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
    _lookup(p, maps.local)
    p.jump_if(R0, "!=", 0, "next")
    p.alu(R3, "=", 0)
    _key(p, DEST_OFF, R3)
    _lookup(p, maps.routes)
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
    _count(p, maps.stats, _S_FORWARD, 0)
    p.load(R1, R9, _V_IFINDEX, 4)
    p.alu(R2, "=", 0)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()
    p.label("next")
    p.alu(R0, "=", ebpf.TC_NEXT)
    p.exit()
    return p.assemble()


def _deliver(p: ebpf.Program, maps: "Maps") -> None:
    """A frame for our originator (r9: the config): delivered to the host as decide_mesh
    delivers it, through the delivery device, or on to the daemon. Only untagged IPv4 and
    IPv6 (the second stage needs an IP protocol), for a client of ours, not segmented."""
    p.load(R1, R6, _SKB_GSO_SIZE, 4)
    p.jump_if(R1, "!=", 0, "next")
    p.load(R1, R7, INNER_OFF, 1)
    p.jump_if(R1, "&", 1, "next")  # multicast inside: the core (BLA, multicast) decides
    p.load(R1, R7, _INNER_TYPE, 2)
    p.jump_if(R1, "==", _host16(_ETH_P_IP), "ip4")
    p.jump_if(R1, "!=", _host16(_ETH_P_IPV6), "next")
    p.load(R2, R9, _C_SLOW6, 1)
    p.jump_if(R2, "!=", 0, "next")
    p.alu_reg(R2, "=", R7)
    p.alu(R2, "+", _L3 + 44)  # the IPv6 header and the L4 header's first 4 bytes
    p.jump_if_reg(R2, ">", R8, "next")
    p.load(R4, R7, _L3 + 6, 1)  # next header
    p.load(R5, R7, _L3 + 42, 2)  # the destination port
    p.jump("l4")
    p.label("ip4")
    p.load(R2, R9, _C_SLOW4, 1)
    p.jump_if(R2, "!=", 0, "next")
    p.alu_reg(R2, "=", R7)
    p.alu(R2, "+", _L3 + 24)
    p.jump_if_reg(R2, ">", R8, "next")
    p.load(R2, R7, _L3, 1)
    p.jump_if(R2, "!=", 0x45, "next")  # IP options: the daemon's
    p.load(R4, R7, _L3 + 9, 1)
    p.load(R5, R7, _L3 + 22, 2)
    p.label("l4")
    p.load(R2, R9, _C_L4, 1)
    p.jump_if(R2, "==", 0, "client")
    # the slow path's rules: (ethertype, protocol, any port) at r10-16, (..., this port) at r10-24
    for off, port in ((-16, None), (-24, R5)):
        p.store(R10, off, R1, 2)
        p.store(R10, off + 2, R4, 1)
        p.store_imm(R10, off + 3, 0 if port is None else 1, 1)
        if port is None:
            p.store_imm(R10, off + 4, 0, 4)
        else:
            p.store(R10, off + 4, port, 2)
            p.store_imm(R10, off + 6, 0, 2)
    for off in (-16, -24):
        _lookup(p, maps.rules, off)
        p.jump_if(R0, "!=", 0, "next")
    p.label("client")
    p.alu(R3, "=", 0)
    _key(p, INNER_OFF, R3)  # only for a client of ours (state True: not roamed away)
    _lookup(p, maps.local)
    p.jump_if(R0, "==", 0, "next")
    p.load(R1, R0, 0, 1)
    p.jump_if(R1, "!=", LOCAL_OURS, "next")
    p.load(R1, R9, _C_WATCH, 1)
    p.jump_if(R1, "==", 0, "deliver")
    p.alu(R3, "=", 0)
    _key(p, INNER_OFF + 6, R3)  # BLA: only from sources we claimed, marked seen
    _lookup(p, maps.watched)
    p.jump_if(R0, "==", 0, "next")
    p.alu_reg(R8, "=", R0)  # (the packet's bounds are checked: its end is no longer needed)
    p.call(ebpf.HELPER_KTIME_GET_NS)
    p.store(R8, 0, R0, 8)
    p.label("deliver")
    _count(p, maps.stats, _S_DELIVER, -UNICAST_PREFIX_LEN)
    for off, size in ((0, 4), (4, 4), (8, 4), (12, 2)):  # the inner Ethernet header over the outer
        p.load(R1, R7, INNER_OFF + off, size)
        p.store(R7, off, R1, size)
    p.load(R1, R9, _C_DEVICE, 4)
    p.alu(R2, "=", ebpf.REDIRECT_INGRESS)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()


def _count(p: ebpf.Program, stats: ebpf.Map, off: int, adjust: int) -> None:
    """Counts a frame and its bytes (the skb's length + `adjust`) at `off` of the per-CPU
    counters (no atomics needed)."""
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, stats)
    p.jump_if(R0, "==", 0, f"counted{off}")
    p.load(R1, R0, off, 8)
    p.alu(R1, "+", 1)
    p.store(R0, off, R1, 8)
    p.load(R1, R6, _SKB_LEN, 4)
    if adjust:
        p.alu(R1, "+", adjust)
    p.load(R2, R0, off + 8, 8)
    p.alu_reg(R2, "+", R1)
    p.store(R0, off + 8, R2, 8)
    p.label(f"counted{off}")


def strip_program(soft_ifindex: int, stats: ebpf.Map) -> bytes:
    """The delivery device's ingress program: the frame there starts with the inner
    Ethernet header (copied there by the first stage), so the stack took it for IPv4 or
    IPv6 and the 24 bytes behind that header (the rest of the outer frame) can go. Then
    into the soft interface, as if the host got it from the TAP."""
    p = ebpf.Program()
    p.alu_reg(R6, "=", R1)
    p.alu(R2, "=", -UNICAST_PREFIX_LEN)
    p.alu(R3, "=", ebpf.ADJ_ROOM_MAC)
    p.alu(R4, "=", 0)
    p.call(ebpf.HELPER_SKB_ADJUST_ROOM)
    p.jump_if(R0, "!=", 0, "failed")
    p.alu(R1, "=", soft_ifindex)
    p.alu(R2, "=", ebpf.REDIRECT_INGRESS)
    p.call(ebpf.HELPER_REDIRECT)
    p.exit()
    p.label("failed")
    p.store_imm(R10, -8, 0, 4)
    _lookup(p, stats)
    p.jump_if(R0, "==", 0, "drop")
    p.load(R1, R0, _S_STRIP_FAILED, 8)
    p.alu(R1, "+", 1)
    p.store(R0, _S_STRIP_FAILED, R1, 8)
    p.label("drop")
    p.alu(R0, "=", ebpf.TC_SHOT)
    p.exit()
    return p.assemble()


def _key(p: ebpf.Program, off: int, vid: int) -> None:
    """The 6-byte address at packet offset `off` and register `vid` as a map key at r10-8."""
    p.load(R1, R7, off, 4)
    p.store(R10, -8, R1, 4)
    p.load(R1, R7, off + 4, 2)
    p.store(R10, -4, R1, 2)
    p.store(R10, -2, vid, 2)


def _lookup(p: ebpf.Program, table: ebpf.Map, key: int = -8) -> None:
    """r0 = the value at the key at r10 + `key`, or 0."""
    p.load_imm64(R1, table.fd, map_fd=True)
    p.alu_reg(R2, "=", R10)
    p.alu(R2, "+", key)
    p.call(ebpf.HELPER_MAP_LOOKUP)


class Maps:
    """The kernel's copy of what the programs read."""

    def __init__(self) -> None:
        self._all: list[ebpf.Map] = []
        try:
            self.routes = self._new(ebpf.MAP_HASH, _KEY.size, _ROUTE.size, MAX_ROUTES, "batmand_routes")
            self.local = self._new(ebpf.MAP_HASH, _KEY.size, 1, MAX_LOCAL, "batmand_local")
            self.watched = self._new(ebpf.MAP_HASH, _KEY.size, 8, MAX_WATCHED, "batmand_watched")
            self.rules = self._new(ebpf.MAP_HASH, _RULE.size, 1, MAX_RULES, "batmand_rules")
            self.config = self._new(ebpf.MAP_ARRAY, 4, _CONFIG.size, 1, "batmand_config")
            self.stats = self._new(ebpf.MAP_PERCPU_ARRAY, 4, _STATS.size, 1, "batmand_fwd_stats")
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
        total = [0] * (_STATS.size // 8)
        for value in self.stats.lookup(b"\0\0\0\0") or ():
            total = [a + b for a, b in zip(total, _STATS.unpack(value))]
        return total

    def close(self) -> None:
        for table in self._all:
            table.close()


class DeliveryDevice:
    """Where delivered frames pass between the two stages: a TAP of the daemon's that
    nobody reads, up, without IPv6 (so the host sends nothing into it). Packet taps
    run before tc, so the half-made frames show only here, never on bat0. Not
    persistent: it goes with the daemon's descriptor, however the daemon ends."""

    def __init__(self, soft: str, stats: ebpf.Map) -> None:
        import pytun  # (only where delivery is on)

        self.name = soft[:11] + "-krx"
        self.tap = pytun.TunTapDevice(name=self.name, flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
        self.prog = self.link = -1
        try:
            try:
                with open(f"/proc/sys/net/ipv6/conf/{self.name}/disable_ipv6", "w") as f:
                    f.write("1")
            except OSError:
                pass  # (read-only /proc/sys: the host's few IPv6 frames wait unread in its queue)
            self.tap.up()
            self.ifindex = socket.if_nametoindex(self.name)
            self.prog = ebpf.load_program(strip_program(socket.if_nametoindex(soft), stats), "batmand_strip")
            self.link = ebpf.attach_ingress(self.prog, self.ifindex)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        for fd in (self.link, self.prog):
            if fd >= 0:
                ebpf.close(fd)
        self.link = self.prog = -1
        self.tap.close()


class KernelForward:
    """Keeps the kernel's copy of the forwarding table (routes toward originators, our
    clients, delivery's settings) and the programs on the hard interfaces in step with
    what the data plane is given: the same set_ports and apply calls."""

    def __init__(self, soft: str | None = None) -> None:
        """`soft`: the soft interface, to deliver to (None: forward only)."""
        self.origs: dict = {}  # the forwarding table's routes toward originators (its clients are not needed)
        self.ports: dict[str, tuple[bytes, int, int]] = {}  # name -> (mac, mtu, ifindex)
        self.wifi = False
        self.primary: bytes | None = None
        self.soft_up = False  # bat0 administratively up (else the daemon delivers, and counts the drops)
        self.links: dict[str, tuple[int, int]] = {}  # name -> (program fd, link fd)
        self.error: str | None = None  # why nothing is attached
        self.deliver_error: str | None = None  # why nothing is delivered, for good
        self.maps: Maps | None = None
        self.device: DeliveryDevice | None = None
        self._installed: set = set()  # originators in the routes map
        self._slow = SlowPath()
        self._rules: set[bytes] = set()  # in the rules map
        self._watched: dict[bytes, tuple] = {}  # in the watched map: key -> (mac, vid)
        self._seen: dict[bytes, int] = {}  # watched key -> the last time the program marked it
        self._before = [0] * (_STATS.size // 8)  # counters of maps closed by a reset
        try:
            self.maps = Maps()
        except OSError as exc:
            self._unavailable(exc)
            return
        if soft is not None:
            try:
                self.device = DeliveryDevice(soft, self.maps.stats)
            except OSError as exc:
                self.deliver_error = str(exc).splitlines()[0]
                log.info("delivery in the kernel is not available (%s): the daemon delivers every frame",
                         self.deliver_error)
        else:
            self.deliver_error = "no soft interface"
        self._write_config()

    def _unavailable(self, exc: OSError) -> None:
        self.error = str(exc).splitlines()[0]
        log.info("forwarding in the kernel is not available (%s): the daemon forwards every frame", self.error)
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
            if primary != self.primary:
                self.primary = primary
                self._write_config()
            if known == self.ports and wifi == self.wifi and self.links.keys() == known.keys():
                return  # (a link event that changed nothing of ours: no rewrite of every route)
            # gone, a new MAC, or the same name on a new interface: no route may point there
            # any more when its program goes (it is attached afresh if still ours)
            stale = [n for n in self.links if n not in known or known[n][::2] != self.ports[n][::2]]
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

    def set_soft_up(self, up: bool) -> None:
        if self.active and up != self.soft_up:
            self.soft_up = up
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
                if state is None:
                    self.maps.local.delete(_KEY.pack(bytes(mac), vid))
                else:
                    self.maps.local.update(_KEY.pack(bytes(mac), vid),
                                           bytes((LOCAL_OURS if state is True else LOCAL_LEAVING,)))
            self._sync_routes(update.origs)
            if update.slow_path is not None and update.slow_path != self._slow:
                self._set_slow_path(update.slow_path)
        except OSError as exc:  # the kernel refused a change: better no program than a wrong one
            self._unavailable(exc)

    def _sync_routes(self, origs) -> None:
        """Write the routes toward `origs` as the table has them now."""
        for orig in origs:
            entry = self._entry(orig)
            key = _KEY.pack(bytes(orig), 0)
            if entry is not None:
                try:
                    self.maps.routes.update(key, entry)
                    self._installed.add(orig)
                    continue
                except OSError as exc:
                    if exc.errno != errno.E2BIG:
                        raise
                    # the map is full: the daemon forwards toward this one
            if orig in self._installed:
                self.maps.routes.delete(key)
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

    # --- delivery ---------------------------------------------------------------------------------

    def _set_slow_path(self, slow: SlowPath) -> None:
        """The core's slow-path rules toward the host as the program reads them."""
        self._slow = slow
        rules = {_RULE.pack(r.ethertype.to_bytes(2, "big"), r.ip_proto, r.dst_port is not None,
                            (r.dst_port or 0).to_bytes(2, "big"))
                 for r in slow.rules if r.direction == TO_HOST and r.ip_proto is not None
                 and r.ethertype in (_ETH_P_IP, _ETH_P_IPV6)}
        for key in rules - self._rules:  # (new rules first: never fewer than either set in between)
            self.maps.rules.update(key, b"\x01")
        for key in self._rules - rules:
            self.maps.rules.delete(key)
        self._rules = rules
        watched = {_KEY.pack(bytes(mac), vid): (mac, vid) for mac, vid in slow.to_host_sources or ()}
        for key in [k for k in self._watched if k not in watched]:
            self.maps.watched.delete(key)
            del self._watched[key]
            self._seen.pop(key, None)
        for key, source in watched.items():
            if key not in self._watched:
                try:
                    self.maps.watched.update(key, bytes(8))
                except OSError as exc:
                    if exc.errno != errno.E2BIG:
                        raise
                    break  # full: not all of them watched, so nothing delivered (_write_config)
                self._watched[key] = source
        self._write_config()

    def _deliver_blocked(self) -> str | None:
        """Why the daemon must deliver every frame for us now (None: the kernel may)."""
        slow = self._slow
        if self.device is None:
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

    def _write_config(self) -> None:
        if self.maps is None:
            return
        rules = [r for r in self._slow.rules if r.direction == TO_HOST]
        slow4, slow6 = ({r.ethertype for r in rules if r.ip_proto is None} & {t} for t in (_ETH_P_IP, _ETH_P_IPV6))
        on = self._deliver_blocked() is None
        config = _CONFIG.pack(self.primary or bytes(6), on, self._slow.to_host_sources is not None, bool(self._rules),
                              bool(slow4), bool(slow6), self.device.ifindex if self.device else 0)
        self.maps.config.update(b"\0\0\0\0", config)

    def take_seen(self) -> dict:
        """The watched sources the kernel delivered from since the last call: (mac, vid) -> time
        (time.monotonic's clock)."""
        seen = {}
        if self.maps is None:
            return seen
        for key, source in self._watched.items():
            value = self.maps.watched.lookup(key)
            if value is None:
                continue
            when = int.from_bytes(value, sys.byteorder)
            if when and when != self._seen.get(key):
                self._seen[key] = when
                seen[source] = when / 1e9
        return seen

    # --- programs ---------------------------------------------------------------------------------

    def _attach(self, name: str, mac: bytes, ifindex: int) -> None:
        prog = ebpf.load_program(program(mac, self.maps), "batmand_fwd")
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

    def _counters(self) -> list[int]:
        if self.maps is None:
            return list(self._before)
        return [a + b for a, b in zip(self._before, self.maps.counters())]

    def counters(self) -> dict:
        """What the kernel forwarded and delivered for us, as `batctl s` counts them (the
        daemon's own come on top)."""
        forward, forward_bytes, rx, rx_bytes, _failed = self._counters()
        return {"forward": forward, "forward_bytes": forward_bytes, "rx": rx, "rx_bytes": rx_bytes}

    def status(self) -> dict:
        blocked = self._deliver_blocked() if self.active else self.error
        return {"interfaces": sorted(self.links), "routes": len(self._installed), "error": self.error,
                "deliver": blocked or "on", "deliver_failed": self._counters()[4]}

    def close(self) -> None:
        for name in list(self.links):
            self._detach(name)
        if self.device is not None:
            self.device.close()
            self.device = None
        if self.maps is not None:
            self._before = self._counters()
            self.maps.close()
            self.maps = None
        self._installed.clear()
