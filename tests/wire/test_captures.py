"""Every batman-adv frame the kernel sent in the reference captures decodes, and encodes
back to exactly the same bytes."""

import collections

import pytest

from batmand.wire import (Bcast, Elp, IcmpPacket, IvOgm, Ogm2, RoamTvlv, TtDataFlags, TtTvlv, Unicast,
                          Unicast4Addr, UnicastFrag, UnicastTvlv, decode_frame, GatewayTvlv, DatTvlv, McastTvlv)
from batmand.wire.errors import NotBatmanError
from tests.wire.captures import decoded, pcap_names, raw_frames


@pytest.mark.parametrize("name", pcap_names())
def test_every_frame_round_trips_byte_for_byte(name):
    batman = 0
    for cf in raw_frames(name):
        try:
            frame = decode_frame(cf.data)
        except NotBatmanError:
            continue
        batman += 1
        assert frame.encode() == cf.data, f"{name} frame {cf.number}"
        # a memoryview decodes the same way
        assert decode_frame(memoryview(cf.data)) == frame
    assert batman > 10


def _types(name):
    counts = collections.Counter()
    for _, frame in decoded(name):
        for packet in frame.packets:
            counts[type(packet)] += 1
    return counts


def test_the_captures_cover_what_the_kernel_sends():
    total = collections.Counter()
    for name in pcap_names():
        total.update(_types(name))
    for cls in (IvOgm, Ogm2, Elp, IcmpPacket, Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, Bcast):
        assert total[cls] > 0, cls.__name__


def test_aggregated_ogms_are_split_into_their_elements():
    frames = decoded("batman_iv-3node-line-aggregation.pcapng")
    sizes = collections.Counter(len(f.packets) for _, f in frames if isinstance(f.packet, IvOgm))
    assert sizes[2] + sizes[3] >= 74 - 5  # README: 74 frames carry 2 or 3 OGMs
    assert sizes[3] > 0
    for cf, frame in frames:
        if len(frame.packets) > 1:
            # the elements fill the frame: each element's size is 24 + tvlv_len
            assert sum(24 + p.tvlv_len for p in frame.packets) + len(frame.padding) == len(cf.data) - 14


def test_elp_keeps_the_kernel_tvlv_padding():
    for cf, frame in decoded("batman_v-2node-boot.pcapng"):
        if isinstance(frame.packet, Elp):
            assert len(cf.data) == 34 and frame.padding == bytes(4)
            assert frame.packet.elp_interval == 500


def test_fragments_number_tail_first():
    frags = [f.packet for _, f in decoded("batman_iv-2node-fragmentation.pcapng") if isinstance(f.packet, UnicastFrag)]
    assert len(frags) == 8
    first, second = frags[0], frags[1]
    assert (first.no, second.no) == (0, 1) and first.seqno == second.seqno
    assert first.total_size == 1452 == len(first.data) + len(second.data)
    # the highest-numbered fragment starts with the original UNICAST header
    assert second.data[0] == 0x40 and second.data[1] == 15


def test_tvlvs_seen_in_the_captures_are_typed():
    seen = collections.Counter()
    for name in pcap_names():
        for _, frame in decoded(name):
            for packet in frame.packets:
                for tvlv in getattr(packet, "tvlvs", ()):
                    seen[type(tvlv)] += 1
    for cls in (TtTvlv, DatTvlv, McastTvlv, GatewayTvlv, RoamTvlv):
        assert seen[cls] > 0, cls.__name__


def test_gateway_tvlv_values():
    gws = {(t.bandwidth_down, t.bandwidth_up) for _, f in decoded("batman_iv-2node-gateway-dhcp.pcapng")
           for p in f.packets for t in getattr(p, "tvlvs", ()) if isinstance(t, GatewayTvlv)}
    assert gws == {(500, 100)}  # `batctl gw server 50mbit/10mbit`, units of 100 kbit/s


def test_vlan_tt_uses_the_tag_bit():
    vids = {v.vid for _, f in decoded("batman_iv-2node-vlan.pcapng") for p in f.packets
            for t in getattr(p, "tvlvs", ()) if isinstance(t, TtTvlv) for v in t.vlans}
    assert {0, 0x8000, 0x800A, 0x8014} <= vids


def test_roaming_advertisement():
    roams = [t for _, f in decoded("batman_iv-2node-roaming.pcapng") for p in f.packets
             for t in getattr(p, "tvlvs", ()) if isinstance(t, RoamTvlv)]
    assert roams and all(str(r.client) == "02:00:00:cc:00:01" for r in roams)


def test_tt_request_flags():
    requests = [t for _, f in decoded("batman_iv-2node-tt-request-response.pcapng") if isinstance(f.packet, UnicastTvlv)
                for t in f.packet.tvlvs if isinstance(t, TtTvlv) and t.flags & TtDataFlags.REQUEST]
    assert any(t.flags == 0x12 for t in requests) and any(t.flags == 0x02 for t in requests)
