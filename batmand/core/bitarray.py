"""Sliding sequence-number windows (the kernel's bitarray.c) on Python ints.

Bit k of a window means "seqno last - k was received"."""

from __future__ import annotations

WINDOW_SIZE = 64  # BATADV_TQ_LOCAL_WINDOW_SIZE == BATADV_BCAST_MAX_AGE
EXPECTED_SEQNO_RANGE = 65536
_MASK = (1 << WINDOW_SIZE) - 1


def seq_diff32(a: int, b: int) -> int:
    """a - b as a signed 32-bit number (the kernel's s32 arithmetic on u32 seqnos)."""
    d = (a - b) & 0xFFFFFFFF
    return d - (1 << 32) if d & 0x80000000 else d


def seq_before8(x: int, y: int) -> bool:
    """x is older than y in u8 serial arithmetic (batadv_seq_before on ttvn)."""
    d = (x - y) & 0xFF
    return d >= 0x80


def bit_is_set(bits: int, last_seqno: int, seqno: int) -> bool:
    """batadv_test_bit: was `seqno` already seen, given the window ends at last_seqno?"""
    diff = seq_diff32(last_seqno, seqno)
    return 0 <= diff < WINDOW_SIZE and bool(bits >> diff & 1)


def bit_get_packet(bits: int, diff: int, mark: bool) -> tuple[int, bool]:
    """Record a packet `diff` seqnos newer than the window's end; returns (bits, moved)."""
    if -WINDOW_SIZE < diff <= 0:
        return (bits | (1 << -diff) if mark else bits), False
    if 0 < diff < WINDOW_SIZE:
        bits = (bits << diff) & _MASK
        return (bits | 1 if mark else bits), True
    # much newer (missed a lot) or much older (the peer restarted): start over
    return (1 if mark else 0), True


def window_protected(diff: int, now: float, reset_at: float, protection: float) -> tuple[bool, float, bool]:
    """batadv_window_protected: a seqno jump that looks like a restart is accepted at most
    once per `protection` seconds. Returns (drop, new reset timestamp, protection started)."""
    if diff <= -WINDOW_SIZE or diff >= EXPECTED_SEQNO_RANGE:
        if now <= reset_at + protection:
            return True, reset_at, False
        return False, now, True
    return False, reset_at, False


def popcount(bits: int) -> int:
    return bits.bit_count()
