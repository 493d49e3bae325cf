"""A hard interface set down and up again (`ip link set X down/up`): the data plane's
rings keep working. When an interface goes down, the kernel sets ENETDOWN on every packet
socket bound to it and poll reports the error until it is read; it re-attaches the
sockets when the interface comes back up. A receive ring's reader must read the error or
spin; a transmit ring must not stay stuck on the frames queued while the interface was
down."""

from __future__ import annotations

import os
import select
import subprocess
import time

import pytest

from batmand.dataplane import rings
from batmand.dataplane.engine import Engine, Port
from tests.daemon.labs import wait_for
from tests.dataplane.inject import cpu_seconds, dp, mac, pair_lab, send_frames, unicast
from tests.netns import entered, namespace

FRAMES = 20
UNKNOWN_ORIG = mac("02:5f:00:00:00:01")  # nobody's originator: the frames take the slow path
IDLE_SECONDS = 3.0
IDLE_CPU_MAX = 0.6  # CPU seconds in IDLE_SECONDS: a spinning reader takes about all of them


def _frames(lab) -> list[bytes]:
    dst, src = mac(lab.originator("b")), mac(lab.originator("a"))
    inner = bytes(6) + mac("02:00:00:00:00:11") + b"\x08\x00" + bytes(46)
    return [unicast(dst, src, UNKNOWN_ORIG, inner[:12] + bytes([i]) + inner[13:]) for i in range(FRAMES)]


def _read_by_rings(status: dict) -> int:
    """UNICAST frames the data plane took from b's rings (these go to the slow path)."""
    return status["counters"].get("slow_mesh", 0)


@pytest.mark.parametrize("workers", [2, 0])
def test_rings_survive_link_down_and_up(workers):
    """b's interface toward a goes down for a few seconds and comes back: while down, the
    data plane (b's workers, or with --workers 0 the daemon itself) stays idle; once up,
    its rings receive again; no worker restarted. (Whether the rings see the error or the
    daemon closes them first when it learns that the interface is down is the daemon's
    business; test_ring_error_is_read_and_counted checks the rings alone.)"""
    with pair_lab(workers_b=workers) as lab:
        lab.start()
        frames = _frames(lab)
        before = dp(lab, "b")
        send_frames(lab.ns("a"), "e-b", frames)
        wait_for(lambda: _read_by_rings(dp(lab, "b")) >= _read_by_rings(before) + FRAMES, timeout=5)
        pids = [w["pid"] for w in dp(lab, "b")["workers"]] or [lab.pids["b"]]

        lab.netns_exec("b", ["ip", "link", "set", "e-a", "down"], check=True)
        time.sleep(0.5)
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(IDLE_SECONDS)
        cpu_down = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        down = dp(lab, "b")
        lab.netns_exec("b", ["ip", "link", "set", "e-a", "up"], check=True)
        time.sleep(0.5)

        send_frames(lab.ns("a"), "e-b", frames)
        after, _ = wait_for(lambda: (lambda s: s if _read_by_rings(s) >= _read_by_rings(down) + FRAMES else None)(
            dp(lab, "b")), timeout=5)
        running = lab.daemon_running("b")

    print(f"workers={workers}: CPU while down {cpu_down:.2f} s in {IDLE_SECONDS:g} s; "
          f"ring errors {({k: v for k, v in down['counters'].items() if 'ring_error' in k})}")
    assert running
    assert cpu_down < IDLE_CPU_MAX, f"the data plane used {cpu_down:.2f} s CPU in {IDLE_SECONDS:g} s while e-a was down"
    if workers:
        assert [w["pid"] for w in after["workers"]] == pids and all(w["restarts"] == 0 for w in after["workers"])


def _veth(ns_a: str, ns_b: str) -> None:
    """va in ns_a, up; its peer vb (02:00:00:00:0b:0b) in ns_b, up."""
    subprocess.run(["ip", "-n", ns_a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", ns_b],
                   check=True)
    subprocess.run(["ip", "-n", ns_a, "link", "set", "va", "up"], check=True)
    subprocess.run(["ip", "-n", ns_b, "link", "set", "vb", "address", "02:00:00:00:0b:0b", "up"], check=True)


def test_ring_error_is_read_and_counted():
    """A receive ring on a veth set down: epoll reports EPOLLERR; the engine reads and
    counts the error (rx_ring_error_enetdown), after which epoll is quiet; set up again,
    the same ring receives."""
    with namespace() as ns_a, namespace() as ns_b:
        _veth(ns_a, ns_b)
        with entered(ns_b):
            port = Port("vb", mac("02:00:00:00:0b:0b"), 1500, rings.RxRing("vb", frames=256, vnet_hdr=True),
                        rings.TxRing("vb"))
        quiet_tap, w = os.pipe()
        engine = Engine(quiet_tap, lambda frame: None, lambda ifname, frame: None)
        engine.add_port(port)
        poll = select.epoll()
        poll.register(port.rx.fileno(), select.EPOLLIN)
        try:
            subprocess.run(["ip", "-n", ns_b, "link", "set", "vb", "down"], check=True)
            events_down = poll.poll(1.0)
            read = engine.port_error(port)
            events_after = poll.poll(0.3)
            subprocess.run(["ip", "-n", ns_b, "link", "set", "vb", "up"], check=True)
            time.sleep(0.3)
            frame = mac("02:00:00:00:0b:0b") + mac("02:00:00:00:0a:0a") + b"\x43\x05" + bytes(60)
            send_frames(ns_a, "va", [frame] * 3)
            time.sleep(0.1)
            received = len(port.rx.frames(10))
            port.rx.release()
        finally:
            poll.close()
            port.rx.close()
            port.tx.close()
            os.close(quiet_tap)
            os.close(w)
    assert events_down and events_down[0][1] & select.EPOLLERR, events_down
    assert read and engine.counters["rx_ring_error_enetdown"] == 1
    assert events_after == [], "epoll still reports the ring after its error was read"
    assert received == 3


def test_tx_ring_sends_again_after_link_down_and_up():
    """Frames queued while the interface was down fill the transmit ring (the sends fail
    with ENETDOWN, counted); once it is up again, the ring sends (its old frames and new
    ones) instead of refusing every frame as full."""
    with namespace() as ns_a, namespace() as ns_b:
        _veth(ns_a, ns_b)
        with entered(ns_a):
            tx = rings.TxRing("va", frames=64)
        with entered(ns_b):
            rx = rings.RxRing("vb", frames=256)
        try:
            frame = mac("02:00:00:00:0b:0b") + mac("02:00:00:00:0a:0a") + b"\x43\x05" + bytes(60)
            subprocess.run(["ip", "-n", ns_a, "link", "set", "va", "down"], check=True)
            queued = 0
            for _ in range(tx.frame_nr + 10):  # more than the ring holds
                queued += tx.put((frame,), len(frame))
                tx.flush()
            subprocess.run(["ip", "-n", ns_a, "link", "set", "va", "up"], check=True)
            time.sleep(0.2)
            sent_after = sum(tx.put((frame,), len(frame)) for _ in range(5))
            tx.flush()
            time.sleep(0.2)
            got = len(rx.frames(1000))
            rx.release()
        finally:
            tx.close()
            rx.close()
    assert queued == tx.frame_nr
    assert sent_after == 5, "the transmit ring stayed full after the interface came back"
    assert got >= 5
    assert tx.errors["enetdown"] > 0, "the failed sends were not counted"
