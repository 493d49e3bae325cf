from batmand.wire import InnerFrame, Mac, Unicast, Unicast4Addr, build_frame, decode_frame
from batmand.wire.fastpath import (decap_unicast, encap_unicast, rewrite_for_forwarding, unicast_dest,
                                   unicast_inner_offset, unicast_prefix, unicast_ttvn)
from tests.wire.captures import decoded

A, B, C = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:02:01"), Mac("02:00:00:00:03:01")
INNER = bytes.fromhex("020000000300020000000100" "0800") + bytes(range(200))


def test_encap_equals_the_general_codec():
    wire = encap_unicast(unicast_prefix(B, A, C, ttvn=7), INNER)
    expected = build_frame(B, A, Unicast(ttvn=7, dest=C, inner=InnerFrame.decode(INNER)))
    assert wire == expected
    assert bytes(decap_unicast(wire)) == INNER
    assert unicast_dest(wire) == C and unicast_ttvn(wire) == 7


def test_decap_of_4addr_and_of_kernel_frames():
    wire = build_frame(B, A, Unicast4Addr(ttvn=1, dest=C, src=A, subtype=2, inner=InnerFrame.decode(INNER)))
    assert bytes(decap_unicast(wire)) == INNER
    count = 0
    for cf, frame in decoded("batman_iv-3node-line-multihop-ping.pcapng"):
        view = decap_unicast(cf.data)
        if isinstance(frame.packet, Unicast):
            assert bytes(view) == frame.inner.encode()
            count += 1
        else:
            assert view is None
    assert count > 10


def test_decap_refuses_what_is_not_unicast():
    wire = encap_unicast(unicast_prefix(B, A, C, ttvn=1), INNER)
    assert unicast_inner_offset(wire[:37]) == 0  # no room for an inner header
    assert decap_unicast(wire[:14] + b"\x40\x0e" + wire[16:]) is None  # version 14
    assert decap_unicast(wire[:12] + b"\x08\x00" + wire[14:]) is None  # not batman
    assert decap_unicast(wire[:14] + b"\x41" + wire[15:]) is None  # fragment


def test_forwarding_rewrite():
    frame = bytearray(encap_unicast(unicast_prefix(B, A, C, ttvn=1, ttl=2), INNER))
    assert rewrite_for_forwarding(frame, C, B)
    pkt = decode_frame(frame).packet
    assert frame[:12] == bytes(C) + bytes(B) and pkt.ttl == 1
    assert not rewrite_for_forwarding(frame, C, B)
