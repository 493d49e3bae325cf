"""Hostile batman-adv frames for the storm test (issue 7, "Hostile input and limits").

`build_storm()` prepares, ahead of time, one stream of Ethernet frames (ethertype 0x4305)
aimed at one hard interface, mixing five kinds in small interleaved chunks:

- ``random``  random bytes behind an Ethernet header (half of them with a valid packet
  type and compat version 15 in front, to get past the first checks)
- ``kernel``  truncated and bit-flipped copies of the kernel's frames in the reference
  captures (tests.wire.captures); the Ethernet header stays intact (unicast ones are
  readdressed to the target) so that every copy reaches the daemon's socket
- ``ogm``     valid-looking B.A.T.M.A.N. IV OGMs of 100,000 fake originators (half of them
  heard directly, half relayed by the attacker), in rounds: round 1 (TT version 1) adds
  25 clients each (2,500,000 fake clients), round 2 (version 2) deletes 12 and adds 12
  new ones, round 3 and later repeat version 2; a quarter of the originators announce a
  wrong TT CRC (which makes the receiver ask for their table)
- ``frag``    UNICAST_FRAG packets that never complete (odd total size, even pieces), from
  many originators and seqnos: known fake originators (mostly 8 steady seqnos each, so
  chains grow to 16 pieces and the reassembly byte budget fills), the real ones, unknown
  ones; some addressed to an originator behind the target, which it has to forward
- ``bcast``   BCAST from known and unknown fake originators, the real ones and the target
  itself, with sequential, replayed and random seqnos; the inner frame is a broadcast with
  a new fake client source each time (temporary TT entries)

Every frame decodes (batmand.wire) to at most one batman-adv packet: aggregates are cut
after their first element. The daemon counts every frame it reads exactly once in
``rx_<packet type>`` (+1 per packet), ``drop_malformed`` or ``drop_inactive_interface``,
so with these frames that sum moves by exactly one per frame read. The one exception, a
fragment chain that completes (the rebuilt packet is received, and counted, again), is
ruled out: the copies of kernel fragments get a fresh seqno each and never a total size
equal to their own length.

The "primer" comes first: round-1 OGMs of the first 6,000 fake originators, more than
the default originator limit (5,000) and with 25 clients each more than the default
global TT limit (100,000), then 3,000 large fragments of steady chains (3 MB, more than
the default 2 MiB reassembly budget); the test sends it at a rate the daemon absorbs, so
the tables are full before the blast. The last 512 primed fake originators (KNOWN) are the
ones the fragment and broadcast kinds count on the target knowing: a full originator table
evicts the least recently heard spoofed originators, so the newest are the ones it holds.

`blast(sock, frames)` sends with plain `socket.send` in a tight loop (optionally paced).

As a program (run it in the attacker's network namespace) it speaks a line protocol:
    python -m tests.daemon.storm --ifname atk0 --target MAC [--node-mac MAC ...]
           [--real-orig MAC ...] [--far-orig MAC] [--total N] [--seed S]
    -> {"ready": true, "frames": n, "primer": n, "by_kind": {...}, "generate_s": s}
    <- {"send": N, "rate": null | frames per second}   (the next N frames of the stream)
    -> {"sent": N, "errors": n, "seconds": s, "rate": r, "by_kind": {...}, "position": n}
    <- {"quit": true}
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `batmand` and `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from batmand.wire import (BROADCAST, Bcast, InnerFrame, IvOgm, Mac, TtChange, TtTvlv, TtVlan, UnicastFrag, WireError,
                          build_frame, tt_entry_crc)
from batmand.wire.constants import COMPAT_VERSION, ETH_P_BATMAN, PacketType, TtClientFlags, TtDataFlags
from batmand.wire.ogm import Ogm2

KINDS = ("random", "kernel", "ogm", "frag", "bcast")
DEFAULT_MIX = {"random": 0.10, "kernel": 0.20, "ogm": 0.30, "frag": 0.20, "bcast": 0.20}
FAKE_ORIGINATORS = 100_000
CLIENTS_PER_ORIGINATOR = 25  # round 1: 100,000 x 25 = 2,500,000 fake clients
PRIMED = 6_000  # OGMs of the first fake originators, sent first (slowly): they fill the tables
PRIMER_FRAGMENTS = 3_000  # then fragments of steady chains: they fill the reassembly budget
KNOWN = 512  # the last primed fake originators: surely known to the target (fragments, broadcasts)
ETH_HLEN = 14
MAX_FRAME = 1514  # fits any hard interface MTU >= 1500
_ETHERTYPE = struct.pack("!H", ETH_P_BATMAN)
_TYPES = [int(t) for t in PacketType] + [0x45, 0x5A, 0x7F]
_AGGREGATE_TYPES = {PacketType.IV_OGM: IvOgm, PacketType.OGM2: Ogm2}


def fake_orig(i: int) -> Mac:
    """Fake originator i: 02:5f:<i as 4 bytes> (locally administered, unicast)."""
    return Mac(b"\x02\x5f" + i.to_bytes(4, "big"))


def fake_client(i: int) -> Mac:
    return Mac(b"\x06\x5c" + (i & 0xFFFFFFFF).to_bytes(4, "big"))


def bcast_client(i: int) -> Mac:
    return Mac(b"\x06\xbc" + (i & 0xFFFFFFFF).to_bytes(4, "big"))


def unicast_mac(rng: random.Random) -> bytes:
    mac = bytearray(rng.randbytes(6))
    mac[0] = (mac[0] & 0xFE) | 0x02  # unicast, locally administered
    return bytes(mac)


def one_packet(frame: bytes) -> bytes:
    """Cut an OGM / OGMv2 aggregate after its first element (plus a few bytes of the next,
    too few for a header), so that the frame decodes to at most one packet. The test is
    the codec's own aggregate walk (batmand.wire.frame)."""
    if len(frame) < ETH_HLEN + 2 or frame[ETH_HLEN + 1] != COMPAT_VERSION:
        return frame
    cls = _AGGREGATE_TYPES.get(frame[ETH_HLEN])
    if cls is None:
        return frame
    body = memoryview(frame)[ETH_HLEN:]
    try:
        _, end = cls.decode(body, 0)
    except (WireError, ValueError, IndexError):
        return frame  # malformed: counted once
    if end < len(body) and body[end] == body[0] and cls.peek_size(body, end):
        return frame[:ETH_HLEN + end + min(cls.HEADER.size - 1, len(body) - end - 1)]
    return frame


