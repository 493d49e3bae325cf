"""Frames that used to kill data-plane workers, sent to a real daemon with two workers: a
checksum-partial UNICAST frame whose checksum starts inside the batman-adv header (any VM
or container on the host can send one over a veth), and frames that arrive while bat0 is
down (every TAP write fails with EIO). Each is dropped and counted by reason; no worker
restarts; traffic goes on afterwards."""

from __future__ import annotations

import json
import sys
import time

from batmand.dataplane.offload import VIRTIO_NET_HDR_F_NEEDS_CSUM, pack_vnet
from tests.daemon.labs import stats, tt_synced, wait_for
from tests.dataplane.inject import dp, mac, pair_lab, send_frames, unicast

BAD_FRAMES = 50


def _ready(lab) -> None:
    """b reachable from a (ping), and a holds b's TT (its frames carry b's current ttvn)."""
    wait_for(lambda: lab.exec("a", ["ping", "-c", "1", "-W", "1", lab.address("b")]).returncode == 0, timeout=30)
    wait_for(lambda: tt_synced(lab, "a", "b"), timeout=30)


def _ttvn_of(lab, node: str, owner: str) -> int:
    """owner's TT version as `node` knows it."""
    rows = json.loads(lab.batmanctl(node, "tg", "--json", check=True).stdout)
    return next(r["tt_last_ttvn"] for r in rows if r["orig_address"] == lab.originator(owner))


def _workers(lab, node: str) -> list[tuple[int, int]]:
    return [(w["pid"], w["restarts"]) for w in dp(lab, node)["workers"]]


def _ping_ok(lab, src: str, dst: str) -> bool:
    return lab.exec(src, ["ping", "-c", "3", "-i", "0.2", "-W", "2", lab.address(dst)]).returncode == 0


def test_partial_checksum_inside_the_batman_header():
    """UNICAST frames for b's host whose virtio header says: checksum from byte 20 (inside
    the 24-byte batman-adv header). b's workers drop and count them (drop_bad_csum); no
    worker restarts; ping goes on."""
    with pair_lab(workers_b=2) as lab:
        lab.start()
        _ready(lab)
        workers = _workers(lab, "b")
        dst, src, orig = mac(lab.originator("b")), mac(lab.originator("a")), mac(lab.originator("b"))
        inner = b"\xff" * 6 + mac("02:00:00:00:0a:11") + b"\x08\x00" + bytes(60)
        frame = unicast(dst, src, orig, inner, ttvn=_ttvn_of(lab, "a", "b"))
        vnet = pack_vnet(VIRTIO_NET_HDR_F_NEEDS_CSUM, 0, 0, 0, 20, 0)
        send_frames(lab.ns("a"), "e-b", [vnet + frame] * BAD_FRAMES, vnet_hdr=True)
        # the same frame with a sane checksum start (in the inner IP header) is delivered
        send_frames(lab.ns("a"), "e-b", [pack_vnet(VIRTIO_NET_HDR_F_NEEDS_CSUM, 0, 0, 0, 24 + 14, 10) + frame],
                    vnet_hdr=True)
        counted, _ = wait_for(lambda: stats(lab, "b").get("drop_bad_csum", 0) >= BAD_FRAMES, timeout=10)
        time.sleep(1.5)  # a restarting worker would show by now
        after = _workers(lab, "b")
        ping = _ping_ok(lab, "a", "b")
        final = stats(lab, "b")
        log = lab.log_path("b").read_text(errors="replace")
    assert after == workers, f"workers (pid, restarts) before {workers}, after {after}"
    assert final["drop_bad_csum"] == BAD_FRAMES
    assert final.get("internal_error", 0) == 0
    assert "exited with" not in log and "Traceback" not in log, log[-3000:]
    assert ping, "ping a -> b failed after the bad frames"


def test_bat0_down_while_frames_arrive():
    """b's bat0 goes down while a keeps sending to b (unicast through b's workers,
    broadcasts through b's control process): every TAP write fails with EIO and is
    counted (drop_tap_write_eio); no worker restarts and the control process keeps
    handling frames; once bat0 is up again, ping works."""
    with pair_lab(workers_b=2) as lab:
        lab.start()
        _ready(lab)
        b_ip, b_mac = lab.address("b"), lab.mesh_mac("b")
        lab.exec("a", ["ip", "neigh", "replace", b_ip, "lladdr", b_mac, "dev", "bat0", "nud", "permanent"], check=True)
        workers = _workers(lab, "b")
        before = stats(lab, "b")
        lab.exec("b", ["ip", "link", "set", "bat0", "down"], check=True)
        udp = ("import socket, sys, time\n"
               "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
               "for i in range(3000):\n"
               "    s.sendto(bytes(200), (sys.argv[1], 9000 + i % 16))\n"
               "    time.sleep(0.0003)\n")
        lab.exec("a", [sys.executable, "-c", udp, b_ip], check=True, timeout=60)
        broadcast = b"\xff" * 6 + mac(lab.mesh_mac("a")) + b"\x88\xb5" + bytes(50)
        send_frames(lab.ns("a"), "bat0", [broadcast] * 20)
        time.sleep(1.5)  # the workers report twice a second; a restarting worker would show by now
        down = stats(lab, "b")
        after = _workers(lab, "b")
        lab.exec("b", ["ip", "link", "set", "bat0", "up"], check=True)
        ping = wait_for(lambda: _ping_ok(lab, "a", "b"), timeout=20)
        log = lab.log_path("b").read_text(errors="replace")
    dropped = down.get("drop_tap_write_eio", 0) - before.get("drop_tap_write_eio", 0)
    print(f"while bat0 was down: {dropped} frames dropped as drop_tap_write_eio; workers {workers} -> {after}")
    assert after == workers, f"workers (pid, restarts) before {workers}, after {after}"
    assert dropped >= 3000 + 20 - 100, f"drop_tap_write_eio moved by {dropped} only"
    assert "Traceback" not in log and "Exception in callback" not in log, log[-3000:]
    assert ping
