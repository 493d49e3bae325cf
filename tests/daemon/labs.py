"""Labs of real batmand daemons in network namespaces, for the daemon tests."""

from __future__ import annotations

import itertools
import json
import os
import re
import time

from batmand.lab import Lab, load
from batmand.wire import TtClientFlags

_counter = itertools.count()


def prefix() -> str:
    """Unique per test run and per lab (namespaces are <prefix>-<node>)."""
    return f"bt{os.getpid() % 100000}x{next(_counter)}"


def make_lab(topology: str, **batmand) -> Lab:
    topo = load(topology)
    topo.batmand.update(batmand)
    return Lab(topo, prefix())


def originators(lab: Lab, node: str) -> list[dict]:
    out = lab.batmanctl(node, "o", "--json")
    return json.loads(out.stdout) if out.returncode == 0 else []


def best_routes(lab: Lab, node: str) -> dict[str, str]:
    """originator -> next hop of the routes `node` uses."""
    return {r["orig_address"]: r["neigh_address"] for r in originators(lab, node) if r["best"]}



def _primary_if(lab: Lab, node: str) -> str:
    return next(link.ifname_a if link.a == node else link.ifname_b
                for link in lab.topology.links if node in (link.a, link.b))


def orig_mac(lab: Lab, node: str) -> str:
    """The originator address of a node: the MAC of its first hard interface."""
    return lab.exec(node, ["cat", f"/sys/class/net/{_primary_if(lab, node)}/address"], check=True).stdout.strip()


def own_ttvn(lab: Lab, node: str) -> int:
    """The ttvn of `node`'s local table, from the header batctl tl prints."""
    header = lab.batmanctl(node, "tl", check=True).stdout.splitlines()[0]
    return int(re.search(r"TTVN: (\d+)", header)[1])


def tt_synced(lab: Lab, node: str, owner: str) -> bool:
    """`node` holds `owner`'s bat0 MAC as announced in `owner`'s TT (not a temporary entry
    learnt from a broadcast) at `owner`'s current ttvn, so its unicast headers carry that
    ttvn. Before that, relays that know the newer ttvn drop its frames, as kernel nodes do;
    and a node's ttvn moves for a while after start-up, as its multicast listeners appear."""
    rows = json.loads(lab.batmanctl(node, "tg", "--json", check=True).stdout)
    mac, orig, ttvn = lab.mesh_mac(owner), lab.originator(owner), own_ttvn(lab, owner)
    return any(r["tt_address"] == mac and r["orig_address"] == orig and not r["tt_flags"] & TtClientFlags.TEMP
               and r["tt_last_ttvn"] == ttvn for r in rows)


def wait_for(predicate, timeout: float, step: float = 0.1):
    """Poll until predicate() is truthy; returns (value, seconds waited) or raises."""
    start = time.monotonic()
    while True:
        value = predicate()
        if value:
            return value, time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


def stats(lab: Lab, node: str) -> dict:
    return json.loads(lab.batmanctl(node, "s", "--json", check=True).stdout)