def kernel_frames() -> list[bytes]:
    """Every batman-adv frame of the reference captures."""
    from tests.wire.captures import pcap_names, raw_frames

    out = []
    for name in pcap_names():
        for cf in raw_frames(name):
            data = bytes(cf.data)
            if len(data) > ETH_HLEN and data[12:14] == _ETHERTYPE and len(data) <= MAX_FRAME:
                out.append(data)
    return out


@dataclass
class Target:
    """What the attacker knows: the MAC it aims at, the target node's other MACs (its
    originator address first), the real originators behind it (heard in OGMs the target
    forwards), one of them far enough that the target forwards to it, and its own MAC."""

    dst: bytes
    src: bytes
    node_macs: list[bytes] = field(default_factory=list)
    real_origs: list[bytes] = field(default_factory=list)
    far_orig: bytes | None = None

    def __post_init__(self) -> None:
        self.dst, self.src = Mac(self.dst), Mac(self.src)
        self.node_macs = [Mac(m) for m in self.node_macs] or [self.dst]
        self.real_origs = [Mac(m) for m in self.real_origs]
        self.far_orig = Mac(self.far_orig) if self.far_orig else None


class Generator:
    """The five kinds, each an endless deterministic source of frames."""

    def __init__(self, target: Target, seed: int = 7, fake_originators: int = FAKE_ORIGINATORS,
                 clients_per_originator: int = CLIENTS_PER_ORIGINATOR, primed: int = PRIMED,
                 known: int = KNOWN) -> None:
        self.t = target
        self.rng = random.Random(seed)
        self.n_origs = fake_originators
        self.n_clients = clients_per_originator
        self.primed = min(primed, fake_originators)
        self.known = max(1, min(known, self.primed or known, fake_originators))
        self._frag_seq = self.rng.getrandbits(16)
        self._blob = self.rng.randbytes(1 << 22)  # random bytes to slice from
        self._kernel: list[bytes] | None = None
        # OGM state: per fake originator the seqno base and its current clients
        self._ogm_seq = [self.rng.getrandbits(32) for _ in range(fake_originators)]
        self._clients: dict[int, list[Mac]] = {}
        self._crc: dict[int, int] = {}
        self._next_client = 0
        self.ogm_round = 0
        self._ogm_pos = 0
        self.clients_announced = 0
        # broadcast state: per originator the last seqnos used (for "next" and "replay")
        self._bcast_seq: dict[bytes, list[int]] = {}
        self._bcast_client = 0

    def _known_orig(self) -> Mac:
        return fake_orig(max(0, self.primed - self.known) + self.rng.randrange(self.known))

    # --- random bytes ------------------------------------------------------------------------

    def _random_bytes(self, n: int) -> bytes:
        start = self.rng.randrange(len(self._blob) - n)
        return self._blob[start:start + n]

    def random(self) -> bytes:
        rng = self.rng
        dst = self.t.dst if rng.random() < 0.9 else BROADCAST
        size = rng.randint(1, 128) if rng.random() < 0.7 else rng.randint(129, MAX_FRAME - ETH_HLEN)
        body = self._random_bytes(size)
        if rng.random() < 0.5 and size >= 2:
            body = bytes((rng.choice(_TYPES), COMPAT_VERSION)) + body[2:]
        return one_packet(dst + unicast_mac(rng) + _ETHERTYPE + body)

    # --- mutated kernel frames ---------------------------------------------------------------

    def kernel(self) -> bytes:
        if self._kernel is None:
            self._kernel = kernel_frames()
        rng = self.rng
        frame = bytearray(rng.choice(self._kernel))
        if not frame[0] & 1:
            frame[0:6] = self.t.dst
        op = rng.random()
        if op < 0.6 and len(frame) > ETH_HLEN + 1:  # bit flips in the batman-adv part
            for _ in range(rng.choice((1, 1, 2, 3, 8, 32))):
                pos = rng.randrange(ETH_HLEN, len(frame))
                frame[pos] ^= 1 << rng.randrange(8)
        if op > 0.4 and len(frame) > ETH_HLEN + 1:  # truncation (also after flipping)
            del frame[rng.randint(ETH_HLEN + 1, len(frame) - 1):]
        if len(frame) >= ETH_HLEN + UnicastFrag.HEADER.size and frame[ETH_HLEN] == PacketType.UNICAST_FRAG \
                and frame[ETH_HLEN + 1] == COMPAT_VERSION:
            # a fresh seqno, and never a total equal to the piece: no copy completes a chain
            self._frag_seq = (self._frag_seq + 1) & 0xFFFF
            struct.pack_into("!H", frame, ETH_HLEN + 16, self._frag_seq)
            total, = struct.unpack_from("!H", frame, ETH_HLEN + 18)
            if total == len(frame) - ETH_HLEN - UnicastFrag.HEADER.size:
                struct.pack_into("!H", frame, ETH_HLEN + 18, (total + 1) & 0xFFFF)
        return one_packet(bytes(frame))

    # --- OGMs of fake originators with TT diffs ------------------------------------------------

    def _tt(self, i: int, round_: int) -> TtTvlv:
        old = self._clients.get(i, [])
        removed: list[Mac] = []
        added: list[Mac] = []
        if round_ == 0:
            added = [fake_client(self._next_client + k) for k in range(self.n_clients)]
            self._clients[i] = added
        elif round_ == 1:
            half = self.n_clients // 2
            removed = old[:half]
            added = [fake_client(self._next_client + k) for k in range(half)]
            self._clients[i] = old[half:] + added
        self._next_client += len(added)
        self.clients_announced += len(added)
        crc = self._crc.get(i, 0)
        for mac in removed + added:  # the VLAN CRC is the XOR of the entries' CRCs
            crc ^= tt_entry_crc(mac, 0, 0)
        self._crc[i] = crc
        if i % 4 == 3:
            crc ^= 0x5A5A5A5A  # a wrong CRC: the receiver asks for the full table
        changes = [TtChange(flags=TtClientFlags.DEL, addr=m, vid=0) for m in removed]
        changes += [TtChange(flags=0, addr=m, vid=0) for m in added]
        return TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=min(round_ + 1, 2), vlans=[TtVlan(crc=crc, vid=0)],
                      changes=changes)

    def ogm_for(self, i: int, round_: int) -> bytes:
        orig = fake_orig(i)
        direct = i % 2 == 0
        sender = orig if direct else self.t.src
        ogm = IvOgm(ttl=50, flags=0, seqno=(self._ogm_seq[i] + round_) & 0xFFFFFFFF, orig=orig,
                    prev_sender=sender, tq=255, tvlvs=[self._tt(i, round_)])
        return build_frame(BROADCAST, sender, ogm)

    def ogm(self) -> bytes:
        """The next OGM: originator by originator, round after round."""
        if self._ogm_pos >= self.n_origs:
            self._ogm_pos = 0
            self.ogm_round += 1
        i = self._ogm_pos
        self._ogm_pos += 1
        return self.ogm_for(i, self.ogm_round)

    # --- fragments that never complete -----------------------------------------------------------

    def frag(self, steady: bool = False) -> bytes:
        """A piece of a chain that never completes; `steady`: a large piece of one of the
        8 steady chains of a known originator, addressed to the target."""
        rng = self.rng
        r = 0.0 if steady else rng.random()
        if r < 0.7:
            orig = self._known_orig()
        elif r < 0.9 and self.t.real_origs:
            orig = rng.choice(self.t.real_origs)
        else:
            orig = fake_orig(rng.randrange(self.n_origs))
        if steady or rng.random() < 0.7:  # one of 8 steady seqnos per originator: one per reassembly bucket
            seqno = (int.from_bytes(orig, "big") * 7919 + rng.randrange(8)) & 0xFFFF
        else:
            seqno = rng.getrandbits(16)
        # the same total for every piece of a chain; odd, while every piece is even: never complete
        total = 1601 + 2 * ((int.from_bytes(orig, "big") * 40503 + seqno) % 9000)
        if self.t.far_orig is not None and not steady and rng.random() < 0.15:
            dest = self.t.far_orig  # bigger than the next link's MTU: forwarded whole
        else:
            dest = rng.choice(self.t.node_macs)
        data = self._random_bytes(2 * (rng.randint(450, 620) if steady else rng.randint(50, 600)))
        ttl = 50 if steady else rng.choice((50, 50, 50, 1))
        frag = UnicastFrag(ttl=ttl, no=rng.randrange(16), dest=dest, orig=orig,
                           seqno=seqno, total_size=total, data=data)
        return build_frame(self.t.dst, self.t.src, frag)

    # --- broadcasts with replayed and random seqnos ----------------------------------------------

    def bcast(self) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            orig = self._known_orig()
        elif r < 0.6 and self.t.real_origs:
            orig = rng.choice(self.t.real_origs)
        elif r < 0.65:
            orig = rng.choice(self.t.node_macs)
        else:
            orig = fake_orig(rng.randrange(self.n_origs))
        used = self._bcast_seq.setdefault(bytes(orig), [rng.getrandbits(32)])
        mode = rng.random()
        if mode < 0.5:
            seqno = (used[-1] + 1) & 0xFFFFFFFF  # the next one: accepted and flooded
        elif mode < 0.75:
            seqno = rng.choice(used[-8:])  # a replay: a duplicate
        else:
            seqno = rng.getrandbits(32)  # a jump: a "restart", then reset protection
        used.append(seqno)
        del used[:-16]
        self._bcast_client += 1
        inner = InnerFrame(h_dest=BROADCAST, h_source=bcast_client(self._bcast_client), h_proto=0x88B5,
                           payload=self._random_bytes(rng.randint(0, 100)))
        packet = Bcast(ttl=rng.choice((49, 49, 49, 20, 1)), seqno=seqno, orig=orig, inner=inner)
        dst = BROADCAST if rng.random() < 0.95 else self.t.dst
        src = self.t.src if rng.random() < 0.5 else unicast_mac(rng)
        return build_frame(dst, src, packet)

    def make(self, kind: str) -> bytes:
        return getattr(self, kind)()


