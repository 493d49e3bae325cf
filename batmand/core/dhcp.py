"""Which way a DHCP message goes (the kernel's batadv_gw_dhcp_recipient_get): read from
an inner Ethernet frame with the kernel's checks, so that batmand and kernel nodes treat
the same frames as DHCP.

IPv4 UDP to port 67 and IPv6 UDP to port 547 go to a server; from those ports, to a
client, whose hardware address (chaddr) is then returned. The kernel reads chaddr at the
same offset for DHCPv6 too, where those bytes are the transaction id: a DHCPv6 reply is
taken for DHCP toward a client only when they happen to look like an Ethernet chaddr
(htype 1, hlen 6). We do the same, so that both kinds of node agree."""

from __future__ import annotations

from batmand.wire import InnerFrame, Mac

TO_SERVER, TO_CLIENT = "to_server", "to_client"

_ETH_P_IP, _ETH_P_IPV6 = 0x0800, 0x86DD
_IPPROTO_UDP = 17
_SERVER_PORT = {_ETH_P_IP: 67, _ETH_P_IPV6: 547}
_HTYPE_OFFSET, _HLEN_OFFSET, _CHADDR_OFFSET = 1, 2, 28  # in the DHCP header
_HTYPE_ETHERNET, _ETH_ALEN = 1, 6


def recipient(inner: InnerFrame) -> tuple[str | None, Mac | None]:
    """(TO_SERVER, None), (TO_CLIENT, chaddr), or (None, None) when the frame is not DHCP
    (or too short to tell): the frame's one 802.1Q tag, if any, is already split off."""
    data, proto = inner.payload, inner.h_proto
    if proto == _ETH_P_IP:
        if len(data) < 20 or data[9] != _IPPROTO_UDP:
            return None, None
        udp = (data[0] & 0x0F) * 4  # as the kernel: the header length is not checked further
    elif proto == _ETH_P_IPV6:
        if len(data) < 40 or data[6] != _IPPROTO_UDP:  # no extension headers, as the kernel
            return None, None
        udp = 40
    else:
        return None, None
    if len(data) < udp + 8:
        return None, None
    src_port, dst_port = data[udp] << 8 | data[udp + 1], data[udp + 2] << 8 | data[udp + 3]
    port = _SERVER_PORT[proto]
    if dst_port == port:
        return TO_SERVER, None
    if src_port != port:
        return None, None
    dhcp = udp + 8
    if len(data) < dhcp + _CHADDR_OFFSET + _ETH_ALEN:
        return None, None
    if data[dhcp + _HTYPE_OFFSET] != _HTYPE_ETHERNET or data[dhcp + _HLEN_OFFSET] != _ETH_ALEN:
        return None, None
    return TO_CLIENT, Mac(data[dhcp + _CHADDR_OFFSET:dhcp + _CHADDR_OFFSET + _ETH_ALEN])
