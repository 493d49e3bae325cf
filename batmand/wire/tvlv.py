"""TVLV containers (type, version, length, value) and the typed values the kernel uses.

A container is `type u8 | version u8 | len u16 BE | value[len]`; containers are simply
concatenated. Known (type, version) pairs decode into typed objects; anything else, and a
known pair whose value does not fit its layout (the kernel ignores such a value), is kept
as `UnknownTvlv` with its bytes, and is re-encoded unchanged.

Odd-length values are rejected on decode (batman-adv 2026.2 stops the parse there; older
kernels never send them) and can never be encoded.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import ClassVar, Union

from ._util import need
from .constants import TvlvType
from .errors import WireError
from .mac import Mac

_HDR = struct.Struct("!BBH")
_TT_DATA = struct.Struct("!BBH")
_TT_VLAN = struct.Struct("!IHH")
_TT_CHANGE = struct.Struct("!B3s6sH")
_GW = struct.Struct("!II")
_ROAM = struct.Struct("!6sH")
_MCAST = struct.Struct("!B3s")


@dataclass(slots=True)
class UnknownTvlv:
    """A container this codec does not interpret; its value is kept as opaque bytes."""

    type: int
    version: int
    value: bytes = b""

    def encode_value(self) -> bytes:
        return bytes(self.value)


@dataclass(slots=True)
class GatewayTvlv:
    """GW v1: advertised bandwidth in units of 100 kbit/s (batadv_tvlv_gateway_data). A
    longer value is read by its first 8 bytes, as the kernel reads it (`extra` keeps the
    rest for re-encoding); a shorter one is malformed."""

    TYPE: ClassVar[int] = TvlvType.GW
    VERSION: ClassVar[int] = 1
    bandwidth_down: int
    bandwidth_up: int
    extra: bytes = b""

    @classmethod
    def decode_value(cls, value: bytes):
        if len(value) < _GW.size:
            return None
        return cls(*_GW.unpack_from(value), extra=bytes(value[_GW.size:]))

    def encode_value(self) -> bytes:
        return _GW.pack(self.bandwidth_down, self.bandwidth_up) + self.extra


@dataclass(slots=True)
class DatTvlv:
    """DAT v1: empty; its presence says "I take part in the distributed ARP table". The
    kernel does not read a value, so one that has bytes counts too (`extra` keeps them)."""

    TYPE: ClassVar[int] = TvlvType.DAT
    VERSION: ClassVar[int] = 1
    extra: bytes = b""

    @classmethod
    def decode_value(cls, value: bytes):
        return cls(bytes(value))

    def encode_value(self) -> bytes:
        return self.extra


@dataclass(slots=True)
class TtVlan:
    """batadv_tvlv_tt_vlan_data: CRC of one VLAN's entries; vid includes 0x8000 if tagged."""

    crc: int
    vid: int
    reserved: int = 0


@dataclass(slots=True)
class TtChange:
    """batadv_tvlv_tt_change: one client added (or, with flag DEL, removed)."""

    flags: int
    addr: Mac
    vid: int
    reserved: bytes = b"\x00\x00\x00"