@dataclass
class Storm:
    """A stream ready to send: frames[i] is of kind KINDS[kinds[i]]; the first `primer`
    frames are the primer OGMs."""

    frames: list[bytes]
    kinds: bytearray
    primer: int  # frames[:primer]: the primer
    generator: Generator
    generate_s: float = 0.0

    def by_kind(self, start: int = 0, stop: int | None = None) -> dict[str, int]:
        view = self.kinds[start:stop]
        return {kind: view.count(k) for k, kind in enumerate(KINDS) if view.count(k)}


def build_storm(target: Target, total: int = 1_000_000, mix: dict[str, float] | None = None, seed: int = 7,
                chunk: int = 64, primer_fragments: int = PRIMER_FRAGMENTS, **generator_args) -> Storm:
    """The primer (OGMs, then fragments), then `total` frames of the kinds in `mix`
    (shares), interleaved in chunks of about `chunk` frames per kind."""
    started = time.perf_counter()
    mix = mix or DEFAULT_MIX
    gen = Generator(target, seed=seed, **generator_args)
    frames: list[bytes] = []
    kinds = bytearray()
    for _ in range(gen.primed):
        frames.append(gen.ogm())
    kinds.extend([KINDS.index("ogm")] * len(frames))
    frames.extend(gen.frag(steady=True) for _ in range(primer_fragments))
    kinds.extend([KINDS.index("frag")] * primer_fragments)
    primer = len(frames)
    weight = sum(mix.values())
    counts = {kind: round(total * share / weight) for kind, share in mix.items() if share > 0}
    counts[max(counts, key=counts.get)] += total - sum(counts.values())
    left = dict(counts)
    per_round = {kind: max(1, round(chunk * n / max(counts.values()))) for kind, n in counts.items()}
    while any(left.values()):
        for kind, n in per_round.items():
            take = min(n, left[kind])
            if not take:
                continue
            make = getattr(gen, kind)
            frames.extend(make() for _ in range(take))
            kinds.extend([KINDS.index(kind)] * take)
            left[kind] -= take
    return Storm(frames, kinds, primer, gen, time.perf_counter() - started)


