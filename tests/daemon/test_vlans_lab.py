"""VLANs in real namespaces: a host behind bat0 that sends on a hundred VLANs the node does
not have is refused (counted, a rate-limited message) and the node stays in the mesh with
OGMs of at most 512 bytes; a configured VLAN carries its clients to the peer, and a reload
that drops it stops announcing bat0 there."""

import contextlib
import signal
import socket
import time

from batmand.wire import IvOgm, decode_frame
from tests.daemon.daemons import answers, ctl_json, link_mac, linked_namespaces, start, stop
from tests.daemon.labs import wait_for
from tests.netns import entered, ip

ETH_P_BATMAN = 0x4305


def _tagged(src: bytes, vid: int) -> bytes:
    return b"\xff" * 6 + src + b"\x81\x00" + vid.to_bytes(2, "big") + b"\x08\x06" + bytes(28)


def _host_sends(ns: str, frames: list[bytes]) -> None:
    """Frames from the host into bat0 (a packet socket on the TAP: batmand reads them)."""
    with entered(ns):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        sock.bind(("bat0", 0))
        for frame in frames:
            sock.send(frame)


@contextlib.contextmanager
def _pair(tmp_path, config: str):
    """a (with `config`) and b on one veth; yields (a, b, processes) once b hears a."""
    (tmp_path / "a.toml").write_text(config)
    (tmp_path / "b.toml").write_text("")
    procs = []
    with linked_namespaces() as (a, b):
        try:
            for n, name in ((a, "a"), (b, "b")):
                procs.append(start(n, ["-i", "eth0", "--config", str(tmp_path / f"{name}.toml"), "--state-dir", "",
                                       "--set", "orig_interval_ms=200", "--set", "bridge_loop_avoidance=false"],
                                      tmp_path / f"{name}.log"))  # no LAN: BLA's start-up hold would only wait
            for n in (a, b):
                wait_for(lambda: answers(n), timeout=20)
                ip("link", "set", "bat0", "up", netns=n)
            wait_for(lambda: any(r["orig_address"] == link_mac(a, "eth0") for r in ctl_json(b, "o")), timeout=20)
            yield a, b, procs
        finally:
            for proc in procs:
                stop(proc)


def test_a_host_on_a_hundred_vlans_cannot_take_the_node_out_of_the_mesh(tmp_path):
    with _pair(tmp_path, "") as (a, b, procs):
        with entered(b):
            capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_BATMAN))
        capture.bind(("eth0", ETH_P_BATMAN))
        capture.settimeout(0.2)
        _host_sends(a, [_tagged(bytes([2, 0xcc, 0, 0, 0, vid]), vid) for vid in range(1, 101)])
        deadline, sizes = time.monotonic() + 4, []
        orig_a = link_mac(a, "eth0")
        while time.monotonic() < deadline:
            try:
                frame = capture.recv(65535)
            except socket.timeout:
                continue
            for packet in decode_frame(frame).packets:
                if isinstance(packet, IvOgm) and str(packet.orig) == orig_a:
                    sizes.append(24 + packet.tvlv_len)
        capture.close()
        assert sizes and max(sizes) <= 512, sizes
        assert {r["tt_vid"] for r in ctl_json(a, "tl")} == {-1}
        assert ctl_json(a, "s")["drop_tt_local_unknown_vlan"] >= 100
        row = next(r for r in ctl_json(b, "o") if r["orig_address"] == orig_a)
        assert row["last_seen_msecs"] < 1000  # still heard: the node is in the mesh
        assert all(p.poll() is None for p in procs)
    log = (tmp_path / "a.log").read_text()
    assert 1 <= log.count("to non-existent VLAN") <= 10  # rate-limited, as the kernel's message


def test_a_configured_vlan_carries_clients_and_a_reload_removes_it(tmp_path):
    with _pair(tmp_path, "vlans = [5]\n") as (a, b, procs):
        client = bytes([2, 0xcc, 0, 0, 0, 0x55])
        _host_sends(a, [_tagged(client, 5)])
        bat0_a = link_mac(a, "bat0")

        def announced(mac: str) -> set:
            return {r["tt_vid"] for r in ctl_json(b, "tg") if r["tt_address"] == mac}

        wait_for(lambda: 5 in announced("02:cc:00:00:00:55") and 5 in announced(bat0_a), timeout=10)
        (tmp_path / "a.toml").write_text("vlans = []\n")
        procs[0].send_signal(signal.SIGHUP)
        wait_for(lambda: 5 not in announced(bat0_a), timeout=10)
        _host_sends(a, [_tagged(bytes([2, 0xcc, 0, 0, 0, 0x56]), 5)])  # no new client there
        time.sleep(1)
        assert 5 not in announced("02:cc:00:00:00:56")
        assert 5 in announced("02:cc:00:00:00:55")  # until it times out, as in the kernel
