"""The in-place OGM walk (wire.ogm_walk) against the full decoder: the same frames accepted
and refused, the same fields, the same element bytes; a forwarded element patched in place
is what re-encoding the edited OGM gives."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from batmand.wire import BROADCAST, WireError, build_frame, decode_frame
from batmand.wire.constants import PacketType
from batmand.wire.ogm_walk import TvlvCache, patched, walk_iv_ogms, with_flags
from tests.wire.captures import decoded, pcap_names
from tests.wire.strategies import iv_ogms, macs


def _agree(data: bytes, cache: TvlvCache | None = None) -> None:
    """walk_iv_ogms says what decode_frame says, for one IV frame."""
    cache = cache or TvlvCache()
    try:
        frame = decode_frame(data)
    except WireError:
        try:
            walk_iv_ogms(data, cache)
        except WireError:
            return
        raise AssertionError("the walk accepted a frame decode_frame refuses")
    elements = walk_iv_ogms(data, cache)
    assert len(elements) == len(frame.packets)
    offset = 14
    for element, ogm, size in zip(elements, frame.packets, frame.sizes):
        assert (element.ttl, element.flags, element.seqno, element.orig, element.prev_sender, element.tq) == \
            (ogm.ttl, ogm.flags, ogm.seqno, ogm.orig, ogm.prev_sender, ogm.tq)
        assert list(element.tvlvs) == ogm.tvlvs
        assert element.raw == bytes(data[offset:offset + size]) and len(element.raw) == size
        offset += size


aggregates = st.lists(iv_ogms, min_size=1, max_size=6)


@settings(max_examples=300)
@given(aggregates, macs, st.binary(max_size=8))
def test_random_aggregates(ogms, src, padding):
    _agree(build_frame(BROADCAST, src, *ogms, padding=padding))


@settings(max_examples=400)
@given(aggregates, macs, st.data())
def test_mutated_aggregates(ogms, src, data):
    """Bytes flipped, cut or appended anywhere: accepted and refused alike."""
    frame = bytearray(build_frame(BROADCAST, src, *ogms))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(14, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(15, len(frame)))
    tail = data.draw(st.binary(max_size=30))
    frame = bytes(frame[:cut]) + tail
    if frame[14] == PacketType.IV_OGM:
        _agree(frame)


def test_captured_aggregates():
    cache = TvlvCache()
    seen = 0
    for name in pcap_names():
        for captured, frame in decoded(name):
            if frame.packet.packet_type == PacketType.IV_OGM:
                _agree(bytes(captured.data), cache)
                seen += 1
    assert seen > 100  # the captures hold plenty of kernel aggregates


@given(iv_ogms, macs, st.integers(0, 255), st.integers(0, 255), st.integers(0, 255))
def test_patched_is_the_reencoded_edit(ogm, prev_sender, ttl, flags, tq):
    raw = ogm.encode()
    edited = dataclasses.replace(ogm, ttl=ttl, flags=flags, prev_sender=prev_sender, tq=tq).encode()
    assert patched(raw, ttl=ttl, flags=flags, prev_sender=bytes(prev_sender), tq=tq) == edited
    assert with_flags(raw, flags) == dataclasses.replace(ogm, flags=flags).encode()


def test_the_tvlv_cache_is_bounded_in_bytes():
    """A peer sending ever new containers costs decoding, never unbounded memory."""
    cache = TvlvCache(max_bytes=4000)
    values = [bytes((0x80, 1, 0, 4)) + i.to_bytes(4, "big") for i in range(500)]  # 8 bytes each
    for value in values:
        assert cache.get(value)[0].value == value[4:]
    assert cache.size <= 4000 and len(cache) == 4000 // TvlvCache.cost(values[0]) > 1
    assert cache.get(values[-1]) is cache.get(values[-1])  # the newest are kept


@given(aggregates, macs)
def test_a_buffer_is_walked_as_its_bytes(ogms, src):
    """A bytearray or memoryview frame gives what its bytes give, every field bytes."""
    data = build_frame(BROADCAST, src, *ogms)
    expected = walk_iv_ogms(data, TvlvCache())
    for buffer in (bytearray(data), memoryview(data)):
        elements = walk_iv_ogms(buffer, TvlvCache())
        assert elements == expected
        assert all(type(e.raw) is bytes and type(e.orig) is bytes for e in elements)
