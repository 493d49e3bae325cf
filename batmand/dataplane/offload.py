"""Segmentation, coalescing and checksum offload for the TAP side of the data plane.

The TAP is opened with IFF_VNET_HDR, so every frame read from it or written to it is
preceded by a 10-byte ``struct virtio_net_hdr`` (little-endian on the hosts we run on).

* TAP -> mesh: the kernel hands us TCP frames of up to 64 KB (TSO, ``GSO_TCPV4`` /
  ``GSO_TCPV6``) whose TCP checksum field holds only the pseudo-header sum.
  :func:`segment` cuts such a frame into MSS-sized Ethernet frames the way Linux's
  ``tcp_gso_segment`` does.
* mesh -> TAP: :class:`Coalescer` merges consecutive in-order segments of one TCP flow
  into one large frame handed to the kernel with a GSO virtio header (like GRO), so
  the kernel's TCP stack sees far fewer packets.

Everything here is pure computation on bytes-like objects; no I/O.  Ones'-complement
sums use the fact that 2**16 == 1 (mod 0xFFFF): the big-endian integer value of a run
of 16-bit words is congruent to the sum of those words, so ``int.from_bytes(...) %
0xFFFF`` is the end-around-carry sum without a Python loop.
"""

from __future__ import annotations

import struct

__all__ = [
    "VNET_HDR_LEN", "VIRTIO_NET_HDR_F_NEEDS_CSUM", "VIRTIO_NET_HDR_F_DATA_VALID",
    "GSO_NONE", "GSO_TCPV4", "GSO_UDP", "GSO_TCPV6", "GSO_ECN",
    "CSUM_UNKNOWN", "CSUM_VALID", "CSUM_PARTIAL",
    "pack_vnet", "unpack_vnet", "VNET_PLAIN", "VNET_DATA_VALID",
    "ones_sum", "finish_checksum", "tcp_checksum_ok", "parse_tcp", "segment", "segment_parts", "Coalescer",
]

# --------------------------------------------------------------------------- virtio header

VNET_HDR_LEN = 10
VIRTIO_NET_HDR_F_NEEDS_CSUM = 1
VIRTIO_NET_HDR_F_DATA_VALID = 2
GSO_NONE = 0
GSO_TCPV4 = 1
GSO_UDP = 3
GSO_TCPV6 = 4
GSO_UDP_L4 = 5  # UDP GSO (USO); a TAP accepts it on write from Linux 6.2
GSO_ECN = 0x80

# struct virtio_net_hdr as TAP devices and packet sockets exchange it without
# TUNSETVNETLE/BE: the legacy layout, in the host's byte order
VNET_HDR = struct.Struct("=BBHHHH")
_VNET = VNET_HDR
_vnet_pack = _VNET.pack


def pack_vnet(flags: int = 0, gso_type: int = 0, hdr_len: int = 0, gso_size: int = 0,
              csum_start: int = 0, csum_offset: int = 0) -> bytes:
    """The 10-byte virtio_net_hdr with the given fields."""
    return _vnet_pack(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)


def unpack_vnet(buf) -> tuple:
    """(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset) from the first 10 bytes."""
    return _VNET.unpack_from(buf, 0)


VNET_PLAIN = pack_vnet()
VNET_DATA_VALID = pack_vnet(VIRTIO_NET_HDR_F_DATA_VALID)

# What the caller of Coalescer.add() knows about a frame's L4 checksum.
CSUM_UNKNOWN = 0   # nothing: the coalescer verifies TCP checksums itself before merging
CSUM_VALID = 1     # already verified
CSUM_PARTIAL = 2   # the checksum field holds only the pseudo-header sum (CHECKSUM_PARTIAL)

# --------------------------------------------------------------------------- checksums

_from_bytes = int.from_bytes
_U16 = struct.Struct("!H")
_u16_pack_into = _U16.pack_into

_TCP_PROTO = 6
_UDP_PROTO = 17

_masks: dict = {}


