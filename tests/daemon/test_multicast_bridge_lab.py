"""Multicast listeners behind a bridge, in the `client` lab (n1's br0 holds bat0 and the
veth to client c1; n1 - n2 - n3; defaults but a short OGM interval), with br0's IGMP/MLD
snooping switched on:

- no querier anywhere: n1 wants all IPv4 and IPv6 multicast (U46, no group listed);
- br0's own querier, once the bridge counts it (a query response interval after it was
  switched on): n1 stops wanting all, and the groups c1 joined, which br0 learnt from c1's
  reports, are listener entries in n1's local TT and in n3's global TT;
- a foreign IGMP querier behind c1 wins the election: it shadows c1's IPv4 listeners from
  the mesh, so n1 wants all IPv4 again and withdraws c1's IPv4 group."""

from __future__ import annotations

import json
import sys
import time

from tests.daemon.labs import make_lab, wait_for

GROUP4, GROUP4_MAC = "239.8.8.8", "01:00:5e:08:08:08"
GROUP6, GROUP6_MAC = "ff05::8:8", "33:33:00:08:00:08"
RESPONSE_INTERVAL = 10.0  # the bridge's default mcast_query_response_interval
RECEIVER = f"""
import socket, struct, sys, time
s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s4.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
              socket.inet_aton("{GROUP4}") + socket.inet_aton(sys.argv[1]))
s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_JOIN_GROUP,
              socket.inet_pton(socket.AF_INET6, "{GROUP6}") + struct.pack("@I", socket.if_nametoindex("eth0")))
print("joined", flush=True)
time.sleep(600)
"""
# IGMPv2 general queries (max response 10 s) from c1's address, once a second
QUERIER = """
import socket, struct, sys, time
def checksum(data):
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
query = struct.pack("!BBH4s", 0x11, 100, 0, bytes(4))
query = struct.pack("!BBH4s", 0x11, 100, checksum(query), bytes(4))
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_IGMP)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[1]))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
print("querying", flush=True)
while True:
    s.sendto(query, ("224.0.0.1", 0))
    time.sleep(1)
"""


def _mcast_flags(lab) -> tuple[str, str, str, str]:
    """n1's batmanctl mf header: own flags (batctl 2023's five slots), bridged slot,
    no-querier slots, shadowing slots."""
    lines = lab.batmanctl("n1", "mf", check=True).stdout.splitlines()
    own = lines[1].split("own flags: [", 1)[1]
    return own[:7], lines[2].split("\t")[-1], lines[3].split("\t")[-1], lines[4].split("\t")[-1]


def _tt(lab, node: str, table: str) -> set[str]:
    return {r["tt_address"] for r in json.loads(lab.batmanctl(node, table, "--json", check=True).stdout)}


def _mdb_groups(lab) -> set[str]:
    """The groups in br0's MDB on c1's port (`bridge mdb show` reads the same dump as n1)."""
    out = lab.exec("n1", ["bridge", "-j", "mdb", "show", "dev", "br0"], check=True).stdout
    return {e["grp"] for bridge in json.loads(out) for e in bridge.get("mdb", []) if e.get("port") == "c-c1"}


def _bridge(lab, *args: str) -> None:
    lab.exec("n1", ["ip", "link", "set", "br0", "type", "bridge", *args], check=True)


def test_listeners_behind_a_bridge_follow_its_querier_and_mdb():
    with make_lab("client", orig_interval_ms=200) as lab:
        lab.start()
        wait_for(lambda: len(json.loads(lab.batmanctl("n1", "o", "--json").stdout or "[]")) >= 2, timeout=30)
        _bridge(lab, "mcast_snooping", "1")
        # (a) snooping but no querier: the bridge floods, so we want all of both families
        wait_for(lambda: _mcast_flags(lab) == ("U46R4R6", "U", "4/6", "./."), timeout=10)
        receiver = lab.spawn("c1", [sys.executable, "-c", RECEIVER, lab.address("c1")], stdout=-1, text=True)
        querier = None
        try:
            assert receiver.stdout.readline().strip() == "joined"
            wait_for(lambda: {GROUP4, GROUP6} <= _mdb_groups(lab), timeout=10)  # br0 snooped c1's reports
            time.sleep(1)
            assert not {GROUP4_MAC, GROUP6_MAC} & _tt(lab, "n1", "tl")  # wanting all, nothing is listed
            # (b) br0's own querier (br0 has n1's IPv6 address to send MLD queries from)
            switched_on = time.monotonic()
            _bridge(lab, "mcast_querier", "1")
            wait_for(lambda: _mcast_flags(lab) == ("U... . ", "U", "./.", "./."), timeout=RESPONSE_INTERVAL + 10)
            waited = time.monotonic() - switched_on
            print(f"br0's querier counted after {waited:.1f} s")
            assert waited >= RESPONSE_INTERVAL - 1, f"the querier counted after {waited:.1f} s, before the bridge's delay"
            wait_for(lambda: {GROUP4_MAC, GROUP6_MAC} <= _tt(lab, "n1", "tl"), timeout=5)
            wait_for(lambda: {GROUP4_MAC, GROUP6_MAC} <= _tt(lab, "n3", "tg"), timeout=10)
            # (c) a foreign IGMP querier behind c1 wins (br0 queries from 0.0.0.0) and shadows
            querier = lab.spawn("c1", [sys.executable, "-c", QUERIER, lab.address("c1")], stdout=-1, text=True)
            assert querier.stdout.readline().strip() == "querying"
            wait_for(lambda: _mcast_flags(lab)[0::3] == ("U4.R4. ", "4/."), timeout=10)
            wait_for(lambda: GROUP4_MAC not in _tt(lab, "n3", "tg"), timeout=10)
            assert GROUP6_MAC in _tt(lab, "n1", "tl") and GROUP4_MAC not in _tt(lab, "n1", "tl")
        finally:
            for proc in (receiver, querier):
                if proc is not None:
                    proc.kill()
                    proc.wait()
