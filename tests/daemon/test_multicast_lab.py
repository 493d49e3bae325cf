"""Multicast optimisations between batmand nodes in namespaces (line5, defaults but a short
OGM interval): a receiver joins a group on n5, a sender on n1 sends to it; the frames go as
unicast to n5 only (no BCAST on the line), n5's listener entry is in n1's global TT; after
the receiver leaves, the entry goes and the sender's frames go nowhere."""

from __future__ import annotations

import json
import sys
import time

from tests.daemon.frames import FrameCapture
from tests.daemon.labs import make_lab, wait_for
from batmand.wire import Bcast, Unicast

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
    """Our frames out of the link that carry a frame for the group (as UNICAST or BCAST)."""
    return [s for s in cap.seen_frames(outgoing=True) if isinstance(s.packet, (Unicast, Bcast))
            and str(s.packet.inner.h_dest) == GROUP_MAC]


def _global_tt(lab, node):
    return {r["tt_address"] for r in json.loads(lab.batmanctl(node, "tg", "--json", check=True).stdout)}


def test_multicast_reaches_its_listener_as_unicast_and_stops_after_it_leaves():
    with make_lab("line5", orig_interval_ms=200) as lab:
        lab.start()
        wait_for(lambda: len(json.loads(lab.batmanctl("n1", "o", "--json").stdout or "[]")) >= 4, timeout=30)
        # batmanctl mf: our flags and every other node's, unbridged and without routers (0x18)
        mf = lab.batmanctl("n1", "mf", check=True).stdout.splitlines()
        assert mf[1] == "Multicast flags (own flags: [.... . P])" and mf[6] == "       Originator Flags", mf
        assert len([line for line in mf[7:] if line.endswith(" [.... . P]")]) == 4, mf
        rows = json.loads(lab.batmanctl("n1", "mf", "--json", check=True).stdout)
        assert all(r["mcast_flags"]["raw"] == 0x18 and r["mcast_flags"]["want_no_rtr_ipv4"] for r in rows), rows
        receiver = lab.spawn("n5", [sys.executable, "-c", RECEIVER, lab.address("n5")], stdout=-1, text=True)
        try:
            assert receiver.stdout.readline().strip() == "joined"
            wait_for(lambda: GROUP_MAC in _global_tt(lab, "n1"), timeout=15)
            links = [link for link in lab.topology.links if "n1" in (link.a, link.b)]
            ifname = links[0].ifname_a if links[0].a == "n1" else links[0].ifname_b
            with FrameCapture(lab.ns("n1"), [ifname]) as cap:
                lab.exec("n1", [sys.executable, "-c", SENDER, lab.address("n1"), "5"], check=True)
                time.sleep(1)
            frames = _to_group(cap)
            assert len(frames) == 5 and all(isinstance(f.packet, Unicast) for f in frames), cap.summary()
            got = [receiver.stdout.readline().strip() for _ in range(5)]
            assert got == [f"m{i}" for i in range(5)]
        finally:
            receiver.kill()
            receiver.wait()
        # the receiver left: n5 withdraws its entry, n1 sends its frames nowhere
        wait_for(lambda: GROUP_MAC not in _global_tt(lab, "n1"), timeout=15)
        with FrameCapture(lab.ns("n1"), [ifname]) as cap:
            lab.exec("n1", [sys.executable, "-c", SENDER, lab.address("n1"), "3"], check=True)
            time.sleep(0.5)
        assert not _to_group(cap), cap.summary()
