"""PACKET_MMAP rings on AF_PACKET sockets: a burst costs one wake-up (RX) or one
syscall (TX), not one syscall per frame, and frames are read and rewritten in place.

RX: TPACKET_V2 (one status word per frame: a frame is visible as soon as it lands) or
TPACKET_V3 (blocks handed over when full or when the block timer retires them: fewer
status words, but a lone frame waits for the timer). TX: a TPACKET_V2 ring on a socket
bound with protocol 0, so it never receives; it goes through the interface's qdisc, as
the kernel's batman-adv does: traffic shaping configured by the user applies to it."""

from __future__ import annotations

import array
import collections
import errno
import mmap
import socket
import struct

from batmand.wire.constants import ETH_P_BATMAN

from . import bpf

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_TX_RING = 13
PACKET_LOSS = 14
PACKET_VNET_HDR = 15
PACKET_FANOUT = 18
PACKET_IGNORE_OUTGOING = 23
TPACKET_V2 = 1
TPACKET_V3 = 2
PACKET_FANOUT_HASH = 0

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_AVAILABLE = 0
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_SENDING = 2
TP_STATUS_WRONG_FORMAT = 4
TP_STATUS_CSUMNOTREADY = 1 << 3
TP_STATUS_CSUM_VALID = 1 << 7

TPACKET2_HDR = struct.Struct("IIIHH")  # status, len, snaplen, mac, net
TPACKET2_DATA = 32  # TX: data starts after the aligned tpacket2_hdr
TPACKET3_HDR = struct.Struct("IIIIIIHH")  # next_offset, sec, nsec, snaplen, len, status, mac, net
BLOCK_HDR = struct.Struct("III")  # at offset 8 of a block: block_status, num_pkts, offset_to_first_pkt
_U32 = struct.Struct("I")
_U16 = struct.Struct("H")
# With a vnet header, the kernel copies hdr_len bytes of a frame into the socket buffer and
# attaches the rest as pages of the ring, which it must copy again when the frame crosses
# into another namespace or socket (veth, a packet socket: skb_copy_ubufs, a page per
# frame). Copied whole at once costs less, for 64-byte and 1500-byte frames alike
# (bench/smallpacket_micro.py): put() sets hdr_len (a hint outside GSO) to the frame's
# length. Nothing on the wire changes.


TPACKET_ALIGNMENT = 16
BLOCK_SIZE = 1 << 16  # V2 blocks (and the TX ring's): a frame never spans two
TX_FRAMES = 256  # transmit-ring slots: a burst that finds them all queued is flushed and waits


