"""A real node joins a daemon whose originator table a flood of spoofed OGMs has filled
(issue 12, "Table lock-out"). Real namespaces: n1 and n2 run batmand (default limits,
200 ms OGM interval); an attacker namespace plugged into n1 sends OGMs of new fake
originators from a packet socket, first until n1's table is full, then on at a lower rate
while n2's daemon starts. n2 must show up in n1's `batmanctl o` with a route and answer
`batmanctl ping` within about ten seconds."""

from __future__ import annotations

import contextlib
import threading
import time

from batmand.core.config import MeshConfig
from batmand.lab import Lab, net
from batmand.lab.topology import from_dict
from batmand.wire import BROADCAST, IvOgm, Mac, build_frame
from tests.daemon.labs import originators, prefix, stats, wait_for
from tests.daemon.storm import open_socket
from tests.netns import entered

INTERVAL_MS = 200
LIMIT = MeshConfig().max_originators
ATTACKER_IF, TARGET_IF = "atk0", "e-atk"
JOIN_WITHIN = 10.0


def spoofed_ogm(i: int) -> bytes:
    """An OGM of fake originator i that claims to be a direct neighbour; it never echoes ours."""
    orig = Mac(b"\x02\x5f" + i.to_bytes(4, "big"))
    return build_frame(BROADCAST, orig, IvOgm(ttl=50, seqno=1, orig=orig, prev_sender=orig, tq=255))


class Flood(threading.Thread):
    """Sends OGMs of ever new fake originators from the attacker's namespace, `rate` per
    second (changeable while it runs)."""

    def __init__(self, ns: str, rate: float) -> None:
        super().__init__(daemon=True)
        with entered(ns):
            self.sock = open_socket(ATTACKER_IF)
        self.rate = rate
        self.sent = 0
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        started, base = time.monotonic(), 0
        rate = self.rate
        while not self._halt.is_set():
            if rate != self.rate:  # a new rate counts from now
                started, base, rate = time.monotonic(), self.sent, self.rate
            due = base + int((time.monotonic() - started) * rate)
            while self.sent < due:
                try:
                    self.sock.send(spoofed_ogm(self.sent))
                except OSError:
                    self.errors += 1
                self.sent += 1
            time.sleep(0.005)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.sock.close()


def _full(st: dict) -> bool:
    """The originator table is full and new spoofed originators keep coming (each evicts
    an entry, or is refused)."""
    return st.get("drop_originator_evicted", 0) + st.get("drop_originator_table_full", 0) > 100


def _lab() -> Lab:
    topology = from_dict({"lab": {"name": "limits", "mtu": 1560}, "batmand": {"orig_interval_ms": INTERVAL_MS},
                          "node": [{"name": "n1"}, {"name": "n2"}], "link": [{"a": "n1", "b": "n2"}]})
    return Lab(topology, prefix())


def test_real_node_joins_a_table_full_of_spoofed_originators():
    with _lab() as lab:
        atk = f"{lab.prefix}-atk"
        flood = None
        try:
            net.create_namespace(atk)
            net.add_veth(atk, ATTACKER_IF, lab.ns("n1"), TARGET_IF, lab.topology.mtu)
            lab.start_daemons(["n1"])
            added = lab.batmanctl("n1", "if", "add", TARGET_IF)
            assert added.returncode == 0, added.stdout + added.stderr

            flood = Flood(atk, rate=2_000)
            flood.start()
            wait_for(lambda: _full(stats(lab, "n1")), timeout=60, step=0.5)
            flood.rate = 500  # the flood goes on while the real node joins

            lab.start_daemons(["n2"])
            joined = time.monotonic()
            n1, n2 = lab.originator("n1"), lab.originator("n2")

            def routed() -> bool:
                rows = {r["orig_address"]: r for r in originators(lab, "n1") if r["best"]}
                return rows.get(n2, {}).get("neigh_address") == n2

            wait_for(routed, timeout=JOIN_WITHIN, step=0.3)
            ping = lab.batmanctl("n1", "ping", "-c", "2", "-i", "0.2", n2, timeout=JOIN_WITHIN)
            assert ping.returncode == 0, ping.stdout + ping.stderr
            assert time.monotonic() - joined < 2 * JOIN_WITHIN
            routes_n2 = {r["orig_address"]: r["neigh_address"] for r in originators(lab, "n2") if r["best"]}
            assert routes_n2.get(n1) == n1

            st = stats(lab, "n1")
            rows = originators(lab, "n1")
            assert len({r["orig_address"] for r in rows}) <= LIMIT
            assert st["drop_originator_evicted"] > 0
            assert flood.sent > LIMIT and not flood.errors
            assert lab.daemon_running("n1") and lab.daemon_running("n2")
        finally:
            if flood is not None:
                flood.stop()
            with contextlib.suppress(Exception):
                net.remove_namespace(atk)
