"""One data-plane engine: moves unicast frames between a TAP queue and the hard
interfaces using only the forwarding table the protocol core publishes. A worker
process runs one; `--workers 0` runs one inside the control process.

What to do with a frame is decided by decision.py's pure functions (cached here per
frame headers until the tables change). Whatever they cannot settle with certainty
(broadcast, unknown clients, stale TT versions, Wi-Fi forwarding, what the core's
slow-path rules claim), and frames too big for the link, go to the slow path, the
protocol core, which applies the kernel's full rules. Frames handed to the slow path
always carry complete checksums.

Offloads (each switchable): the TAP speaks virtio-net headers; TSO super-frames read
from it are cut into MTU segments here (`tso`); checksums the host left partial travel
on as partial to the next kernel (`csum_offload`, PACKET_VNET_HDR on the sending
socket); and TCP segments delivered to the host in one batch are coalesced (`gro`)."""

from __future__ import annotations

import io
import logging
import os
import struct
import time

from batmand.core.forwarding import FROM_HOST, TO_HOST, ForwardingTable
from batmand.wire.fastpath import DEST_OFF, TTL_OFF, UNICAST_PREFIX_LEN, VLAN_ETHERTYPE, unicast_prefix

from . import offload
from .decision import (DELIVER, ETH_HEADER_LEN, HOST_IP4_KEY, HOST_KEY_MIN, IP4_MARK, MESH_IP4_KEY, MESH_KEY_MIN, SLOW,
                       DeliverSeen, Forward, decide_host, decide_mesh, eth_fields, host_key, mesh_key)
from .rings import TP_STATUS_CSUM_VALID, TP_STATUS_CSUMNOTREADY, RxRing, TxRing, error_name

log = logging.getLogger("batmand")

BATCH = 64  # frames per wake-up before the engine looks at its control messages again
DECISION_CACHE = 4096  # cached forwarding decisions per hard interface
SELECTIVE_FORGET = 512  # beyond this many cached decisions a route change forgets them all
VNET = offload.VNET_HDR_LEN
_VNET = offload.VNET_HDR
_CSUM_FIELDS = struct.Struct("=HH")  # csum_start, csum_offset at offset 6 of a vnet header
_NEEDS_CSUM = offload.VIRTIO_NET_HDR_F_NEEDS_CSUM
_DATA_VALID = offload.VIRTIO_NET_HDR_F_DATA_VALID
_GSO_NONE = offload.GSO_NONE
# a partial checksum from the mesh must start in the inner frame's payload, past our header
_INNER_L3 = UNICAST_PREFIX_LEN + 14


class Port:
    """A hard interface as the engine sees it: its receive ring and its transmit ring."""

    def __init__(self, name: str, mac: bytes, mtu: int, rx: RxRing, tx: TxRing) -> None:
        self.name = name
        self.mac = mac
        self.mtu = mtu
        self.rx = rx
        self.tx = tx
        self.decisions: dict = {}  # decision.mesh_key of a received frame -> Engine._decide()
        # A socket with a TX ring sends only from its ring, so a lone frame goes out by a
        # plain send on the receive socket (bound to the interface, through the same qdisc):
        # no slot to fill and no kick. `direct_vnet` goes in front of the transmit ring's
        # headers when only the receive socket takes a vnet header; None: no plain sends.
        self.direct_vnet = b"" if rx.vnet_hdr == tx.vnet_hdr else offload.VNET_PLAIN if rx.vnet_hdr else None

    def send_direct(self, head: bytes, frame) -> bool:
        """Send one frame (`head` as for the transmit ring) at once. False: it was not sent
        (frames wait in the ring, which they must not overtake; the socket's buffer is full;
        the interface is down), and the transmit ring takes it with its own rules."""
        if self.direct_vnet is None or self.tx.pending:
            return False
        try:
            self.rx.sock.sendmsg((self.direct_vnet + head, frame) if self.direct_vnet else (head, frame))
        except OSError:
            return False
        return True


