"""Record the claim frames two kernel nodes (batman-adv 2022.3, BLA on) exchange as the
backbone gateways of one LAN: tests/data/bla-kernel-2022.3.pcap, which
tests/core/test_bla_capture.py reads. Run it (as root, where the interop tests run) with

    BATMAND_SHARED=/work/shared PYTHONPATH=. .venv/bin/python -m tests.interop.record_bla_capture [OUT.pcap]

Topology bla-kernels: k1 - n3 - k2, k1 and k2 kernel nodes whose LAN NICs are bridged into
one LAN namespace with a LAN host (tests/daemon/bla_lan.py), n3 a batmand node (the mesh
between them, and the mesh client they claim). IPv6 is off everywhere; the frames are
what these steps make the kernels send, taken at the LAN bridge's ports (each frame once,
as the gateway sent it; untagged, 42 bytes, no padding):

1. the LAN host's first broadcast: each kernel becomes a backbone gateway and ANNOUNCEs
   itself at once (CRC 0, its own group id: CRC16 of its primary MAC); then the higher
   group wins on both, and ANNOUNCEs follow every BLA period (~10 s) while the 20-30 s
   hold runs out;
2. n3's host pings the LAN host: both race to CLAIM it, the unicast's gateway takes it over;
3. a second client behind n3 (a MAC of n3's host's making) sends a frame to the LAN host:
   the gateway it goes through CLAIMs it; then that client "roams" into the LAN (a frame
   with its MAC comes from the LAN host) and the claiming gateway sends an UNCLAIM;
4. the other gateway's BLA is switched off and on (`batctl bl 0; batctl bl 1`): it forgets
   everything, sees the claiming gateway's next ANNOUNCE with a CRC it does not have and
   sends a REQUEST, answered with the CLAIM and an ANNOUNCE;
5. both send their first LOOPDETECT (the sixth BLA period after their start) and the
   recording stops.

The script checks that each kind of frame appeared and prints the frames."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from batmand.core.bla_frames import CLAIM, LOOPDETECT, REQUEST, TYPE_NAMES, UNCLAIM, parse_claim
from batmand.lab import Lab, load
from batmand.wire import InnerFrame, Mac
from tests.daemon.bla_lan import BlaLan, ClaimCapture
from tests.interop.matrix import converge, ok
from tests.netns import entered

OUT = Path(__file__).resolve().parents[1] / "data" / "bla-kernel-2022.3.pcap"
GATEWAYS = ["k1", "k2"]
ROAMER = Mac("02:00:00:00:03:0c")  # the client that moves from behind n3 into the LAN
NOWHERE = Mac("02:00:00:00:00:99")  # a unicast destination nobody has: the bridges flood it
ETH_P_LOCAL = b"\x88\xb5"  # IEEE 802 local experimental (a host with bridge-nf-call-iptables
# drops bridged IPv4 that is no IPv4)


def say(t0: float, message: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f} s] {message}", flush=True)


def kinds(capture: ClaimCapture) -> list[tuple[str, int]]:
    return [(g, parse_claim(InnerFrame.decode(raw)).kind) for _, g, raw in list(capture.frames)]


def wait_frame(capture: ClaimCapture, gateway: str, kind: int, timeout: float, after: int = 0) -> None:
    deadline = time.monotonic() + timeout
    while (gateway, kind) not in kinds(capture)[after:]:
        if time.monotonic() > deadline:
            raise SystemExit(f"no {TYPE_NAMES[kind]} from {gateway} within {timeout} s")
        time.sleep(0.2)


def send_raw(ns: str, ifname: str, dst: Mac, src: Mac) -> None:
    """One frame of ours, any source MAC, straight onto an interface."""
    with entered(ns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    with sock:
        sock.bind((ifname, 0))
        sock.send(bytes(dst) + bytes(src) + ETH_P_LOCAL + b"BLA-RECORD".ljust(46, b"\0"))


def claim_roamer(lan: BlaLan, timeout: float = 15) -> str:
    """ROAMER (behind n3's host) sends to the LAN host until the gateways agree on its claim."""
    deadline = time.monotonic() + timeout
    while True:
        send_raw(lan.lab.ns("n3"), "bat0", Mac(lan.host_mac), ROAMER)
        time.sleep(0.5)
        owner = lan.claimed_by(str(ROAMER))
        if owner is not None:
            return owner
        if time.monotonic() > deadline:
            raise SystemExit(f"no agreed claim for {ROAMER}")


def record(out: Path) -> int:
    t0 = time.monotonic()
    lab = Lab(load("bla-kernels"), f"blarec{os.getpid() % 100000}")
    with lab:
        lan = BlaLan(lab, GATEWAYS)
        lan.build()
        sniffer, capture = lan.sniff(), ClaimCapture(lan.lan, GATEWAYS)
        try:
            client = Mac(lab.mesh_mac("n3"))
            say(t0, f"booted: k1 {lan.orig['k1']}, k2 {lan.orig['k2']}, n3's host {client}, "
                    f"the LAN host {lan.host_mac}")
            converge(lab, timeout=60)
            _, passed = lan.hold(sniffer, "n3")
            say(t0, f"1. first broadcast; the hold ended after {passed}")
            owner = lan.claim("n3")
            say(t0, f"2. n3's host claimed by {owner}")
            roamer_owner = claim_roamer(lan)
            time.sleep(0.5)  # past the 100 ms in which a claim counts as a race, not as roaming
            mark = len(capture.frames)
            send_raw(lan.host, "eth0", NOWHERE, ROAMER)
            wait_frame(capture, roamer_owner, UNCLAIM, 5, mark)
            say(t0, f"3. {ROAMER} claimed by {roamer_owner}, roamed into the LAN, unclaimed")
            owner = lan.claimed_by(str(client))
            assert owner is not None, "the gateways no longer agree on n3's host's claim"
            other = next(g for g in GATEWAYS if g != owner)
            mark = len(capture.frames)
            ok(lab.exec(other, ["batctl", "bl", "0"]))
            ok(lab.exec(other, ["batctl", "bl", "1"]))
            wait_frame(capture, other, REQUEST, 15, mark)
            wait_frame(capture, owner, CLAIM, 5, mark)
            say(t0, f"4. {other}'s BLA off and on: it sent a REQUEST, {owner} answered")
            for g in GATEWAYS:
                wait_frame(capture, g, LOOPDETECT, 90)
            time.sleep(0.5)
            say(t0, "5. both sent a LOOPDETECT")
        finally:
            sniffer.stop()
            capture.stop()
        for where in ("k1", "k2"):
            dmesg = lab.exec(where, ["dmesg"]).stdout
            if "Possible loop" in dmesg:
                raise SystemExit(f"{where} reported a loop:\n{dmesg[-2000:]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    count = capture.write(str(out))
    start = capture.frames[0][0]
    for t, g, raw in capture.frames:
        f = parse_claim(InnerFrame.decode(raw))
        print(f"{t - start:7.3f} {g} {TYPE_NAMES[f.kind]:10} dst {f.eth_dst} src {f.eth_src} "
              f"sender {f.sender_hw} group {f.group:#06x}")
    say(t0, f"{count} claim frames written to {out}")
    return count


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
