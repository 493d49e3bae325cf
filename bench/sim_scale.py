#!/usr/bin/env python3
"""Control-plane cost at scale: CPU seconds per simulated second per node of a simulated
B.A.T.M.A.N. IV mesh (random geometric graph), measured over a warm-up phase and a
steady phase of the same run. Prints one JSON object."""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batmand.core.config import MeshConfig  # noqa: E402
from batmand.sim import Network  # noqa: E402


def build(n: int, degree: float, seed: int) -> Network:
    """n nodes uniformly in a unit square, linked within the radius giving `degree`."""
    rng = random.Random(seed)
    radius = math.sqrt(degree / (math.pi * n))
    points = [(rng.random(), rng.random()) for _ in range(n)]
    net = Network(seed=seed, config=MeshConfig(max_originators=max(5000, 2 * n)))
    for i in range(n):
        net.add_node(f"n{i}")
    cells: dict = {}
    for i, (x, y) in enumerate(points):
        cells.setdefault((int(x / radius), int(y / radius)), []).append(i)
    for i, (x, y) in enumerate(points):
        cx, cy = int(x / radius), int(y / radius)
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                for j in cells.get((cx + dx, cy + dy), ()):
                    if j > i and math.dist(points[i], points[j]) <= radius:
                        net.link(f"n{i}", f"n{j}")
    return net


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--degree", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=10.0, help="simulated seconds")
    parser.add_argument("--steady", type=float, default=5.0, help="simulated seconds")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    net = build(args.nodes, args.degree, args.seed)
    net.keep_deliveries = False
    t0 = time.process_time()
    net.run_for(args.warmup)
    t1 = time.process_time()
    frames_warm = net.frames_sent
    net.run_for(args.steady)
    t2 = time.process_time()
    origs = [len(node.mesh.originators.nodes) for node in net.nodes.values()]
    print(json.dumps({
        "nodes": args.nodes,
        "links": len(net.segments),
        "warmup_sim_s": args.warmup,
        "steady_sim_s": args.steady,
        "warmup_cpu_s_per_sim_s_per_node": round((t1 - t0) / args.warmup / args.nodes, 6),
        "steady_cpu_s_per_sim_s_per_node": round((t2 - t1) / args.steady / args.nodes, 6),
        "frames_per_sim_s_per_node_steady": round((net.frames_sent - frames_warm) / args.steady / args.nodes, 1),
        "mean_originators_known": round(sum(origs) / len(origs), 1),
    }, indent=2))


if __name__ == "__main__":
    main()
