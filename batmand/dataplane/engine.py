"""One data-plane engine: moves unicast frames between a TAP queue and the hard
interfaces using only the forwarding table the protocol core publishes. A worker
process runs one; `--workers 0` runs one inside the control process.

Whatever the engine cannot handle with certainty (broadcast, unknown clients, stale TT
versions, frames too big for the link, Wi-Fi forwarding) goes to the slow path, the
protocol core, which applies the kernel's full rules. Frames handed to the slow path
always carry complete checksums.

Offloads (each switchable): the TAP speaks virtio-net headers; TSO super-frames read
from it are cut into MTU segments here (`tso`); checksums the host left partial travel
on as partial to the next kernel (`csum_offload`, PACKET_VNET_HDR on the sending
socket); and TCP segments delivered to the host in one batch are coalesced (`gro`)."""

from __future__ import annotations

import logging
import os
import struct
import time

from batmand.core.bitarray import seq_before8
from batmand.core.forwarding import ForwardingTable
from batmand.wire.fastpath import UNICAST_PREFIX_LEN, unicast_prefix

from . import offload
from .rings import TP_STATUS_CSUM_VALID, TP_STATUS_CSUMNOTREADY, RxRing, TxRing, error_name

log = logging.getLogger("batmand")

BATCH = 64  # frames per wake-up before the engine looks at its control messages again
DECISION_CACHE = 4096  # cached forwarding decisions per hard interface
# what a decision depends on: our 24-byte header, the inner addresses, a VLAN tag and the
# ethertype behind it
DECISION_KEY = UNICAST_PREFIX_LEN + 18
DELIVER, SLOW = "deliver", "slow"
_BATMAN = b"\x43\x05"
_VLAN = b"\x81\x00"
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
        self.decisions: dict = {}  # first DECISION_KEY bytes of a received frame -> Engine._decide()


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

    __slots__ = ("port", "prefix", "client", "hits", "plain_head", "_partial_heads")

    def __init__(self, port: Port, prefix: bytes, client: tuple) -> None:
        self.port = port
        self.prefix = prefix
        self.client = client
        self.hits = 0
        self.plain_head = offload.VNET_PLAIN + prefix if port.tx.vnet_hdr else prefix
        self._partial_heads: dict = {}

    def partial_head(self, csum_start: int, csum_offset: int) -> bytes:
        """vnet header (NEEDS_CSUM, the offsets moved by our prefix) + prefix, for a frame
        whose checksum the host left partial at these offsets."""
        key = (csum_start, csum_offset)
        head = self._partial_heads.get(key)
        if head is None:
            head = _VNET.pack(_NEEDS_CSUM, 0, 0, 0, csum_start + UNICAST_PREFIX_LEN, csum_offset) + self.prefix
            if len(self._partial_heads) < 64:
                self._partial_heads[key] = head
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
        self._host_cache: dict = {}  # first 16 bytes of a host frame -> HostRoute
        self.counters = dict.fromkeys(
            ("tx", "tx_bytes", "rx", "rx_bytes", "forward", "forward_bytes", "slow_host", "slow_mesh",
             "tso_frames", "tso_segments", "gro_merged", "gro_written", "tap_write_dropped", "tx_ring_full",
             "bad_gso", "truncated", "rx_batches", "rx_unicast", "drop_bad_csum"), 0)
        self._seen: dict = {}

    # --- tables ---------------------------------------------------------------------------------

    def apply(self, update) -> None:
        self.fwd.apply(update)
        self._forget_decisions()

    def set_table(self, table: ForwardingTable) -> None:
        """A whole new forwarding table (a restart's or a resync's)."""
        self.fwd = table
        self._forget_decisions()

    def _forget_decisions(self) -> None:
        self._take_cache_hits()
        self._host_cache.clear()
        for port in self.ports.values():
            port.decisions.clear()

    def set_ports(self, ports: dict[str, tuple[bytes, int]], primary: bytes | None, wifi: bool) -> None:
        """Interface addresses and MTUs changed (rings are attached with add_port)."""
        for name, (mac, mtu) in ports.items():
            port = self.ports.get(name)
            if port is not None:
                port.mac, port.mtu = mac, mtu
        self.primary = primary
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

    def take_seen(self) -> dict:
        """Local clients that sent through the fast path since the last call: (mac, vid) -> time."""
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
        buf, view, fd = self._read_buf, self._read_view, self.tap_fd
        readv, bufs, cache = os.readv, (buf,), self._host_cache
        offloading = self.csum_offload
        sent = sent_bytes = 0
        for _ in range(BATCH):
            try:
                n = readv(fd, bufs)
            except BlockingIOError:
                break
            except OSError as exc:  # the queue is detached or the TAP going away
                self._count("tap_read_error_" + error_name(exc.errno))
                break
            if n <= VNET:
                self._count("drop_tap_runt")
                continue
            if buf[1] == _GSO_NONE and offloading:
                # the common case inline: a known destination, the checksum left as the host left it
                route = cache.get(bytes(buf[VNET:VNET + 16]))
                if route is not None and n - VNET + UNICAST_PREFIX_LEN - 14 <= route.port.mtu:
                    if buf[0] & _NEEDS_CSUM:
                        csum_start, csum_offset = _CSUM_FIELDS.unpack_from(buf, 6)
                        if csum_start + csum_offset + 2 > n - VNET:
                            self.counters["drop_bad_csum"] += 1
                            continue
                        head = route.partial_head(csum_start, csum_offset)
                    else:
                        head = route.plain_head
                    if route.port.tx.put((head, view[VNET:n]), len(head) + n - VNET):
                        route.hits += 1
                        touched.add(route.port)
                        sent += 1
                        sent_bytes += n - VNET
                    else:
                        self.counters["tx_ring_full"] += 1
                    continue
            flags, gso_type, _hdr_len, gso_size, csum_start, csum_offset = _VNET.unpack_from(buf)
            if gso_type == _GSO_NONE:
                self._from_host(view[VNET:n], flags & _NEEDS_CSUM, csum_start, csum_offset, touched)
                continue
            self._from_host_gso(view[VNET:n], gso_type, gso_size, csum_start, touched)
        self.counters["tx"] += sent
        self.counters["tx_bytes"] += sent_bytes

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
        (our headers, their headers, payload), never joined; else one by one as any frame."""
        l2 = 18 if frame[12:14] == _VLAN else 14
        try:
            parts = offload.segment_parts(frame, gso_type, gso_size, self.csum_offload, l2, csum_start=csum_start)
        except (ValueError, struct.error):
            self.counters["bad_gso"] += 1
            return
        self.counters["tso_frames"] += 1
        self.counters["tso_segments"] += len(parts)
        route = self._host_cache.get(bytes(frame[0:16])) or self._host_route(frame)
        if route is None or len(parts[0][0]) + gso_size + UNICAST_PREFIX_LEN - 14 > route.port.mtu:
            for headers, payload in parts:
                self._from_host(headers + payload, self.csum_offload, csum_start, 16, touched)
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

    def _from_host(self, frame, needs_csum, csum_start: int, csum_offset: int, touched: set) -> None:
        if needs_csum and csum_start + csum_offset + 2 > len(frame):
            self.counters["drop_bad_csum"] += 1
            return
        route = self._host_cache.get(bytes(frame[0:16]))
        if route is None:
            route = self._host_route(frame)
        if route is not None:
            port = route.port
            length = len(frame)
            if length + UNICAST_PREFIX_LEN - 14 <= port.mtu:
                if not needs_csum:
                    head = route.plain_head
                elif self.csum_offload:
                    head = route.partial_head(csum_start, csum_offset)
                else:  # the next kernel will not finish it: do it here
                    frame = bytearray(frame)
                    offload.finish_checksum(frame, csum_start, csum_offset)
                    head = route.plain_head
                ok = port.tx.put((head, frame), len(head) + length)
                if ok:
                    route.hits += 1
                    touched.add(port)
                    self.counters["tx"] += 1
                    self.counters["tx_bytes"] += length
                else:
                    self.counters["tx_ring_full"] += 1
                return
        whole = bytearray(frame)
        if needs_csum:
            offload.finish_checksum(whole, csum_start, csum_offset)
        self.counters["slow_host"] += 1
        self.slow_host(bytes(whole))

    def _host_route(self, frame):
        """The fast-path decision for a host frame's addresses, cached per (dst, src, tag)."""
        if len(frame) < 14 or frame[0] & 1:
            return None
        tagged = _vid(frame, 0)
        if tagged is None or frame[tagged[1]:tagged[1] + 2] == _BATMAN:
            return None
        vid = tagged[0]
        client = (bytes(frame[6:12]), vid)
        if self.fwd.local_clients.get(client) is not True:
            return None  # the core learns (or refuses) this client
        hit = self.fwd.lookup(bytes(frame[0:6]), vid)
        if hit is None:
            return None
        orig, next_hop, ifname, ttvn = hit
        port = self.ports.get(ifname)
        if port is None:
            return None
        route = HostRoute(port, unicast_prefix(next_hop, port.mac, orig, ttvn), client)
        if len(self._host_cache) >= DECISION_CACHE:
            self._take_cache_hits()
            self._host_cache.clear()  # the host varying addresses cannot grow it
        self._host_cache[bytes(frame[0:16])] = route
        return route

    # --- mesh -> host / next hop -----------------------------------------------------------------

    def _decide(self, port: Port, frame) -> object:
        """What to do with a UNICAST frame from `port`: DELIVER, (out port, next hop) to
        forward, or SLOW. Depends only on the first DECISION_KEY bytes (addresses, TTL, TTVN,
        the inner destination, tag and ethertype), so on_port caches it per port until the
        tables change. Batman-in-batman goes to the core, which drops it (as the kernel does,
        to prevent loops)."""
        if len(frame) < UNICAST_PREFIX_LEN + 14 or frame[15] != 15 or frame[0:6] != port.mac:
            return SLOW
        tagged = _vid(frame, UNICAST_PREFIX_LEN)
        if tagged is None or frame[tagged[1]:tagged[1] + 2] == _BATMAN:
            return SLOW
        client = (bytes(frame[24:30]), tagged[0])
        if frame[18:24] == self.primary:
            if seq_before8(frame[17], self.fwd.own_ttvn):
                return SLOW
            return DELIVER if client[0][0] & 1 or self.fwd.local_clients.get(client) is True else SLOW
        route = self.fwd.origs.get(bytes(frame[18:24]))
        if route is None or self.wifi or frame[16] < 2 or seq_before8(frame[17], route.ttvn) \
                or client in self.fwd.local_clients:
            return SLOW
        out = self.ports.get(route.iface)
        return SLOW if out is None else (out, bytes(route.next_hop) + out.mac)

    def on_port(self, port: Port) -> None:
        """A batch of UNICAST frames from a hard interface's ring: deliver (through the
        coalescer) or forward in place; the rest to the slow path. Whatever happens, the
        batch's slots go back to the kernel."""
        touched = set()
        try:
            self._on_port(port, touched)
            if self.gro:
                self._flush_gro()
        except Exception:
            self._internal_error()
            self.coalescer = offload.Coalescer(udp=self.coalescer.udp)  # it may hold views of the slots
        finally:
            port.rx.release()
        self._flush(touched)

    def _on_port(self, port: Port, touched: set) -> None:
        ring = port.rx
        view = ring.view
        counters = self.counters
        coalesce = self.gro
        coalescer = self.coalescer
        tap = self.tap_fd
        decisions = port.decisions
        batch = ring.frames(BATCH)
        counters["rx_batches"] += 1
        if ring.truncated:
            counters["truncated"] += ring.truncated
            ring.truncated = 0
        delivered = forwarded = delivered_bytes = forwarded_bytes = 0
        for off, length, status in batch:
            if status & TP_STATUS_CSUMNOTREADY:
                _f, _g, _h, _s, csum_start, csum_offset = _VNET.unpack_from(view, off - VNET)
                if csum_start < _INNER_L3 or csum_start + csum_offset + 2 > length:
                    counters["drop_bad_csum"] += 1  # its sender (a VM, a container) pointed it into our header
                    continue
            key = bytes(view[off:off + DECISION_KEY])
            decision = decisions.get(key)
            if decision is None:
                decision = self._decide(port, view[off:off + length])
                if len(decisions) >= DECISION_CACHE:
                    decisions.clear()  # a peer varying addresses cannot grow it
                if length >= DECISION_KEY:
                    decisions[key] = decision
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
                except BlockingIOError:
                    counters["tap_write_dropped"] += 1
                except OSError as exc:  # EIO: bat0 is down
                    self._count("drop_tap_write_" + error_name(exc.errno))
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
            view[off + 16] -= 1
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


def _vid(frame, off: int) -> tuple[int, int] | None:
    """(TT vid, offset of the ethertype behind any tag) of the Ethernet header at off."""
    if frame[off + 12:off + 14] != _VLAN:
        return 0, off + 12
    if len(frame) < off + 18:
        return None
    vid = (frame[off + 14] << 8 | frame[off + 15]) & 0x0FFF
    return (0x8000 | vid if vid else 0), off + 16
