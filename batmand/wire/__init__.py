"""batman-adv compat-15 wire codec: bytes in, typed objects out, and back, byte for byte.

No sockets, clocks or globals. Everything malformed raises WireError.
"""

from .bcast import Bcast, Mcast
from .constants import (COMPAT_VERSION, ETH_P_BATMAN, TTL, IcmpMsgType, McastFlags, OgmFlags, PacketType,
                        TtClientFlags, TtDataFlags, TvlvType, Unicast4AddrSubtype, VLAN_HAS_TAG)
from .errors import NotBatmanError, WireError
from .ethernet import Ethernet, InnerFrame
from .frame import Frame, Packet, build_frame, decode_frame, decode_packets
from .icmp import IcmpPacket, IcmpRRPacket, IcmpTpPacket
from .mac import BROADCAST, Mac
from .ogm import ELP_TVLV_PADDING, Elp, IvOgm, Ogm2
from .tt_crc import crc32c_raw, tt_entry_crc, tt_vlan_crc
from .tvlv import (DatTvlv, GatewayTvlv, McastTrackerTvlv, McastTvlv, RoamTvlv, TtChange, TtTvlv, TtVlan,
                   UnknownTvlv, decode_tvlvs, encode_tvlvs, tvlv_type, tvlv_version)
from .unicast import Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, UnknownUnicast

__all__ = [name for name in dir() if not name.startswith("_")]
