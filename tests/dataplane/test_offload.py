"""TSO segmentation, GRO coalescing and checksum helpers of the data plane (batmand.dataplane.offload).

Reference packets and checksums come from scapy and from a plain word-by-word checksum
written here, so the module's integer tricks are checked against something independent."""

import ipaddress
import struct

import pytest
from hypothesis import given, settings, strategies as st
from scapy.layers.inet import IP, TCP, UDP, in4_chksum
from scapy.layers.inet6 import IPv6, IPv6ExtHdrDestOpt, in6_chksum
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw
from scapy.utils import checksum as scapy_checksum

from batmand.dataplane import offload as o
from batmand.dataplane.offload import (
    CSUM_PARTIAL, CSUM_UNKNOWN, CSUM_VALID, GSO_ECN, GSO_TCPV4, GSO_TCPV6, GSO_UDP,
    VIRTIO_NET_HDR_F_DATA_VALID as DATA_VALID, VIRTIO_NET_HDR_F_NEEDS_CSUM as NEEDS_CSUM,
    VNET_HDR_LEN, VNET_PLAIN, Coalescer, finish_checksum, ones_sum, pack_vnet, parse_tcp,
    segment, tcp_checksum_ok, unpack_vnet)

MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"
V4_SRC, V4_DST = "10.0.0.1", "10.0.0.2"
V6_SRC, V6_DST = "fd00::1", "fd00::2"
TS_OPTS = [("NOP", None), ("NOP", None), ("Timestamp", (123456, 654321))]
MSS = 1448

# --------------------------------------------------------------------------- references


def ref_sum(data: bytes, initial: int = 0) -> int:
    """Word-by-word ones'-complement sum with end-around carry (folded, not inverted)."""
    s = initial
    for i in range(0, len(data), 2):
        s += data[i] << 8 | (data[i + 1] if i + 1 < len(data) else 0)
        while s > 0xFFFF:
            s = (s & 0xFFFF) + (s >> 16)
    return s


def pseudo_sum(frame: bytes, proto: int = 6) -> int:
    """Non-inverted pseudo-header sum of an IPv4/IPv6 TCP (or UDP, proto 17) packet
    (addresses and length as scapy dissects them)."""
    p = Ether(frame)
    if IP in p:
        ip = p[IP]
        tcp_len = ip.len - ip.ihl * 4
        pseudo = struct.pack("!4s4sxBH", bytes(map(int, ip.src.split("."))),
                             bytes(map(int, ip.dst.split("."))), proto, tcp_len)
    else:
        ip6 = p[IPv6]
        tcp_len = ip6.plen
        pseudo = (ipaddress.IPv6Address(ip6.src).packed + ipaddress.IPv6Address(ip6.dst).packed
                  + struct.pack("!I3xB", tcp_len, proto))
    return ref_sum(pseudo)


def l4_offset(frame: bytes) -> int:
    l2 = 18 if frame[12:14] == b"\x81\x00" else 14
    if frame[l2 - 2:l2] == b"\x08\x00":
        return l2 + (frame[l2] & 15) * 4
    return l2 + 40


def with_pseudo_sum(frame: bytes) -> bytes:
    """The frame as the kernel hands a TSO frame over: TCP checksum = pseudo-header sum."""
    l4 = l4_offset(frame)
    b = bytearray(frame)
    b[l4 + 16:l4 + 18] = struct.pack("!H", pseudo_sum(frame))
    return bytes(b)


def scapy_l4_checksum_ok(frame: bytes) -> bool:
    """TCP checksum check via scapy's in4_chksum / in6_chksum (0 over a valid packet)."""
    p = Ether(frame)
    l4 = l4_offset(frame)
    if IP in p:
        end = 14 + p[IP].len if Dot1Q not in p else 18 + p[IP].len
        return in4_chksum(6, p[IP], frame[l4:end]) == 0
    end = l4 + p[IPv6].plen
    return in6_chksum(6, p[IPv6], frame[l4:end]) == 0


def ip_header_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 15) * 4
    return scapy_checksum(frame[14:14 + ihl]) == 0


def tcp_frame(payload: bytes = b"x" * MSS, *, seq: int = 1000, ack: int = 5000, flags: str = "A",
              v6: bool = False, ip_id: int = 100, options=TS_OPTS, sport: int = 40000,
              dport: int = 5201, src=None, dst=None, ttl: int = 64, tos: int = 0, df: bool = True,
              vlan=None, mac_dst: str = MAC_B, ip_options=None, window: int = 502) -> bytes:
    """A complete, valid Ethernet/IP/TCP frame built by scapy."""
    eth = Ether(src=MAC_A, dst=mac_dst)
    if vlan is not None:
        eth = eth / Dot1Q(vlan=vlan)
    if v6:
        l3 = IPv6(src=src or V6_SRC, dst=dst or V6_DST, hlim=ttl, tc=tos)
    else:
        l3 = IP(src=src or V4_SRC, dst=dst or V4_DST, id=ip_id, ttl=ttl, tos=tos,
                flags="DF" if df else 0, options=ip_options or [])
    tcp = TCP(sport=sport, dport=dport, seq=seq, ack=ack, flags=flags, window=window,
              options=options or [])
    return bytes(eth / l3 / tcp / Raw(payload)) if payload else bytes(eth / l3 / tcp)


def tso_frame(payload: bytes, **kw) -> bytes:
    return with_pseudo_sum(tcp_frame(payload, **kw))


def payload_of(frame: bytes) -> bytes:
    info = parse_tcp(frame, 18 if frame[12:14] == b"\x81\x00" else 14)
    return frame[info[o.P_POFF]:info[o.P_POFF] + info[o.P_PLEN]]