def _wsum(data) -> int:
    """A non-negative integer congruent (mod 0xFFFF) to the sum of the big-endian 16-bit
    words of ``data`` (odd length padded with a zero byte), and 0 only if data is all zero.

    Division of a long integer costs one hardware division per 30-bit digit, so a long
    value is first folded in halves with shift + add (2**(16k) == 1 mod 0xFFFF), which is
    about three times cheaper than taking ``% 0xFFFF`` of it directly."""
    n = len(data)
    x = _from_bytes(data, "big")
    if n & 1:
        x <<= 8
        n += 1
    if n > 512:
        nbits = n << 3
        while nbits > 4096:
            half = ((nbits + 31) >> 5) << 4          # a multiple of 16, about half
            mask = _masks.get(half)
            if mask is None:
                mask = _masks[half] = (1 << half) - 1
            x = (x >> half) + (x & mask)
            nbits = half + 1
    return x


def ones_sum(data, initial: int = 0) -> int:
    """16-bit ones'-complement sum of ``data`` as big-endian words (an odd length is padded
    with a zero byte), plus ``initial``; folded, not inverted.  0 only when everything is 0."""
    total = _wsum(data) + initial
    r = total % 0xFFFF
    if r == 0 and total:
        return 0xFFFF
    return r


def _fold(total: int) -> int:
    """Fold a non-negative sum of 16-bit words to 1..0xFFFF (0 only for 0)."""
    r = total % 0xFFFF
    if r == 0 and total:
        return 0xFFFF
    return r


def finish_checksum(frame: bytearray, csum_start: int, csum_offset: int) -> None:
    """Complete a CHECKSUM_PARTIAL frame in place: the field at csum_start + csum_offset holds
    the pseudo-header sum; store the complement of the sum of frame[csum_start:] there.
    A UDP result of 0 (csum_offset 6) is stored as 0xFFFF."""
    with memoryview(frame) as mv:
        tail = mv[csum_start:]
        total = _wsum(tail)
        tail.release()
    c = ~_fold(total) & 0xFFFF
    if c == 0 and csum_offset == 6:
        c = 0xFFFF
    _u16_pack_into(frame, csum_start + csum_offset, c)


def tcp_checksum_ok(frame, l3_offset: int) -> bool:
    """True when the TCP or UDP checksum of the IPv4 / IPv6 packet at ``l3_offset`` is right
    (pseudo-header included; lengths from the IP header, so Ethernet padding is ignored).
    False for anything else: other protocols, IPv4 fragments, IPv6 extension headers,
    truncated packets.  An IPv4 UDP checksum of 0 ("none") counts as right."""
    n = len(frame)
    if n < l3_offset + 20:
        return False
    version = frame[l3_offset] >> 4
    if version == 4:
        vi, tot, frag, proto, addrs = _V4_CHECK.unpack_from(frame, l3_offset)
        ihl = (vi & 15) << 2
        if ihl < 20 or frag & 0x3FFF:
            return False
        l4 = l3_offset + ihl
        end = l3_offset + tot
    elif version == 6:
        if n < l3_offset + 40:
            return False
        plen, proto, addrs = _V6_CHECK.unpack_from(frame, l3_offset)
        l4 = l3_offset + 40
        end = l4 + plen
    else:
        return False
    if end > n:
        return False
    l4_len = end - l4
    if proto == _TCP_PROTO:
        if l4_len < 20:
            return False
    elif proto == _UDP_PROTO:
        if l4_len < 8:
            return False
        field = frame[l4 + 6] << 8 | frame[l4 + 7]
        if field == 0:
            return version == 4
    else:
        return False
    total = _wsum(frame[l4:end]) + _from_bytes(addrs, "big") + proto + l4_len
    return total % 0xFFFF == 0


_V4_CHECK = struct.Struct("!B1xH2xH1xB2x8s")     # ver/ihl, total length, frag, proto, src+dst
_V6_CHECK = struct.Struct("!4xHB1x32s")          # payload length, next header, src+dst

# --------------------------------------------------------------------------- parsing

# ethertype (at l2_len - 2), ver/ihl, tos, total length, id, frag, ttl, proto, src, dst
_ETH_V4 = struct.Struct("!HBBHHHBB2x4s4s")
# ethertype, ver/tc/flow, payload length, next header, hop limit, src, dst
_ETH_V6 = struct.Struct("!HIHBB16s16s")
# ports, seq, ack, data offset, flags
_TCP = struct.Struct("!4sIIBB")
_eth_v4_unpack = _ETH_V4.unpack_from
_eth_v6_unpack = _ETH_V6.unpack_from
_tcp_unpack = _TCP.unpack_from

# Indices into the record parse_tcp() returns.
P_L3, P_L4, P_THL, P_POFF, P_PLEN, P_KEY, P_SEQ, P_ACK, P_FLAGS, P_V6 = range(10)


