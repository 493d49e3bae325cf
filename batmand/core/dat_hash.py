"""Where the distributed ARP table keeps an address (the kernel's batadv_hash_dat and
batadv_choose_orig): every node must compute the same ring positions, or kernel and
batmand nodes store and ask at different places.

An entry's key is Bob Jenkins' one-at-a-time hash of its IPv4 address and VID (the VID
as the TT keys it: 0 untagged, 0x8000 | vid tagged, big-endian) modulo 65535; an
originator's position is the kernel's jhash (lookup3) of its address modulo 65535. The
candidates for a key are the DAT-capable originators closest to it going up the ring."""

from __future__ import annotations

DAT_ADDR_MAX = 0xFFFF
CANDIDATES_NUM = 3  # BATADV_DAT_CANDIDATES_NUM
_M = 0xFFFFFFFF


def hash_dat(ip: bytes, vid: int, size: int = DAT_ADDR_MAX) -> int:
    """batadv_hash_dat: the one-at-a-time hash of ip (4 bytes) and vid (2 bytes, BE)."""
    h = 0
    for byte in bytes(ip) + (vid & 0xFFFF).to_bytes(2, "big"):
        h = (h + byte) & _M
        h = (h + (h << 10)) & _M
        h ^= h >> 6
    h = (h + (h << 3)) & _M
    h ^= h >> 11
    h = (h + (h << 15)) & _M
    return h % size


def _rol(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M


# the final mix of lookup3 (the kernel's __jhash_final): (into, from, rotation) in order
_FINAL_MIX = (("c", "b", 14), ("a", "c", 11), ("b", "a", 25), ("c", "b", 16), ("a", "c", 4), ("b", "a", 14),
              ("c", "b", 24))


def jhash6(key: bytes, initval: int = 0) -> int:
    """The kernel's jhash() of a 6-byte key (lookup3: the tail bytes, then the final mix)."""
    start = (0xDEADBEEF + 6 + initval) & _M
    v = {"a": (start + (key[0] | key[1] << 8 | key[2] << 16 | key[3] << 24)) & _M,
         "b": (start + (key[4] | key[5] << 8)) & _M, "c": start}
    for into, source, k in _FINAL_MIX:
        v[into] = ((v[into] ^ v[source]) - _rol(v[source], k)) & _M
    return v["c"]


def orig_position(orig: bytes) -> int:
    """batadv_choose_orig: an originator's place on the ring."""
    return jhash6(bytes(orig)) % DAT_ADDR_MAX


def closeness(position: int, key: int) -> int:
    """The kernel's distance value: larger is closer; the node at the key, or the first
    one above it (wrapping), is closest."""
    return (DAT_ADDR_MAX - position + key) & 0xFFFF


def select_candidates(key: int, origs) -> list:
    """batadv_dat_select_candidates: up to 3 of `origs` (address -> anything), closest
    first; equally close ones by the lower address (the kernel since 2026: 2022.3 took
    the one its hash table walked last, which only two nodes at the same place can tell)."""
    ranked = sorted(origs, key=lambda mac: (-closeness(orig_position(mac), key), bytes(mac)))
    return ranked[:CANDIDATES_NUM]