def big_payload(n: int) -> bytes:
    return bytes((i * 7 + i // 251) & 0xFF for i in range(n))


# --------------------------------------------------------------------------- vnet header


def test_vnet_header_layout_is_little_endian_and_ten_bytes():
    h = pack_vnet(NEEDS_CSUM, GSO_TCPV6, 0x1234, 1448, 54, 16)
    assert len(h) == VNET_HDR_LEN == 10
    assert h == bytes([1, 4, 0x34, 0x12]) + struct.pack("<HHH", 1448, 54, 16)
    assert unpack_vnet(h + b"rest") == (NEEDS_CSUM, GSO_TCPV6, 0x1234, 1448, 54, 16)
    assert VNET_PLAIN == bytes(10)
    assert (GSO_TCPV4, GSO_UDP, GSO_ECN) == (1, 3, 0x80)


# --------------------------------------------------------------------------- checksums


@given(st.binary(max_size=3000), st.integers(0, 0xFFFF))
@settings(max_examples=300)
def test_ones_sum_matches_word_loop(data, initial):
    assert ones_sum(data, initial) == ref_sum(data, initial)
    assert ones_sum(memoryview(data)) == ref_sum(data)
    assert ones_sum(bytearray(data)) == ref_sum(data)


@pytest.mark.parametrize("data, expected", [
    (b"", 0), (b"\x00\x00\x00", 0), (b"\xff\xff", 0xFFFF), (b"\xff\xff\xff\xff", 0xFFFF),
    (b"\x00\x01\xff\xfe", 0xFFFF), (b"\x80", 0x8000), (b"\x12\x34\x56", 0x1234 + 0x5600),
])
def test_ones_sum_edge_cases(data, expected):
    assert ones_sum(data) == ref_sum(data) == expected


@given(st.binary(min_size=2, max_size=2000), st.data())
@settings(max_examples=300)
def test_finish_checksum_matches_reference(data, draw):
    start = draw.draw(st.integers(0, len(data) - 2))
    offset = draw.draw(st.integers(0, len(data) - start - 2))
    frame = bytearray(data)
    expected = bytearray(data)
    c = ~ref_sum(bytes(expected[start:])) & 0xFFFF
    if c == 0 and offset == 6:
        c = 0xFFFF
    expected[start + offset:start + offset + 2] = struct.pack("!H", c)
    finish_checksum(frame, start, offset)
    assert frame == expected


def test_finish_checksum_completes_scapy_packets():
    for v6 in (False, True):
        good = tcp_frame(b"odd-length payload!", v6=v6)
        partial = bytearray(with_pseudo_sum(good))
        assert partial != bytearray(good)
        finish_checksum(partial, l4_offset(good), 16)
        assert partial == bytearray(good)


def test_finish_checksum_udp_zero_becomes_ffff():
    # data whose sum (with the field 0) is 0xFFFF -> complement 0 -> stored as 0xFFFF for UDP
    frame = bytearray(b"\xff\xff" + b"\x00" * 8)
    finish_checksum(frame, 0, 6)
    assert frame[6:8] == b"\xff\xff"
    frame = bytearray(b"\xff\xff" + b"\x00" * 18)
    finish_checksum(frame, 0, 16)
    assert frame[16:18] == b"\x00\x00"


@pytest.mark.parametrize("v6", [False, True])
def test_tcp_checksum_ok(v6):
    good = tcp_frame(b"hello world", v6=v6)
    assert tcp_checksum_ok(good, 14)
    assert tcp_checksum_ok(memoryview(good), 14)
    assert tcp_checksum_ok(good + b"\xaa" * 7, 14)   # trailing padding ignored
    for pos in (l4_offset(good) + 16, len(good) - 1, l4_offset(good) - 1):  # csum, data, address
        bad = bytearray(good)
        bad[pos] ^= 0x40
        assert not tcp_checksum_ok(bytes(bad), 14)
    assert not tcp_checksum_ok(good[:-1], 14)          # truncated
    assert not tcp_checksum_ok(good, 12)


def test_tcp_checksum_ok_udp_and_others():
    u4 = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=V4_SRC, dst=V4_DST) / UDP(sport=1, dport=2) / b"abc")
    u6 = bytes(Ether(src=MAC_A, dst=MAC_B) / IPv6(src=V6_SRC, dst=V6_DST) / UDP(sport=1, dport=2) / b"abcd")
    assert tcp_checksum_ok(u4, 14) and tcp_checksum_ok(u6, 14)
    bad = bytearray(u4)
    bad[-1] ^= 1
    assert not tcp_checksum_ok(bytes(bad), 14)
    no_csum = bytearray(u4)
    no_csum[40:42] = b"\x00\x00"
    assert tcp_checksum_ok(bytes(no_csum), 14)          # IPv4 UDP "no checksum"
    zero6 = bytearray(u6)
    zero6[60:62] = b"\x00\x00"
    assert not tcp_checksum_ok(bytes(zero6), 14)        # not allowed over IPv6
    icmp = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=V4_SRC, dst=V4_DST, proto=1)
                 / b"\x08\x00\xf7\xff\x00\x00\x00\x00")
    assert not tcp_checksum_ok(icmp, 14)


# --------------------------------------------------------------------------- parse_tcp


def test_parse_tcp_ipv4_and_ipv6():
    f4 = tcp_frame(b"abcdef", seq=7, ack=9, flags="PA")
    l3, l4, thl, poff, plen, key, seq, ack, flags, v6 = parse_tcp(f4)
    assert (l3, l4, thl, poff, plen, seq, ack, flags, v6) == (14, 34, 32, 66, 6, 7, 9, 0x18, False)
    assert key == bytes([10, 0, 0, 1, 10, 0, 0, 2]) + struct.pack("!HH", 40000, 5201)
    f6 = tcp_frame(b"abcdef", v6=True, options=None)
    l3, l4, thl, poff, plen, key, seq, ack, flags, v6 = parse_tcp(f6)
    assert (l3, l4, thl, poff, plen, v6) == (14, 54, 20, 74, 6, True)
    assert len(key) == 36 and key.endswith(struct.pack("!HH", 40000, 5201))
    assert parse_tcp(memoryview(f6)) == parse_tcp(f6)


