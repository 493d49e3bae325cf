"""Multicast optimisations between batmand and the kernel's batman-adv (2022.3): interop-bkb,
b1 - k2 - b3 (batmand, kernel, batmand; OGMs every 500 ms, multicast settings at their
defaults), B.A.T.M.A.N. IV and V. k2 is the sender, b1 the listener, b3 a node that is not.

1. The kernel reads our MCAST container: `batctl mf` (batctl 2023.0, five slots) lists b1
   and b3 with `[.... . ]`, `batctl mfj` with raw 0x38 or 0x18 (with or without the
   packet-type capability bit 0x20, which 2022.3 stores and ignores); we read the kernel's:
   b1's `batmanctl mf --json` lists k2 with raw 0x18 (`[.... . ]`, batctl 2023's five slots).
2. A receiver on b1 joins 239.7.7.9: b1 announces 01:00:5e:07:07:09 in its local TT
   (`batmanctl tl`: `[.P....]`, NOPURGE), and the kernel's `batctl tg` holds it as a global
   entry of b1's originator alone, with no flags (`[....]`).
3. k2's guest pings the group (busybox ping out of bat0): with one listener the kernel sends
   each echo as one plain UNICAST (0x40, TTL 50) to b1's originator, the receiver sees every
   one, and nothing for the group reaches b3's link (no BCAST flood, no copy).
4. The receiver is killed: b1 withdraws the entry, the kernel's `batctl tg` loses it, and
   the kernel's next pings to the group go nowhere (2022.3 drops them: tx_dropped)."""

from __future__ import annotations

import json
import queue
import re
import sys
import threading
import time

import pytest

from batmand.lab import Lab, load
from batmand.wire import PacketType, Unicast
from tests.daemon.frames import FrameCapture
from tests.daemon.labs import prefix, stats, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge, kernel_json, ok

INTERVAL_MS = 500
GROUP = "239.7.7.9"
GROUP_MAC = "01:00:5e:07:07:09"
PORT = 5009
PINGS = 5
ICMP, IGMP = 1, 2
OUR_FLAGS = (0x18, 0x38)  # unbridged, no multicast router; 0x20: the 2024.0 packet-type capability
KERNEL_FLAGS = 0x18  # 2022.3, unbridged, no router
OLD_BATCTL_TEXT = "[.... . ]"  # batctl 2023.0's five slots (no P slot) for both of OUR_FLAGS
# joins GROUP on the interface of the address given (a UDP socket's membership), prints
# each ICMP echo request to the group that the host receives (a raw socket sees them)
RECEIVER = f"""
import socket, struct, sys
member = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
member.bind(("", {PORT}))
member.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                  socket.inet_aton("{GROUP}") + socket.inet_aton(sys.argv[1]))
raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
print("joined", flush=True)
while True:
    data, (src, _) = raw.recvfrom(2048)
    ihl = (data[0] & 15) * 4
    if data[16:20] == socket.inet_aton("{GROUP}") and data[ihl] == 8:
        ident, seq = struct.unpack("!HH", data[ihl + 4:ihl + 8])
        print("echo", seq, src, flush=True)
"""


def _lab(algo: str) -> Lab:
    topo = load("interop-bkb")
    topo.batmand["orig_interval_ms"] = INTERVAL_MS
    topo.batmand["routing_algo"] = algo
    if algo == "BATMAN_V":  # virtio-net reports no speed: both sides get the same figure
        for name, node in topo.nodes.items():
            node.batmand["hardif"] = {i: {"throughput_override": "100mbit"} for i in topo.hard_interfaces(name)}
    return Lab(topo, prefix())


def _kernel_counters(lab: Lab) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"(\w+): (\d+)", ok(lab.exec("k2", ["batctl", "s"])))}


def _group_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if GROUP_MAC in line]


def _kernel_group_entries(lab: Lab) -> list[str]:
    return _group_lines(ok(lab.exec("k2", ["batctl", "tg", "-H"])))


