"""Multicast optimisations between batmand nodes in namespaces (line5, defaults but a short
OGM interval): a receiver joins a group on n5, a sender on n1 sends to it. With every node
capable the frames go as MCAST packets listing n5 (counted by the mcast_* counters); once
one node's links are below 1280 bytes, as unicast copies, one per listener; above
multicast_fanout listeners, as a flood; after the receivers leave, their entries go and the
sender's frames go nowhere."""

from __future__ import annotations

import json
import sys
import time

from tests.daemon.frames import FrameCapture
from tests.daemon.labs import make_lab, stats, wait_for
from batmand.wire import Bcast, Mcast, Unicast

GROUP = "239.7.7.7"
GROUP_MAC = "01:00:5e:07:07:07"
PORT = 5007
RECEIVER = f"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("", {PORT}))
s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, struct.pack("4s4s", socket.inet_aton("{GROUP}"),
             socket.inet_aton(sys.argv[1])))
s.settimeout(30)
print("joined", flush=True)
while True:
    data, _ = s.recvfrom(100)
    print(data.decode(), flush=True)
"""
SENDER = f"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 2)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[1]))
for i in range(int(sys.argv[2])):
    s.sendto(b"m%d" % i, ("{GROUP}", {PORT}))
"""


def _to_group(cap):
    """Our frames out of the link that carry a frame for the group (as MCAST, UNICAST or BCAST)."""
    return [s for s in cap.seen_frames(outgoing=True) if isinstance(s.packet, (Mcast, Unicast, Bcast))
            and str(s.packet.inner.h_dest) == GROUP_MAC]


def _global_tt(lab, node):
    return {r["tt_address"] for r in json.loads(lab.batmanctl(node, "tg", "--json", check=True).stdout)}


def _first_link(lab, node):
    link = next(link for link in lab.topology.links if node in (link.a, link.b))
    return link.ifname_a if link.a == node else link.ifname_b


def _send(lab, cap_node, count):
    with FrameCapture(lab.ns(cap_node), [_first_link(lab, cap_node)]) as cap:
        lab.exec("n1", [sys.executable, "-c", SENDER, lab.address("n1"), str(count)], check=True)
        time.sleep(1)
    return _to_group(cap)


def _join(lab, node):
    receiver = lab.spawn(node, [sys.executable, "-c", RECEIVER, lab.address(node)], stdout=-1, text=True)
    assert receiver.stdout.readline().strip() == "joined"
    return receiver


def test_multicast_reaches_its_listeners_only_and_stops_after_they_leave():
    with make_lab("line5", orig_interval_ms=200) as lab:
        lab.start()
        wait_for(lambda: len(json.loads(lab.batmanctl("n1", "o", "--json").stdout or "[]")) >= 4, timeout=30)
        # batmanctl mf: our flags and every other node's: unbridged, no routers, MTUs of at
        # least 1280 (the MCAST packet capability): 0x38, as batman-adv 2024.0 and later
        mf = lab.batmanctl("n1", "mf", check=True).stdout.splitlines()
        assert mf[1] == "Multicast flags (own flags: [.... . ])" and mf[6] == "       Originator Flags", mf
        assert len([line for line in mf[7:] if line.endswith(" [.... . ]")]) == 4, mf
        rows = json.loads(lab.batmanctl("n1", "mf", "--json", check=True).stdout)
        assert all(r["mcast_flags"]["raw"] == 0x38 and r["mcast_flags"]["have_mc_ptype_capa"] for r in rows), rows
        receivers = [_join(lab, "n5")]
        try:
            wait_for(lambda: GROUP_MAC in _global_tt(lab, "n1"), timeout=15)
            # every node capable: one MCAST packet per frame, listing n5, relayed hop by hop
            before = {n: stats(lab, n) for n in ("n1", "n3", "n5")}
            frames = _send(lab, "n1", 5)
            assert len(frames) == 5 and all(isinstance(f.packet, Mcast) for f in frames), [f.describe() for f in frames]
            assert {tuple(map(str, f.packet.tvlvs[0].dests)) for f in frames} == {(lab.originator("n5"),)}
            assert [receivers[0].stdout.readline().strip() for _ in range(5)] == [f"m{i}" for i in range(5)]
            after = {n: stats(lab, n) for n in ("n1", "n3", "n5")}
            grew = {(n, k): after[n][k] - before[n][k] for n in after for k in ("mcast_tx_local", "mcast_fwd",
                                                                              "mcast_rx_local")}
            assert grew == {("n1", "mcast_tx_local"): 5, ("n1", "mcast_fwd"): 0, ("n1", "mcast_rx_local"): 0,
                            ("n3", "mcast_tx_local"): 0, ("n3", "mcast_fwd"): 5, ("n3", "mcast_rx_local"): 0,
                            ("n5", "mcast_tx_local"): 0, ("n5", "mcast_fwd"): 0, ("n5", "mcast_rx_local"): 5}, grew
            # a second listener on n3, and n4's link below 1280 bytes: n4 loses the capability,
            # so n1 falls back to a unicast copy per listener
            receivers.append(_join(lab, "n3"))
            wait_for(lambda: lab.batmanctl("n1", "tg", "--json", check=True).stdout.count(GROUP_MAC) == 2, timeout=15)
            for ifname in lab.topology.hard_interfaces("n4"):
                lab.exec("n4", ["ip", "link", "set", ifname, "mtu", "1200"], check=True)
            n4 = lab.originator("n4")
            wait_for(lambda: any(r["orig_address"] == n4 and r["mcast_flags"]["raw"] == 0x18
                                 for r in json.loads(lab.batmanctl("n1", "mf", "--json", check=True).stdout)),
                     timeout=15)
            frames = _send(lab, "n1", 3)
            assert len(frames) == 6 and all(isinstance(f.packet, Unicast) for f in frames), [f.describe() for f in frames]
            assert sorted({str(f.packet.dest) for f in frames}) == sorted([lab.originator("n3"), lab.originator("n5")])
            for receiver in receivers:
                assert [receiver.stdout.readline().strip() for _ in range(3)] == [f"m{i}" for i in range(3)]
            # more listeners than multicast_fanout: a flood
            assert lab.batmanctl("n1", "multicast_fanout", "1", check=True).returncode == 0
            frames = _send(lab, "n1", 2)
            assert len(frames) == 2 and all(isinstance(f.packet, Bcast) for f in frames), [f.describe() for f in frames]
            lab.batmanctl("n1", "multicast_fanout", "16", check=True)
        finally:
            for receiver in receivers:
                receiver.kill()
                receiver.wait()
        # the receivers left: their entries go, n1 sends its frames nowhere
        wait_for(lambda: GROUP_MAC not in _global_tt(lab, "n1"), timeout=15)
        assert not _send(lab, "n1", 3)
