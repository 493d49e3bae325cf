"""The distributed ARP table between batmand and the kernel's batman-adv (2022.3): a line
b1 - k2 - b3 - k4 (batmand, kernel, batmand, kernel; OGMs every 500 ms; bat0 addresses
10.77.0.1 ... .4), B.A.T.M.A.N. IV and V. With four DAT-capable nodes each node's
candidates for any address are the three others, so every exchange reaches both kinds of
node; the order a sender addresses them in is the DHT's, which checks our ring positions
and keys against the kernel's.

1. b1's host pings k4 (a batmand host asks for a kernel host): b1 sends three DHT_GETs,
   k4's host answers the GET, the kernel k4 stores its reply with six DHT_PUTs (then sends
   the reply itself), b1's held-back broadcast never leaves.
2. k2's host pings b3 (a kernel host asks for a batmand host): the kernel's three GETs,
   b3's six PUTs. (A candidate whose GET arrives after the owner's PUT answers from its
   cache, as the kernel does: allowed, and seen on the wire.) Afterwards the kernel nodes'
   `batctl dc` hold the batmand hosts' addresses (bat0 IP -> bat0 MAC), batmand's
   `batmanctl dc --json` the kernel hosts', listed in the same order, and the dat_*
   counters moved both ways on both kinds.
3. b3 keeps entries 3 s only (dat_timeout_ms; the kernel keeps them 5 min): once k4's
   address left b3's cache, b3's host pings k4 again and is answered from the DHT: k2 and
   k4 (kernel) and b1 (batmand) each send a DAT_CACHE_REPLY (dat_cached_reply_tx), with the
   same inner frame and header; k4's host never sees the request. b1's host, asking for
   k2, is answered from b1's own cache (nothing on the wire, no counter moves).
4. `batmanctl dat 0` on b3: the kernel stops asking b3; `batctl dat 0` on k4: batmand stops
   asking k4 (each side reads the other's DAT container, and its absence).
5. k4 (DAT off) floods its host's ARP: k2 and b1 answer the broadcast request from their
   caches, the kernel as plain UNICAST, batmand as 4addr DAT_CACHE_REPLY (a difference from
   2022.3, see there)."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest

from batmand.core.dat_hash import hash_dat, select_candidates
from batmand.lab import Lab, from_dict
from batmand.lab import kernel_node as kn
from batmand.wire import Bcast, IvOgm, Mac, Unicast, Unicast4Addr
from tests.daemon.frames import FrameCapture, arp_fields
from tests.daemon.labs import prefix, stats, tt_synced, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge

INTERVAL_MS = 500
B3_TIMEOUT_MS = 3000
COUNTERS = ("dat_get_tx", "dat_get_rx", "dat_put_tx", "dat_put_rx", "dat_cached_reply_tx")
NOBODY = "10.77.0.222"  # an address no host has


def _lab(algo: str) -> Lab:
    nodes = [{"name": "b1"}, {"name": "k2", "kind": "kernel"},
             {"name": "b3", "batmand": {"dat_timeout_ms": B3_TIMEOUT_MS}}, {"name": "k4", "kind": "kernel"}]
    links = [{"a": "b1", "b": "k2"}, {"a": "k2", "b": "b3"}, {"a": "b3", "b": "k4"}]
    topo = from_dict({"lab": {"mtu": 1560}, "batmand": {"orig_interval_ms": INTERVAL_MS}, "node": nodes,
                      "link": links}, name="dat-bkbk")
    topo.batmand["routing_algo"] = algo
    if algo == "BATMAN_V":  # virtio-net reports no speed: both sides get the same figure
        for name, node in topo.nodes.items():
            node.batmand["hardif"] = {i: {"throughput_override": "100mbit"} for i in topo.hard_interfaces(name)}
    return Lab(topo, prefix())


def _counters(lab: Lab, node: str) -> dict[str, int]:
    if lab.is_kernel(node):
        values = dict(re.findall(r"(\w+): (\d+)", lab.exec(node, ["batctl", "s"], check=True).stdout))
    else:
        values = stats(lab, node)
    return {k: int(values[k]) for k in COUNTERS}


def _all_counters(lab: Lab) -> dict[str, dict[str, int]]:
    return {n: _counters(lab, n) for n in lab.nodes}


def _delta(before, after) -> dict[str, dict[str, int]]:
    """node -> the counters that moved, by how much."""
    return {n: {k: after[n][k] - before[n][k] for k in COUNTERS if after[n][k] != before[n][k]} for n in before}


_DC_LINE = re.compile(r"^ \* +(\d+\.\d+\.\d+\.\d+) ([0-9a-f:]{17}) +(-?\d+) +(\d+):(\d\d)$", re.M)


def _dc(lab: Lab, node: str) -> list[tuple[str, str, int]]:
    """(IP, MAC, VID) of `batctl dc` / `batmanctl dc --json`, in the order listed."""
    if lab.is_kernel(node):
        out = lab.exec(node, ["batctl", "dc", "-H"], check=True).stdout
        return [(m[1], m[2], int(m[3])) for m in _DC_LINE.finditer(out)]
    out = lab.batmanctl(node, "dc", "--json", check=True).stdout
    return [(r["dat_cache_ip4address"], r["dat_cache_hwaddress"], r["dat_cache_vid"])
            for r in (json.loads(out) if out.strip() else [])]


def _kernel_tt_synced(lab: Lab, node: str, owner: str) -> bool:
    out = lab.exec(node, ["batctl", "tg", "-H"]).stdout
    return any(lab.mesh_mac(owner) in line and lab.originator(owner) in line for line in out.splitlines())


def _ping(lab: Lab, src: str, dst: str) -> None:
    res = lab.exec(src, ["ping", "-c", "1", "-W", "3", lab.address(dst)])
    assert res.returncode == 0, f"ping {src} -> {dst}: {res.stdout}{res.stderr}"


def _originated(packet, orig: str) -> bool:
    """Whether a packet received straight from `orig` was sent by it, not forwarded: a
    broadcast carries its originator, a unicast leaves its originator with TTL 50."""
    if isinstance(packet, Bcast):
        return str(packet.orig) == orig
    if isinstance(packet, (Unicast, Unicast4Addr)):
        return packet.ttl == 50
    return True


class Captures:
    """Frame captures on every hard interface of every batmand node, for one step. Every
    frame a node sends is seen once: leaving a batmand node, or arriving from a kernel
    node over its link (each kernel node's neighbours are batmand nodes here; what it
    forwards is told apart by the originator or the TTL)."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.caps = {n: FrameCapture(lab.ns(n), lab.topology.hard_interfaces(n)) for n in lab.daemon_nodes}

    def __enter__(self) -> "Captures":
        try:
            for cap in self.caps.values():
                cap.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for cap in self.caps.values():
            cap.stop()

    def sent(self, node: str) -> list:
        """What `node` put on its links (Seen frames, in capture order per interface)."""
        if not self.lab.is_kernel(node):
            return self.caps[node].seen_frames(outgoing=True)
        nics = set(kn.node_macs(self.lab.topology.nodes[node].host, len(self.lab.topology.node_links(node)))[0])
        orig = self.lab.originator(node)
        return [s for cap in self.caps.values() for s in cap.seen_frames(outgoing=False)
                if s.frame is not None and str(s.frame.ethernet.h_source) in nics and _originated(s.packet, orig)]

    def dat(self, node: str, subtype: int | None = None) -> list:
        """The DAT frames (4addr subtypes 2, 3, 4) `node` originated."""
        orig = self.lab.originator(node)
        return [s for s in self.sent(node) if isinstance(s.packet, Unicast4Addr) and s.packet.subtype in (2, 3, 4)
                and str(s.packet.src) == orig and (subtype is None or s.packet.subtype == subtype)]

    def arp_broadcasts(self, node: str) -> list:
        orig = self.lab.originator(node)
        return [s for s in self.sent(node) if isinstance(s.packet, Bcast) and str(s.packet.orig) == orig
                and s.packet.inner.h_proto == 0x0806]

    def summary(self) -> str:
        frames = sorted(((n, s) for n, cap in self.caps.items() for s in cap.seen_frames()), key=lambda x: x[1].t)
        return "\n".join(f"{n}: {s.describe()}" for n, s in frames if not isinstance(s.packet, IvOgm)) or "(no frames)"


