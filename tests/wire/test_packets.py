"""Packet forms the reference captures do not contain, checked against byte layouts written
out by hand from batadv_packet.h (offsets in the comments)."""

import pytest

from batmand.wire import (BROADCAST, IcmpMsgType, IcmpPacket, IcmpRRPacket, IcmpTpPacket, InnerFrame, Mac, Mcast,
                          McastTrackerTvlv, Unicast4Addr, Unicast4AddrSubtype, UnknownTvlv, UnknownUnicast,
                          WireError, build_frame, decode_frame, GatewayTvlv, RoamTvlv, IvOgm, TtTvlv, Elp,
                          ELP_TVLV_PADDING, McastTvlv, decode_tvlvs, encode_tvlvs)

A = Mac("02:00:00:00:01:01")
B = Mac("02:00:00:00:02:01")
ETH = bytes(B) + bytes(A) + b"\x43\x05"
INNER = bytes.fromhex("020000000200" "020000000100" "0800") + b"payload!"


def test_icmp_destination_unreachable_and_parameter_problem():
    for msg in (IcmpMsgType.DESTINATION_UNREACHABLE, IcmpMsgType.PARAMETER_PROBLEM, IcmpMsgType.TTL_EXCEEDED):
        raw = ETH + bytes([0x43, 15, 50, msg]) + bytes(B) + bytes(A) + bytes([7, 0]) + b"\x01\x02"
        frame = decode_frame(raw)
        assert isinstance(frame.packet, IcmpPacket)
        assert (frame.packet.msg_type, frame.packet.uid, frame.packet.seqno) == (msg, 7, 0x0102)
        assert frame.packet.dst == B and frame.packet.orig == A
        assert frame.encode() == raw


def test_icmp_record_route():
    rr = bytes(A) + bytes(B) + bytes(6 * 14)
    raw = ETH + bytes([0x43, 15, 50, IcmpMsgType.ECHO_REQUEST]) + bytes(B) + bytes(A) + bytes([3, 2]) + b"\x00\x05" + rr
    frame = decode_frame(raw)
    pkt = frame.packet
    assert isinstance(pkt, IcmpRRPacket) and len(raw) - 14 == 116
    assert (pkt.uid, pkt.rr_cur, pkt.seqno) == (3, 2, 5) and pkt.rr[:2] == [A, B]
    assert frame.encode() == raw
    # a TTL-exceeded answer to an RR request keeps 116 bytes but is not an RR packet
    raw_err = raw[:17] + bytes([IcmpMsgType.TTL_EXCEEDED]) + raw[18:]
    frame = decode_frame(raw_err)
    assert isinstance(frame.packet, IcmpPacket) and len(frame.padding) == 96 and frame.encode() == raw_err


def test_icmp_throughput_meter():
    data = bytes(range(40))
    raw = (ETH + bytes([0x43, 15, 50, IcmpMsgType.TP]) + bytes(B) + bytes(A) + bytes([9, 1]) + b"\xab\xcd"
           + (0xFFFFF82F).to_bytes(4, "big") + b"\x11\x22\x33\x44" + data)
    pkt = decode_frame(raw).packet
    assert isinstance(pkt, IcmpTpPacket)
    assert (pkt.uid, pkt.subtype, pkt.session, pkt.seqno, pkt.timestamp) == (9, 1, b"\xab\xcd", 0xFFFFF82F, 0x11223344)
    assert pkt.data == data and decode_frame(raw).encode() == raw


@pytest.mark.parametrize("subtype", list(Unicast4AddrSubtype))
def test_unicast_4addr_subtypes(subtype):
    raw = ETH + bytes([0x42, 15, 50, 4]) + bytes(B) + bytes(A) + bytes([subtype, 0]) + INNER
    pkt = decode_frame(raw).packet
    assert isinstance(pkt, Unicast4Addr) and pkt.subtype == subtype and pkt.src == A and pkt.ttvn == 4
    assert pkt.inner.h_proto == 0x0800 and pkt.inner.payload == b"payload!"


def test_mcast_packet_with_tracker():
    # tracker with 2 destinations: num_dests(2) + 12 bytes + 2 padding bytes = 16
    tracker = b"\x07\x01\x00\x10" + b"\x00\x02" + bytes(A) + bytes(B) + b"\x00\x00"
    raw = ETH + bytes([0x05, 15, 50, 0]) + len(tracker).to_bytes(2, "big") + tracker + INNER
    frame = decode_frame(raw)
    pkt = frame.packet
    assert isinstance(pkt, Mcast) and pkt.tvlv_len == 20
    (trk,) = pkt.tvlvs
    assert isinstance(trk, McastTrackerTvlv) and trk.dests == [A, B] and trk.num_dests == 2
    assert pkt.inner.payload == b"payload!" and frame.encode() == raw
    # the inner frame starts 4-byte aligned relative to the IP header rule (header % 4 == 2)
    assert (6 + pkt.tvlv_len) % 4 == 2
    # built from scratch with the kernel's padding choice, it is the same bytes
    built = build_frame(B, A, Mcast(tvlvs=[McastTrackerTvlv(dests=[A, B])], inner=pkt.inner))
    assert built == raw
    assert McastTrackerTvlv(dests=[A]).encode_value() == b"\x00\x01" + bytes(A)