def table_sizes(table: ForwardingTable) -> dict:
    """Entries in a forwarding table (batmanctl dp: every worker's next to the control process's)."""
    return {"origs": len(table.origs), "clients": len(table.clients), "local_clients": len(table.local_clients)}


def tap_accepts_udp_gso(release: str | None = None) -> bool:
    """A TAP takes GSO_UDP_L4 frames on write from Linux 6.2 (virtio-net USO); older
    kernels refuse them, so UDP datagrams are then written one by one."""
    try:
        major, minor = (int(x) for x in (release or os.uname().release).split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 2)


class HostRoute:
    """A cached fast-path decision for frames from the host with given addresses: the
    port, the 24-byte prefix, the ready transmit-ring heads, and use since the last look."""

    __slots__ = ("port", "prefix", "client", "dest", "hits", "plain_head", "partial_heads")

    def __init__(self, port: Port, prefix: bytes, client: tuple, dest: tuple) -> None:
        self.port = port
        self.prefix = prefix
        self.client = client
        self.dest = dest  # (mac, vid) of the client the frames go to
        self.hits = 0
        self.plain_head = offload.VNET_PLAIN + prefix if port.tx.vnet_hdr else prefix
        self.partial_heads: dict = {}  # (csum_start, csum_offset) -> partial_head()

    def partial_head(self, csum_start: int, csum_offset: int) -> bytes:
        """vnet header (NEEDS_CSUM, the offsets moved by our prefix) + prefix, for a frame
        whose checksum the host left partial at these offsets."""
        key = (csum_start, csum_offset)
        head = self.partial_heads.get(key)
        if head is None:
            head = _VNET.pack(_NEEDS_CSUM, 0, 0, 0, csum_start + UNICAST_PREFIX_LEN, csum_offset) + self.prefix
            if len(self.partial_heads) < 64:
                self.partial_heads[key] = head
        return head


