"""OGMv2 frames against the reference decodes (`*.pcapng.ogm2.txt`, written from the raw
bytes by the capture kit's own decoder), because tshark 4.0 cannot decode OGMv2."""

import re

import pytest

from batmand.wire import McastTvlv, Ogm2, TtTvlv, tvlv_type, tvlv_version
from tests.conftest import PCAP_DIR
from tests.wire.captures import decoded

FILES = ["batman_v-2node-boot.pcapng", "batman_v-3node-line-multihop-ping.pcapng"]
_PAIRS = re.compile(r"(\w+)=(\S+)")


def _reference(name):
    """{frame number: [lines of key=value dicts, in order]}"""
    out, current = {}, None
    for line in (PCAP_DIR / (name + ".ogm2.txt")).read_text().splitlines():
        match = re.match(r"Frame (\d+):", line)
        if match:
            current = out.setdefault(int(match.group(1)), [])
        elif current is not None and line.strip() and not line.startswith("#"):
            tvlv = re.search(r"\(type (\d+), version (\d+), length (\d+)\)", line)
            fields = dict(zip(("type", "version", "len"), tvlv.groups())) if tvlv else dict(_PAIRS.findall(line))
            current.append((re.split(r"[ =]", line.strip())[0], fields))
    return out


def _throughput(value: int) -> str:
    return "0xffffffff" if value == 0xFFFFFFFF else str(value)  # the reference prints MAX in hex


def _ours(packet: Ogm2):
    yield "OGM2", {"packet_type": str(packet.packet_type), "version": str(packet.version), "ttl": str(packet.ttl),
                   "flags": f"0x{packet.flags:02x}", "seqno": str(packet.seqno), "orig": str(packet.orig),
                   "tvlv_len": str(packet.tvlv_len), "throughput": _throughput(packet.throughput)}
    for tvlv in packet.tvlvs:
        yield "TVLV", {"type": str(tvlv_type(tvlv)), "version": str(tvlv_version(tvlv)),
                       "len": str(len(tvlv.encode_value()))}
        if isinstance(tvlv, TtTvlv):
            yield "flags", {"flags": f"0x{tvlv.flags:02x}", "ttvn": str(tvlv.ttvn), "num_vlan": str(tvlv.num_vlan)}
            for vlan in tvlv.vlans:
                yield "vlan", {"vid": f"0x{vlan.vid:04x}", "crc": f"0x{vlan.crc:08x}"}
            for change in tvlv.changes:
                yield "change", {"flags": f"0x{change.flags:02x}", "addr": str(change.addr), "vid": f"0x{change.vid:04x}"}
        elif isinstance(tvlv, McastTvlv):
            yield "flags", {"flags": f"0x{tvlv.flags:02x}", "reserved": tvlv.reserved.hex()}
        else:
            assert tvlv_type(tvlv) == 2  # DAT: nothing but its header


@pytest.mark.parametrize("name", FILES)
def test_ogm2_fields_match_the_reference_decode(name):
    reference = _reference(name)
    ours = {cf.number: [item for p in frame.packets for item in _ours(p)]
            for cf, frame in decoded(name) if isinstance(frame.packet, Ogm2)}
    assert set(ours) == set(reference) and len(ours) > 30
    for number, expected in reference.items():
        got = ours[number]
        assert [kind for kind, _ in got] == [kind for kind, _ in expected], number
        for (_, mine), (_, theirs) in zip(got, expected):
            assert {k: v for k, v in theirs.items() if k in mine} == mine, number