def parse_tcp(frame, l2_len: int = 14):
    """Parse an Ethernet frame carrying TCP over IPv4 (any ihl, not a fragment) or IPv6 (TCP
    directly after the fixed header).  ``l2_len`` is where L3 starts (18 after one 802.1Q
    tag); the ethertype is read just before it.

    Returns None for anything else (or a truncated packet), else the plain tuple
    ``(l3, l4, tcp_hdr_len, payload_off, payload_len, key, seq, ack, flags, is_v6)``:
    offsets are from the frame start, the payload length comes from the IP header (any
    Ethernet padding after it is not counted), ``key`` is bytes src + dst address + the
    4 port bytes (12 bytes for IPv4, 36 for IPv6)."""
    n = len(frame)
    if n < l2_len + 40:          # 20 IPv4 + 20 TCP is the least we accept
        return None
    et = frame[l2_len - 2] << 8 | frame[l2_len - 1]
    if et == 0x0800:
        (_, vi, _tos, tot, _id, frag, _ttl, proto, src, dst) = _eth_v4_unpack(frame, l2_len - 2)
        if proto != _TCP_PROTO or vi >> 4 != 4 or frag & 0x3FFF:
            return None
        ihl = (vi & 15) << 2
        if ihl < 20:
            return None
        l4 = l2_len + ihl
        end = l2_len + tot
        is_v6 = False
    elif et == 0x86DD:
        if n < l2_len + 60:
            return None
        (_, vtf, plen, nh, _hl, src, dst) = _eth_v6_unpack(frame, l2_len - 2)
        if nh != _TCP_PROTO or vtf >> 28 != 6:
            return None
        l4 = l2_len + 40
        end = l4 + plen
        is_v6 = True
    else:
        return None
    if end > n or l4 + 20 > end:
        return None
    ports, seq, ack, doff, flags = _tcp_unpack(frame, l4)
    thl = (doff >> 4) << 2
    poff = l4 + thl
    if thl < 20 or poff > end:
        return None
    return (l2_len, l4, thl, poff, end - poff, src + dst + ports, seq, ack, flags, is_v6)


# --------------------------------------------------------------------------- TSO segmentation

_FIN, _SYN, _RST, _PSH, _ACK, _URG, _ECE, _CWR = 1, 2, 4, 8, 16, 32, 64, 128
_U32 = struct.Struct("!I")
_u32_pack_into = _U32.pack_into


def segment(frame, gso_type: int, gso_size: int, csum_offload: bool, l2_len: int = 14) -> list:
    """segment_parts(), each segment joined into one bytes object."""
    join = b"".join
    return [join(parts) for parts in segment_parts(frame, gso_type, gso_size, csum_offload, l2_len)]


