#!/usr/bin/env python3
"""Where the core's bytes per originator are: core_ogm.py's load model at two sizes, every
object reachable from the Mesh counted once (sys.getsizeof, GC header included) under the
slot, attribute or container it was first reached through, and the difference between the
sizes per originator. Complements core_ogm.py --memory (tracemalloc's total) with a
breakdown; a table resizing between the two sizes shows as a fraction of an object.

    PYTHONPATH=TREE .venv/bin/python bench/core_objects.py [--neighs 3] [--seconds 6]
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import types
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
import core_ogm  # noqa: E402

# shared by every mesh, not state: not followed
SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType,
        types.MethodType, types.MappingProxyType)


def build(origs: int, neighs: int, seconds: int):
    """A mesh fed as core_ogm.run_cell feeds it (without the timing)."""
    from batmand.core.config import MeshConfig
    from batmand.core.events import Transmit
    from batmand.core.mesh import Mesh
    us = b"\x02\x00\x00\x00\x00\x01"
    mesh = Mesh(MeshConfig(max_originators=max(1000, 2 * origs + neighs + 10)),
                soft_mac=b"\x02\x00\x00\x00\x00\x02", now=0.0)
    load = core_ogm.Load(origs, neighs)
    pending: list[bytes] = []
    mesh.add_interface(0.0, "eth0", us)
    for sec in range(seconds):
        slots = load.second(us)
        for k, frames in enumerate(slots):
            now = sec + k / len(slots)
            batch, pending, actions = frames + pending, [], []
            while mesh.next_deadline() <= now:
                actions += mesh.tick(mesh.next_deadline())
            actions += mesh.receive_many(now, "eth0", batch)
            for action in actions:
                if isinstance(action, Transmit):
                    pending += load.answers(action.frame, us)
    return mesh


def children(obj, where: str):
    """(child, where it hangs) for a slotted object's slots, an object's attributes, a
    container's items."""
    cls = type(obj)
    slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ()) if not s.startswith("__")]
    if slots and not isinstance(obj, tuple):
        for name in slots:
            if hasattr(obj, name):
                yield getattr(obj, name), f"{cls.__qualname__}.{name}"
        return
    if hasattr(obj, "__dict__"):
        for name, value in vars(obj).items():
            yield value, f"{cls.__qualname__}.{name}"
        return
    label = f"{cls.__qualname__} in {where}"
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield key, "key of " + label
            yield value, "value of " + label
        return
    for child in gc.get_referents(obj):
        yield child, "in " + label


def census(root) -> tuple[collections.Counter, collections.Counter]:
    seen: set[int] = set()
    size: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    stack = [(root, "mesh")]
    while stack:
        obj, where = stack.pop()
        if id(obj) in seen or isinstance(obj, SKIP) or obj is None or obj is True or obj is False:
            continue
        seen.add(id(obj))
        if type(obj) is int and -5 <= obj <= 256:
            continue  # the interpreter's cached small ints
        name = f"{type(obj).__qualname__} @ {where}"
        size[name] += sys.getsizeof(obj)
        count[name] += 1
        stack.extend(children(obj, where))
    return size, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--neighs", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=6, help="simulated seconds (core_ogm: warmup + seconds)")
    parser.add_argument("--sizes", default="500,1000", help="the two originator counts")
    args = parser.parse_args()
    small, large = (int(x) for x in args.sizes.split(","))
    size_a, count_a = census(build(small, args.neighs, args.seconds))
    size_b, count_b = census(build(large, args.neighs, args.seconds))
    per = large - small
    rows = sorted(((size_b[k] - size_a[k]) / per, (count_b[k] - count_a[k]) / per, k) for k in size_b)
    for bytes_, objects, name in reversed(rows):
        if abs(bytes_) >= 2:
            print(f"{bytes_:8.1f} B {objects:6.2f}  {name}")
    print(f"total {sum(r[0] for r in rows):.0f} B per originator")


if __name__ == "__main__":
    main()