def test_parse_tcp_padding_vlan_and_ip_options():
    short = tcp_frame(b"ab", options=None)           # 56 bytes: Ethernet pads it to 60
    assert len(short) == 56
    assert parse_tcp(short + b"\0\0\0\0")[o.P_PLEN] == 2
    tagged = tcp_frame(b"abc", vlan=7)
    assert parse_tcp(tagged) is None
    assert parse_tcp(tagged, 18)[:5] == (18, 38, 32, 70, 3)
    opts = tcp_frame(b"abc", ip_options=[b"\x01\x01\x01\x00"])   # ihl 6
    assert parse_tcp(opts)[:4] == (14, 38, 32, 70)


def test_parse_tcp_refuses_non_tcp_and_broken():
    assert parse_tcp(bytes(Ether(src=MAC_A, dst=MAC_B) / IP() / UDP() / (b"x" * 40))) is None
    assert parse_tcp(bytes(Ether(src=MAC_A, dst=MAC_B) / ARP())) is None
    assert parse_tcp(bytes(Ether(src=MAC_A, dst=MAC_B) / IP(flags="MF") / TCP() / (b"x" * 20))) is None
    assert parse_tcp(bytes(Ether(src=MAC_A, dst=MAC_B) / IP(frag=100) / TCP() / (b"x" * 20))) is None
    assert parse_tcp(bytes(Ether(src=MAC_A, dst=MAC_B) / IPv6() / IPv6ExtHdrDestOpt() / TCP() / b"x")) is None
    full = tcp_frame(b"x" * 100)
    assert parse_tcp(full[:-1]) is None                # IP length says more than there is
    bad_doff = bytearray(full)
    bad_doff[46] = 0x40                                 # data offset 4 words
    assert parse_tcp(bytes(bad_doff)) is None
    assert parse_tcp(b"") is None


# --------------------------------------------------------------------------- segment()


def expected_segments(payload, mss, *, v6, flags, seq=1000, ip_id=100, **kw):
    """What the segments must be, built independently by scapy (checksums complete)."""
    chunks = [payload[i:i + mss] for i in range(0, len(payload), mss)]
    out = []
    for i, chunk in enumerate(chunks):
        f = flags
        if i < len(chunks) - 1:
            f = f.replace("F", "").replace("P", "")
        if i > 0:
            f = f.replace("C", "")
        out.append(tcp_frame(chunk, seq=(seq + i * mss) & 0xFFFFFFFF, v6=v6, flags=f, ip_id=ip_id + i, **kw))
    return out


@pytest.mark.parametrize("v6", [False, True])
def test_segment_64k_tso_frame(v6):
    payload = big_payload(MSS * 44 + 700)
    tso = tso_frame(payload, v6=v6, flags="FPA", seq=0xFFFF0000)   # seq wraps around 2**32
    gso = GSO_TCPV6 if v6 else GSO_TCPV4
    segs = segment(tso, gso, MSS, False)
    assert len(segs) == 45
    hdr = 14 + (40 if v6 else 20) + 32
    assert [len(s) for s in segs] == [hdr + MSS] * 44 + [hdr + 700]
    assert b"".join(payload_of(s) for s in segs) == payload
    for i, s in enumerate(segs):
        info = parse_tcp(s)
        assert info[o.P_SEQ] == (0xFFFF0000 + i * MSS) & 0xFFFFFFFF
        assert info[o.P_FLAGS] == (0x19 if i == 44 else 0x10)
        assert scapy_l4_checksum_ok(s) and tcp_checksum_ok(s, 14)
        if not v6:
            assert struct.unpack_from("!H", s, 18)[0] == 100 + i
            assert ip_header_ok(s)
    assert segs == expected_segments(payload, MSS, v6=v6, flags="FPA", seq=0xFFFF0000)
    # offloaded: pseudo-header sums, and finishing them gives the same bytes
    offl = segment(tso, gso, MSS, True)
    l4 = 54 if v6 else 34
    for s_off, s_full in zip(offl, segs):
        assert struct.unpack_from("!H", s_off, l4 + 16)[0] == pseudo_sum(s_full)
        b = bytearray(s_off)
        finish_checksum(b, l4, 16)
        assert bytes(b) == s_full


def test_segment_cwr_first_only_and_ecn_accepted():
    payload = big_payload(5000)
    tso = tso_frame(payload, flags="CPA")
    segs = segment(tso, GSO_TCPV4 | GSO_ECN, 1200, False)
    assert [parse_tcp(s)[o.P_FLAGS] for s in segs] == [0x90, 0x10, 0x10, 0x10, 0x18]
    assert segs == expected_segments(payload, 1200, v6=False, flags="CPA")


def test_segment_odd_mss_ip_options_and_vlan():
    payload = big_payload(3001)
    tso = tso_frame(payload, ip_options=[b"\x01\x01\x01\x00"], ip_id=0xFFFF)   # id wraps
    segs = segment(tso, GSO_TCPV4, 999, False)
    assert len(segs) == 4
    assert [struct.unpack_from("!H", s, 18)[0] for s in segs] == [0xFFFF, 0, 1, 2]
    assert all(ip_header_ok(s) and scapy_l4_checksum_ok(s) for s in segs)
    assert b"".join(payload_of(s) for s in segs) == payload
    tagged = tso_frame(payload, vlan=5, v6=True)
    segs = segment(tagged, GSO_TCPV6, 1000, False, l2_len=18)
    assert len(segs) == 4 and all(s[12:16] == tagged[12:16] for s in segs)
    assert all(scapy_l4_checksum_ok(s) for s in segs)
    assert b"".join(payload_of(s) for s in segs) == payload


@pytest.mark.parametrize("v6", [False, True])
def test_segment_frame_that_fits(v6):
    frame = tcp_frame(b"small", v6=v6, flags="PA")
    tso = with_pseudo_sum(frame)
    gso = GSO_TCPV6 if v6 else GSO_TCPV4
    assert segment(tso, gso, MSS, True) == [tso]
    assert segment(tso, gso, MSS, False) == [frame]
    assert segment(memoryview(tso), gso, 0, False) == [frame]
    assert segment(tso, gso, 5, False) == [frame]        # exactly one MSS