def segment_parts(frame, gso_type: int, gso_size: int, csum_offload: bool, l2_len: int = 14,
                  csum_start: int | None = None) -> list:
    """Cut one TSO frame from the TAP (GSO_TCPV4 / GSO_TCPV6, optionally | GSO_ECN) into
    Ethernet frames carrying at most ``gso_size`` payload bytes each, like tcp_gso_segment:
    headers copied, seq advanced, FIN/PSH only on the last segment, CWR only on the first,
    IPv4 total length / ID (+1 per segment) / header checksum and IPv6 payload length
    rewritten.  The input's TCP checksum field must hold the pseudo-header sum.

    csum_offload True: each segment's TCP checksum field gets its own pseudo-header sum
    (send it with NEEDS_CSUM, csum_start = the TCP offset, csum_offset = 16); False: the
    full checksum.  A frame whose payload fits (or gso_size 0) comes back alone.
    Bytes after the IP packet (padding) are dropped from segments.
    Each segment comes as (headers, payload view): a caller that copies them into a
    transmit ring never joins them. ``csum_start``, when given (the virtio header's), must
    point at the TCP header. Raises ValueError when the frame cannot be segmented."""
    kind = gso_type & ~GSO_ECN          # CWR goes on the first segment only either way
    if kind != GSO_TCPV4 and kind != GSO_TCPV6:
        raise ValueError(f"gso_type {gso_type:#x} is not TCP")
    info = parse_tcp(frame, l2_len)
    if info is None:
        raise ValueError("not a complete IPv4/IPv6 TCP packet")
    l3, l4, thl, poff, plen, _key, seq, _ack, flags, is_v6 = info
    if is_v6 != (kind == GSO_TCPV6):
        raise ValueError("gso_type does not match the IP version")
    if csum_start is not None and csum_start != l4:
        raise ValueError("csum_start is not the TCP header's offset")
    if gso_size < 0:
        raise ValueError("negative gso_size")
    end = poff + plen
    addr_off = l3 + 8 if is_v6 else l3 + 12
    addr_sum = _from_bytes(frame[addr_off:l4 if is_v6 else l3 + 20], "big") + _TCP_PROTO

    if gso_size == 0 or plen <= gso_size:
        if csum_offload:
            if end == len(frame) and type(frame) is bytes:
                return [(frame, b"")]
            return [(bytes(frame[:end]), b"")]
        out = bytearray(frame[:end])
        _u16_pack_into(out, l4 + 16, 0)
        body = memoryview(out)[l4:]
        total = _wsum(body)
        body.release()
        _u16_pack_into(out, l4 + 16, ~_fold(total + addr_sum + end - l4) & 0xFFFF)
        return [(bytes(out), b"")]

    mv = memoryview(frame)
    tmpl = bytearray(mv[:poff])
    l3_hlen = l4 - l3
    # The header words that change per segment are zeroed in the template, so the
    # template's TCP header sum is a constant to which each segment's values are added.
    if not is_v6:
        ip_id = tmpl[l3 + 4] << 8 | tmpl[l3 + 5]
        _u16_pack_into(tmpl, l3 + 2, 0)
        _u16_pack_into(tmpl, l3 + 4, 0)
        _u16_pack_into(tmpl, l3 + 10, 0)
        ip_sum = _from_bytes(tmpl[l3:l4], "big")
    _u32_pack_into(tmpl, l4 + 4, 0)
    tmpl[l4 + 13] = 0
    _u16_pack_into(tmpl, l4 + 16, 0)
    th_sum = _from_bytes(tmpl[l4:poff], "big")

    first_flags = flags & ~(_FIN | _PSH)
    mid_flags = first_flags & ~_CWR
    last_flags = flags & ~_CWR
    out = []
    append = out.append
    count = -(-plen // gso_size)
    last = count - 1
    for i in range(count):
        off = poff + i * gso_size
        chunk = mv[off:min(off + gso_size, end)]
        n = len(chunk)
        seg_seq = (seq + i * gso_size) & 0xFFFFFFFF
        f = mid_flags if 0 < i < last else (first_flags if i == 0 else last_flags)
        h = bytearray(tmpl)
        if is_v6:
            _u16_pack_into(h, l3 + 4, thl + n)
        else:
            tot = l3_hlen + thl + n
            pid = (ip_id + i) & 0xFFFF
            _u16_pack_into(h, l3 + 2, tot)
            _u16_pack_into(h, l3 + 4, pid)
            _u16_pack_into(h, l3 + 10, ~_fold(ip_sum + tot + pid) & 0xFFFF)
        _u32_pack_into(h, l4 + 4, seg_seq)
        h[l4 + 13] = f
        tcp_len = thl + n
        if csum_offload:
            _u16_pack_into(h, l4 + 16, _fold(addr_sum + tcp_len))
        else:
            total = (th_sum + (seg_seq >> 16) + (seg_seq & 0xFFFF) + f
                     + addr_sum + tcp_len + _wsum(chunk))
            _u16_pack_into(h, l4 + 16, ~_fold(total) & 0xFFFF)
        append((h, chunk))
    return out


# --------------------------------------------------------------------------- GRO coalescing

_NO_MERGE_FLAGS = _SYN | _RST | _URG | _FIN | _CWR | _ECE


class _Run:
    """Segments of one flow being merged; sits in the Coalescer's output list."""
    __slots__ = ("first", "payloads", "match", "flags", "ack", "next_seq", "mss", "size",
                 "limit", "psh", "l3", "l4", "poff", "is_v6", "csum", "csum_start",
                 "csum_offset", "verified", "key", "mask", "masked", "udp")


_MASKS: dict = {}


def _constant_fields(l3: int, l4: int, poff: int, is_v6: bool, udp: bool = False) -> int:
    """A bit mask over a segment's headers (as one big-endian integer) covering what must
    not change within a run: L2, TOS/flow label, TTL, DF, addresses, ports, ACK, data
    offset and the TCP options. Lengths, IP ID and checksum, seq, flags, window and TCP
    checksum are left out (checked separately, or free to differ)."""
    key = (l3, l4, poff, is_v6, udp)
    mask = _MASKS.get(key)
    if mask is None:
        spans = ([(0, l3 + 4), (l3 + 6, l3 + 8), (l3 + 8, l4 + 4), (l4 + 8, l4 + 13), (l4 + 20, poff)] if is_v6 else
                 [(0, l3 + 2), (l3 + 6, l3 + 10), (l3 + 12, l4 + 4), (l4 + 8, l4 + 13), (l4 + 20, poff)])
        if udp:  # UDP: the header's length and checksum vary; the rest is the ports
            spans = spans[:3]
        bits = bytearray(poff)
        for start, end in spans:
            bits[start:end] = b"\xff" * (end - start)
        mask = _MASKS[key] = _from_bytes(bits, "big")
        if len(_MASKS) > 256:  # header layouts seen: a handful in practice
            _MASKS.clear()
    return mask


class Coalescer:
    """Merge in-order TCP segments about to be written to the TAP into GSO frames (GRO).

    ``add()`` each frame, then ``flush()`` to get the TAP writes (vnet header + frame).
    Frames of one TCP flow keep their order; frames that are not TCP keep theirs;
    different flows may be reordered against each other.  ``max_size`` bounds a merged
    Ethernet frame (without the vnet header), ``max_segments`` the segments in one; the
    IPv4 total length / IPv6 payload length of a merged frame never exceeds 65535.

    Segments merge as in Linux's tcp_gro_receive: same flow, same L2 header, IPv4 with
    ihl 5 (no fragment) or IPv6 without extension headers, same TOS / traffic class and
    flow label, TTL / hop limit, DF, ACK number, TCP options and flags (PSH allowed on
    the last), in sequence, all but the last exactly as long as the first.  The IPv4 ID
    is not compared (re-segmentation numbers IDs from the first segment's).  A segment
    with no payload or with SYN/RST/URG/FIN/CWR/ECE is never merged and ends its flow's
    run.  CSUM_UNKNOWN segments are checksummed here only when a merge is possible.

    TCP frames are kept by reference (memoryview slices) until flush(); other frames
    are copied at once.

    Counters (plain ints, updated by flush() for what it returns): ``merged``, the
    segments merged into a preceding one; ``flushed_frames``, the items returned."""

    def __init__(self, max_size: int = 65535, max_segments: int = 64, udp: bool = False) -> None:
        if max_segments < 1:
            raise ValueError("max_segments must be at least 1")
        self.udp = udp  # also merge trusted UDP datagrams of a flow into GSO_UDP_L4 frames
        self.max_size = max_size
        self.max_segments = max_segments
        self.merged = 0
        self.flushed_frames = 0
        self._out: list = []       # bytes (finished) or _Run, in arrival order
        self._open: dict = {}      # flow key -> _Run still accepting segments
        self._last: _Run | None = None  # the open run that took the latest segment

    def add(self, frame, csum: int, csum_start: int = 0, csum_offset: int = 0) -> None:
        """Queue one inner Ethernet frame.  ``csum`` is CSUM_UNKNOWN, CSUM_VALID or
        CSUM_PARTIAL (then csum_start / csum_offset locate the checksum, from the frame
        start).  A memoryview's buffer must stay untouched until flush()."""
        run = self._last
        if run is not None and csum == run.csum and csum != CSUM_UNKNOWN and (
                self._extends_udp if run.udp else self._extends)(run, frame, csum_start, csum_offset):
            return
        self._last = None
        n = len(frame)
        if n >= 54:
            l2 = 18 if frame[12] == 0x81 and frame[13] == 0 else 14
            info = parse_tcp(frame, l2)
        else:
            info = None
        if info is None:
            if self.udp and n >= 42 and csum != CSUM_UNKNOWN and self._add_udp(frame, csum, csum_start, csum_offset):
                return
            if n >= 34:
                self._maybe_tcp(frame)
            self._single(frame, csum, csum_start, csum_offset)
            return
        l3, l4, thl, poff, plen, key, seq, ack, flags, is_v6 = info
        run = self._open.get(key)
        if (plen == 0 or flags & _NO_MERGE_FLAGS or l4 - l3 != (40 if is_v6 else 20)
                or (csum == CSUM_PARTIAL and (csum_start != l4 or csum_offset != 16))):
            if run is not None:
                del self._open[key]
            self._single(frame, csum, csum_start, csum_offset)
            return
        if is_v6:
            match = b"".join((frame[:l3 + 4], frame[l3 + 6:l3 + 8], frame[l4 + 12:l4 + 13],
                              frame[l4 + 20:poff]))
        else:
            match = b"".join((frame[:l3 + 2], frame[l3 + 6:l3 + 10], frame[l4 + 12:l4 + 13],
                              frame[l4 + 20:poff]))
        if run is not None:
            if (seq == run.next_seq and match == run.match and ack == run.ack
                    and (flags & ~_PSH) == run.flags and plen <= run.mss
                    and run.size + plen <= run.limit):
                if not run.verified:
                    first = run.first
                    if _l4_sum_ok(first, run.l3, run.l4, run.poff + run.mss, run.is_v6):
                        run.verified = True
                    else:
                        run = None       # leave the bad segment alone, start afresh below
                if run is not None:
                    if csum == CSUM_UNKNOWN and not _l4_sum_ok(frame, l3, l4, poff + plen, is_v6):
                        del self._open[key]
                        self._out.append(VNET_PLAIN + frame)
                        return
                    run.payloads.append(memoryview(frame)[poff:poff + plen])
                    run.size += plen
                    run.next_seq = (seq + plen) & 0xFFFFFFFF
                    if (flags & _PSH or plen < run.mss
                            or len(run.payloads) >= self.max_segments):
                        run.psh = flags & _PSH
                        del self._open[key]
                    else:
                        self._last = run
                    return
            del self._open[key]
        if flags & _PSH or self.max_segments == 1:
            self._single(frame, csum, csum_start, csum_offset)
            return
        run = _Run()
        run.first = frame
        run.payloads = [memoryview(frame)[poff:poff + plen]]
        run.match = match
        run.flags = flags
        run.ack = ack
        run.next_seq = (seq + plen) & 0xFFFFFFFF
        run.mss = plen
        run.size = poff + plen
        run.limit = min(self.max_size, (l4 if is_v6 else l3) + 0xFFFF)
        run.psh = 0
        run.l3 = l3
        run.l4 = l4
        run.poff = poff
        run.is_v6 = is_v6
        run.csum = csum
        run.csum_start = csum_start
        run.csum_offset = csum_offset
        run.verified = csum != CSUM_UNKNOWN
        run.udp = False
        run.key = key
        run.mask = _constant_fields(l3, l4, poff, is_v6)
        run.masked = _from_bytes(frame[:poff], "big") & run.mask
        self._open[key] = run
        self._out.append(run)
        self._last = run

    def _add_udp(self, frame, csum: int, csum_start: int, csum_offset: int) -> bool:
        """Queue a trusted UDP datagram (checksum partial or verified) into its flow's run:
        datagrams of one flow with the same payload size (the last may be shorter) become
        one GSO_UDP_L4 frame, which the host's stack splits again at the socket. False:
        not such a datagram (IP options, fragments, trailing bytes), the caller sends it alone."""
        l3 = 18 if frame[12] == 0x81 and frame[13] == 0 else 14
        et = frame[l3 - 2] << 8 | frame[l3 - 1]
        if et == 0x0800:
            if frame[l3] != 0x45 or frame[l3 + 9] != _UDP_PROTO or frame[l3 + 6] & 0x3F or frame[l3 + 7]:
                return False
            l4 = l3 + 20
            end = l3 + (frame[l3 + 2] << 8 | frame[l3 + 3])
            is_v6 = False
        elif et == 0x86DD:
            if frame[l3 + 6] != _UDP_PROTO:
                return False
            l4 = l3 + 40
            end = l4 + (frame[l3 + 4] << 8 | frame[l3 + 5])
            is_v6 = True
        else:
            return False
        poff = l4 + 8
        if end > len(frame) or end <= poff or (frame[l4 + 4] << 8 | frame[l4 + 5]) != end - l4:
            return False
        if csum == CSUM_PARTIAL and (csum_start != l4 or csum_offset != 6):
            return False
        plen = end - poff
        key = b"u" + bytes(frame[(l3 + 8 if is_v6 else l3 + 12):l4 + 4])
        run = self._open.get(key)
        if run is not None:
            if (run.csum == csum and run.poff == poff and plen <= run.mss and run.size + plen <= run.limit
                    and _from_bytes(frame[:poff], "big") & run.mask == run.masked):
                run.payloads.append(memoryview(frame)[poff:end])
                run.size += plen
                if plen < run.mss or len(run.payloads) >= self.max_segments:
                    del self._open[key]
                else:
                    self._last = run  # the next datagram of the flow takes _extends_udp
                return True
            del self._open[key]  # it goes after the run, in order
        if self.max_segments == 1:
            return False
        run = _Run()
        run.udp = True
        run.first = frame
        run.payloads = [memoryview(frame)[poff:end]]
        run.mss = plen
        run.size = end
        run.limit = min(self.max_size, l3 + 0xFFFF)
        run.psh = 0
        run.l3, run.l4, run.poff, run.is_v6 = l3, l4, poff, is_v6
        run.csum, run.csum_start, run.csum_offset = csum, csum_start, csum_offset
        run.verified = True
        run.key = key
        run.mask = _constant_fields(l3, l4, poff, is_v6, udp=True)
        run.masked = _from_bytes(frame[:poff], "big") & run.mask
        self._open[key] = run
        self._out.append(run)
        self._last = run
        return True

    def _extends(self, run: _Run, frame, csum_start: int, csum_offset: int) -> bool:
        """The common case, cheaply: the next segment of the TCP run that took the previous
        one (one masked integer compare instead of parsing); False leaves it to add()."""
        poff = run.poff
        if len(frame) <= poff:
            return False
        hdr = bytes(frame[:poff])
        if _from_bytes(hdr, "big") & run.mask != run.masked:
            return False
        l3, l4 = run.l3, run.l4
        if run.is_v6:
            plen = (hdr[l3 + 4] << 8 | hdr[l3 + 5]) - (poff - l4)
        else:
            plen = (hdr[l3 + 2] << 8 | hdr[l3 + 3]) - (poff - l3)
        seq = _U32.unpack_from(hdr, l4 + 4)[0]
        flags = hdr[l4 + 13]
        if (seq != run.next_seq or flags & ~_PSH != run.flags or not 0 < plen <= run.mss
                or run.size + plen > run.limit or poff + plen > len(frame)
                or (run.csum == CSUM_PARTIAL and (csum_start != l4 or csum_offset != 16))):
            return False
        payloads = run.payloads
        payloads.append(memoryview(frame)[poff:poff + plen])
        run.size += plen
        run.next_seq = (seq + plen) & 0xFFFFFFFF
        if flags & _PSH or plen < run.mss or len(payloads) >= self.max_segments:
            run.psh = flags & _PSH
            del self._open[run.key]
            self._last = None
        return True

    def _extends_udp(self, run: _Run, frame, csum_start: int, csum_offset: int) -> bool:
        """_extends for a UDP run: the next datagram of the flow that sent the previous one
        (the mask fixes addresses, ports, IHL or next header, no fragment), with
        _add_udp's length checks, without parsing it as TCP and then as UDP first. (Its
        first lines are _extends' on purpose: a shared helper costs 4-5 % of on_port per
        datagram, bench/smallpacket_micro.py.)"""
        poff = run.poff
        if len(frame) <= poff:
            return False
        hdr = bytes(frame[:poff])
        if _from_bytes(hdr, "big") & run.mask != run.masked:
            return False
        l3, l4 = run.l3, run.l4
        end = l4 + (hdr[l3 + 4] << 8 | hdr[l3 + 5]) if run.is_v6 else l3 + (hdr[l3 + 2] << 8 | hdr[l3 + 3])
        plen = end - poff
        if (end > len(frame) or plen <= 0 or (hdr[l4 + 4] << 8 | hdr[l4 + 5]) != end - l4 or plen > run.mss
                or run.size + plen > run.limit or (run.csum == CSUM_PARTIAL and (csum_start != l4 or csum_offset != 6))):
            return False
        payloads = run.payloads
        payloads.append(memoryview(frame)[poff:end])
        run.size += plen
        if plen < run.mss or len(payloads) >= self.max_segments:
            del self._open[run.key]
            self._last = None
        return True

    def _single(self, frame, csum, csum_start, csum_offset) -> None:
        if csum == CSUM_VALID:
            self._out.append(VNET_DATA_VALID + frame)
        elif csum == CSUM_PARTIAL:
            self._out.append(_vnet_pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, 0, 0, 0, csum_start, csum_offset)
                             + frame)
        else:
            self._out.append(VNET_PLAIN + frame)

    def _maybe_tcp(self, frame) -> None:
        """A frame that parse_tcp() refused but that may belong to a TCP flow (an IPv4
        fragment, IPv6 with extension headers, a truncated packet): close every open run
        so no later segment of its flow overtakes it."""
        if not self._open:
            return
        l2 = 18 if frame[12] == 0x81 and frame[13] == 0 else 14
        if len(frame) < l2 + 20:
            return
        et = frame[l2 - 2] << 8 | frame[l2 - 1]
        if et == 0x0800:
            tcp = frame[l2 + 9] == _TCP_PROTO
        elif et == 0x86DD:
            tcp = len(frame) >= l2 + 40 and frame[l2 + 6] not in (_UDP_PROTO, 58)
        else:
            tcp = False
        if tcp:
            self._open.clear()

    def flush(self) -> list:
        """Every frame queued since the last flush, as vnet header + frame, one per TAP write."""
        out = self._out
        if not out:
            return out
        self._out = []
        self._open.clear()
        self._last = None
        result = []
        append = result.append
        join = b"".join
        merged = 0
        for item in out:
            if type(item) is not _Run:
                append(item)
                continue
            first = item.first
            payloads = item.payloads
            if len(payloads) == 1:
                if item.csum == CSUM_PARTIAL:
                    vnet = _vnet_pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, 0, 0, 0,
                                      item.csum_start, item.csum_offset)
                elif item.verified:
                    vnet = VNET_DATA_VALID
                else:
                    vnet = VNET_PLAIN
                append(join((vnet, first)))
                continue
            merged += len(payloads) - 1
            l3 = item.l3
            l4 = item.l4
            poff = item.poff
            size = item.size
            h = bytearray(first[:poff])
            if item.udp:
                append(join([_udp_gso_header(h, l3, l4, size, item.mss, item.is_v6), h, *payloads]))
                continue
            tcp_len = size - l4
            if item.is_v6:
                _u16_pack_into(h, l3 + 4, tcp_len)
                addrs = h[l3 + 8:l4]
                gso_type = GSO_TCPV6
            else:
                _u16_pack_into(h, l3 + 2, size - l3)
                _u16_pack_into(h, l3 + 10, 0)
                _u16_pack_into(h, l3 + 10, ~_fold(_from_bytes(h[l3:l4], "big")) & 0xFFFF)
                addrs = h[l3 + 12:l4]
                gso_type = GSO_TCPV4
            h[l4 + 13] |= item.psh
            _u16_pack_into(h, l4 + 16, _fold(_from_bytes(addrs, "big") + _TCP_PROTO + tcp_len))
            vnet = _vnet_pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, gso_type, poff, item.mss, l4, 16)
            payloads.insert(0, h)
            payloads.insert(0, vnet)
            append(join(payloads))
        self.merged += merged
        self.flushed_frames += len(result)
        return result


