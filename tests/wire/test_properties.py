"""Property tests: malformed input only ever raises WireError; whatever decodes encodes back
to the same bytes; generated valid packets survive encode -> decode unchanged."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batmand.wire import WireError, build_frame, decode_frame
from tests.wire.captures import decoded, pcap_names
from tests.wire.strategies import ethernet_pairs, frames


def _check(data: bytes) -> None:
    try:
        frame = decode_frame(data)
    except WireError:
        return
    assert frame.encode() == data


def _real_frames() -> list[bytes]:
    return [cf.data for name in pcap_names() for cf, _ in decoded(name)]


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data):
    _check(data)


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from([0x00, 0x01, 0x03, 0x04, 0x05, 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x02, 0x80]),
       st.sampled_from([15, 14]), st.binary(max_size=200))
def test_random_bodies_behind_a_batman_header(ptype, version, body):
    _check(b"\xff" * 6 + b"\x02" * 6 + b"\x43\x05" + bytes([ptype, version]) + body)


def test_every_truncation_of_every_real_frame():
    for data in _real_frames():
        for cut in range(len(data)):
            _check(data[:cut])


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bit_flips_of_real_frames(data):
    frames_ = _real_frames()
    frame = bytearray(data.draw(st.sampled_from(frames_)))
    for _ in range(data.draw(st.integers(1, 4))):
        bit = data.draw(st.integers(0, len(frame) * 8 - 1))
        frame[bit // 8] ^= 1 << (bit % 8)
    _check(bytes(frame))


def test_random_byte_changes_in_headers_deterministic():
    """Every byte of the first 80 of each real frame set to a few nasty values."""
    rng = random.Random(15)
    for data in _real_frames()[::7]:
        for pos in range(14, min(len(data), 80)):
            for value in (0x00, 0xFF, 0x01, rng.randrange(256)):
                mutated = bytearray(data)
                mutated[pos] = value
                _check(bytes(mutated))


@settings(max_examples=800, deadline=None)
@given(frames, ethernet_pairs)
def test_generated_packets_round_trip(frame_parts, addrs):
    packets, padding = frame_parts
    wire = build_frame(addrs[0], addrs[1], *packets, padding=padding)
    frame = decode_frame(wire)
    assert frame.packets == packets
    assert frame.padding == padding
    assert frame.encode() == wire
