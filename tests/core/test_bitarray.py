from batmand.core.bitarray import bit_get_packet, seq_before8, seq_diff32, bit_is_set, window_protected


def test_seq_diff_wraps_like_s32():
    assert seq_diff32(5, 3) == 2
    assert seq_diff32(1, 0xFFFFFFFF) == 2
    assert seq_diff32(0xFFFFFFFF, 1) == -2
    assert seq_diff32(0x80000000, 0) == -0x80000000


def test_seq_before_u8():
    assert seq_before8(0, 1) and not seq_before8(1, 0)
    assert seq_before8(255, 0) and not seq_before8(0, 255)  # 255 -> 0 is "newer"
    assert not seq_before8(7, 7)


def test_window_moves_and_marks():
    bits, moved = bit_get_packet(0, 1, True)
    assert (bits, moved) == (1, True)
    bits, moved = bit_get_packet(bits, 3, True)  # three newer: shift, mark bit 0
    assert (bits, moved) == (0b1001, True)
    bits, moved = bit_get_packet(bits, -1, True)  # one older: mark bit 1, no move
    assert (bits, moved) == (0b1011, False)
    bits, moved = bit_get_packet(bits, 64, False)  # far newer: start over
    assert (bits, moved) == (0, True)
    bits, _ = bit_get_packet((1 << 64) - 1, 1, False)
    assert bits == (1 << 64) - 2  # never more than 64 bits


def test_test_bit():
    assert bit_is_set(0b10, 100, 99) and not bit_is_set(0b10, 100, 100)
    assert not bit_is_set(0xFF, 100, 101) and not bit_is_set(0xFF, 100, 30)


def test_reset_protection():
    drop, reset_at, started = window_protected(-100, now=100.0, reset_at=float("-inf"), protection=30.0)
    assert (drop, reset_at, started) == (False, 100.0, True)
    drop, reset_at, _ = window_protected(-100, now=120.0, reset_at=100.0, protection=30.0)
    assert drop and reset_at == 100.0
    drop, reset_at, _ = window_protected(70000, now=131.0, reset_at=100.0, protection=30.0)
    assert not drop and reset_at == 131.0
    assert window_protected(5, now=101.0, reset_at=100.0, protection=30.0) == (False, 100.0, False)
