"""batmanctl dc: batctl's dat_cache lines, checked against what the kernel node's batctl
printed in the DAT capture (shared/reference/pcaps/batman_iv-2node-dat-4addr.commands.txt)."""

from __future__ import annotations

from batmand.cli import tables
from tests.conftest import PCAP_DIR


def test_dc_lines_are_the_kernels():
    kernel = (PCAP_DIR / "batman_iv-2node-dat-4addr.commands.txt").read_text().splitlines()
    assert tables.dat_cache_title("bat0") in kernel and tables.DAT_CACHE_HEADER in kernel
    rows = [{"last_seen_msecs": 1400, "dat_cache_ip4address": "10.254.0.12", "dat_cache_hwaddress": "02:00:00:00:02:00",
             "dat_cache_vid": -1},
            {"last_seen_msecs": 6999, "dat_cache_ip4address": "10.254.0.2", "dat_cache_hwaddress": "02:00:00:00:02:00",
             "dat_cache_vid": -1}]
    assert all(tables.dat_cache_line(r) in kernel for r in rows)
    tagged = dict(rows[0], dat_cache_vid=5, last_seen_msecs=61_000)
    assert tables.dat_cache_line(tagged) == " *     10.254.0.12 02:00:00:00:02:00    5      1:01"
    assert tables.dat_cache_line(rows[0], {"02:00:00:00:02:00": "node-b"}) == \
        " *     10.254.0.12            node-b   -1      0:01"