def test_unknown_tvlv_is_kept_opaque_and_odd_lengths_are_refused():
    raw = b"\x42\x07\x00\x04abcd" + b"\x01\x01\x00\x08" + bytes(8)
    tvlvs = decode_tvlvs(raw)
    assert tvlvs[0] == UnknownTvlv(0x42, 7, b"abcd") and tvlvs[1] == GatewayTvlv(0, 0)
    assert encode_tvlvs(tvlvs) == raw
    # a known type whose value does not fit its layout stays opaque (the kernel ignores it)
    assert decode_tvlvs(b"\x05\x01\x00\x02xy") == [UnknownTvlv(5, 1, b"xy")]
    with pytest.raises(WireError, match="odd length"):
        decode_tvlvs(b"\x42\x07\x00\x03abc\x00")
    with pytest.raises(WireError, match="odd length"):
        encode_tvlvs([UnknownTvlv(0x42, 1, b"abc")])
    with pytest.raises(WireError, match="overruns"):
        decode_tvlvs(b"\x42\x07\x00\x08abcd")


def test_unknown_unicast_type_keeps_its_destination():
    raw = ETH + bytes([0x55, 15, 30, 0]) + bytes(B) + b"future"
    pkt = decode_frame(raw).packet
    assert isinstance(pkt, UnknownUnicast) and pkt.dest == B and pkt.body == b"future"
    assert decode_frame(raw).encode() == raw


@pytest.mark.parametrize("ptype", [0x02, 0x06, 0x3F, 0x80, 0xFF])
def test_unknown_special_types_are_errors(ptype):
    with pytest.raises(WireError, match="unknown packet type"):
        decode_frame(ETH + bytes([ptype, 15]) + bytes(40))


def test_wrong_compat_version_is_an_error():
    with pytest.raises(WireError, match="compat version 14"):
        decode_frame(ETH + bytes([0x40, 14, 50, 0]) + bytes(B) + INNER)


def test_out_of_range_fields_fail_to_encode_with_wire_error():
    with pytest.raises(WireError):
        IvOgm(seqno=1 << 32, orig=A, prev_sender=A).encode()
    with pytest.raises(WireError):
        build_frame(BROADCAST, A, Elp(orig=A, seqno=-1))


def test_built_ogm_matches_the_kernel_layout():
    ogm = IvOgm(seqno=0x01020304, orig=A, prev_sender=B, tq=200, flags=0x04, ttl=49,
                tvlvs=[RoamTvlv(client=B, vid=0x8001), McastTvlv(flags=0x18)])
    raw = ogm.encode()
    assert raw[:24] == bytes([0, 15, 49, 4, 1, 2, 3, 4]) + bytes(A) + bytes(B) + bytes([0, 200, 0, 20])
    assert raw[24:] == b"\x05\x01\x00\x08" + bytes(B) + b"\x80\x01" + b"\x06\x02\x00\x04\x18\x00\x00\x00"


def test_elp_as_the_kernel_sends_it():
    raw = build_frame(BROADCAST, A, Elp(orig=A, seqno=7, elp_interval=500), padding=ELP_TVLV_PADDING)
    assert len(raw) == 34
    assert raw[14:] == bytes([3, 15]) + bytes(A) + b"\x00\x00\x00\x07\x00\x00\x01\xf4" + bytes(4)


def test_tt_tvlv_change_count_must_fit():
    # 4-byte header + one VLAN + 5 bytes: not a whole change entry -> kept opaque
    value = b"\x01\x01\x00\x01" + bytes(8) + bytes(5)
    assert isinstance(decode_tvlvs(b"\x04\x01" + len(value + b"\x00").to_bytes(2, "big") + value + b"\x00")[0],
                      UnknownTvlv)
    ok = b"\x01\x01\x00\x01" + bytes(8) + bytes(12)
    (tt,) = decode_tvlvs(b"\x04\x01\x00\x18" + ok)
    assert isinstance(tt, TtTvlv) and len(tt.changes) == 1 and tt.num_vlan == 1


def test_inner_vlan_tag():
    inner = bytes(B) + bytes(A) + b"\x81\x00\x20\x0a\x08\x06" + b"arp"
    frame = InnerFrame.decode(inner)
    assert (frame.vlan_tci, frame.vid, frame.h_proto, frame.payload) == (0x200A, 10, 0x0806, b"arp")
    assert frame.encode() == inner


def test_short_inner_frame_is_an_error():
    with pytest.raises(WireError, match="inner Ethernet"):
        decode_frame(ETH + bytes([0x40, 15, 50, 0]) + bytes(B) + bytes(10))
