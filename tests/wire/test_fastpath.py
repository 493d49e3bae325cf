from batmand.wire import InnerFrame, Mac, Unicast, Unicast4Addr, build_frame, decode_frame
from batmand.wire.fastpath import (DEST_OFF, INNER_OFF, TTL_OFF, TTVN_OFF, UNICAST_4ADDR_PREFIX_LEN,
                                   unicast_inner_offset, unicast_prefix)
from tests.wire.captures import decoded

A, B, C = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:02:01"), Mac("02:00:00:00:03:01")
INNER = bytes.fromhex("020000000300020000000100" "0800") + bytes(range(200))


def test_prefix_equals_the_general_codec():
    wire = unicast_prefix(B, A, C, ttvn=7, ttl=9) + INNER
    assert wire == build_frame(B, A, Unicast(ttl=9, ttvn=7, dest=C, inner=InnerFrame.decode(INNER)))
    assert unicast_inner_offset(wire) == INNER_OFF and wire[INNER_OFF:] == INNER
    assert wire[DEST_OFF:DEST_OFF + 6] == C and wire[TTVN_OFF] == 7 and wire[TTL_OFF] == 9


def test_inner_offset_of_4addr_and_of_kernel_frames():
    wire = build_frame(B, A, Unicast4Addr(ttvn=1, dest=C, src=A, subtype=2, inner=InnerFrame.decode(INNER)))
    assert unicast_inner_offset(wire) == UNICAST_4ADDR_PREFIX_LEN and wire[UNICAST_4ADDR_PREFIX_LEN:] == INNER
    count = 0
    for cf, frame in decoded("batman_iv-3node-line-multihop-ping.pcapng"):
        off = unicast_inner_offset(cf.data)
        if isinstance(frame.packet, Unicast):
            assert cf.data[off:] == frame.inner.encode()
            assert decode_frame(cf.data).packet.dest == cf.data[DEST_OFF:DEST_OFF + 6]
            count += 1
        else:
            assert off == 0
    assert count > 10


def test_inner_offset_refuses_what_is_not_unicast():
    wire = unicast_prefix(B, A, C, ttvn=1) + INNER
    assert unicast_inner_offset(wire[:37]) == 0  # no room for an inner header
    assert unicast_inner_offset(wire[:14] + b"\x40\x0e" + wire[16:]) == 0  # version 14
    assert unicast_inner_offset(wire[:12] + b"\x08\x00" + wire[14:]) == 0  # not batman
    assert unicast_inner_offset(wire[:14] + b"\x41" + wire[15:]) == 0  # fragment