def test_segment_refuses_what_it_cannot_cut():
    udp = bytes(Ether(src=MAC_A, dst=MAC_B) / IP() / UDP() / (b"x" * 3000))
    with pytest.raises(ValueError):
        segment(udp, GSO_TCPV4, 1000, False)
    tso = tso_frame(big_payload(3000))
    with pytest.raises(ValueError):
        segment(tso[:-10], GSO_TCPV4, 1000, False)       # truncated
    with pytest.raises(ValueError):
        segment(tso, GSO_TCPV6, 1000, False)             # wrong IP version
    with pytest.raises(ValueError):
        segment(tso, GSO_UDP, 1000, False)
    with pytest.raises(ValueError):
        segment(b"\x00" * 20, GSO_TCPV4, 1000, False)


@given(st.integers(1, 9000), st.integers(1, 3000), st.booleans(), st.booleans())
@settings(max_examples=60, deadline=None)
def test_segment_any_size(plen, mss, v6, offload):
    payload = big_payload(plen)
    tso = tso_frame(payload, v6=v6, options=None, flags="PA")
    segs = segment(tso, GSO_TCPV6 if v6 else GSO_TCPV4, mss, offload)
    assert len(segs) == -(-plen // mss)
    assert b"".join(payload_of(s) for s in segs) == payload
    l4 = 54 if v6 else 34
    for s in segs:
        assert len(s) <= l4 + 20 + mss
        if offload:
            s = bytearray(s)
            finish_checksum(s, l4, 16)
            s = bytes(s)
        assert tcp_checksum_ok(s, 14)


# --------------------------------------------------------------------------- Coalescer


def summary(items):
    """(vnet header fields, seq, payload length, flags) of each flushed item."""
    out = []
    for item in items:
        vnet = unpack_vnet(item)
        frame = item[VNET_HDR_LEN:]
        info = parse_tcp(frame, 18 if frame[12:14] == b"\x81\x00" else 14)
        if info is None:
            out.append((vnet, None))
        else:
            out.append((vnet, info[o.P_SEQ], info[o.P_PLEN], info[o.P_FLAGS]))
    return out


def segs_of(n, *, seq=1000, mss=MSS, last=None, v6=False, **kw):
    """n consecutive full-checksum segments (the last with `last` payload bytes if given)."""
    out = []
    for i in range(n):
        size = last if (last is not None and i == n - 1) else mss
        out.append(tcp_frame(big_payload(size), seq=seq + i * mss, ip_id=100 + i, v6=v6, **kw))
    return out


def coalesce(frames, csum=CSUM_UNKNOWN, **kw):
    c = Coalescer(**kw)
    for f in frames:
        c.add(f, csum)
    return c.flush()


@pytest.mark.parametrize("v6", [False, True])
def test_coalesce_segments_back_into_the_tso_frame(v6):
    payload = big_payload(MSS * 40 + 333)
    gso = GSO_TCPV6 if v6 else GSO_TCPV4
    tso = tso_frame(payload, v6=v6, flags="PA")
    segs = segment(tso, gso, MSS, False)
    c = Coalescer()
    for s in segs:
        c.add(s, CSUM_UNKNOWN)
    assert (c.merged, c.flushed_frames) == (0, 0)       # the counters move with flush()
    out = c.flush()
    assert len(out) == 1 and c.merged == 40 and c.flushed_frames == 1
    l4 = 54 if v6 else 34
    assert unpack_vnet(out[0]) == (NEEDS_CSUM, gso, l4 + 32, MSS, l4, 16)
    merged = out[0][VNET_HDR_LEN:]
    assert merged == tso                 # same headers, lengths, IP checksum, pseudo sum, PSH
    assert payload_of(merged) == payload
    if not v6:
        assert ip_header_ok(merged)
    # round trip
    assert segment(merged, gso, MSS, False) == segs
    assert c.flush() == [] and c.flushed_frames == 1


def test_coalesce_fin_segment_is_left_on_its_own():
    payload = big_payload(MSS * 5 + 10)
    segs = segment(tso_frame(payload, flags="FPA"), GSO_TCPV4, MSS, False)
    out = coalesce(segs)
    assert len(out) == 2
    assert unpack_vnet(out[0])[:2] == (NEEDS_CSUM, GSO_TCPV4)
    assert out[1] == VNET_PLAIN + segs[-1]          # untouched, checksum left to the kernel
    assert payload_of(out[0][10:]) + payload_of(out[1][10:]) == payload
    assert segment(out[0][10:], GSO_TCPV4, MSS, False) == segs[:-1]


@pytest.mark.parametrize("csum", [CSUM_VALID, CSUM_PARTIAL])
def test_coalesce_trusted_segments(csum):
    segs = segs_of(4)
    if csum == CSUM_PARTIAL:
        segs = [with_pseudo_sum(s) for s in segs]
    c = Coalescer()
    for s in segs:
        c.add(s, csum, 34, 16)
    out = c.flush()
    assert len(out) == 1 and unpack_vnet(out[0]) == (NEEDS_CSUM, GSO_TCPV4, 66, MSS, 34, 16)
    assert segment(out[0][10:], GSO_TCPV4, MSS, False) == segs_of(4)


def test_single_frames_keep_bytes_and_get_the_right_flags():
    seg = tcp_frame(big_payload(100))
    partial = with_pseudo_sum(seg)
    c = Coalescer()
    c.add(seg, CSUM_UNKNOWN)
    c.add(tcp_frame(big_payload(100), sport=1), CSUM_VALID)
    c.add(partial, CSUM_PARTIAL, 34, 16)
    out = c.flush()
    assert out == [VNET_PLAIN + seg, pack_vnet(DATA_VALID) + tcp_frame(big_payload(100), sport=1),
                   pack_vnet(NEEDS_CSUM, 0, 0, 0, 34, 16) + partial]
    # a lone segment the coalescer had to verify (because a follower arrived) is DATA_VALID
    a, b = segs_of(2, flags="A")
    bad_b = bytearray(b)
    bad_b[-1] ^= 1
    c.add(a, CSUM_UNKNOWN)
    c.add(bytes(bad_b), CSUM_UNKNOWN)
    assert c.flush() == [pack_vnet(DATA_VALID) + a, VNET_PLAIN + bytes(bad_b)]
    c.add(a, CSUM_UNKNOWN)
    c.add(tcp_frame(big_payload(10), seq=1000 + MSS, ip_id=101, flags="SA"), CSUM_UNKNOWN)
    out = c.flush()
    assert unpack_vnet(out[0])[0] == 0                 # SYN came first: nothing verified
    c.add(a, CSUM_UNKNOWN)
    c.add(segs_of(1, seq=1000 + MSS, ack=6000)[0], CSUM_UNKNOWN)
    out = c.flush()
    assert [unpack_vnet(i)[0] for i in out] == [0, 0]   # ack differs: no merge attempt


def test_interleaved_flows_stay_ordered_per_flow():
    fa = segs_of(6, sport=1111)
    fb = segs_of(6, sport=2222, v6=True)
    # flow A has a gap after its third segment, so it forms two runs
    fa = fa[:3] + [tcp_frame(big_payload(MSS), seq=1000 + (i + 1) * MSS, sport=1111,
                             ip_id=100 + i) for i in range(3, 6)]
    udp = [bytes(Ether(src=MAC_A, dst=MAC_B) / IP() / UDP(sport=i) / b"u") for i in range(4)]
    order = [fa[0], fb[0], udp[0], fa[1], fb[1], fb[2], udp[1], fa[2], fa[3], udp[2], fb[3],
             fa[4], fb[4], fa[5], fb[5], udp[3]]
    out = coalesce(order)
    flows = {}
    udp_seen = []
    for item in out:
        frame = item[10:]
        info = parse_tcp(frame)
        if info is None:
            udp_seen.append(frame)
            continue
        flows.setdefault(info[o.P_KEY], []).append((info[o.P_SEQ], info[o.P_PLEN]))
    assert udp_seen == udp
    runs = sorted(flows.values(), key=len)
    assert runs[0] == [(1000, MSS * 6)]
    assert runs[1] == [(1000, MSS * 3), (1000 + 4 * MSS, MSS * 3)]


def test_gap_changed_ack_and_options_stop_merging():
    base = segs_of(6)
    gap = base[:3] + [tcp_frame(big_payload(MSS), seq=1000 + 4 * MSS, ip_id=103)] + base[4:]
    assert [(s, n) for _, s, n, _ in summary(coalesce(gap))] == [
        (1000, 3 * MSS), (1000 + 4 * MSS, MSS), (1000 + 4 * MSS, 2 * MSS)]
    acks = base[:2] + segs_of(4, seq=1000 + 2 * MSS, ack=7000)
    assert [(s, n) for _, s, n, _ in summary(coalesce(acks))] == [
        (1000, 2 * MSS), (1000 + 2 * MSS, 4 * MSS)]
    other_ts = [("NOP", None), ("NOP", None), ("Timestamp", (123457, 654321))]
    opts = base[:4] + segs_of(2, seq=1000 + 4 * MSS, options=other_ts)
    assert [(s, n) for _, s, n, _ in summary(coalesce(opts))] == [
        (1000, 4 * MSS), (1000 + 4 * MSS, 2 * MSS)]
    ttl = base[:1] + segs_of(5, seq=1000 + MSS, ttl=63)
    assert [n for _, s, n, _ in summary(coalesce(ttl))] == [MSS, 5 * MSS]
    tos = base[:2] + segs_of(4, seq=1000 + 2 * MSS, tos=4)
    assert [n for _, s, n, _ in summary(coalesce(tos))] == [2 * MSS, 4 * MSS]
    df = base[:3] + segs_of(3, seq=1000 + 3 * MSS, df=False)
    assert [n for _, s, n, _ in summary(coalesce(df))] == [3 * MSS, 3 * MSS]
    mac = base[:3] + segs_of(3, seq=1000 + 3 * MSS, mac_dst="02:00:00:00:00:0c")
    assert [n for _, s, n, _ in summary(coalesce(mac))] == [3 * MSS, 3 * MSS]
    vlan = base[:3] + segs_of(3, seq=1000 + 3 * MSS, vlan=3)
    assert [n for _, s, n, _ in summary(coalesce(vlan))] == [3 * MSS, 3 * MSS]


def test_window_changes_do_not_stop_merging():
    segs = segs_of(2) + segs_of(2, seq=1000 + 2 * MSS, window=700)
    out = coalesce(segs)
    assert len(out) == 1 and parse_tcp(out[0][10:])[o.P_PLEN] == 4 * MSS


def test_control_flags_end_the_run():
    base = segs_of(6)
    for flag in ("SA", "FA", "RA", "UA", "EA", "CA"):
        special = tcp_frame(big_payload(MSS), seq=1000 + 3 * MSS, ip_id=103, flags=flag)
        frames = base[:3] + [special] + base[4:]
        out = summary(coalesce(frames))
        assert [(s, n) for _, s, n, _ in out] == [
            (1000, 3 * MSS), (1000 + 3 * MSS, MSS), (1000 + 4 * MSS, 2 * MSS)], flag
        assert out[1][0] == (0, 0, 0, 0, 0, 0)
    # PSH is merged as the last segment and closes the run
    psh = tcp_frame(big_payload(MSS), seq=1000 + 2 * MSS, ip_id=102, flags="PA")
    out = summary(coalesce(base[:2] + [psh] + base[3:]))
    assert [(s, n, f) for _, s, n, f in out] == [
        (1000, 3 * MSS, 0x18), (1000 + 3 * MSS, 3 * MSS, 0x10)]


def test_bad_checksum_stops_merging_and_passes_through():
    base = segs_of(6)
    bad = bytearray(base[3])
    bad[-5] ^= 0xFF
    bad = bytes(bad)
    out = coalesce(base[:3] + [bad] + base[4:])
    assert [(v[0], s, n) for v, s, n, _ in summary(out)] == [
        (NEEDS_CSUM, 1000, 3 * MSS), (0, 1000 + 3 * MSS, MSS), (NEEDS_CSUM, 1000 + 4 * MSS, 2 * MSS)]
    assert out[1] == VNET_PLAIN + bad
    # a bad first segment is left alone, the following ones still merge
    bad0 = bytearray(base[0])
    bad0[70] ^= 1
    out = coalesce([bytes(bad0)] + base[1:])
    assert [(v[0], s, n) for v, s, n, _ in summary(out)] == [
        (0, 1000, MSS), (NEEDS_CSUM, 1000 + MSS, 5 * MSS)]
    assert out[0] == VNET_PLAIN + bytes(bad0)
    # a trusted caller is trusted
    assert len(coalesce(base[:3] + [bad] + base[4:], CSUM_VALID)) == 1


def test_short_segment_closes_the_run_and_padding_is_ignored():
    segs = segs_of(3, mss=200, last=2, options=None)
    assert len(segs[-1]) == 56
    padded = segs[:-1] + [segs[-1] + b"\xee\xee\xee\xee"]
    after = tcp_frame(big_payload(200), seq=1000 + 402, ip_id=103, options=None)
    out = coalesce(padded + [after])
    assert [(s, n) for _, s, n, _ in summary(out)] == [(1000, 402), (1402, 200)]
    merged = out[0][10:]
    assert len(merged) == 54 + 402
    assert payload_of(merged) == big_payload(200) * 2 + big_payload(2)
    assert segment(merged, GSO_TCPV4, 200, False) == segs
    # a longer segment after full ones does not merge
    longer = segs_of(2, mss=200, options=None) + [
        tcp_frame(big_payload(300), seq=1400, ip_id=102, options=None)]
    assert [n for _, s, n, _ in summary(coalesce(longer))] == [400, 300]
    # a padded lone frame goes out untouched
    assert coalesce([padded[-1]], CSUM_VALID) == [pack_vnet(DATA_VALID) + padded[-1]]


def test_max_segments_and_max_size():
    segs = segs_of(10, mss=100, options=None)
    c = Coalescer(max_segments=4)
    for s in segs:
        c.add(s, CSUM_VALID)
    assert [n for _, s, n, _ in summary(c.flush())] == [400, 400, 200]
    assert (c.merged, c.flushed_frames) == (7, 3)
    assert [n for _, s, n, _ in summary(coalesce(segs, max_segments=1))] == [100] * 10
    out = coalesce(segs, max_size=54 + 350)
    assert [n for _, s, n, _ in summary(out)] == [300, 300, 300, 100]
    assert all(len(i) - 10 <= 54 + 350 for i in out)
    # IP length fields never overflow, whatever max_size says
    big = segs_of(50, mss=1460, options=None)
    out = coalesce(big, max_size=10 ** 6, max_segments=100)
    assert all(len(i) - 10 - 14 <= 65535 for i in out)
    assert sum(n for _, s, n, _ in summary(out)) == 50 * 1460


def test_non_coalescable_frames_pass_through_unchanged():
    frames = [
        tcp_frame(big_payload(100), ip_options=[b"\x01\x01\x01\x00"]),
        bytes(Ether(src=MAC_A, dst=MAC_B) / IP(flags="MF", proto=6) / (b"f" * 100)),
        bytes(Ether(src=MAC_A, dst=MAC_B) / IP() / UDP() / b"udp"),
        bytes(Ether(src=MAC_A, dst=MAC_B) / ARP()),
        bytes(Ether(src=MAC_A, dst=MAC_B) / IPv6() / IPv6ExtHdrDestOpt() / TCP() / b"x"),
        tcp_frame(b"", flags="A"),                               # pure ACK
        b"\x01\x02\x03",
    ]
    for csum, vnet in ((CSUM_UNKNOWN, VNET_PLAIN), (CSUM_VALID, pack_vnet(DATA_VALID)),
                       (CSUM_PARTIAL, pack_vnet(NEEDS_CSUM, 0, 0, 0, 34, 6))):
        c = Coalescer()
        for f in frames:
            c.add(f, csum, 34, 6)
        assert c.flush() == [vnet + f for f in frames]
        assert c.merged == 0 and c.flushed_frames == len(frames)


def test_ip_options_and_fragments_keep_flow_order():
    segs = segs_of(4)
    with_opts = tcp_frame(big_payload(MSS), seq=1000 + 2 * MSS, ip_options=[b"\x01\x01\x01\x00"])
    out = coalesce(segs[:2] + [with_opts] + segs[3:])
    assert [(s, n) for _, s, n, _ in summary(out)] == [(1000, 2 * MSS), (1000 + 2 * MSS, MSS),
                                                       (1000 + 3 * MSS, MSS)]
    frag = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=V4_SRC, dst=V4_DST, flags="MF", proto=6)
                 / (b"f" * 64))
    out = coalesce(segs[:2] + [frag] + segs[2:])
    assert len(out) == 3 and out[1] == VNET_PLAIN + frag