def _names(lab: Lab, frames) -> list[str]:
    """The 4addr destinations of `frames`, as node names, sorted."""
    by_orig = {lab.originator(n): n for n in lab.nodes}
    return sorted(by_orig.get(str(s.packet.dest), str(s.packet.dest)) for s in frames)


def _order(lab: Lab, frames) -> list[str]:
    """The 4addr destinations of `frames` as node names, in the order they were seen."""
    by_orig = {lab.originator(n): n for n in lab.nodes}
    return [by_orig.get(str(s.packet.dest), str(s.packet.dest)) for s in frames]


def _ring(lab: Lab, asker: str, ip: str) -> list[str]:
    """The DAT candidates `asker` picks for `ip` (all nodes DAT-capable), closest first."""
    by_orig = {Mac(lab.originator(n)): n for n in lab.nodes if n != asker}
    return [by_orig[m] for m in select_candidates(hash_dat(socket.inet_aton(ip), 0), list(by_orig))]


def _flush(lab: Lab, node: str) -> None:
    lab.exec(node, ["ip", "neigh", "flush", "dev", "bat0"], check=True)


def _reply_follows_puts(frames, puts) -> bool:
    """The host's own ARP reply (plain UNICAST) goes out after its PUTs on the same link."""
    order = [s for s in frames if s.packet is not None and s.frame.inner is not None
             and s.frame.inner.h_proto == 0x0806]
    for s in order:
        if isinstance(s.packet, Unicast) and not isinstance(s.packet, Unicast4Addr):
            before = order[:order.index(s)]
            return all(p in before for p in puts if p.ifname == s.ifname)
    return False