# --- sending ---------------------------------------------------------------------------------


def open_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only
    sock.bind((ifname, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    return sock


def blast(sock: socket.socket, frames, rate: float | None = None) -> tuple[int, float]:
    """Send every frame with sock.send; returns (errors, seconds). With `rate`, paced to
    about that many frames per second (in bursts of 100)."""
    send = sock.send
    errors = 0
    started = time.perf_counter()
    if rate is None:
        for frame in frames:
            try:
                send(frame)
            except OSError:
                errors += 1
    else:
        burst = 100
        for i in range(0, len(frames), burst):
            for frame in frames[i:i + burst]:
                try:
                    send(frame)
                except OSError:
                    errors += 1
            due = started + (i + burst) / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    return errors, time.perf_counter() - started


# --- the program --------------------------------------------------------------------------------


def _mac_of(ifname: str) -> bytes:
    return Mac(Path(f"/sys/class/net/{ifname}/address").read_text().strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="hostile batman-adv frames (line protocol on stdin/stdout)")
    parser.add_argument("--ifname", required=True)
    parser.add_argument("--target", required=True, help="the hard interface MAC to aim at")
    parser.add_argument("--node-mac", action="append", default=[], help="MACs of the target node, originator first")
    parser.add_argument("--real-orig", action="append", default=[], help="real originators of the mesh")
    parser.add_argument("--far-orig", help="an originator the target forwards to")
    parser.add_argument("--total", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--fake-originators", type=int, default=FAKE_ORIGINATORS)
    args = parser.parse_args(argv)

    target = Target(dst=Mac(args.target), src=_mac_of(args.ifname), node_macs=args.node_mac,
                    real_origs=args.real_orig, far_orig=args.far_orig)
    storm = build_storm(target, total=args.total, seed=args.seed, fake_originators=args.fake_originators)
    sock = open_socket(args.ifname)
    out = sys.stdout

    def reply(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    gen = storm.generator
    reply({"ready": True, "frames": len(storm.frames), "primer": storm.primer, "by_kind": storm.by_kind(),
           "generate_s": round(storm.generate_s, 2), "fake_originators": gen.n_origs,
           "fake_clients_announced": gen.clients_announced, "ogm_rounds": gen.ogm_round + 1,
           "bytes": sum(map(len, storm.frames)), "pid": os.getpid()})
    position = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        count = int(cmd.get("send", 0))
        chunk = storm.frames[position:position + count]
        errors, seconds = blast(sock, chunk, cmd.get("rate"))
        reply({"sent": len(chunk), "errors": errors, "seconds": round(seconds, 4),
               "rate": round(len(chunk) / seconds) if seconds > 0 else None,
               "by_kind": storm.by_kind(position, position + len(chunk)), "position": position + len(chunk)})
        position += len(chunk)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
