"""The translation-table CRC exactly as the kernel computes it.

Per entry: Linux `crc32c(0, ...)` (reflected Castagnoli, initial value 0, no final XOR)
chained over vid (u16 BE, 0x8000 set when tagged), flags & 0xF0 (one byte) and the MAC.
Per VLAN: XOR of the entry CRCs, so the order of entries does not matter.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from batmand import lazy_package

from .constants import TT_SYNC_MASK

lazy_package.register("crc32c")  # its C function, without the __init__ (see lazy_package)
try:
    from crc32c._crc32c import crc32c
except ImportError:  # a release that keeps it elsewhere
    from crc32c import crc32c


def crc32c_raw(data: bytes, seed: int = 0) -> int:
    """Linux crc32c(seed, data): no pre- or post-inversion (the crc32c package's `crc32c`,
    also exported here, inverts both)."""
    return crc32c(data, seed ^ 0xFFFFFFFF) ^ 0xFFFFFFFF


def tt_entry_crc(addr: bytes, vid: int, flags: int = 0) -> int:
    return crc32c_raw(struct.pack("!HB", vid, flags & TT_SYNC_MASK) + bytes(addr))


def tt_vlan_crc(entries: Iterable[tuple[bytes, int]], vid: int) -> int:
    """CRC of one VLAN over (addr, flags) pairs."""
    crc = 0
    for addr, flags in entries:
        crc ^= tt_entry_crc(addr, vid, flags)
    return crc
