"""Hypothesis strategies that generate valid batman-adv packets of every type."""

from hypothesis import strategies as st

from batmand.wire import (BROADCAST, Bcast, DatTvlv, Elp, GatewayTvlv, IcmpMsgType, IcmpPacket, IcmpRRPacket,
                          IcmpTpPacket, InnerFrame, IvOgm, Mac, Mcast, McastTrackerTvlv, McastTvlv, Ogm2,
                          RoamTvlv, TtChange, TtTvlv, TtVlan, Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv,
                          UnknownTvlv, UnknownUnicast)
from batmand.wire.tvlv import _KNOWN

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
macs = st.binary(min_size=6, max_size=6).map(Mac)
even_bytes = st.binary(max_size=40).map(lambda b: b[: len(b) // 2 * 2])

unknown_tvlvs = st.builds(UnknownTvlv, type=u8, version=u8, value=even_bytes).filter(
    lambda t: (t.type, t.version) not in _KNOWN)
tt_tvlvs = st.builds(
    TtTvlv, flags=u8, ttvn=u8,
    vlans=st.lists(st.builds(TtVlan, crc=u32, vid=u16, reserved=u16), max_size=4),
    changes=st.lists(st.builds(TtChange, flags=u8, addr=macs, vid=u16, reserved=st.binary(min_size=3, max_size=3)),
                     max_size=6))
tvlvs = st.one_of(
    unknown_tvlvs,
    st.builds(GatewayTvlv, bandwidth_down=u32, bandwidth_up=u32),
    st.builds(DatTvlv),
    tt_tvlvs,
    st.builds(RoamTvlv, client=macs, vid=u16),
    st.builds(McastTvlv, flags=u8, reserved=st.binary(min_size=3, max_size=3)),
    st.builds(McastTrackerTvlv, dests=st.lists(macs, max_size=5), padding=st.sampled_from([b"", b"\x00\x00"])),
)
tvlv_lists = st.lists(tvlvs, max_size=4)

inner_frames = st.builds(InnerFrame, h_dest=macs, h_source=macs, h_proto=u16.filter(lambda p: p != 0x8100),
                         payload=st.binary(max_size=64), vlan_tci=st.one_of(st.none(), u16))

iv_ogms = st.builds(IvOgm, ttl=u8, flags=u8, seqno=u32, orig=macs, prev_sender=macs, reserved=u8, tq=u8,
                    tvlvs=tvlv_lists)
ogm2s = st.builds(Ogm2, ttl=u8, flags=u8, seqno=u32, orig=macs, throughput=u32, tvlvs=tvlv_lists)
elps = st.builds(Elp, orig=macs, seqno=u32, elp_interval=u32)
icmps = st.builds(IcmpPacket, ttl=u8, msg_type=u8.filter(lambda m: m != IcmpMsgType.TP), dst=macs, orig=macs,
                  uid=u8, reserved=u8, seqno=u16)
icmp_rrs = st.builds(IcmpRRPacket, ttl=u8, msg_type=st.sampled_from([IcmpMsgType.ECHO_REQUEST, IcmpMsgType.ECHO_REPLY]),
                     dst=macs, orig=macs, uid=u8, rr_cur=u8, seqno=u16, rr=st.lists(macs, min_size=16, max_size=16))
icmp_tps = st.builds(IcmpTpPacket, ttl=u8, dst=macs, orig=macs, uid=u8, subtype=u8,
                     session=st.binary(min_size=2, max_size=2), seqno=u32, timestamp=u32, data=st.binary(max_size=64))
unicasts = st.builds(Unicast, ttl=u8, ttvn=u8, dest=macs, inner=inner_frames)
unicast_4addrs = st.builds(Unicast4Addr, ttl=u8, ttvn=u8, dest=macs, src=macs, subtype=u8, reserved=u8,
                           inner=inner_frames)
frags = st.builds(UnicastFrag, ttl=u8, no=st.integers(0, 15), priority=st.integers(0, 7), reserved=st.integers(0, 1),
                  dest=macs, orig=macs, seqno=u16, total_size=u16, data=st.binary(max_size=64))
unicast_tvlvs = st.builds(UnicastTvlv, ttl=u8, reserved=u8, dst=macs, src=macs, align=u16, tvlvs=tvlv_lists)
unknown_unicasts = st.builds(UnknownUnicast, packet_type=st.integers(0x45, 0x7F), ttl=u8, reserved=u8, dest=macs,
                             body=st.binary(max_size=32))
bcasts = st.builds(Bcast, ttl=u8, reserved=u8, seqno=u32, orig=macs, inner=inner_frames)
mcasts = st.builds(Mcast, ttl=u8, reserved=u8, tvlvs=tvlv_lists, inner=inner_frames)

# (packets of one frame, allowed padding): aggregates of one type; padding only where the
# packet has its own length and the padding cannot be mistaken for more packet
frames = st.one_of(
    st.tuples(st.lists(iv_ogms, min_size=1, max_size=3), st.just(b"")),
    st.tuples(st.lists(ogm2s, min_size=1, max_size=3), st.just(b"")),
    st.tuples(st.lists(elps, min_size=1, max_size=1), st.binary(max_size=30)),
    st.tuples(st.lists(icmps, min_size=1, max_size=1), st.binary(max_size=20)),
    st.tuples(st.lists(icmp_rrs, min_size=1, max_size=1), st.binary(max_size=20)),
    st.tuples(st.lists(st.one_of(icmp_tps, unicasts, unicast_4addrs, frags, unknown_unicasts, bcasts, mcasts),
                       min_size=1, max_size=1), st.just(b"")),
    st.tuples(st.lists(unicast_tvlvs, min_size=1, max_size=1), st.binary(max_size=3)),
)
ethernet_pairs = st.tuples(st.one_of(st.just(BROADCAST), macs), macs)