def _to_group(cap: FrameCapture) -> list:
    """Frames on the link carrying a frame for the group other than IGMP (reports are
    flooded by design, IGMPv3's go to 224.0.0.22 anyway), whatever the packet type."""
    found = []
    for s in cap.seen_frames():
        inner = s.frame.inner if s.frame is not None and s.frame.packets else None
        if inner is None or str(inner.h_dest) != GROUP_MAC:
            continue
        if inner.h_proto == 0x0800 and len(inner.payload) > 9 and inner.payload[9] == IGMP:
            continue
        found.append(s)
    return found


def _describe(frames) -> str:
    return "\n".join(s.describe() for s in frames) or "(none)"


def _ping_group(lab: Lab) -> str:
    """PINGS echo requests to the group from k2's guest, out of bat0 (busybox ping; the
    hosts do not answer multicast echoes, so its status is not looked at)."""
    return lab.exec("k2", ["ping", "-c", str(PINGS), "-i", "0.2", "-W", "1", "-I", "bat0", GROUP],
                    timeout=30).stdout


class _Lines:
    """A process's output lines as they come (a thread reads them into a queue)."""

    def __init__(self, proc) -> None:
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.queue.put(line.strip())

    def take(self, count: int, timeout: float) -> list[str]:
        lines, deadline = [], time.monotonic() + timeout
        while len(lines) < count:
            try:
                lines.append(self.queue.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                break
        return lines


@pytest.mark.parametrize("algo", ["BATMAN_IV", "BATMAN_V"])
def test_multicast_between_batmand_and_a_kernel_node(algo):
    lab = _lab(algo)
    require_kernel_nodes(len(lab.kernel_nodes))
    report: dict = {}
    started = time.monotonic()
    with lab:
        lab.start(timeout=120)
        report["converged_s"] = round(converge(lab), 1)
        b1, k2, b3 = (lab.originator(n) for n in ("b1", "k2", "b3"))

        # 1. the flags, each side as the other announces them
        def kernel_lists_us():
            rows = {r["orig_address"]: r for r in kernel_json(lab, "k2", "mfj")}
            return rows if all("mcast_flags" in rows.get(o, {}) for o in (b1, b3)) else None

        rows, _ = wait_for(kernel_lists_us, timeout=10, step=0.5)
        for orig in (b1, b3):
            flags = rows[orig]["mcast_flags"]
            assert flags["raw"] in OUR_FLAGS, rows[orig]
            assert flags["want_no_rtr_ipv4"] and flags["want_no_rtr_ipv6"], rows[orig]
            assert not (flags["all_unsnoopables"] or flags["want_all_ipv4"] or flags["want_all_ipv6"]), rows[orig]
        text = ok(lab.exec("k2", ["batctl", "mf"])).splitlines()
        assert f"Multicast flags (own flags: {OLD_BATCTL_TEXT})" in text, text
        for orig in (b1, b3):
            assert f"{orig} {OLD_BATCTL_TEXT}" in text, text
        ours = {r["orig_address"]: r for r in json.loads(ok(lab.batmanctl("b1", "mf", "--json")))}
        assert ours[k2]["mcast_flags"]["raw"] == KERNEL_FLAGS, ours
        mf = ok(lab.batmanctl("b1", "mf")).splitlines()
        assert f"{k2} {OLD_BATCTL_TEXT}" in mf, mf  # batmanctl prints batctl 2023's five slots, as k2's batctl
        report["flags"] = {"batctl mfj raw": {n: rows[o]["mcast_flags"]["raw"] for n, o in (("b1", b1), ("b3", b3))},
                           "batmanctl mf raw k2": ours[k2]["mcast_flags"]["raw"]}

        # 2. a listener on b1: its entry in b1's local TT, then in the kernel's global TT
        receiver = lab.spawn("b1", [sys.executable, "-c", RECEIVER, lab.address("b1")], stdout=-1, text=True)
        lines = _Lines(receiver)
        try:
            assert lines.take(1, 10) == ["joined"]
            t0 = time.monotonic()
            # NEW (the N slot) until b1's next OGM commits the change, then NOPURGE alone
            local, _ = wait_for(lambda: [line for line in _group_lines(ok(lab.batmanctl("b1", "tl", "-H")))
                                         if "[.P....]" in line], timeout=10, step=0.2)
            assert len(local) == 1, local
            entries, _ = wait_for(lambda: _kernel_group_entries(lab), timeout=15, step=0.2)
            report["announced_s"] = round(time.monotonic() - t0, 1)
            assert len(entries) == 1 and b1 in entries[0] and "[....]" in entries[0], entries
            assert b3 not in entries[0], entries

            # 3. the kernel's multicast to the group: unicast to b1, nothing on b3's link
            before_k2, before_b1 = _kernel_counters(lab), stats(lab, "b1")
            with FrameCapture(lab.ns("b1"), lab.topology.hard_interfaces("b1")) as cap1, \
                    FrameCapture(lab.ns("b3"), lab.topology.hard_interfaces("b3")) as cap3:
                pinged = _ping_group(lab)
                echoes = lines.take(PINGS, 10)
                time.sleep(0.3)
            after_k2, after_b1 = _kernel_counters(lab), stats(lab, "b1")
            seqs = sorted(int(line.split()[1]) for line in echoes if line.startswith("echo "))
            assert seqs == list(range(PINGS)), (echoes, pinged)
            assert all(line.split()[2] == lab.address("k2") for line in echoes), echoes
            to_b1 = _to_group(cap1)
            assert len(to_b1) == PINGS, _describe(to_b1) + "\n" + cap1.summary()
            for s in to_b1:
                p = s.packet
                assert not s.outgoing and type(p) is Unicast and p.packet_type == PacketType.UNICAST, s.describe()
                assert (str(p.dest), p.ttl) == (b1, 50), s.describe()
                assert p.inner.h_proto == 0x0800 and p.inner.payload[9] == ICMP, s.describe()
            assert cap3.seen_frames(outgoing=False), "b3's capture saw nothing of k2 at all"
            to_b3 = _to_group(cap3)
            assert not to_b3, "multicast reached b3's link:\n" + _describe(to_b3)
            assert after_k2["tx"] - before_k2["tx"] >= PINGS, (before_k2, after_k2)
            assert after_b1["rx"] - before_b1["rx"] >= PINGS, (before_b1, after_b1)
            report["to_listener"] = (f"{len(to_b1)} UNICAST to b1 (ttl 50), receiver got seqs {seqs}, "
                                     f"0 frames for the group on b3's link; k2 tx +{after_k2['tx'] - before_k2['tx']}, "
                                     f"b1 rx +{after_b1['rx'] - before_b1['rx']}")
        finally:
            receiver.kill()
            receiver.wait()

        # 4. the listener left: the kernel drops the entry, and its frames to the group
        t0 = time.monotonic()
        wait_for(lambda: not _kernel_group_entries(lab), timeout=20, step=0.2)
        report["withdrawn_s"] = round(time.monotonic() - t0, 1)
        assert not _group_lines(ok(lab.batmanctl("b1", "tl", "-H")))
        before = _kernel_counters(lab)
        with FrameCapture(lab.ns("b1"), lab.topology.hard_interfaces("b1")) as cap1, \
                FrameCapture(lab.ns("b3"), lab.topology.hard_interfaces("b3")) as cap3:
            _ping_group(lab)
            time.sleep(0.3)
        after = _kernel_counters(lab)
        assert cap1.seen_frames(outgoing=False) and cap3.seen_frames(outgoing=False), "a capture saw nothing"
        stray = _to_group(cap1) + _to_group(cap3)
        assert not stray, "multicast without listeners left k2:\n" + _describe(stray)
        assert after["tx_dropped"] - before["tx_dropped"] >= PINGS, (before, after)
        report["no_listener"] = f"nothing on either link, k2 tx_dropped +{after['tx_dropped'] - before['tx_dropped']}"
    report["total_s"] = round(time.monotonic() - started, 1)
    print(f"\nINTEROP MULTICAST {algo}: {json.dumps(report)}")
