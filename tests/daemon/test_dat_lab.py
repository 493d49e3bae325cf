"""The distributed ARP table in real namespaces: five batmand nodes in a line (n1 ... n5,
OGMs every 200 ms), bat0 addresses 10.77.0.N, what the links carry captured.

(a) n1's host pings n5 with nothing cached anywhere: n1 asks the address's three DAT
candidates (UNICAST_4ADDR DHT_GET), n5's host answers the GET's request, n5 stores the
reply at the candidates of both addresses (DHT_PUT, n1 among them), so n1's held-back
broadcast never leaves (a candidate the PUT reaches before n1's GET answers it from its
cache: a race, allowed then only); (b) asked again after `ip neigh flush`, n1 answers its
host from its cache: no ARP and no DAT frame leaves it, and `batmanctl dc` lists n5's bat0
MAC; (c) the entries expire after dat_timeout_ms (one to two timeouts); (d) `batmanctl dat 0`
takes the DAT container out of n1's OGMs, the others stop asking n1, and n1's host's ARP
floods as a broadcast again.

The hard interfaces get fixed MACs before the daemons start, so that the candidates (the
DHT's ring positions are hashes of the originator addresses) are the same in every run."""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

from batmand.core.dat_hash import hash_dat, select_candidates
from batmand.lab import Lab, load
from batmand.wire import Mac
from tests.daemon.frames import FrameCapture, arp_fields, arp_request, has_dat_container, host_sends
from tests.daemon.labs import best_routes, prefix, stats, tt_synced, wait_for

INTERVAL_MS = 200
# dat_timeout_ms: (a) and (b) and reading the caches take 2 s on a quiet machine, up to 5 s on
# a busy one (a batmanctl takes a second or two then); the expiry 10..20 s after
TIMEOUT_MS = 10000
X, Y = "n1", "n5"
HOLD_BACK = 0.25  # ARP_REQ_DELAY: the host's broadcast waits this long for a DHT answer


def _orig_of(node: str) -> str:
    return f"02:d0:00:00:{int(node[1:]):02x}:01"


def _fix_macs(lab: Lab) -> None:
    """Node nI's hard interfaces become 02:d0:00:00:0I:0J (J = 1 is the primary)."""
    for node in lab.nodes:
        for j, ifname in enumerate(lab.topology.hard_interfaces(node), 1):
            mac = f"02:d0:00:00:{int(node[1:]):02x}:{j:02x}"
            lab.netns_exec(node, ["ip", "link", "set", ifname, "address", mac], check=True)


def _ip(lab: Lab, node: str) -> bytes:
    return socket.inet_aton(lab.address(node))


def _candidates(lab: Lab, asker: str, ip: bytes, capable: list[str] | None = None) -> list[str]:
    """The nodes `asker` keeps `ip` at (the kernel's selection over the DAT-capable others)."""
    others = [n for n in (capable or lab.nodes) if n != asker]
    by_orig = {Mac(_orig_of(n)): n for n in others}
    return [by_orig[m] for m in select_candidates(hash_dat(ip, 0), list(by_orig))]


def _all(lab: Lab, fn) -> dict:
    with ThreadPoolExecutor(len(lab.nodes)) as pool:
        return dict(zip(lab.nodes, pool.map(fn, lab.nodes)))


def _dc(lab: Lab, node: str) -> list[dict]:
    out = lab.batmanctl(node, "dc", "--json", check=True).stdout
    return json.loads(out) if out.strip() else []


def _ping(lab: Lab, src: str, dst: str) -> None:
    res = lab.exec(src, ["ping", "-c", "1", "-W", "2", lab.address(dst)])
    assert res.returncode == 0, f"ping {src} -> {dst}: {res.stdout}{res.stderr}"


def _delta(before: dict, after: dict, key: str) -> dict:
    return {n: after[n][key] - before[n][key] for n in before}


