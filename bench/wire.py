#!/usr/bin/env python3
"""Wire codec micro-benchmarks; prints one JSON object.

- decode of an aggregated IV OGM frame (3 OGMs, the first with TT/DAT/MCAST TVLVs and two
  TT changes), general codec
- unicast encap + decap of a 1500-byte inner frame: the data plane's way (a ready prefix,
  a slice past it) versus the general codec, side by side in the same run, with their ratio
Each figure is the best of several repeats (ops/s), so it is a rate, not a bare time.
"""

from __future__ import annotations

import json
import platform
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.wire import (BROADCAST, DatTvlv, InnerFrame, IvOgm, Mac, McastTvlv, TtChange, TtTvlv, TtVlan,  # noqa: E402
                          Unicast, build_frame, decode_frame)
from batmand.wire.fastpath import unicast_inner_offset, unicast_prefix  # noqa: E402

A, B, C = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:02:01"), Mac("02:00:00:00:03:01")


def rate(stmt, number: int, repeat: int = 5) -> float:
    best = min(timeit.repeat(stmt, number=number, repeat=repeat))
    return number / best


def main() -> None:
    tt = TtTvlv(flags=1, ttvn=3, vlans=[TtVlan(crc=0x1BE95E8E, vid=0)],
                changes=[TtChange(flags=0, addr=Mac("02:00:00:00:c1:01"), vid=0),
                         TtChange(flags=1, addr=Mac("02:00:00:00:c1:02"), vid=0)])
    own = IvOgm(seqno=1, orig=A, prev_sender=A, tvlvs=[tt, DatTvlv(), McastTvlv(flags=0x18)])
    fwd = [IvOgm(seqno=9, orig=C, prev_sender=B, ttl=49, tq=200, tvlvs=[TtTvlv(flags=1, ttvn=1, vlans=[TtVlan(crc=1, vid=0)])]),
           IvOgm(seqno=5, orig=B, prev_sender=B, ttl=49, flags=4, tq=240)]
    ogm_frame = build_frame(BROADCAST, A, own, *fwd)
    assert len(decode_frame(ogm_frame).packets) == 3

    inner = bytes.fromhex("020000000300020000000100" "0800") + bytes(1486)  # 1500-byte frame
    prefix = unicast_prefix(B, A, C, ttvn=3)
    fast_wire = prefix + inner
    assert fast_wire[unicast_inner_offset(fast_wire):] == inner

    def fast_roundtrip():  # as the data plane does it: a ready prefix, a slice past it
        wire = prefix + inner
        memoryview(wire)[unicast_inner_offset(wire):]

    def general_roundtrip():
        wire = build_frame(B, A, Unicast(ttvn=3, dest=C, inner=InnerFrame.decode(inner)))
        decode_frame(wire).inner.encode()

    results = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "ogm_aggregate_bytes": len(ogm_frame),
        "ogm_aggregate_decode_ops_per_s": round(rate(lambda: decode_frame(ogm_frame), 5000)),
        "ogm_aggregate_encode_ops_per_s": round(rate(lambda: build_frame(BROADCAST, A, own, *fwd), 5000)),
        "unicast_1500_fast_encap_decap_ops_per_s": round(rate(fast_roundtrip, 200000)),
        "unicast_1500_general_encap_decap_ops_per_s": round(rate(general_roundtrip, 20000)),
    }
    results["fast_over_general_ratio"] = round(
        results["unicast_1500_fast_encap_decap_ops_per_s"] / results["unicast_1500_general_encap_decap_ops_per_s"], 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
