#!/usr/bin/env python3
"""Throughput-meter cost in the protocol core: CPU seconds per GB of tp traffic (stream
bytes acknowledged), sender and receiver cores together plus the simulator, over a
simulated 1 Gbit/s link. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.core.config import MeshConfig  # noqa: E402
from batmand.sim import Network  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="simulated test length")
    parser.add_argument("--rate", type=float, default=125e6, help="link rate in bytes/s")
    args = parser.parse_args()
    net = Network(seed=1, config=MeshConfig(orig_interval_ms=200))
    net.add_node("A")
    net.add_node("B")
    link = net.link("A", "B")
    net.run_for(3)
    link.rate = args.rate
    a, b = net.nodes["A"], net.nodes["B"]
    cpu = time.process_time()
    _, actions = a.mesh.tp_start(net.now, b.orig, int(args.seconds * 1000))
    net._handle(a, actions)
    net.run_for(args.seconds + 0.01)
    cpu = time.process_time() - cpu
    result = a.tp[-1][1]
    print(json.dumps({"bench": "tp_meter", "simulated_s": args.seconds, "link_bytes_per_s": args.rate,
                      "acked_bytes": result.total_bytes, "cpu_s": round(cpu, 3),
                      "cpu_s_per_gb": round(cpu / (result.total_bytes / 1e9), 2) if result.total_bytes else None,
                      "frames": net.frames_sent}))


if __name__ == "__main__":
    main()
