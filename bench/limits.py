#!/usr/bin/env python3
"""CPU per hostile frame once the tables are full (issue 12, "CPU amplification"), through
one protocol core's receive path (frames decoded as from a socket). Prints one JSON object:

- tt_diff_us: an OGM whose TT diff deletes one client and adds another, for an originator
  holding 2,000 entries (the per-originator limit); tt_duplicate_us: the same OGM again
  (a duplicate seqno: the kernel hands its TVLVs to TT all the same)
- fragments_per_s: pieces of spoofed chains that never complete, with the reassembly
  budget (--frag-budget, 1 MB) full, so every piece evicts the oldest chain
- new_originators_per_s: OGMs of ever new spoofed originators into a full originator table
- temporary_per_s: broadcasts from ever new clients with the temporary-entry budget full

Run it against another checkout to compare: PYTHONPATH=/path/to/checkout bench/limits.py"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

if not any(Path(p, "batmand").is_dir() for p in sys.path if p):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.core.config import MeshConfig  # noqa: E402
from batmand.core.mesh import Mesh  # noqa: E402
from batmand.wire import (BROADCAST, Bcast, InnerFrame, IvOgm, Mac, TtChange, TtTvlv, TtVlan, UnicastFrag,  # noqa: E402
                          UnicastTvlv, build_frame, tt_entry_crc)
from batmand.wire.constants import TtDataFlags  # noqa: E402
from tt_tables import full_table  # noqa: E402

OURS = Mac("02:00:00:00:00:01")
ATTACKER = Mac("02:66:66:66:66:66")


def fake(i: int) -> Mac:
    return Mac(b"\x02\x5f" + i.to_bytes(4, "big"))


def client(i: int) -> Mac:
    return Mac(b"\x06\x5c" + i.to_bytes(4, "big"))


def ogm(orig: Mac, seqno: int, tvlvs=()) -> bytes:
    return build_frame(BROADCAST, orig, IvOgm(ttl=50, seqno=seqno, orig=orig, prev_sender=orig, tq=255,
                                              tvlvs=list(tvlvs)))


def core(**config) -> Mesh:
    mesh = Mesh(MeshConfig(**config), soft_mac=Mac("02:00:00:00:00:aa"), rng=random.Random(1))
    mesh.add_interface(0.0, "if0", OURS)
    return mesh


def rate(frames: list[bytes], mesh: Mesh, now: float) -> float:
    """Seconds per frame."""
    started = time.perf_counter()
    for frame in frames:
        mesh.receive(now, "if0", frame)
    return (time.perf_counter() - started) / len(frames)


def tt_diff(entries: int, count: int) -> dict:
    """Diffs in runs of 250 (the ttvn wraps after 255, which costs a full-table request by
    the kernel's rule), each run after a full-table response that resets the originator."""
    mesh = core()
    orig = fake(7)
    mesh.receive(1.0, "if0", ogm(orig, 100))
    seqno, spent, done, next_client = 101, 0.0, 0, entries
    while done < count:
        clients = [client(next_client + k) for k in range(entries)]
        next_client += entries
        full = full_table(clients)
        crc = full.vlans[0].crc
        mesh.receive(1.0, "if0", build_frame(OURS, orig, UnicastTvlv(dst=OURS, src=orig, tvlvs=[full])))
        assert len(mesh.tt.by_orig[orig]) == entries, "the full table was not taken"
        frames = []
        for k in range(min(250, count - done)):  # each diff: the oldest client out, a new one in
            new, old = client(next_client), clients[k]
            next_client += 1
            crc ^= tt_entry_crc(new, 0, 0) ^ tt_entry_crc(old, 0, 0)
            diff = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=2 + k, vlans=[TtVlan(crc=crc, vid=0)],
                          changes=[TtChange(flags=1, addr=old, vid=0), TtChange(flags=0, addr=new, vid=0)])
            frames.append(ogm(orig, seqno, [diff]))
            seqno += 1
        requests = mesh.counters["tt_request_tx"]
        spent += rate(frames, mesh, 2.0) * len(frames)
        done += len(frames)
        assert mesh.counters["tt_request_tx"] == requests, "a diff did not match: a TT request went out"
    per_duplicate = rate(frames[-1:] * min(count, 1000), mesh, 2.0)
    return {"tt_entries": entries, "tt_diff_us": round(spent / done * 1e6, 1),
            "tt_duplicate_us": round(per_duplicate * 1e6, 1)}


