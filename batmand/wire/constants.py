"""Numbers of the batman-adv compat-15 wire format (include/uapi/linux/batadv_packet.h)."""

from enum import IntEnum, IntFlag

ETH_P_BATMAN = 0x4305
ETH_P_8021Q = 0x8100
COMPAT_VERSION = 15
TTL = 50  # BATADV_TTL: initial TTL of OGMs, unicast, fragments, ICMP, unicast TVLV


class PacketType(IntEnum):
    IV_OGM = 0x00
    BCAST = 0x01
    CODED = 0x02  # network coding: removed from the kernel in 2025.4, never handled
    ELP = 0x03
    OGM2 = 0x04
    MCAST = 0x05
    UNICAST = 0x40
    UNICAST_FRAG = 0x41
    UNICAST_4ADDR = 0x42
    ICMP = 0x43
    UNICAST_TVLV = 0x44


UNICAST_MIN = 0x40  # 0x40..0x7f: unicast class, unknown ones are still routed
UNICAST_MAX = 0x7F

# lower-case names used in JSON output and by `batmanctl td --json`
PACKET_TYPE_NAMES = {
    PacketType.IV_OGM: "iv_ogm",
    PacketType.BCAST: "bcast",
    PacketType.CODED: "coded",
    PacketType.ELP: "elp",
    PacketType.OGM2: "ogm2",
    PacketType.MCAST: "mcast",
    PacketType.UNICAST: "unicast",
    PacketType.UNICAST_FRAG: "unicast_frag",
    PacketType.UNICAST_4ADDR: "unicast_4addr",
    PacketType.ICMP: "icmp",
    PacketType.UNICAST_TVLV: "unicast_tvlv",
}


class OgmFlags(IntFlag):
    NOT_BEST_NEXT_HOP = 0x01
    PRIMARIES_FIRST_HOP = 0x02
    DIRECTLINK = 0x04


class IcmpMsgType(IntEnum):
    ECHO_REPLY = 0
    DESTINATION_UNREACHABLE = 3
    ECHO_REQUEST = 8
    TTL_EXCEEDED = 11
    PARAMETER_PROBLEM = 12
    TP = 15


class TpSubtype(IntEnum):
    MSG = 0
    ACK = 1


RR_LEN = 16  # record-route slots in the 116-byte ICMP form


class Unicast4AddrSubtype(IntEnum):
    DATA = 1
    DAT_DHT_GET = 2
    DAT_DHT_PUT = 3
    DAT_CACHE_REPLY = 4


class TvlvType(IntEnum):
    GW = 0x01
    DAT = 0x02
    NC = 0x03  # removed, kept so it can be named
    TT = 0x04
    ROAM = 0x05
    MCAST = 0x06
    MCAST_TRACKER = 0x07


class TtDataFlags(IntFlag):
    OGM_DIFF = 0x01
    REQUEST = 0x02
    RESPONSE = 0x04
    FULL_TABLE = 0x10


TT_DATA_TYPE_MASK = 0x0F


class TtClientFlags(IntFlag):
    DEL = 0x01
    ROAM = 0x02
    WIFI = 0x10
    ISOLA = 0x20
    # local-only bits, never on the wire
    NOPURGE = 0x100
    NEW = 0x200
    PENDING = 0x400
    TEMP = 0x800


TT_SYNC_MASK = 0x00F0  # the client flags that enter the TT CRC
VLAN_HAS_TAG = 0x8000  # BATADV_VLAN_HAS_TAG, set in every tagged VID on the wire


class McastFlags(IntFlag):
    WANT_ALL_UNSNOOPABLES = 0x01
    WANT_ALL_IPV4 = 0x02
    WANT_ALL_IPV6 = 0x04
    WANT_NO_RTR4 = 0x08
    WANT_NO_RTR6 = 0x10
    HAVE_MC_PTYPE_CAPA = 0x20
