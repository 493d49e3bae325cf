"""The TT CRC computed over the entries a kernel node announced equals the CRC that node
put in its OGMs and TT responses."""

import collections

from batmand.wire import (IvOgm, Ogm2, TtClientFlags, TtDataFlags, TtTvlv, UnicastTvlv, crc32c_raw,
                          tt_entry_crc, tt_vlan_crc, Mac)
from tests.wire.captures import decoded


def test_raw_crc32c_vectors():
    # Linux crc32c(0, ...) - not the standard CRC-32C (0xe3069283)
    assert crc32c_raw(b"123456789") == 0x58E3FA20
    assert tt_entry_crc(Mac("02:00:00:00:00:01"), 0) == 0x29E723C0
    both = [(Mac("02:00:00:00:00:01"), 0), (Mac("02:00:00:00:00:02"), 0)]
    assert tt_vlan_crc(both, 0) == 0x1350F3F4
    # only WIFI/ISOLA take part; DEL/ROAM do not
    assert tt_entry_crc(Mac("02:00:00:00:00:01"), 0, TtClientFlags.ROAM) == 0x29E723C0
    assert tt_entry_crc(Mac("02:00:00:00:00:01"), 0, TtClientFlags.WIFI) != 0x29E723C0


def _crc_by_vid(changes):
    crcs = collections.defaultdict(int)
    for change in changes:
        crcs[change.vid] ^= tt_entry_crc(change.addr, change.vid, change.flags)
    return dict(crcs)


def _ogm_crcs(name):
    """{(orig, ttvn): {vid: crc}} from every OGM / OGMv2 TT TVLV in a capture."""
    out = {}
    for _, frame in decoded(name):
        for packet in frame.packets:
            if isinstance(packet, (IvOgm, Ogm2)):
                for tvlv in packet.tvlvs:
                    if isinstance(tvlv, TtTvlv):
                        out[(packet.orig, tvlv.ttvn)] = {v.vid: v.crc for v in tvlv.vlans}
    return out


def _full_tables(name):
    for _, frame in decoded(name):
        if isinstance(frame.packet, UnicastTvlv):
            for tvlv in frame.packet.tvlvs:
                if isinstance(tvlv, TtTvlv) and tvlv.flags & TtDataFlags.RESPONSE:
                    yield frame.packet.src, tvlv


def test_full_table_responses_match_the_ogm_crc():
    checked = 0
    for name in ("batman_iv-2node-tt-request-response.pcapng", "batman_iv-2node-vlan.pcapng",
                 "batman_v-2node-boot.pcapng"):
        ogm_crcs = _ogm_crcs(name)
        for src, tvlv in _full_tables(name):
            if not tvlv.flags & TtDataFlags.FULL_TABLE:
                continue
            computed = _crc_by_vid(tvlv.changes)
            announced = {v.vid: v.crc for v in tvlv.vlans}
            assert computed == {vid: crc for vid, crc in announced.items() if vid in computed}
            assert ogm_crcs[(src, tvlv.ttvn)] == announced
            checked += 1
    assert checked >= 4


def test_table_rebuilt_from_ogm_diffs_matches_the_ogm_crc():
    """Boot capture: ttvn 1 of each node adds its 5 clients; their CRC is in the same OGM."""
    checked = 0
    for _, frame in decoded("batman_iv-2node-boot.pcapng"):
        for packet in frame.packets:
            for tvlv in getattr(packet, "tvlvs", ()):
                if isinstance(tvlv, TtTvlv) and tvlv.ttvn == 1 and tvlv.changes:
                    assert len(tvlv.changes) == 5
                    assert _crc_by_vid(tvlv.changes) == {v.vid: v.crc for v in tvlv.vlans}
                    checked += 1
    assert checked >= 2