def fragments(budget: int, count: int) -> dict:
    mesh = core(max_fragment_bytes=budget)
    origs = [fake(i) for i in range(1000)]
    for orig in origs:
        mesh.receive(1.0, "if0", ogm(orig, 1))
    rng = random.Random(2)

    def piece() -> bytes:
        # 8 steady chains per originator (one per bucket) that grow to 16 pieces; an odd total
        # and even pieces: they never complete
        k = rng.randrange(len(origs))
        frag = UnicastFrag(no=rng.randrange(16), dest=OURS, orig=origs[k], seqno=8 * k + rng.randrange(8),
                           total_size=9001, data=bytes(500))
        return build_frame(OURS, ATTACKER, frag)

    for _ in range(100 * budget // 500):  # fill the budget
        if mesh.reassembly.bytes + 500 > budget:
            break
        mesh.receive(1.0, "if0", piece())
    frames = [piece() for _ in range(count)]
    evicted = mesh.counters["drop_fragment_buffer_full"]
    per_frame = rate(frames, mesh, 1.0)
    return {"frag_budget_bytes": budget, "chains_buffered": len(mesh.reassembly.chains),
            "fragments_per_s": round(1 / per_frame), "evictions": mesh.counters["drop_fragment_buffer_full"] - evicted}


def originators(count: int) -> dict:
    mesh = core()
    limit = mesh.config.max_originators
    for i in range(limit):
        mesh.receive(1.0, "if0", ogm(fake(i), 1))
    frames = [ogm(fake(limit + i), 1) for i in range(count)]
    return {"max_originators": limit, "new_originators_per_s": round(1 / rate(frames, mesh, 1.0)),
            "originators_kept": len(mesh.originators.nodes)}


def temporary(count: int) -> dict:
    mesh = core()
    limit = getattr(mesh.config, "max_temporary_tt_entries", mesh.config.max_global_tt_entries)
    origs = [fake(i) for i in range(100)]
    for orig in origs:
        mesh.receive(1.0, "if0", ogm(orig, 1))
    seqnos = dict.fromkeys(origs, 1000)

    def bcast(k: int) -> bytes:
        orig = origs[k % len(origs)]
        seqnos[orig] += 1
        inner = InnerFrame(h_dest=BROADCAST, h_source=client(k), h_proto=0x88B5, payload=bytes(30))
        return build_frame(BROADCAST, ATTACKER, Bcast(ttl=2, seqno=seqnos[orig], orig=orig, inner=inner))

    for k in range(limit + 1000):  # fill the budget (or, without one, the global table)
        mesh.receive(1.0, "if0", bcast(k))
    frames = [bcast(limit + 1000 + k) for k in range(count)]
    return {"temporary_budget": limit, "temporary_per_s": round(1 / rate(frames, mesh, 1.0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000, help="TT entries of the originator")
    parser.add_argument("--ogms", type=int, default=2000, help="OGMs with a diff measured")
    parser.add_argument("--frag-budget", type=int, default=1_000_000, help="reassembly budget (bytes)")
    parser.add_argument("--fragments", type=int, default=20_000, help="fragments measured")
    parser.add_argument("--spoofed", type=int, default=20_000, help="new originators / broadcasts measured")
    args = parser.parse_args()
    import batmand

    result = {"batmand": str(Path(batmand.__file__).resolve().parent.parent), "python": sys.version.split()[0]}
    result.update(tt_diff(args.entries, args.ogms))
    result.update(fragments(args.frag_budget, args.fragments))
    result.update(originators(args.spoofed))
    result.update(temporary(args.spoofed))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
