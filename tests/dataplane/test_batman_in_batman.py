"""Batman-in-batman from the mesh is dropped, as the kernel drops it (batadv_interface_rx:
"drop batman-in-batman packets to prevent loops"), also behind a VLAN tag, on the fast path
(workers, inline) as on the core's: a UNICAST frame for b's host whose inner frame is a
batman-adv frame never reaches b's bat0."""

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
