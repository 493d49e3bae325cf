"""B.A.T.M.A.N. IV OGM aggregates read in place, for the receive path of a large mesh.

`decode_frame` builds an IvOgm (and a Mac per address, and every TVLV) for each element;
at thousands of OGMs a second that is most of the cost. `walk_iv_ogms` reads only the
fields the protocol uses, as one named tuple per element, and keeps each element's bytes
so that a forwarded OGM is patched instead of re-encoded. It accepts and refuses exactly
what `decode_frame` does (tests/wire/test_ogm_walk.py checks both on random, mutated and
captured aggregates). TVLV containers are decoded through a cache keyed by their bytes:
an originator announces the same containers every second, through every neighbour."""

from __future__ import annotations

import struct
from typing import NamedTuple

from .constants import COMPAT_VERSION, ETH_P_BATMAN, PacketType
from .errors import WireError
from .ethernet import ETH_HLEN
from .frame import decode_frame
from .tvlv import decode_tvlvs

_ETH_PROTO = struct.Struct("!H")
_FIELDS = struct.Struct("!xxBBI6s6sxBH")  # ttl flags seqno orig prev_sender tq tvlv_len
_TVLV_LEN = struct.Struct("!xxH")  # tq and reserved skipped: an element's tvlv_len
OGM_HLEN = 24
TTL_OFFSET, FLAGS_OFFSET, PREV_SENDER_OFFSET, TQ_OFFSET = 2, 3, 14, 21  # in the 24-byte header


class IvOgmFields(NamedTuple):
    """One element of an IV aggregate: its header fields (addresses as plain bytes), its
    decoded TVLVs (shared, read-only) and its bytes on the wire."""

    ttl: int
    flags: int
    seqno: int
    orig: bytes
    prev_sender: bytes
    tq: int
    tvlvs: tuple
    raw: bytes


class TvlvCache:
    """Decoded TVLV containers by their bytes, bounded in bytes (the oldest go first), so
    that a peer sending ever new containers only makes us decode them. An entry is charged
    what it holds decoded, estimated from its size (`cost`): a typical OGM's 28 bytes of
    containers hold about 560 bytes of Python objects."""

    def __init__(self, max_bytes: int = 4 << 20) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._decoded: dict[bytes, tuple] = {}

    def get(self, value: bytes) -> tuple:
        tvlvs = self._decoded.get(value)
        if tvlvs is None:
            try:
                tvlvs = tuple(decode_tvlvs(value))  # WireError for a malformed one (not cached)
            except (ValueError, IndexError) as exc:  # as decode_frame reports them
                if isinstance(exc, WireError):
                    raise
                raise WireError(f"malformed TVLV: {exc}") from None
            self._decoded[value] = tvlvs
            self.size += self.cost(value)
            while self.size > self.max_bytes:
                oldest = next(iter(self._decoded))
                self.size -= self.cost(oldest)
                del self._decoded[oldest]
        return tvlvs

    @staticmethod
    def cost(value: bytes) -> int:
        """What an entry holds: the key, the tuple and the decoded containers (measured
        with tracemalloc: about 560 bytes for 28 bytes of TT, DAT and MCAST containers;
        a TT change list decodes to some 15 bytes of objects per byte)."""
        return 256 + 16 * len(value)

    def __len__(self) -> int:
        return len(self._decoded)


def walk_iv_ogms(data, cache: TvlvCache) -> list[IvOgmFields]:
    """The elements of an IV OGM frame (Ethernet header included), walked as the kernel
    walks an aggregate (decode_frame's rules); WireError where decode_frame raises one."""
    if type(data) is not bytes:  # (a bytearray or memoryview: then its slices would not be bytes)
        data = bytes(data)
    end = len(data)
    if end < ETH_HLEN or _ETH_PROTO.unpack_from(data, 12)[0] != ETH_P_BATMAN:
        return _refused(data)
    off = ETH_HLEN
    if end - off < 2 or data[off] != PacketType.IV_OGM or data[off + 1] != COMPAT_VERSION:
        return _refused(data)
    elements = []
    unpack, new = _FIELDS.unpack_from, tuple.__new__  # (IvOgmFields(...) runs Python code)
    cached, get = cache._decoded.get, cache.get  # a hit without a Python call, else decode and keep
    while True:
        if end - off < OGM_HLEN:
            return _refused(data)  # only the first element gets here short
        ttl, flags, seqno, orig, prev, tq, tvlv_len = unpack(data, off)
        start = off + OGM_HLEN
        stop = start + tvlv_len
        if stop > end:
            return _refused(data)
        tvlvs = (cached(value := data[start:stop]) or get(value)) if tvlv_len else ()
        elements.append(new(IvOgmFields, (ttl, flags, seqno, orig, prev, tq, tvlvs, data[off:stop])))
        off = stop
        # the next element: same packet type, header and TVLVs inside the frame, even length
        if off >= end or data[off] != PacketType.IV_OGM or end - off < OGM_HLEN:
            return elements
        (next_len,) = _TVLV_LEN.unpack_from(data, off + OGM_HLEN - 4)
        if next_len % 2 or off + OGM_HLEN + next_len > end:
            return elements


def _refused(data) -> list:
    """Not the common case: let the full decoder say why (it raises WireError)."""
    decode_frame(data)
    raise WireError("IV OGM aggregate refused")  # decode_frame accepted what the walk did not


def patched(raw: bytes, *, ttl: int, flags: int, prev_sender: bytes, tq: int) -> bytes:
    """A forwarded copy of an element: the header fields the kernel rewrites, TVLVs as they
    came (batadv_iv_ogm_forward works on the received bytes too)."""
    out = bytearray(raw)
    out[TTL_OFFSET] = ttl
    out[FLAGS_OFFSET] = flags
    out[PREV_SENDER_OFFSET:PREV_SENDER_OFFSET + 6] = prev_sender
    out[TQ_OFFSET] = tq
    return bytes(out)


def with_flags(raw: bytes, flags: int) -> bytes:
    if raw[FLAGS_OFFSET] == flags:
        return raw
    out = bytearray(raw)
    out[FLAGS_OFFSET] = flags
    return bytes(out)
