"""Whole frames: decode_frame() and Frame, the entry points of the wire codec.

Ethernet padding: frames shorter than 60 bytes are padded on a real wire (captures taken
on a tap/virtio link are not). For packets with a length of their own (OGM aggregates,
OGMv2, ELP, ICMP, UNICAST_TVLV) the bytes after the packet are kept in `Frame.padding` and
ignored, as the kernel ignores them; `encode()` appends them again, so decode/encode is
byte-exact. Packets that carry an inner frame or fragment data run to the end of the
frame, so there any padding belongs to the inner frame, exactly as the kernel delivers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ._util import need, to_jsonable
from .bcast import Bcast, Mcast
from .constants import COMPAT_VERSION, ETH_P_BATMAN, PACKET_TYPE_NAMES, UNICAST_MAX, UNICAST_MIN, PacketType
from .errors import NotBatmanError, WireError
from .ethernet import ETH_HLEN, Ethernet
from .icmp import IcmpPacket, IcmpRRPacket, IcmpTpPacket, decode_icmp
from .mac import Mac
from .ogm import Elp, IvOgm, Ogm2
from .tvlv import tvlv_to_json
from .unicast import Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, UnknownUnicast

Packet = Union[IvOgm, Ogm2, Elp, IcmpPacket, IcmpRRPacket, IcmpTpPacket, Unicast, Unicast4Addr, UnicastFrag,
               UnicastTvlv, UnknownUnicast, Bcast, Mcast]

_SINGLE = {
    PacketType.ELP: Elp.decode,
    PacketType.BCAST: Bcast.decode,
    PacketType.MCAST: Mcast.decode,
    PacketType.UNICAST: Unicast.decode,
    PacketType.UNICAST_FRAG: UnicastFrag.decode,
    PacketType.UNICAST_4ADDR: Unicast4Addr.decode,
    PacketType.ICMP: decode_icmp,
    PacketType.UNICAST_TVLV: UnicastTvlv.decode,
}
_AGGREGATES = {PacketType.IV_OGM: IvOgm, PacketType.OGM2: Ogm2}


def _decode_aggregate(cls, buf):
    """Walk an aggregate as the kernel does: the next element must have the same packet
    type, fit the frame with its TVLVs, and have an even tvlv_len; the rest is padding."""
    packet, off = cls.decode(buf, 0)
    packets, sizes = [packet], [off]
    while off < len(buf) and buf[off] == packets[0].packet_type and cls.peek_size(buf, off):
        packet, end = cls.decode(buf, off)
        packets.append(packet)
        sizes.append(end - off)
        off = end
    return packets, sizes, off


def decode_packets(buf) -> tuple[list[Packet], bytes]:
    """Decode a batman-adv packet (no Ethernet header); returns (packets, padding).

    Also used for packets rebuilt from fragments, which re-enter the receive path."""
    packets, _sizes, padding = _decode_packets(buf)
    return packets, padding


def _decode_packets(buf) -> tuple[list[Packet], list[int], bytes]:
    """(packets, each one's size on the wire, padding)."""
    buf = memoryview(buf)
    need(buf, 0, 2, "batman-adv header")
    ptype, version = buf[0], buf[1]
    if version != COMPAT_VERSION:
        raise WireError(f"unsupported compat version {version} (packet type 0x{ptype:02x})")
    try:
        if ptype in _AGGREGATES:
            packets, sizes, end = _decode_aggregate(_AGGREGATES[ptype], buf)
        elif ptype in _SINGLE:
            packet, end = _SINGLE[ptype](buf, 0)
            packets, sizes = [packet], [end]
        elif UNICAST_MIN <= ptype <= UNICAST_MAX:
            packet, end = UnknownUnicast.decode(buf, 0)
            packets, sizes = [packet], [end]
        else:
            raise WireError(f"unknown packet type 0x{ptype:02x}")
    except (ValueError, IndexError) as exc:  # Mac() and friends; never let a raw error escape
        if isinstance(exc, WireError):
            raise
        raise WireError(f"malformed packet type 0x{ptype:02x}: {exc}") from None
    return packets, sizes, bytes(buf[end:])


@dataclass(slots=True, kw_only=True)
class Frame:
    """One Ethernet frame on a hard interface: outer header, batman-adv packet(s), padding.
    `packets` has several entries only for aggregated OGM / OGMv2 frames."""

    ethernet: Ethernet
    packets: list[Packet] = field(default_factory=list)
    padding: bytes = b""
    sizes: list[int] = field(default_factory=list, compare=False)  # each packet's size as decoded

    @property
    def packet(self) -> Packet:
        return self.packets[0]

    @property
    def inner(self):
        """The inner Ethernet frame of UNICAST/UNICAST_4ADDR/BCAST/MCAST, else None."""
        return getattr(self.packets[0], "inner", None)

    def encode(self) -> bytes:
        return self.ethernet.encode() + b"".join(p.encode() for p in self.packets) + self.padding

    def to_json(self) -> dict:
        packets = []
        for packet in self.packets:
            item = to_jsonable(packet)
            item["packet_type"] = PACKET_TYPE_NAMES.get(packet.packet_type, f"unknown_0x{packet.packet_type:02x}")
            if "tvlvs" in item:
                item["tvlvs"] = [tvlv_to_json(t) for t in packet.tvlvs]
            packets.append(item)
        out = {"ethernet": to_jsonable(self.ethernet), "packets": packets}
        if self.padding:
            out["padding"] = self.padding.hex()
        return out


def decode_frame(buf) -> Frame:
    """Decode one whole Ethernet frame (bytes or memoryview).

    Raises NotBatmanError (a WireError) for other ethertypes and WireError for anything
    malformed; never another exception type."""
    buf = memoryview(buf)
    if buf.ndim != 1 or buf.itemsize != 1:
        buf = buf.cast("B")
    ethernet = Ethernet.decode(buf)
    if ethernet.h_proto != ETH_P_BATMAN:
        raise NotBatmanError(f"not a batman-adv frame (ethertype 0x{ethernet.h_proto:04x})")
    packets, sizes, padding = _decode_packets(buf[ETH_HLEN:])
    return Frame(ethernet=ethernet, packets=packets, padding=padding, sizes=sizes)


def build_frame(h_dest: Mac, h_source: Mac, *packets: Packet, padding: bytes = b"") -> bytes:
    """Encode packets behind an Ethernet header with ethertype 0x4305."""
    return Frame(ethernet=Ethernet(h_dest=h_dest, h_source=h_source, h_proto=ETH_P_BATMAN),
                 packets=list(packets), padding=padding).encode()