def _udp_gso_header(h: bytearray, l3: int, l4: int, size: int, mss: int, is_v6: bool) -> bytes:
    """Rewrite the first datagram's headers (h) for the merged frame; return its vnet header."""
    udp_len = size - l4
    if is_v6:
        _u16_pack_into(h, l3 + 4, udp_len)
        addrs = h[l3 + 8:l4]
    else:
        _u16_pack_into(h, l3 + 2, size - l3)
        _u16_pack_into(h, l3 + 10, 0)
        _u16_pack_into(h, l3 + 10, ~_fold(_from_bytes(h[l3:l4], "big")) & 0xFFFF)
        addrs = h[l3 + 12:l4]
    _u16_pack_into(h, l4 + 4, udp_len)
    _u16_pack_into(h, l4 + 6, _fold(_from_bytes(addrs, "big") + _UDP_PROTO + udp_len))
    return _vnet_pack(VIRTIO_NET_HDR_F_NEEDS_CSUM, GSO_UDP_L4, l4 + 8, mss, l4, 6)


def _l4_sum_ok(frame, l3: int, l4: int, end: int, is_v6: bool) -> bool:
    """TCP checksum check for a packet parse_tcp() accepted with a fixed-size IP header:
    the addresses sit right before the TCP header, so one integer covers both."""
    return (_wsum(frame[(l3 + 8 if is_v6 else l3 + 12):end]) + _TCP_PROTO + end - l4) % 0xFFFF == 0