def test_partial_with_unexpected_offsets_is_not_merged():
    segs = [with_pseudo_sum(s) for s in segs_of(3)]
    c = Coalescer()
    for s in segs:
        c.add(s, CSUM_PARTIAL, 34, 17)
    assert c.flush() == [pack_vnet(NEEDS_CSUM, 0, 0, 0, 34, 17) + s for s in segs]


def test_memoryview_buffers_may_be_reused_after_flush():
    segs = segs_of(5)
    buf = bytearray(b"".join(segs))
    c = Coalescer()
    pos = 0
    for s in segs:
        c.add(memoryview(buf)[pos:pos + len(s)], CSUM_UNKNOWN)
        pos += len(s)
    out = c.flush()
    buf[:] = bytes(len(buf))
    assert len(out) == 1 and segment(out[0][10:], GSO_TCPV4, MSS, False) == segs


@given(st.integers(1, 20000), st.integers(1, 2000), st.booleans(), st.integers(2, 64),
       st.sampled_from(["A", "PA"]))
@settings(max_examples=60, deadline=None)
def test_segment_then_coalesce_round_trip(plen, mss, v6, max_segments, flags):
    payload = big_payload(plen)
    gso = GSO_TCPV6 if v6 else GSO_TCPV4
    tso = tso_frame(payload, v6=v6, flags=flags)
    segs = segment(tso, gso, mss, False)
    out = coalesce(segs, max_segments=max_segments)
    assert len(out) == -(-len(segs) // max_segments)
    again = []
    for item in out:
        vnet = unpack_vnet(item)
        frame = item[10:]
        if vnet[1] == o.GSO_NONE:
            assert vnet[0] == 0 and frame in segs
            again.append(frame)
        else:
            assert vnet[3] == mss
            again.extend(segment(frame, vnet[1], vnet[3], False))
    assert again == segs


def test_ipv4_options_are_never_coalesced():
    opts = [b"\x01\x01\x01\x00"]
    segs = [tcp_frame(big_payload(MSS), seq=1000 + i * MSS, ip_id=100 + i, ip_options=opts)
            for i in range(4)]
    assert coalesce(segs) == [VNET_PLAIN + s for s in segs]
    assert coalesce(segs, CSUM_VALID) == [pack_vnet(DATA_VALID) + s for s in segs]


def test_a_flag_difference_stops_merging():
    segs = segs_of(2) + segs_of(2, seq=1000 + 2 * MSS, flags="")     # ACK bit dropped
    assert [n for _, s, n, _ in summary(coalesce(segs))] == [2 * MSS, 2 * MSS]


def test_an_unmergeable_frame_of_the_flow_is_not_overtaken():
    segs = segs_of(4)
    pure_ack = tcp_frame(b"", seq=1000 + 2 * MSS, flags="A", window=900)
    out = coalesce(segs[:2] + [pure_ack] + segs[2:])
    assert [(s, n) for _, s, n, _ in summary(out)] == [(1000, 2 * MSS), (1000 + 2 * MSS, 0),
                                                       (1000 + 2 * MSS, 2 * MSS)]


def _scenarios():
    """Segment sequences that merge, break and resume in every way the tests above use."""
    base = segs_of(6)
    yield base
    yield base[:3] + [tcp_frame(big_payload(MSS), seq=1000 + 4 * MSS, ip_id=103)] + base[4:]  # gap
    yield base[:2] + segs_of(4, seq=1000 + 2 * MSS, ack=7000)
    yield base[:4] + segs_of(2, seq=1000 + 4 * MSS, options=[("NOP", None), ("NOP", None),
                                                             ("Timestamp", (123457, 654321))])
    yield base[:1] + segs_of(5, seq=1000 + MSS, ttl=63)
    yield base[:2] + segs_of(4, seq=1000 + 2 * MSS, tos=4)
    yield base[:3] + segs_of(3, seq=1000 + 3 * MSS, df=False)
    yield base[:3] + segs_of(3, seq=1000 + 3 * MSS, mac_dst="02:00:00:00:00:0c")
    yield base[:3] + segs_of(3, seq=1000 + 3 * MSS, vlan=3)
    yield segs_of(2) + segs_of(2, seq=1000 + 2 * MSS, window=700)
    yield segs_of(3) + segs_of(1, seq=1000 + 3 * MSS, flags="PA") + segs_of(2, seq=1000 + 4 * MSS)
    yield segs_of(3) + segs_of(1, seq=1000 + 3 * MSS, flags="FA")
    yield segs_of(4, last=100) + segs_of(2, seq=1000 + 3 * MSS + 100)
    yield segs_of(70)
    yield segs_of(5, v6=True) + segs_of(2, seq=1000 + 5 * MSS, v6=True, ttl=3)
    fa, fb = segs_of(6, sport=1111), segs_of(6, sport=2222)
    yield [f for pair in zip(fa, fb) for f in pair]
    yield fa[:3] + fb[:3] + fa[3:] + fb[3:]


@pytest.mark.parametrize("csum", [CSUM_VALID, CSUM_PARTIAL])
def test_fast_path_merges_exactly_like_the_general_path(csum, monkeypatch):
    """Trusted segments take the masked-compare shortcut for the run that took the last
    segment; its output must equal what the full parse-and-compare path gives."""
    real_extends = Coalescer._extends
    shortcuts = []

    def counting(self, *args):
        taken = real_extends(self, *args)
        shortcuts.append(taken)
        return taken

    for frames in _scenarios():
        if csum == CSUM_PARTIAL:
            frames = [with_pseudo_sum(f) for f in frames]
        with monkeypatch.context() as m:
            m.setattr(Coalescer, "_extends", counting)
            fast = Coalescer()
            for f in frames:
                fast.add(f, csum, l4_offset(f), 16)
            got = fast.flush()
        with monkeypatch.context() as m:
            m.setattr(Coalescer, "_extends", lambda *a: False)
            slow = Coalescer()
            for f in frames:
                slow.add(f, csum, l4_offset(f), 16)
            expected = slow.flush()
        assert got == expected
        assert fast.merged == slow.merged
    assert shortcuts.count(True) > 50 and shortcuts.count(False) > 5, "the shortcut was not exercised both ways"


# --------------------------------------------------------------------------- UDP (GSO_UDP_L4)

def udp_frame(payload: bytes, *, sport: int = 4000, dport: int = 5201, v6: bool = False, ip_id: int = 7,
              ttl: int = 64, partial: bool = True) -> bytes:
    """A UDP datagram as the host hands it over with checksum offload: the checksum field
    holds the pseudo-header sum (partial) or the full checksum."""
    l3 = IPv6(src=V6_SRC, dst=V6_DST, hlim=ttl) if v6 else IP(src=V4_SRC, dst=V4_DST, id=ip_id, ttl=ttl, flags="DF")
    frame = bytes(Ether(src=MAC_A, dst=MAC_B) / l3 / UDP(sport=sport, dport=dport) / Raw(payload))
    if not partial:
        return frame
    b = bytearray(frame)
    b[l4_offset(frame) + 6:l4_offset(frame) + 8] = struct.pack("!H", pseudo_sum(frame, 17))
    return bytes(b)


def split_udp_gso(item: bytes) -> list[bytes]:
    """What the host's stack does with a GSO_UDP_L4 frame at a socket: the datagrams'
    payloads, and checks of the merged headers."""
    flags, gso_type, hdr_len, gso_size, csum_start, csum_offset = unpack_vnet(item)
    frame = item[VNET_HDR_LEN:]
    assert (flags, gso_type, csum_offset) == (o.VIRTIO_NET_HDR_F_NEEDS_CSUM, o.GSO_UDP_L4, 6)
    assert hdr_len == csum_start + 8
    assert struct.unpack_from("!H", frame, csum_start + 4)[0] == len(frame) - csum_start
    body = frame[hdr_len:]
    return [body[i:i + gso_size] for i in range(0, len(body), gso_size)]


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("csum", [CSUM_PARTIAL, CSUM_VALID])
def test_udp_datagrams_of_a_flow_merge_into_one_gso_frame(v6, csum):
    payloads = [bytes([i]) * 64 for i in range(10)] + [b"tail"]
    frames = [udp_frame(p, v6=v6, ip_id=i, partial=csum == CSUM_PARTIAL) for i, p in enumerate(payloads)]
    c = Coalescer(udp=True)
    for f in frames:
        c.add(f, csum, l4_offset(f), 6)
    out = c.flush()
    assert len(out) == 1 and c.merged == 10
    assert split_udp_gso(out[0]) == payloads
    frame = out[0][VNET_HDR_LEN:]
    if not v6:
        assert ip_header_ok(frame)
        assert struct.unpack_from("!H", frame, 16)[0] == len(frame) - 14
    l4 = l4_offset(frame)
    assert struct.unpack_from("!H", frame, l4 + 6)[0] == pseudo_sum(frame, 17)


def test_udp_runs_close_on_size_change_flow_change_and_stay_ordered():
    a = [udp_frame(bytes(64), sport=1) for _ in range(3)] + [udp_frame(bytes(100), sport=1)] + \
        [udp_frame(bytes(64), sport=1) for _ in range(2)]
    b = [udp_frame(bytes(64), sport=2) for _ in range(3)]
    order = [a[0], b[0], a[1], b[1], a[2], a[3], b[2], a[4], a[5]]
    c = Coalescer(udp=True)
    for f in order:
        c.add(f, CSUM_PARTIAL, l4_offset(f), 6)
    sizes = []
    for item in c.flush():
        port = struct.unpack_from("!H", item, VNET_HDR_LEN + 34)[0]
        got = split_udp_gso(item) if unpack_vnet(item)[1] == o.GSO_UDP_L4 else [item[VNET_HDR_LEN + 42:]]
        sizes.append((port, [len(p) for p in got]))
    # flow 1: 64,64,64; the 100-byte datagram is bigger: a new run, which a shorter one ends
    assert [s for s in sizes if s[0] == 1] == [(1, [64, 64, 64]), (1, [100, 64]), (1, [64])]
    assert [s for s in sizes if s[0] == 2] == [(2, [64, 64, 64])]


def test_udp_is_left_alone_when_untrusted_disabled_or_unusual():
    frames = [udp_frame(bytes(64), partial=False) for _ in range(4)]
    assert len(coalesce(frames, CSUM_UNKNOWN, udp=True)) == 4  # unverified: one by one
    partial = [udp_frame(bytes(64)) for _ in range(4)]
    c = Coalescer()  # udp off (a kernel before 6.2)
    for f in partial:
        c.add(f, CSUM_PARTIAL, l4_offset(f), 6)
    assert len(c.flush()) == 4
    frag = bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=V4_SRC, dst=V4_DST, flags="MF") / UDP() / Raw(bytes(64)))
    c = Coalescer(udp=True)
    for f in (frag, frag):
        c.add(f, CSUM_VALID)
    assert [unpack_vnet(i)[1] for i in c.flush()] == [0, 0]