def _moved(lab: Lab, before, after, cap: Captures, asker: str, owner: str, expected: dict) -> dict:
    """The counters moved as `expected`, but for cached replies: a candidate that had the
    owner's PUT before its own GET (the GETs go out one after the other, some through a
    relay, and the kernel nodes run emulated) answers from its cache, as a kernel does;
    each such answer is a DAT_CACHE_REPLY to the asker on the wire. Returns the deltas."""
    delta = _delta(before, after)
    moved = {n: dict(d) for n, d in delta.items()}
    cached = {n: d.pop("dat_cached_reply_tx", 0) for n, d in moved.items()}
    assert moved == expected, f"{delta}\n{cap.summary()}"
    for n, count in cached.items():
        replies = cap.dat(n, 4)
        assert count == len(replies) and count <= int(n not in (asker, owner)), f"{n}: {delta}\n{cap.summary()}"
        assert all(str(s.packet.dest) == lab.originator(asker) for s in replies), cap.summary()
    return delta


@pytest.mark.parametrize("algo", ["BATMAN_IV", "BATMAN_V"])
def test_dat_between_batmand_and_kernel_nodes(algo):
    lab = _lab(algo)
    require_kernel_nodes(len(lab.kernel_nodes))
    report: dict = {}
    with lab:
        lab.start(timeout=120)
        nodes = lab.nodes
        macs = {n: lab.mesh_mac(n) for n in nodes}
        ips = {n: lab.address(n) for n in nodes}
        zero = "00:00:00:00:00:00"
        report["converged_s"] = round(converge(lab), 1)
        synced = lambda n, m: (_kernel_tt_synced if lab.is_kernel(n) else tt_synced)(lab, n, m)  # noqa: E731
        wait_for(lambda: all(synced(n, m) for n in nodes for m in nodes if m != n), timeout=60, step=1.0)
        assert {n: _dc(lab, n) for n in nodes} == {n: [] for n in nodes}  # nobody has ARPed yet
        for n in nodes:
            _flush(lab, n)

        # 1. a batmand host asks for a kernel host
        before = _all_counters(lab)
        with Captures(lab) as cap:
            _ping(lab, "b1", "k4")
            time.sleep(0.6)  # past b1's held-back broadcast
        after = _all_counters(lab)
        gets, puts = cap.dat("b1", 2), cap.dat("k4", 3)
        assert _names(lab, gets) == ["b3", "k2", "k4"], cap.summary()
        # in the order of the DHT (each sender's frames here leave on one link, in order):
        # the kernel's ring positions and keys are ours
        assert _order(lab, gets) == _ring(lab, "b1", ips["k4"]), cap.summary()
        assert all(arp_fields(s.packet.inner) == (1, macs["b1"], ips["b1"], zero, ips["k4"]) and s.packet.ttl == 50
                   for s in gets), cap.summary()
        assert _names(lab, puts) == ["b1", "b1", "b3", "b3", "k2", "k2"], cap.summary()  # keys k4's and b1's IPs
        assert _order(lab, puts) == _ring(lab, "k4", ips["k4"]) + _ring(lab, "k4", ips["b1"]), cap.summary()
        assert {arp_fields(s.packet.inner) for s in puts} == {(2, macs["k4"], ips["k4"], macs["b1"], ips["b1"])}
        assert all((s.packet.ttl, s.packet.reserved) == (50, 0) for s in puts), cap.summary()
        assert _reply_follows_puts(cap.sent("k4"), puts), cap.summary()
        assert not cap.arp_broadcasts("b1"), cap.summary()
        report["batmand_asks_kernel"] = _moved(lab, before, after, cap, "b1", "k4", {
            "b1": {"dat_get_tx": 3, "dat_put_rx": 2}, "k2": {"dat_get_rx": 1, "dat_put_rx": 2},
            "b3": {"dat_get_rx": 1, "dat_put_rx": 2}, "k4": {"dat_get_rx": 1, "dat_put_tx": 6}})
        ttvn_b3 = next(s.packet.ttvn for s in gets if str(s.packet.dest) == lab.originator("b3"))

        # 2. a kernel host asks for a batmand host
        before = _all_counters(lab)
        with Captures(lab) as cap:
            _ping(lab, "k2", "b3")
            time.sleep(0.6)
        after = _all_counters(lab)
        gets, puts = cap.dat("k2", 2), cap.dat("b3", 3)
        assert _names(lab, gets) == ["b1", "b3", "k4"], cap.summary()
        assert all(arp_fields(s.packet.inner) == (1, macs["k2"], ips["k2"], zero, ips["b3"])
                   and (s.packet.ttl, s.packet.reserved) == (50, 0) for s in gets), cap.summary()
        # the kernel's GET to b3 carries the ttvn b1's did
        assert [s.packet.ttvn for s in gets if str(s.packet.dest) == lab.originator("b3")] == [ttvn_b3]
        assert _names(lab, puts) == ["b1", "b1", "k2", "k2", "k4", "k4"], cap.summary()
        assert {arp_fields(s.packet.inner) for s in puts} == {(2, macs["b3"], ips["b3"], macs["k2"], ips["k2"])}
        assert _reply_follows_puts(cap.sent("b3"), puts), cap.summary()
        assert not cap.arp_broadcasts("k2"), cap.summary()
        report["kernel_asks_batmand"] = _moved(lab, before, after, cap, "k2", "b3", {
            "b1": {"dat_get_rx": 1, "dat_put_rx": 2}, "k2": {"dat_get_tx": 3, "dat_put_rx": 2},
            "b3": {"dat_get_rx": 1, "dat_put_tx": 6}, "k4": {"dat_get_rx": 1, "dat_put_rx": 2}})

        # the caches: the kernel nodes hold the batmand hosts' addresses, batmand the
        # kernel hosts', every one with its bat0 MAC, listed in the same (the kernel's) order
        tables = {n: _dc(lab, n) for n in nodes}
        everyone = {(ips[n], macs[n], -1) for n in nodes}
        for n in ("k2", "k4", "b1"):
            assert set(tables[n]) == everyone, (n, tables[n])
        assert [ip for ip, _, _ in tables["b1"]] == [ip for ip, _, _ in tables["k2"]] == \
            [ip for ip, _, _ in tables["k4"]], tables
        report["dc"] = {n: [f"{ip} {mac}" for ip, mac, _ in tables[n]] for n in ("k2", "b1")}

        # 3. b3's entries expire (3 s; the kernel's live 5 min): asked again, k4's address
        # comes from the DHT, each candidate answering from its cache
        _, waited = wait_for(lambda: ips["k4"] not in {ip for ip, _, _ in _dc(lab, "b3")},
                             timeout=2 * B3_TIMEOUT_MS / 1000 + 5, step=0.5)
        _flush(lab, "b3")
        before = _all_counters(lab)
        with Captures(lab) as cap:
            _ping(lab, "b3", "k4")
            time.sleep(0.6)
        after = _all_counters(lab)
        assert _names(lab, cap.dat("b3", 2)) == ["b1", "k2", "k4"], cap.summary()
        replies = {n: cap.dat(n, 4) for n in ("b1", "k2", "k4")}
        assert all(len(r) == 1 for r in replies.values()), cap.summary()
        replies = {n: r[0].packet for n, r in replies.items()}
        expected = (2, macs["k4"], ips["k4"], macs["b3"], ips["b3"])
        assert all(arp_fields(p.inner) == expected for p in replies.values()), cap.summary()
        # batmand's cached reply is the kernel's, but for the sender: same inner bytes, header
        assert len({p.inner.encode() for p in replies.values()}) == 1, cap.summary()
        assert len({(p.ttl, p.ttvn, p.dest, p.subtype, p.reserved) for p in replies.values()}) == 1, cap.summary()
        assert not cap.dat("k4", 3) and not cap.arp_broadcasts("b3"), cap.summary()  # k4's host was not asked
        assert _delta(before, after) == {
            "b1": {"dat_get_rx": 1, "dat_cached_reply_tx": 1}, "k2": {"dat_get_rx": 1, "dat_cached_reply_tx": 1},
            "b3": {"dat_get_tx": 3}, "k4": {"dat_get_rx": 1, "dat_cached_reply_tx": 1}}, _delta(before, after)
        assert (ips["k4"], macs["k4"], -1) in _dc(lab, "b3")
        report["answered_from_the_dht"] = _delta(before, after)

        # b1 has k2's address (from k2's GET): its host is answered at home
        _flush(lab, "b1")
        before = _all_counters(lab)
        with Captures(lab) as cap:
            _ping(lab, "b1", "k2")
            time.sleep(0.6)
        assert not cap.dat("b1") and not cap.arp_broadcasts("b1"), cap.summary()
        assert _delta(before, _all_counters(lab)) == {n: {} for n in nodes}

        # 4. DAT off on b3: the kernel asks the two others; off on k4 too: batmand asks k2 only
        lab.batmanctl("b3", "dat", "0", check=True)
        time.sleep(4 * INTERVAL_MS / 1000)
        with Captures(lab) as cap:
            lab.exec("k2", ["ping", "-c", "1", "-W", "1", NOBODY])
        assert set(_names(lab, cap.dat("k2", 2))) == {"b1", "k4"}, cap.summary()
        lab.exec("k4", ["batctl", "dat", "0"], check=True)
        assert lab.exec("k4", ["batctl", "dat"], check=True).stdout.strip() == "disabled"
        time.sleep(4 * INTERVAL_MS / 1000)
        with Captures(lab) as cap:
            lab.exec("b1", ["ping", "-c", "1", "-W", "1", NOBODY])
        assert set(_names(lab, cap.dat("b1", 2))) == {"k2"}, cap.summary()

        # 5. a request that came by broadcast: k4 (DAT off) floods its host's ARP for b1;
        # k2 and b1 have b1's address and answer it from their caches, with the same frame.
        # The 2022.3 kernel sends such an answer as plain UNICAST (it keeps 4addr for
        # requests that came in a 4addr GET); batmand sends DAT_CACHE_REPLY 4addr, as
        # kernels with b45072d0 (after 2026.2) do (dat.py's choice)
        _flush(lab, "k4")
        before = _all_counters(lab)
        with Captures(lab) as cap:
            _ping(lab, "k4", "b1")
            time.sleep(0.3)
        after = _all_counters(lab)
        assert cap.arp_broadcasts("k4"), cap.summary()
        answer = (2, macs["b1"], ips["b1"], macs["k4"], ips["k4"])
        kernel, ours = ([s.packet for s in cap.sent(n) if s.frame is not None and s.frame.inner is not None
                         and arp_fields(s.frame.inner) == answer] for n in ("k2", "b1"))
        assert len(kernel) == 1 and type(kernel[0]) is Unicast, cap.summary()
        assert len(ours) == 1 and type(ours[0]) is Unicast4Addr and ours[0].subtype == 4, cap.summary()
        assert ours[0].inner.encode() == kernel[0].inner.encode()
        assert (ours[0].ttvn, ours[0].dest) == (kernel[0].ttvn, kernel[0].dest)
        moved = _delta(before, after)
        assert moved["k2"].get("dat_cached_reply_tx") == 1 and moved["b1"].get("dat_cached_reply_tx") == 1, moved
        report["cached_reply_to_a_broadcast"] = {"k2 (kernel)": f"UNICAST ttl {kernel[0].ttl}",
                                                 "b1 (batmand)": f"UNICAST_4ADDR subtype 4 ttl {ours[0].ttl}"}
    print(f"\nINTEROP DAT {algo}: {json.dumps(report)}")