def frame_size_for(mtu: int) -> int:
    """Ring slot size holding a frame of this MTU plus the ring and vnet headers, rounded
    to the kernel's alignment only: a power of two would waste up to half of every slot
    (2048 bytes for 1684 at MTU 1560, 8192 for 4124 at MTU 4000)."""
    need = mtu + 14 + 4 + 10 + 96
    return -(-need // TPACKET_ALIGNMENT) * TPACKET_ALIGNMENT


def block_size_for(frame_size: int) -> int:
    """Blocks are whole pages holding at least one frame."""
    return max(BLOCK_SIZE, -(-frame_size // mmap.PAGESIZE) * mmap.PAGESIZE)


def slot_offsets(frame_size: int, block_size: int, frame_nr: int) -> array.array:
    """Where each slot starts: frames are packed from the start of each block, and the
    block's rest (when the frame size does not divide it) is a gap the kernel skips."""
    per_block = block_size // frame_size
    return array.array("Q", [(i // per_block) * block_size + (i % per_block) * frame_size for i in range(frame_nr)])


def ring_bytes_for(mtu: int, frames: int) -> int:
    """What a V2 ring of at least `frames` slots for this MTU maps (whole blocks)."""
    size = frame_size_for(mtu)
    block = block_size_for(size)
    return -(-frames // (block // size)) * block


def error_name(code: int) -> str:
    """An errno as a counter suffix: ENETDOWN -> "enetdown"."""
    return errno.errorcode.get(code, str(code)).lower()


def take_error(sock: socket.socket) -> int:
    """SO_ERROR: the socket's pending error, cleared by reading it (0: none)."""
    try:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError:
        return 0


def statistics(sock: socket.socket) -> tuple[int, int]:
    """PACKET_STATISTICS since the last call: (frames seen, frames dropped for lack of room)."""
    try:
        raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
    except OSError:
        return 0, 0
    packets, drops = struct.unpack_from("II", raw)
    return packets, drops


class RxRing:
    """A receive ring on a packet socket bound to one interface, optionally a member of
    a PACKET_FANOUT_HASH group, with a classic BPF filter."""

    def __init__(self, ifname: str, *, mtu: int = 1560, frames: int = 1024, max_frames: int = 0,
                 version: int = TPACKET_V2, vnet_hdr: bool = False, program: bytes | None = None,
                 fanout_group: int | None = None, block_timeout_ms: int = 1,
                 sock: socket.socket | None = None, mapped: bool = True) -> None:
        """`frames` slots at first, up to `max_frames` after a burst (grow()); `mapped=False`:
        the ring is set up but not mapped here (the control process opens the workers'
        rings, and only the worker that reads one maps it)."""
        self.version = version
        self.vnet_hdr = vnet_hdr
        self.frame_size = frame_size_for(mtu)
        self.block_timeout_ms = block_timeout_ms
        self._size(frames)  # an inherited socket (sock) has its ring: the same sizes map it again
        self.max_frames = max(max_frames, self.frame_nr)
        if sock is not None:
            self.sock = sock
        else:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            try:
                self._setup(ifname, program, fanout_group)
            except OSError:
                self.sock.close()
                raise
        self.map = self.view = None
        if mapped:
            self._map(inherited=sock is not None)
        self.index = 0
        self._taken: list[int] = []  # status words of slots (V2) or blocks (V3) handed to us
        self.truncated = 0  # frames longer than a slot, dropped (the engine collects the count)
        self.crowded = False  # a burst filled half the ring: grow() once it is read empty
        self.drained = False  # the last frames() took every waiting frame

    def _map(self, inherited: bool) -> None:
        while True:
            try:
                self.map = mmap.mmap(self.sock.fileno(), self.ring_bytes, mmap.MAP_SHARED,
                                     mmap.PROT_READ | mmap.PROT_WRITE)
                break
            except OSError as exc:
                # an inherited ring that an earlier reader (a worker since restarted) has grown
                if not inherited or exc.errno != errno.EINVAL or self.frame_nr >= self.max_frames:
                    raise
                self._size(self.max_frames)
        self.view = memoryview(self.map)

    def _setup(self, ifname, program, fanout_group) -> None:
        s = self.sock
        s.setsockopt(SOL_PACKET, PACKET_VERSION, self.version)
        if self.vnet_hdr:
            s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        if program is not None:
            bpf.attach(s, program)
        s.setsockopt(SOL_PACKET, PACKET_RX_RING, self._request())
        s.bind((ifname, ETH_P_BATMAN))
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        if fanout_group is not None:
            s.setsockopt(SOL_PACKET, PACKET_FANOUT, fanout_group | PACKET_FANOUT_HASH << 16)
        s.setblocking(False)

    def _request(self, empty: bool = False) -> bytes:
        """PACKET_RX_RING's argument for the current sizes (`empty`: no ring)."""
        sizes = (0, 0, 0, 0) if empty else (self.block_size, self.block_nr, self.frame_size, self.frame_nr)
        if self.version == TPACKET_V2:
            return struct.pack("IIII", *sizes)
        return struct.pack("IIIIIII", *sizes, 0 if empty else self.block_timeout_ms, 0, 0)

    def grow(self) -> bool:
        """Re-make the ring with max_frames slots. It starts smaller, so that an idle
        daemon holds a third of the memory; the first burst that fills half of it (the
        crowded flag) makes it as large as one TCP flow's burst needs, once it has been
        read empty. The kernel swaps rings only unmapped and from none to one, so frames
        arriving meanwhile miss the ring, as they would a full one: the few that land in
        the socket's plain queue are read and dropped (left there, they would keep the
        socket readable). False: not now (a slice of the ring is still referenced)."""
        if self.map is None or self.frame_nr >= self.max_frames:
            return False
        try:
            self.view.release()
            self.map.close()
        except BufferError:
            if not self.map.closed:
                self.view = memoryview(self.map)
            return False
        small = self.frame_nr
        for frames in (self.max_frames, small):
            self.sock.setsockopt(SOL_PACKET, PACKET_RX_RING, self._request(empty=True))
            self._size(frames)
            try:
                self.sock.setsockopt(SOL_PACKET, PACKET_RX_RING, self._request())
                self._map(inherited=False)
                break
            except OSError:  # no memory or address space for it: the small ring again, for good
                if frames == small:
                    raise
                self.max_frames = small
        while True:
            try:
                self.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_TRUNC)
            except OSError:  # empty (EAGAIN), or the interface went down meanwhile
                break
        self.index = 0
        self.crowded = False
        return self.frame_nr > small

    def _size(self, frames: int) -> None:
        if self.version == TPACKET_V2:
            self.block_size = block_size_for(self.frame_size)
            per_block = self.block_size // self.frame_size
        else:
            self.block_size = max(1 << 17, block_size_for(self.frame_size))
            per_block = self.block_size // self.frame_size
        self.block_nr = max(2, -(-frames // per_block))
        self.frame_nr = self.block_nr * per_block
        self.ring_bytes = self.block_size * self.block_nr
        self.slots = slot_offsets(self.frame_size, self.block_size, self.frame_nr)

    def _resync(self) -> None:
        """Find the oldest waiting frame (the first user-owned slot after a kernel-owned
        one): after mapping an inherited ring, or when our index lost the kernel's."""
        n, view = self.frame_nr, self.map
        status = [_U32.unpack_from(view, base)[0] & TP_STATUS_USER for base in self.slots]
        for i in range(n):
            if status[i] and not status[i - 1]:
                self.index = i
                return

    def fileno(self) -> int:
        return self.sock.fileno()

    def take_error(self) -> int:
        """Read and clear the socket's pending error (0: none). When the interface goes
        down the kernel sets ENETDOWN, and poll reports it until it is read: a ring that
        is never recv()'d from must read it, or its reader spins. The ring itself stays
        valid and receives again when the interface comes back up."""
        return take_error(self.sock)

    def frames(self, budget: int) -> list[tuple[int, int, int]]:
        """Up to `budget` waiting frames as (offset of the data in self.view, length,
        tp_status). They stay ours (readable and rewritable in place) until release().
        With vnet_hdr the 10-byte virtio header sits just before the data."""
        if self.version == TPACKET_V3:
            return self._frames_v3(budget)
        view, slots, n = self.map, self.slots, self.frame_nr
        unpack = TPACKET2_HDR.unpack_from
        if not _U32.unpack_from(view, slots[self.index])[0] & TP_STATUS_USER:
            self._resync()  # nothing at our index: we may have lost the kernel's position
        i = self.index
        out = []
        taken = self._taken
        for _ in range(budget):
            base = slots[i]
            status, length, snaplen, mac, _net = unpack(view, base)
            if not status & TP_STATUS_USER:
                break
            if snaplen < length:
                self.truncated += 1  # bigger than a slot (the MTU grew): not forwarded cut short
            else:
                out.append((base + mac, length, status))
            taken.append(base)
            i = i + 1 if i + 1 < n else 0
        else:  # the budget ran out with frames waiting: is half the ring waiting?
            self.index = i
            self.drained = False
            if n < self.max_frames and _U32.unpack_from(view, slots[(i + n // 2) % n])[0] & TP_STATUS_USER:
                self.crowded = True
            return out
        self.index = i
        self.drained = True
        return out

    def release(self) -> None:
        """Hand every frame returned by frames() back to the kernel."""
        view = self.map
        for base in self._taken:
            _U32.pack_into(view, base, TP_STATUS_KERNEL)
        self._taken.clear()

    def _resync_v3(self) -> None:
        waiting = [(struct.unpack_from("Q", self.map, b * self.block_size + 24)[0], b)
                   for b in range(self.block_nr)
                   if _U32.unpack_from(self.map, b * self.block_size + 8)[0] & TP_STATUS_USER]
        if waiting:
            self.index = min(waiting)[1]

    def _frames_v3(self, budget: int) -> list[tuple[int, int, int]]:
        view, bsize = self.map, self.block_size
        unpack_pkt = TPACKET3_HDR.unpack_from
        if not _U32.unpack_from(view, self.index * bsize + 8)[0] & TP_STATUS_USER:
            self._resync_v3()
        out = []
        self.drained = False
        while len(out) < budget:
            base = self.index * bsize
            block_status, num, first = BLOCK_HDR.unpack_from(view, base + 8)
            if not block_status & TP_STATUS_USER:
                self.drained = True
                break
            off = base + first
            for _ in range(num):
                next_off, _s, _ns, snaplen, length, status, mac, _net = unpack_pkt(view, off)
                if snaplen < length:
                    self.truncated += 1
                else:
                    out.append((off + mac, length, status))
                off += next_off
            self._taken.append(base + 8)
            self.index = (self.index + 1) % self.block_nr
        if not self.drained and self.frame_nr < self.max_frames:
            half = (self.index + (self.block_nr - 1) // 2) % self.block_nr  # (the blocks taken are behind index)
            self.crowded = self.crowded or bool(_U32.unpack_from(view, half * bsize + 8)[0] & TP_STATUS_USER)
        return out

    def close(self) -> None:
        if self.map is not None:
            try:
                self.view.release()
                self.map.close()
            except BufferError:
                pass  # a slice of the ring is still referenced: the mapping goes with it
        self.sock.close()


class TxRing:
    """A transmit ring: put() copies a frame into the next free slot, flush() makes the
    kernel send every queued slot in one syscall.

    A send that fails (the interface is down: ENETDOWN) leaves the slots queued for the
    next flush; they go out when the interface is back, and frames that find no free
    slot meanwhile are dropped and counted. A frame the kernel refuses (longer than the
    MTU, which can shrink at run time) is skipped (PACKET_LOSS): without it, the kernel
    would stop at its slot until the ring wrapped around."""

    def __init__(self, ifname: str, *, mtu: int = 1560, frames: int = TX_FRAMES, vnet_hdr: bool = False,
                 sock: socket.socket | None = None) -> None:
        self.vnet_hdr = vnet_hdr
        self.frame_size = frame_size_for(mtu)
        self.block_size = block_size_for(self.frame_size)
        per_block = self.block_size // self.frame_size
        self.block_nr = max(1, -(-frames // per_block))
        self.frame_nr = self.block_nr * per_block
        self.slots = slot_offsets(self.frame_size, self.block_size, self.frame_nr)
        self.max_data = self.frame_size - TPACKET2_DATA - (10 if vnet_hdr else 0)
        self._max_length = self.max_data + (10 if vnet_hdr else 0)  # what put() takes, vnet header included
        if sock is None:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            try:
                sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
                sock.setsockopt(SOL_PACKET, PACKET_LOSS, 1)
                if vnet_hdr:
                    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
                req = struct.pack("IIII", self.block_size, self.block_nr, self.frame_size, self.frame_nr)
                sock.setsockopt(SOL_PACKET, PACKET_TX_RING, req)
                sock.bind((ifname, 0))
            except OSError:
                sock.close()
                raise
        self.sock = sock
        self.map = mmap.mmap(sock.fileno(), self.block_size * self.block_nr, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.index = 0
        self.pending = 0
        self.dropped = 0  # frames that found no free slot even after a flush
        self.bad = 0  # frames the kernel refused (TP_STATUS_WRONG_FORMAT)
        self.errors: collections.Counter = collections.Counter()  # failed sends by errno name

    def fileno(self) -> int:
        return self.sock.fileno()

    def _free_slot(self) -> int | None:
        base = self.slots[self.index]
        status = _U32.unpack_from(self.map, base)[0]
        if status == TP_STATUS_AVAILABLE:
            return base
        if status == TP_STATUS_WRONG_FORMAT:
            self.bad += 1
            return base
        return None

    def put(self, parts, length: int) -> bool:
        """Queue one frame given as buffers (vnet header first when vnet_hdr) of `length`
        bytes in total. False when it is too big or no slot frees up."""
        if length > self._max_length:
            return False
        m = self.map
        base = self.slots[self.index]
        if _U32.unpack_from(m, base)[0] != TP_STATUS_AVAILABLE:  # the common case needs no more calls
            base = self._free_slot()
            if base is None:
                self.flush(force=True)
                base = self._free_slot()
                if base is None:
                    self.dropped += 1
                    return False
        pos = base + TPACKET2_DATA
        for part in parts:
            end = pos + len(part)
            m[pos:end] = part
            pos = end
        if self.vnet_hdr and not m[base + TPACKET2_DATA + 1]:  # gso_type NONE: hdr_len = the whole frame
            _U16.pack_into(m, base + TPACKET2_DATA + 2, length - 10)
        TPACKET2_HDR.pack_into(m, base, TP_STATUS_SEND_REQUEST, length, length, 0, 0)
        self.index = self.index + 1 if self.index + 1 < self.frame_nr else 0
        self.pending += 1
        return True

    def flush(self, force: bool = False) -> None:
        """Send the queued slots; `force` also when none was queued since the last flush
        (earlier ones may still wait after a failed send)."""
        if not (self.pending or force):
            return
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
            self.pending = 0
        except BlockingIOError:
            pass  # the qdisc is full: the slots stay queued for the next flush
        except OSError as exc:
            self.errors[error_name(exc.errno)] += 1  # ENETDOWN: sent once the interface is up

    def close(self) -> None:
        self.map.close()
        self.sock.close()