def test_tap_udp_gso_needs_linux_6_2():
    from batmand.dataplane.engine import tap_accepts_udp_gso
    assert not tap_accepts_udp_gso("6.1.0-57-amd64")
    assert tap_accepts_udp_gso("6.2.0") and tap_accepts_udp_gso("6.18.44-fc-v669")
    assert not tap_accepts_udp_gso("weird")


def _udp_variant(kind: str, size: int, sport: int, v6: bool) -> bytes:
    """A UDP datagram of a flow, or one that must not join its flow's run."""
    if kind == "frag" and not v6:
        return bytes(Ether(src=MAC_A, dst=MAC_B) / IP(src=V4_SRC, dst=V4_DST, flags="MF") / UDP(sport=sport)
                     / Raw(bytes(size)))
    frame = udp_frame(bytes(size), sport=sport, v6=v6, ttl=3 if kind == "ttl" else 64)
    if kind == "padded":
        return frame + bytes(6)  # Ethernet padding behind the datagram
    if kind == "badlen":
        b = bytearray(frame)
        b[l4_offset(frame) + 5] ^= 1  # UDP length disagrees with the IP length
        return bytes(b)
    return frame


@given(st.lists(st.tuples(st.sampled_from(["plain"] * 6 + ["frag", "ttl", "padded", "badlen"]),
                          st.sampled_from([64, 64, 64, 40, 100]), st.sampled_from([1, 1, 2])), max_size=40),
       st.booleans(), st.integers(1, 8), st.sampled_from([0, 6, 16]))
@settings(max_examples=150, deadline=None)
def test_udp_fast_path_merges_exactly_like_the_general_path(spec, v6, max_segments, offset):
    """Datagrams extending the run that took the last one skip parse_tcp and _add_udp
    (_extends_udp); the output must equal what the full path gives. offset 16: a partial
    checksum pointing elsewhere, which no UDP run takes."""
    frames = [_udp_variant(kind, size, sport, v6) for kind, size, sport in spec]

    def run(extends_udp):
        c = Coalescer(udp=True, max_segments=max_segments)
        c._extends_udp = extends_udp.__get__(c) if extends_udp else (lambda *a: False)
        for f in frames:
            c.add(f, CSUM_PARTIAL, l4_offset(f), offset)
        return c.flush(), c.merged

    assert run(Coalescer._extends_udp) == run(None)
