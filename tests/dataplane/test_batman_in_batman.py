"""Batman-in-batman is dropped, as the kernel drops it, also behind a VLAN tag, on the fast
path (workers, inline) as on the core's: from the mesh (batadv_interface_rx: "drop
batman-in-batman packets to prevent loops"), a UNICAST frame for b's host whose inner
frame is a batman-adv frame never reaches b's bat0; from the host (batadv_interface_tx),
a batman-adv frame sent into bat0 never enters the mesh, even right after an ordinary
frame with the same addresses and tag took the fast path."""

from __future__ import annotations

import json

import pytest

from tests.daemon.labs import stats, tt_synced, wait_for
from tests.dataplane.inject import Sniffer, mac, pair_lab, send_frames, unicast

COUNT = 20


@pytest.mark.parametrize("workers", [0, 2])
def test_batman_in_batman_is_never_delivered(workers):
    with pair_lab(workers_b=workers) as lab:
        lab.start()
        wait_for(lambda: lab.exec("a", ["ping", "-c", "1", "-W", "1", lab.address("b")]).returncode == 0, timeout=30)
        wait_for(lambda: tt_synced(lab, "a", "b"), timeout=30)
        rows = json.loads(lab.batmanctl("a", "tg", "--json", check=True).stdout)
        ttvn = next(r["tt_last_ttvn"] for r in rows if r["orig_address"] == lab.originator("b"))
        dst, src = mac(lab.originator("b")), mac(lab.originator("a"))
        to_host = mac(lab.mesh_mac("b"))  # b's own bat0: the engine delivers to it
        sender = mac("02:00:00:00:0b:0b")
        plain = to_host + sender + b"\x43\x05" + bytes(60)
        tagged = to_host + sender + b"\x81\x00\x00\x00" + b"\x43\x05" + bytes(60)  # priority tag, VID 0
        marker = to_host + sender + b"\x08\x00" + bytes(60)
        sniffer = Sniffer(lab.ns("b"), "bat0")
        try:
            before = stats(lab, "b").get("drop_batman_in_batman", 0)
            send_frames(lab.ns("a"), "e-b", [unicast(dst, src, dst, f, ttvn) for f in [plain, tagged] * (COUNT // 2)])
            send_frames(lab.ns("a"), "e-b", [unicast(dst, src, dst, marker, ttvn)])
            wait_for(lambda: stats(lab, "b").get("drop_batman_in_batman", 0) - before >= COUNT, timeout=10)
            seen: list[bytes] = []

            def marker_arrived() -> bool:  # the harmless frame sent after them
                seen.extend(f for f in sniffer.take() if f[6:12] == sender)
                return any(f[12:14] == b"\x08\x00" for f in seen)

            wait_for(marker_arrived, timeout=10)
            assert all(b"\x43\x05" not in (f[12:14], f[16:18]) for f in seen), seen
        finally:
            sniffer.close()


COUNT_FROM_HOST = 10


def test_batman_in_batman_from_the_host_never_enters_the_mesh():
    """b's host sends priority-tagged (VID 0) frames to a's bat0 MAC, each IPv4 one
    followed by a batman-adv one with the same addresses and tag: the IPv4 ones reach a
    (b's engine caches their route), the batman-adv ones are dropped at b
    (drop_tx_batman_in_batman); a sees none of them. Inline engine: one TAP queue, so the
    frames stay in order and meet the cached route."""
    with pair_lab(workers_b=0) as lab:
        lab.start()
        wait_for(lambda: lab.exec("b", ["ping", "-c", "1", "-W", "1", lab.address("a")]).returncode == 0, timeout=30)
        wait_for(lambda: tt_synced(lab, "b", "a"), timeout=30)
        to_a, src = mac(lab.mesh_mac("a")), mac(lab.mesh_mac("b"))  # b's bat0 MAC: b's own client
        tag = b"\x81\x00\x00\x00"
        ipv4 = [to_a + src + tag + b"\x08\x00" + bytes([0x45]) + bytes(58) + bytes([i]) for i in range(COUNT_FROM_HOST)]
        inner_batman = to_a + src + tag + b"\x43\x05" + bytes(60)
        sniffer = Sniffer(lab.ns("a"), "e-b")
        try:
            before = stats(lab, "b").get("drop_tx_batman_in_batman", 0)
            send_frames(lab.ns("b"), "bat0", [f for frame in ipv4 for f in (frame, inner_batman)])
            wait_for(lambda: stats(lab, "b").get("drop_tx_batman_in_batman", 0) - before >= COUNT_FROM_HOST,
                     timeout=10)
            seen: list[bytes] = []

            def last_arrived() -> bool:
                seen.extend(f[24:] for f in sniffer.unicast([to_a]))
                return ipv4[-1] in seen

            wait_for(last_arrived, timeout=10)
        finally:
            sniffer.close()
    assert inner_batman not in seen, "a batman-adv frame from b's host entered the mesh"
    assert set(seen) >= set(ipv4)
