"""Fragmentation (the kernel's fragmentation.c): cut a batman-adv packet that does not fit
the next hop's MTU into UNICAST_FRAG packets, and put fragments back together.

Sending: at most 16 fragments of at most 1280 bytes, equal sizes, cut from the tail:
fragment `no` 0 carries the tail, the highest `no` the head (with the original header).
Receiving: 8 chains per originator (bucket = seqno % 8), a new seqno in a bucket discards
the old chain, duplicates are dropped, the merge is head-first in descending `no`.
Our addition: one byte budget across all originators, the chain touched longest ago evicted
first."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from batmand.wire import Mac, UnicastFrag

MAX_FRAG_SIZE = 1280
HEADER = 20
MAX_FRAGMENTS = 16
BUFFER_COUNT = 8
SIZE_LIMIT = (MAX_FRAG_SIZE - HEADER) * MAX_FRAGMENTS  # 20160: largest packet rebuilt


def fragment(packet: bytes, mtu: int, *, seqno: int, orig: Mac, dest: Mac, priority: int = 0,
             ttl: int = 50) -> list[bytes] | None:
    """batadv_frag_send_packet: the fragments in sending order, or None (more than 16)."""
    max_size = min(mtu, MAX_FRAG_SIZE) - HEADER
    if not packet or max_size <= 0:
        return None
    count = (len(packet) - 1) // max_size + 1
    max_size = (len(packet) - 1) // count + 1
    if count > MAX_FRAGMENTS:
        return None
    out = []
    rest = packet
    no = 0
    while len(rest) > max_size:
        out.append(UnicastFrag(ttl=ttl, no=no, priority=priority, dest=dest, orig=orig, seqno=seqno,
                               total_size=len(packet), data=rest[-max_size:]).encode())
        rest = rest[:-max_size]
        no += 1
    out.append(UnicastFrag(ttl=ttl, no=no, priority=priority, dest=dest, orig=orig, seqno=seqno,
                           total_size=len(packet), data=rest).encode())
    return out


def priority_of(inner: bytes) -> int:
    """batadv_skb_set_priority: 802.1d priority from the VLAN PCP or the IP DSCP."""
    if len(inner) < 14:
        return 0
    ethertype = inner[12:14]
    if ethertype == b"\x81\x00" and len(inner) >= 16:
        return inner[14] >> 5
    if ethertype == b"\x08\x00" and len(inner) >= 16:
        return (inner[15] & 0xFC) >> 5
    if ethertype == b"\x86\xdd" and len(inner) >= 16:
        traffic_class = ((inner[14] & 0x0F) << 4) | (inner[15] >> 4)
        return (traffic_class & 0xFC) >> 5
    return 0


@dataclass(eq=False)
class Chain:
    seqno: int
    total_size: int
    touched: float  # last fragment added (the kernel's chain timestamp)
    parts: dict[int, bytes] = field(default_factory=dict)  # no -> data
    size: int = 0  # bytes in parts


class Reassembly:
    """Fragment chains of all originators, within a byte budget. Chains are kept in the order
    they were last touched, so evicting the oldest and timing chains out cost O(1) per chain
    however many are buffered. The budget and the timeout are read from `config` at each use."""

    def __init__(self, counters, config) -> None:
        self.chains: OrderedDict[tuple[Mac, int], Chain] = OrderedDict()
        self.counters = counters
        self.config = config
        self.bytes = 0

    def _drop(self, key) -> None:
        chain = self.chains.pop(key, None)
        if chain is not None:
            self.bytes -= chain.size

    def add(self, now: float, frag: UnicastFrag) -> bytes | None:
        """Buffer one fragment; returns the whole packet when the chain is complete."""
        key = (frag.orig, frag.seqno % BUFFER_COUNT)
        chain = self.chains.get(key)
        if chain is None or chain.seqno != frag.seqno:
            self._drop(key)
            chain = self.chains[key] = Chain(frag.seqno, frag.total_size, now)
        elif frag.no in chain.parts:
            self.counters.drop("fragment_duplicate")
            return None
        else:
            self.chains.move_to_end(key)
        chain.touched = now
        chain.parts[frag.no] = data = bytes(frag.data)
        chain.size += len(data)
        self.bytes += len(data)
        if chain.size > SIZE_LIMIT or chain.total_size != frag.total_size or chain.total_size > SIZE_LIMIT:
            self.counters.drop("fragment_chain_invalid")
            self._drop(key)
            return None
        if chain.size == chain.total_size:
            self._drop(key)
            return b"".join(chain.parts[no] for no in sorted(chain.parts, reverse=True))
        limit = self.config.max_fragment_bytes
        while self.bytes > limit and self.chains:
            self.counters.drop("fragment_buffer_full")
            _, oldest = self.chains.popitem(last=False)
            self.bytes -= oldest.size
        return None

    def purge(self, now: float) -> None:
        timeout = self.config.frag_timeout_ms / 1000.0
        while self.chains:
            key = next(iter(self.chains))
            if now - self.chains[key].touched <= timeout:
                break
            self.counters.drop("fragment_timeout")
            self._drop(key)

    def forget(self, orig: Mac) -> None:
        for bucket in range(BUFFER_COUNT):
            self._drop((orig, bucket))