class Engine:
    def __init__(self, tap_fd: int, slow_host, slow_mesh, *, gro: bool = True, csum_offload: bool = True) -> None:
        self.tap_fd = tap_fd
        self.slow_host = slow_host  # frame -> None: a frame from the host for the core
        self.slow_mesh = slow_mesh  # (ifname, frame) -> None: a frame from the mesh for the core
        self.gro = gro
        self.csum_offload = csum_offload
        self.fwd = ForwardingTable()
        self.ports: dict[str, Port] = {}
        self.primary: bytes | None = None
        self.wifi = False
        self.coalescer = offload.Coalescer(udp=gro and tap_accepts_udp_gso())
        self._read_buf = bytearray(VNET + 65536)
        self._read_view = memoryview(self._read_buf)
        # readinto returns None when the queue is empty: no exception per batch, as os.readv's
        self._tap_readinto = io.FileIO(tap_fd, "rb", closefd=False).readinto if tap_fd >= 0 else None
        self._host_cache: dict = {}  # decision.host_key of a host frame -> HostRoute
        self._host_l4 = self._mesh_l4 = False  # the keys include the IP protocol and port (slow-path rules)
        self._host_ports = self._mesh_ports = frozenset()  # protocols whose port a rule reads
        self._tap_lone = True  # the last TAP wake-up read at most one frame
        self.counters = dict.fromkeys(
            ("tx", "tx_bytes", "rx", "rx_bytes", "forward", "forward_bytes", "slow_host", "slow_mesh",
             "tso_frames", "tso_segments", "gro_merged", "gro_written", "tap_write_dropped", "tx_ring_full",
             "bad_gso", "truncated", "rx_batches", "rx_unicast", "drop_bad_csum"), 0)
        self._seen: dict = {}

    # --- tables ---------------------------------------------------------------------------------

    def apply(self, update) -> None:
        self.fwd.apply(update)
        if update.local_clients or update.own_ttvn is not None or update.slow_path is not None:
            self._forget_decisions()  # every decision may read these
        else:
            self._forget_routes(update.origs, update.clients)

    def _forget_routes(self, origs: dict, clients: dict) -> None:
        """Only originators' routes and clients' originators changed (a router switch, a
        client that moved: in a large mesh many times a second): forget the decisions that
        read them, keep the others. Large caches are forgotten whole, which costs less than
        looking through them."""
        host, ports = self._host_cache, self.ports.values()
        if len(host) > SELECTIVE_FORGET or any(len(p.decisions) > SELECTIVE_FORGET for p in ports):
            self._forget_decisions()
            return
        self._take_cache_hits()  # what the forgotten ones were used for is not lost
        for key in [k for k, route in host.items()
                    if route.prefix[DEST_OFF:DEST_OFF + 6] in origs or route.dest in clients]:
            del host[key]
        for port in ports:
            # a mesh decision reads the route toward the frame's destination originator (a
            # key starts with our header; the fast IPv4 key is a tuple whose first item
            # does), never the clients' originators
            decisions = port.decisions
            for key in [k for k in decisions if (k[0] if k.__class__ is tuple else k)[DEST_OFF:DEST_OFF + 6] in origs]:
                del decisions[key]

    def set_table(self, table: ForwardingTable) -> None:
        """A whole new forwarding table (a restart's or a resync's)."""
        self.fwd = table
        self._forget_decisions()

    def _forget_decisions(self) -> None:
        self._take_cache_hits()
        self._host_cache.clear()
        for port in self.ports.values():
            port.decisions.clear()
        self._host_l4 = self.fwd.slow_path.l4(FROM_HOST)
        self._mesh_l4 = self.fwd.slow_path.l4(TO_HOST)
        self._host_ports = self.fwd.slow_path.port_protos(FROM_HOST)
        self._mesh_ports = self.fwd.slow_path.port_protos(TO_HOST)

    def set_ports(self, ports: dict[str, tuple[bytes, int]], primary: bytes | None, wifi: bool) -> None:
        """Interface addresses and MTUs changed (rings are attached with add_port)."""
        for name, (mac, mtu) in ports.items():
            port = self.ports.get(name)
            if port is not None:
                port.mac, port.mtu = mac, mtu
        # while the primary interface is down, nothing addressed to our originator is ours
        # (batadv_is_my_mac only knows active interfaces): decide_mesh then delivers nothing
        self.primary = primary if any(mac == primary for mac, _mtu in ports.values()) else None
        self.wifi = wifi
        self._forget_decisions()

    def add_port(self, port: Port) -> None:
        self.remove_port(port.name)
        self.ports[port.name] = port
        self._forget_decisions()

    def remove_port(self, name: str) -> Port | None:
        port = self.ports.pop(name, None)
        self._forget_decisions()  # decisions elsewhere may point at this port
        return port

    def _take_cache_hits(self) -> None:
        now = time.monotonic()
        for route in self._host_cache.values():
            if route.hits:
                self._seen[route.client] = now
        for port in self.ports.values():  # sources delivered to the host the core watches
            for decision in port.decisions.values():
                if decision.__class__ is DeliverSeen and decision.hits:
                    self._seen[decision.client] = now
                    decision.hits = 0

    def take_seen(self) -> dict:
        """Local clients that sent through the fast path since the last call, and the sources
        the core watches that it delivered: (mac, vid) -> time."""
        self._take_cache_hits()
        for route in self._host_cache.values():
            route.hits = 0
        seen, self._seen = self._seen, {}
        return seen

    # --- host -> mesh ------------------------------------------------------------------------------

    def on_tap(self) -> None:
        """Read a batch from the TAP queue: encapsulate what the table knows, cut TSO
        super-frames first, hand the rest to the slow path."""
        touched = set()
        try:
            self._on_tap(touched)
        except Exception:
            self._internal_error()
        finally:
            self._flush(touched)

    def _on_tap(self, touched: set) -> None:
        buf, view, readinto = self._read_buf, self._read_view, self._tap_readinto
        cache, counters = self._host_cache, self.counters
        offloading, l4, header_len, short = self.csum_offload, self._host_l4, ETH_HEADER_LEN, VNET + HOST_KEY_MIN
        ip4_key, ip4_len = HOST_IP4_KEY.unpack_from, VNET + HOST_IP4_KEY.size
        sent = sent_bytes = 0
        # While frames come one per wake-up, the first leaves at once by a plain send rather
        # than after the read that says EAGAIN; in a stream they share one ring kick.
        lone = self._tap_lone
        i = 0
        for i in range(BATCH):
            try:
                n = readinto(buf)
            except OSError as exc:  # the queue is detached or the TAP going away
                self._count("tap_read_error_" + error_name(exc.errno))
                break
            if n is None:  # EAGAIN: the queue is empty
                break
            if n < short:
                self._short_from_host(n)
                continue
            if buf[1] != _GSO_NONE:
                _flags, gso_type, _hdr_len, gso_size, csum_start, _offset = _VNET.unpack_from(buf)
                self._from_host_gso(view[VNET:n], gso_type, gso_size, csum_start, touched)
                continue
            needs_csum = buf[0] & _NEEDS_CSUM
            if needs_csum:
                csum = _CSUM_FIELDS.unpack_from(buf, 6)
                csum_start, csum_offset = csum
                if csum_start + csum_offset + 2 > n - VNET:
                    counters["drop_bad_csum"] += 1
                    continue
            frame = view[VNET:n]
            # host_key, inline: the Ethernet header, with its tag (with an L4 rule: decision.host_key_ip4)
            if not l4:
                key = bytes(buf[VNET:VNET + header_len[buf[VNET + 12]]])
            elif n >= ip4_len and buf[VNET + 12:VNET + 15] == IP4_MARK:
                key = ip4_key(buf, VNET)
            else:
                key = host_key(frame, True, self._host_ports)
            route = cache.get(key)
            if route is None:
                route = self._host_route(frame, key)
            if route is not None and n - VNET + UNICAST_PREFIX_LEN - 14 <= route.port.mtu:
                if not needs_csum:
                    head = route.plain_head
                elif offloading:  # the checksum stays as the host left it, for the next kernel
                    head = route.partial_heads.get(csum) or route.partial_head(csum_start, csum_offset)
                else:  # the next kernel will not finish it: do it here
                    frame = bytearray(frame)
                    offload.finish_checksum(frame, csum_start, csum_offset)
                    head = route.plain_head
                port = route.port
                if (lone and not i and port.send_direct(head, frame)) or port.tx.put((head, frame),
                                                                                     len(head) + n - VNET):
                    route.hits += 1
                    touched.add(port)
                    sent += 1
                    sent_bytes += n - VNET
                else:
                    counters["tx_ring_full"] += 1
                continue
            self._to_slow_host(frame, (csum_start, csum_offset) if needs_csum else None)
        self._tap_lone = i <= 1
        counters["tx"] += sent
        counters["tx_bytes"] += sent_bytes

    def _flush(self, ports) -> None:
        """Send what the transmit rings of these ports queued; count failed sends."""
        counters = self.counters
        for port in ports:
            tx = port.tx
            tx.flush()
            if tx.errors:
                for name, n in tx.errors.items():
                    key = "tx_ring_error_" + name
                    counters[key] = counters.get(key, 0) + n
                tx.errors.clear()

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def _internal_error(self) -> None:
        """A bug met by some frame: never the end of the worker (its ring slots are
        released; a restarted worker would only meet the same frame again)."""
        self._count("internal_error")
        if self.counters["internal_error"] == 1:
            log.exception("data-plane error (counted as internal_error; later ones are only counted)")

    def _from_host_gso(self, frame, gso_type: int, gso_size: int, csum_start: int, touched: set) -> None:
        """A TSO super-frame: cut it into MTU segments. When the table knows the route
        (all segments share the addresses) they go straight into the transmit ring as
        (our headers, their headers, payload), never joined; else all to the slow path."""
        l2 = 18 if frame[12:14] == VLAN_ETHERTYPE else 14
        try:
            parts = offload.segment_parts(frame, gso_type, gso_size, self.csum_offload, l2, csum_start=csum_start)
        except (ValueError, struct.error):
            self.counters["bad_gso"] += 1
            return
        self.counters["tso_frames"] += 1
        self.counters["tso_segments"] += len(parts)
        key = host_key(frame, self._host_l4, self._host_ports)
        route = self._host_cache.get(key) or self._host_route(frame, key)
        if route is None or len(parts[0][0]) + gso_size + UNICAST_PREFIX_LEN - 14 > route.port.mtu:
            csum = (csum_start, 16) if self.csum_offload else None  # the TCP checksum, left partial
            for headers, payload in parts:
                self._to_slow_host(headers + payload, csum)
            return
        port = route.port
        head = route.partial_head(csum_start, 16) if self.csum_offload else route.plain_head
        put = port.tx.put
        sent = sent_bytes = 0
        for headers, payload in parts:
            size = len(headers) + len(payload)
            if put((head, headers, payload), len(head) + size):
                sent += 1
                sent_bytes += size
        route.hits += sent
        touched.add(port)
        self.counters["tx"] += sent
        self.counters["tx_bytes"] += sent_bytes
        self.counters["tx_ring_full"] += len(parts) - sent

    def _short_from_host(self, n: int) -> None:
        """A frame from the TAP shorter than a decision's key: the core decides (nothing
        at all is a runt)."""
        buf = self._read_buf
        if n <= VNET:
            self._count("drop_tap_runt")
            return
        csum = _CSUM_FIELDS.unpack_from(buf, 6) if buf[0] & _NEEDS_CSUM else None
        if csum is not None and csum[0] + csum[1] + 2 > n - VNET:
            self.counters["drop_bad_csum"] += 1
            return
        self._to_slow_host(self._read_view[VNET:n], csum)

    def _to_slow_host(self, frame, csum: tuple[int, int] | None) -> None:
        """A host frame for the core, its checksum completed (csum: where the host left it partial)."""
        whole = bytearray(frame)
        if csum is not None:
            offload.finish_checksum(whole, *csum)
        self.counters["slow_host"] += 1
        self.slow_host(bytes(whole))

    def _host_route(self, frame, key: bytes) -> HostRoute | None:
        """decide_host's answer as a route with its ready headers, cached by the frame's
        key (decision.host_key); None: the slow path (not cached: the core may learn the
        client any moment, and every table change clears the cache anyway)."""
        if key.__class__ is tuple and key[1] not in self._host_ports:
            key = key[:2]  # narrowed on a miss only: a stream's hits cost nothing more
            route = self._host_cache.get(key)
            if route is not None:
                return route
        decision = decide_host(frame, self.fwd)
        if decision is SLOW:
            return None
        port = self.ports.get(decision.iface)
        if port is None:
            return None
        dst, _src, vid, _ethertype, _l3 = eth_fields(frame, 0)  # (decide_host read them)
        route = HostRoute(port, unicast_prefix(decision.next_hop, port.mac, decision.orig, decision.ttvn),
                          decision.client, (dst, vid))
        if len(self._host_cache) >= DECISION_CACHE:
            self._take_cache_hits()
            self._host_cache.clear()  # the host varying addresses cannot grow it
        self._host_cache[key] = route
        return route

    # --- mesh -> host / next hop -----------------------------------------------------------------

    def _decide(self, port: Port, frame) -> object:
        """decide_mesh's answer for a frame from `port`, with a Forward turned into (out
        port, its new outer addresses); SLOW when the out port is not ours (yet)."""
        decision = decide_mesh(frame, port.mac, self.primary, self.fwd, self.wifi)
        if decision.__class__ is not Forward:
            return decision
        out = self.ports.get(decision.iface)
        return SLOW if out is None else (out, bytes(decision.next_hop) + out.mac)

    def _mesh_decision(self, port: Port, frame, key) -> object:
        """_decide's answer for a frame whose key missed port.decisions, cached. The fast
        IPv4 key of a protocol whose port no rule reads (ICMP: its checksum sits there) is
        narrowed to (headers, protocol) first, here on a miss only, so a stream's hits cost
        nothing more."""
        decisions = port.decisions
        if key.__class__ is tuple and key[1] not in self._mesh_ports:
            key = key[:2]
            decision = decisions.get(key)
            if decision is not None:
                return decision
        decision = self._decide(port, frame)
        if len(decisions) >= DECISION_CACHE:
            decisions.clear()  # a peer varying addresses cannot grow it
        decisions[key] = decision
        return decision

    def on_port(self, port: Port) -> None:
        """A batch of UNICAST frames from a hard interface's ring: deliver (through the
        coalescer) or forward in place; the rest to the slow path. Whatever happens, the
        batch's slots go back to the kernel."""
        touched = set()
        try:
            if self._on_port(port, touched):
                # The host often answers a lone frame inside our TAP write (a ping, a request):
                # the answer is read now, before the bookkeeping and the trip through the event
                # loop. (A lone frame went past the coalescer: it has nothing to flush.)
                self.on_tap()
            elif self.gro:
                self._flush_gro()
        except Exception:
            self._internal_error()
            self.coalescer = offload.Coalescer(udp=self.coalescer.udp)  # it may hold views of the slots
        finally:
            port.rx.release()
        if port.rx.crowded and port.rx.drained and port.rx.grow():
            self._count("rx_ring_grown")
            log.info("%s: receive ring grown to %d slots after a burst", port.name, port.rx.frame_nr)
        self._flush(touched)

    def _on_port(self, port: Port, touched: set) -> bool:
        ring = port.rx
        view = ring.view
        counters = self.counters
        coalesce = self.gro
        coalescer = self.coalescer
        tap = self.tap_fd
        decisions = port.decisions
        l4, short, ttl_off = self._mesh_l4, MESH_KEY_MIN, TTL_OFF
        ip4_key, ip4_len, mark = MESH_IP4_KEY.unpack_from, MESH_IP4_KEY.size, UNICAST_PREFIX_LEN + 12
        batch = ring.frames(BATCH)
        # the coalescer is empty between batches: a lone frame has nothing to merge with,
        # and is written at once rather than parsed, copied and queued
        coalesce = coalesce and len(batch) > 1
        counters["rx_batches"] += 1
        if ring.truncated:
            counters["truncated"] += ring.truncated
            ring.truncated = 0
        delivered = forwarded = delivered_bytes = forwarded_bytes = 0
        lone = False  # a frame went to the TAP at once (a lone one; without gro, any)
        for off, length, status in batch:
            if status & TP_STATUS_CSUMNOTREADY:
                _f, _g, _h, _s, csum_start, csum_offset = _VNET.unpack_from(view, off - VNET)
                if csum_start < _INNER_L3 or csum_start + csum_offset + 2 > length:
                    counters["drop_bad_csum"] += 1  # its sender (a VM, a container) pointed it into our header
                    continue
            if length < short:
                decision = SLOW  # shorter than a decision's key: the core decides
            else:
                # mesh_key, inline (with an L4 rule: decision.mesh_key_ip4)
                if not l4:
                    key = bytes(view[off:off + short])
                elif length >= ip4_len and view[off + mark:off + mark + 3] == IP4_MARK:
                    key = ip4_key(view, off)
                else:
                    key = mesh_key(view[off:off + length], True, self._mesh_ports)
                decision = decisions.get(key)
                if decision is None:
                    decision = self._mesh_decision(port, view[off:off + length], key)
            if decision.__class__ is DeliverSeen:
                decision.hits += 1
                decision = DELIVER
            if decision is DELIVER:
                delivered += 1
                delivered_bytes += length - UNICAST_PREFIX_LEN
                if status & TP_STATUS_CSUMNOTREADY:
                    csum, csum_start = offload.CSUM_PARTIAL, csum_start - UNICAST_PREFIX_LEN
                elif status & TP_STATUS_CSUM_VALID:
                    csum, csum_start, csum_offset = offload.CSUM_VALID, 0, 0
                else:
                    csum, csum_start, csum_offset = offload.CSUM_UNKNOWN, 0, 0
                if coalesce:
                    coalescer.add(view[off + UNICAST_PREFIX_LEN:off + length], csum, csum_start, csum_offset)
                    continue
                # the 10 bytes in front of the inner frame (batman header) become its vnet header
                if csum == offload.CSUM_PARTIAL:
                    _VNET.pack_into(view, off + 14, _NEEDS_CSUM, 0, 0, 0, csum_start, csum_offset)
                else:
                    _VNET.pack_into(view, off + 14, _DATA_VALID if csum == offload.CSUM_VALID else 0, 0, 0, 0, 0, 0)
                try:
                    os.write(tap, view[off + 14:off + length])
                    lone = True
                except BlockingIOError:
                    counters["tap_write_dropped"] += 1
                except OSError as exc:  # EIO: bat0 is down
                    self._count("drop_tap_write_" + error_name(exc.errno))
                if self.gro:
                    counters["gro_written"] += 1  # a TAP write of the GRO stage, with nothing merged
                continue
            if decision is SLOW:
                if coalesce:
                    self._flush_gro()  # a flow's earlier segments go to the host first
                self._to_slow_mesh(port, view, off, length, status)
                continue
            out, addresses = decision
            if length - 14 > out.mtu:
                self._to_slow_mesh(port, view, off, length, status)  # the core fragments it
                continue
            view[off:off + 12] = addresses
            view[off + ttl_off] -= 1
            tx = out.tx
            if tx.vnet_hdr:
                ok = tx.put((view[off - VNET:off + length],), VNET + length) if status & TP_STATUS_CSUMNOTREADY \
                    else tx.put((offload.VNET_PLAIN, view[off:off + length]), VNET + length)
            else:
                if status & TP_STATUS_CSUMNOTREADY:
                    _finish_rx_checksum(view, off, view[off:off + length])
                ok = tx.put((view[off:off + length],), length)
            if ok:
                touched.add(out)
                forwarded += 1
                forwarded_bytes += length
            else:
                counters["tx_ring_full"] += 1
        counters["rx_unicast"] += delivered + forwarded
        counters["rx"] += delivered
        counters["rx_bytes"] += delivered_bytes
        counters["forward"] += forwarded
        counters["forward_bytes"] += forwarded_bytes
        return lone

    def port_error(self, port: Port) -> bool:
        """Read, clear and count the receive socket's pending error: ENETDOWN when the
        interface went down, which poll reports (POLLERR) until it is read. The ring
        stays; the kernel attaches it again when the interface comes back up."""
        error = port.rx.take_error()
        if error:
            key = "rx_ring_error_" + error_name(error)
            self.counters[key] = self.counters.get(key, 0) + 1
        return bool(error)

    def _flush_gro(self) -> None:
        coalescer, counters, tap = self.coalescer, self.counters, self.tap_fd
        merged_before = coalescer.merged
        for item in coalescer.flush():
            try:
                os.write(tap, item)
            except BlockingIOError:
                counters["tap_write_dropped"] += _frames_in(item)
            except OSError as exc:  # EIO: bat0 is down
                key = "drop_tap_write_" + error_name(exc.errno)
                counters[key] = counters.get(key, 0) + _frames_in(item)
            counters["gro_written"] += 1
        counters["gro_merged"] += coalescer.merged - merged_before

    def _to_slow_mesh(self, port: Port, view, off: int, length: int, status: int) -> None:
        frame = bytearray(view[off:off + length])
        if status & TP_STATUS_CSUMNOTREADY:
            _finish_rx_checksum(view, off, frame)
        self.counters["slow_mesh"] += 1
        self.slow_mesh(port.name, bytes(frame))


def _frames_in(item) -> int:
    """How many received frames a TAP write (vnet header + frame) carries: GRO merges them."""
    _f, gso_type, hdr_len, gso_size, _s, _o = _VNET.unpack_from(item)
    if gso_type == _GSO_NONE or not gso_size:
        return 1
    return -(-(len(item) - VNET - hdr_len) // gso_size)


def _finish_rx_checksum(view, off: int, frame) -> None:
    """Complete, in `frame`, a checksum its sender left partial (TP_STATUS_CSUMNOTREADY);
    the receive ring's vnet header in front of the frame at `off` says where it is (the
    offsets were checked when the frame was taken from the ring)."""
    _f, _g, _h, _s, csum_start, csum_offset = _VNET.unpack_from(view, off - VNET)
    offload.finish_checksum(frame, csum_start, csum_offset)