def test_dat_in_a_line_of_five():
    topo = load("line5")
    topo.batmand.update(orig_interval_ms=INTERVAL_MS, dat_timeout_ms=TIMEOUT_MS)
    lab = Lab(topo, prefix())
    with lab:
        _fix_macs(lab)
        lab.start()
        nodes = lab.nodes
        macs = {n: lab.mesh_mac(n) for n in nodes}  # bat0 MACs
        ips = {n: lab.address(n) for n in nodes}
        assert {n: lab.originator(n) for n in nodes} == {n: _orig_of(n) for n in nodes}

        # converged: every route, and every node's bat0 MAC in every TT (the unicast
        # replies need it), before any host sends an ARP
        def converged():
            routes = _all(lab, lambda n: best_routes(lab, n))
            if not all(set(routes[n]) >= {_orig_of(m) for m in nodes if m != n} for n in nodes):
                return False
            return all(_all(lab, lambda n: all(tt_synced(lab, n, m) for m in nodes if m != n)).values())

        wait_for(converged, timeout=30, step=0.2)
        assert _all(lab, lambda n: _dc(lab, n)) == {n: [] for n in nodes}  # nothing learnt yet

        gets_to = _candidates(lab, X, _ip(lab, Y))  # n5, n4, n2 with these MACs
        puts_to = _candidates(lab, Y, _ip(lab, Y)) + _candidates(lab, Y, _ip(lab, X))
        assert Y in gets_to and X in puts_to, (gets_to, puts_to)  # the scenario the MACs were chosen for
        ifx, ify = lab.topology.hard_interfaces(X), lab.topology.hard_interfaces(Y)

        # (a) a miss: DHT_GET to the candidates, answered by n5's host through the GET
        lab.exec(X, ["ip", "neigh", "flush", "dev", "bat0"], check=True)
        before = _all(lab, lambda n: stats(lab, n))
        started = time.monotonic()
        others = [n for n in gets_to if n != Y]  # the candidates that may race (below)
        with FrameCapture(lab.ns(X), ifx) as capx, FrameCapture(lab.ns(Y), ify) as capy, ExitStack() as stack:
            capo = {n: stack.enter_context(FrameCapture(lab.ns(n), lab.topology.hard_interfaces(n))) for n in others}
            _ping(lab, X, Y)
            time.sleep(HOLD_BACK + 0.35)  # past the held-back broadcast's moment
        # (b) right away (the entries live TIMEOUT_MS): answered from n1's own cache
        lab.exec(X, ["ip", "neigh", "flush", "dev", "bat0"], check=True)
        with FrameCapture(lab.ns(X), ifx) as capb:
            _ping(lab, X, Y)
            time.sleep(HOLD_BACK + 0.35)
        with ThreadPoolExecutor(2) as pool:  # every cache read at once, long before the entries expire
            text = pool.submit(lab.batmanctl, X, "dc", check=True)
            hidden = pool.submit(lab.batmanctl, X, "dc", "-H", check=True)
            caches = _all(lab, lambda n: _dc(lab, n))
        dc_text, dc_hidden = text.result().stdout, hidden.result().stdout
        read_at = time.monotonic() - started
        after = _all(lab, lambda n: stats(lab, n))

        # (a): what n1 sent
        gets = capx.dat(outgoing=True, src=_orig_of(X))
        assert sorted(str(s.packet.dest) for s in gets) == sorted(_orig_of(n) for n in gets_to), capx.summary()
        for s in gets:
            p = s.packet
            assert (p.subtype, p.ttl, p.reserved) == (2, 50, 0), s.describe()
            assert arp_fields(p.inner) == (1, macs[X], ips[X], "00:00:00:00:00:00", ips[Y]), s.describe()
            assert str(p.inner.h_dest) == "ff:ff:ff:ff:ff:ff" and str(s.frame.ethernet.h_source) == _orig_of(X)
        assert not capx.arp_broadcasts(orig=_orig_of(X)), "the held-back broadcast went out:\n" + capx.summary()
        assert all(has_dat_container(o) for o in capx.own_ogms(_orig_of(X))) and capx.own_ogms(_orig_of(X))
        # what n5 sent: a PUT per candidate of each address of the reply, then the reply itself
        puts = capy.dat(outgoing=True, src=_orig_of(Y))
        assert sorted(str(s.packet.dest) for s in puts) == sorted(_orig_of(n) for n in puts_to), capy.summary()
        assert {arp_fields(s.packet.inner) for s in puts} == {(2, macs[Y], ips[Y], macs[X], ips[X])}
        assert all(s.packet.subtype == 3 for s in puts)
        # the counters say the same
        assert _delta(before, after, "dat_get_tx") == {n: 3 if n == X else 0 for n in nodes}
        assert _delta(before, after, "dat_get_rx") == {n: int(n in gets_to) for n in nodes}
        assert _delta(before, after, "dat_put_tx") == {n: len(puts_to) if n == Y else 0 for n in nodes}
        assert _delta(before, after, "dat_put_rx") == {n: puts_to.count(n) for n in nodes}
        # A race the kernel has as well: n5's PUT can reach another candidate before n1's GET
        # does (the GET to n5, n5's host's reply and the PUT overtake the GET to n4 or n2 when
        # a node on their way is slow: a busy machine), and that candidate answers the GET from
        # its cache. So a candidate may answer once, with n5's address to n1, after the PUT
        # reached it (its only source of that address); no other node answers from a cache.
        replied = {}
        for n in others:
            put_at = min((s.t for s in capo[n].dat(outgoing=False, subtype=3) if str(s.packet.dest) == _orig_of(n)),
                         default=float("inf"))
            replies = capo[n].dat(outgoing=True, src=_orig_of(n), subtype=4)
            assert len(replies) <= 1, capo[n].summary()
            for s in replies:
                assert put_at < s.t, f"{n} answered before the PUT reached it:\n{capo[n].summary()}"
                assert str(s.packet.dest) == _orig_of(X), s.describe()
                assert arp_fields(s.packet.inner) == (2, macs[Y], ips[Y], macs[X], ips[X]), s.describe()
            replied[n] = len(replies)
        assert _delta(before, after, "dat_cached_reply_tx") == {n: replied.get(n, 0) for n in nodes}, \
            "\n".join(f"{n}:\n{cap.summary()}" for n, cap in capo.items())
        assert sorted(str(s.packet.src) for s in capx.dat(outgoing=False, subtype=4)) == \
            sorted(_orig_of(n) for n in others for _ in range(replied[n])), capx.summary()
        # the candidates of n5's address store it
        for n in _candidates(lab, Y, _ip(lab, Y)):
            assert {(r["dat_cache_ip4address"], r["dat_cache_hwaddress"]) for r in caches[n]} >= \
                {(ips[Y], macs[Y])}, n

        # (b): nothing left n1 but the ICMP, and n1 lists n5's address
        assert not capb.dat(outgoing=True), capb.summary()
        assert not capb.arp_broadcasts(orig=_orig_of(X)), capb.summary()
        row = next(r for r in caches[X] if r["dat_cache_ip4address"] == ips[Y])
        assert (row["dat_cache_hwaddress"], row["dat_cache_vid"]) == (macs[Y], -1)
        assert dc_text.splitlines()[1] == "Distributed ARP Table (bat0):", dc_text
        assert re.search(rf"^ \* +{re.escape(ips[Y])} {macs[Y]}   -1      0:0\d$", dc_text, re.M), dc_text
        assert dc_hidden.splitlines()[0].startswith(" * "), dc_hidden

        # (c) not refreshed, every entry goes after one to two timeouts (purge every timeout)
        left_x = None  # when n5's address left n1's table
        # (n5's host's ARP probe for n1, about 5 s after (a), refreshes n5's own entry at n5,
        # which then goes up to two timeouts after that; the caches were read early)
        deadline = time.monotonic() + 2 * TIMEOUT_MS / 1000 + 10
        while True:
            tables = _all(lab, lambda n: _dc(lab, n))
            if left_x is None and ips[Y] not in {r["dat_cache_ip4address"] for r in tables[X]}:
                left_x = time.monotonic() - started
            if not any(tables.values()):
                break
            assert time.monotonic() < deadline, f"entries left after {2 * TIMEOUT_MS} ms: {tables}"
            time.sleep(0.5)
        assert left_x >= TIMEOUT_MS / 1000, left_x  # not before the timeout
        print(f"\nDAT lab: the caches read {read_at:.1f} s after (a), n5's address left n1's cache "
              f"{left_x:.1f} s after, every entry gone after {time.monotonic() - started:.1f} s (dat_timeout_ms "
              f"{TIMEOUT_MS}); the PUT won the race at {[n for n in others if replied[n]] or 'none'}")

        # (d) DAT off on n1: no container in its OGMs, the others stop choosing it
        asker = Y
        ip = next(socket.inet_aton(f"10.77.0.{h}") for h in range(200, 250)
                  if X in _candidates(lab, asker, socket.inet_aton(f"10.77.0.{h}")))
        nobody = socket.inet_ntoa(ip)
        with FrameCapture(lab.ns(asker), ify) as cap:
            host_sends(lab.ns(asker), arp_request(macs[asker], ips[asker], nobody))
            time.sleep(0.3)
        assert _orig_of(X) in {str(s.packet.dest) for s in cap.dat(outgoing=True, src=_orig_of(asker))}, cap.summary()

        assert lab.batmanctl(X, "dat", "0", check=True).returncode == 0
        assert lab.batmanctl(X, "dat", check=True).stdout.strip() == "disabled"
        with FrameCapture(lab.ns(X), ifx) as capd:
            time.sleep(6 * INTERVAL_MS / 1000)  # the peers hear an OGM without the container
        # an IV OGM is built when it is scheduled, an interval before it leaves (as in the
        # kernel): the first one or two may still carry the container, none after a bare one
        carried = [has_dat_container(o) for o in capd.own_ogms(_orig_of(X))]
        assert False in carried, carried
        assert True not in carried[carried.index(False):] and carried.count(True) <= 2, carried
        with FrameCapture(lab.ns(asker), ify) as cap:
            host_sends(lab.ns(asker), arp_request(macs[asker], ips[asker], nobody))
            time.sleep(0.3)
        now_to = _candidates(lab, asker, ip, capable=[n for n in nodes if n != X])
        assert sorted(str(s.packet.dest) for s in cap.dat(outgoing=True, src=_orig_of(asker))) == \
            sorted(_orig_of(n) for n in now_to), cap.summary()

        # ... and n1's host's ARP floods at once, with no DHT_GET
        lab.exec(X, ["ip", "neigh", "flush", "dev", "bat0"], check=True)
        get_tx = stats(lab, X)["dat_get_tx"]
        with FrameCapture(lab.ns(X), ifx) as capf:
            _ping(lab, X, Y)
            time.sleep(0.2)
        assert not capf.dat(outgoing=True), capf.summary()
        flooded = capf.arp_broadcasts(orig=_orig_of(X), outgoing=True)
        assert flooded and arp_fields(flooded[0].packet.inner)[4] == ips[Y], capf.summary()
        assert stats(lab, X)["dat_get_tx"] == get_tx