@dataclass(slots=True)
class TtTvlv:
    """TT v1 (batadv_tvlv_tt_data + VLAN list + change list)."""

    TYPE: ClassVar[int] = TvlvType.TT
    VERSION: ClassVar[int] = 1
    JSON_EXTRA: ClassVar[tuple] = ("num_vlan",)
    flags: int
    ttvn: int
    vlans: list[TtVlan] = field(default_factory=list)
    changes: list[TtChange] = field(default_factory=list)

    @property
    def num_vlan(self) -> int:
        return len(self.vlans)

    @classmethod
    def decode_value(cls, value: bytes):
        if len(value) < _TT_DATA.size:
            return None
        flags, ttvn, num_vlan = _TT_DATA.unpack_from(value)
        off = _TT_DATA.size
        rest = len(value) - off - num_vlan * _TT_VLAN.size
        if rest < 0 or rest % _TT_CHANGE.size:
            return None
        # lists of their exact size (appending over-allocates; the OGM parser keeps these)
        vlans = [None] * num_vlan
        for i in range(num_vlan):
            vlans[i] = TtVlan(*_TT_VLAN.unpack_from(value, off))
            off += _TT_VLAN.size
        changes = [None] * (rest // _TT_CHANGE.size)
        for i in range(len(changes)):
            cflags, reserved, addr, vid = _TT_CHANGE.unpack_from(value, off)
            changes[i] = TtChange(cflags, Mac(addr), vid, reserved)
            off += _TT_CHANGE.size
        return cls(flags, ttvn, vlans, changes)

    def encode_value(self) -> bytes:
        parts = [_TT_DATA.pack(self.flags, self.ttvn, len(self.vlans))]
        parts += [_TT_VLAN.pack(v.crc, v.vid, v.reserved) for v in self.vlans]
        parts += [_TT_CHANGE.pack(c.flags, bytes(c.reserved), c.addr, c.vid) for c in self.changes]
        return b"".join(parts)


@dataclass(slots=True)
class RoamTvlv:
    """ROAM v1 (batadv_tvlv_roam_adv): the client that moved to the sender."""

    TYPE: ClassVar[int] = TvlvType.ROAM
    VERSION: ClassVar[int] = 1
    client: Mac
    vid: int

    @classmethod
    def decode_value(cls, value: bytes):
        if len(value) != _ROAM.size:
            return None
        client, vid = _ROAM.unpack(value)
        return cls(Mac(client), vid)

    def encode_value(self) -> bytes:
        return _ROAM.pack(self.client, self.vid)


@dataclass(slots=True)
class McastTvlv:
    """MCAST v2 (batadv_tvlv_mcast_data): multicast flags of the originator. The kernel
    reads the first byte of any value (an empty one is flags 0); `reserved` keeps the rest."""

    TYPE: ClassVar[int] = TvlvType.MCAST
    VERSION: ClassVar[int] = 2
    flags: int
    reserved: bytes | None = b"\x00\x00\x00"  # None: the value was empty

    @classmethod
    def decode_value(cls, value: bytes):
        return cls(value[0], bytes(value[1:])) if value else cls(0, None)

    def encode_value(self) -> bytes:
        return b"" if self.reserved is None else bytes([self.flags]) + bytes(self.reserved)


@dataclass(slots=True)
class McastTrackerTvlv:
    """MCAST_TRACKER v1: destination originators of a MCAST packet.

    `num_dests u16 | dests[6 * n]`, then padding (2 zero bytes when n is even) so that the
    inner Ethernet frame that follows in the MCAST packet stays 4-byte aligned."""

    TYPE: ClassVar[int] = TvlvType.MCAST_TRACKER
    VERSION: ClassVar[int] = 1
    JSON_EXTRA: ClassVar[tuple] = ("num_dests",)
    dests: list[Mac] = field(default_factory=list)
    padding: bytes | None = None  # None: the kernel's choice (2 bytes if len(dests) is even)

    @property
    def num_dests(self) -> int:
        return len(self.dests)

    @classmethod
    def decode_value(cls, value: bytes):
        if len(value) < 2:
            return None
        (num,) = struct.unpack_from("!H", value)
        end = 2 + 6 * num
        if end > len(value):
            return None
        dests = [Mac(value[2 + 6 * i : 8 + 6 * i]) for i in range(num)]
        return cls(dests, bytes(value[end:]))

    def encode_value(self) -> bytes:
        padding = self.padding
        if padding is None:
            padding = b"\x00\x00" if len(self.dests) % 2 == 0 else b""
        return struct.pack("!H", len(self.dests)) + b"".join(self.dests) + bytes(padding)


Tvlv = Union[UnknownTvlv, GatewayTvlv, DatTvlv, TtTvlv, RoamTvlv, McastTvlv, McastTrackerTvlv]

_KNOWN = {(cls.TYPE, cls.VERSION): cls for cls in (GatewayTvlv, DatTvlv, TtTvlv, RoamTvlv, McastTvlv, McastTrackerTvlv)}


def tvlv_type(tvlv: Tvlv) -> int:
    return tvlv.type if isinstance(tvlv, UnknownTvlv) else tvlv.TYPE


def tvlv_version(tvlv: Tvlv) -> int:
    return tvlv.version if isinstance(tvlv, UnknownTvlv) else tvlv.VERSION


def malformed(tvlv: Tvlv) -> bool:
    """A container of a known type and version whose value does not fit its layout (kept
    as UnknownTvlv): the kernel's handlers ignore such a value."""
    return isinstance(tvlv, UnknownTvlv) and (tvlv.type, tvlv.version) in _KNOWN


def decode_tvlvs(buf, off: int = 0, end: int | None = None) -> list[Tvlv]:
    """Decode the containers in buf[off:end]; they must fill the region exactly."""
    end = len(buf) if end is None else end
    out: list[Tvlv] = []
    while off < end:
        need(buf[:end], off, _HDR.size, "TVLV header")
        ttype, version, length = _HDR.unpack_from(buf, off)
        off += _HDR.size
        if length > end - off:
            raise WireError(f"TVLV type {ttype} length {length} overruns its region by {length - (end - off)} bytes")
        if length % 2:
            raise WireError(f"TVLV type {ttype} has odd length {length}")
        value = bytes(buf[off : off + length])
        off += length
        cls = _KNOWN.get((ttype, version))
        decoded = cls.decode_value(value) if cls else None
        out.append(decoded if decoded is not None else UnknownTvlv(ttype, version, value))
    return out


def encode_tvlv(tvlv: Tvlv) -> bytes:
    value = tvlv.encode_value()
    if len(value) % 2:
        raise WireError(f"refusing to emit TVLV type {tvlv_type(tvlv)} with odd length {len(value)}")
    if len(value) > 0xFFFF:
        raise WireError(f"TVLV type {tvlv_type(tvlv)} too long: {len(value)} bytes")
    return _HDR.pack(tvlv_type(tvlv), tvlv_version(tvlv), len(value)) + value


def encode_tvlvs(tvlvs: list[Tvlv]) -> bytes:
    return b"".join(encode_tvlv(t) for t in tvlvs)


class TvlvCarrier:
    """Mixin for packets with a `tvlvs` list: tvlv_len is derived, never stored."""

    __slots__ = ()

    @property
    def tvlv_len(self) -> int:
        return len(encode_tvlvs(self.tvlvs))


def tvlv_to_json(tvlv: Tvlv) -> dict:
    from ._util import to_jsonable

    out = {"type": tvlv_type(tvlv), "version": tvlv_version(tvlv), "len": len(tvlv.encode_value())}
    if isinstance(tvlv, UnknownTvlv):
        out["value"] = bytes(tvlv.value).hex()
    else:
        out["name"] = TvlvType(tvlv.TYPE).name.lower()
        out.update(to_jsonable(tvlv))
    return out
