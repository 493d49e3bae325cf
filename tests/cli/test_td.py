"""batmanctl td: capture files, JSON output, malformed input, and live capture on a veth."""

import json
import subprocess
import sys
import time

import pytest

from batmand.capture import write_pcap
from batmand.core.bla_frames import ANNOUNCE, CLAIM, LOOPDETECT, REQUEST, UNCLAIM, claim_frame
from batmand.cli.tcpdump import format_frame
from batmand.wire import BROADCAST, Elp, IvOgm, Mac, build_frame, ELP_TVLV_PADDING
from tests.conftest import PCAP_DIR
from tests.netns import in_netns, ip, namespace

BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]
A, B = Mac("02:00:00:00:01:01"), Mac("02:00:00:00:02:01")


def batmanctl(*args, **kw):
    return subprocess.run(BATMANCTL + list(args), capture_output=True, text=True, timeout=60, **kw)


def test_reads_every_reference_capture():
    for path in sorted(PCAP_DIR.glob("*.pcapng")):
        result = batmanctl("td", "-r", str(path))
        assert result.returncode == 0, result.stderr
        assert "malformed" not in result.stdout
        assert result.stdout.count("BAT ") > 10


def test_text_lines_in_batctl_style():
    out = batmanctl("td", "-r", str(PCAP_DIR / "batman_iv-3node-line-batctl-ping-traceroute.pcapng")).stdout
    assert "BAT 02:00:00:00:01:01 > 02:00:00:00:03:01: ICMP echo request, id " in out
    assert "ICMP time exceeded in-transit" in out
    assert ": OGM IV via neigh 02:00:00:00:02:01, seq " in out and "flags [.D.]" in out
    out = batmanctl("td", "-r", str(PCAP_DIR / "batman_iv-2node-dat-4addr.pcapng")).stdout
    assert "4ADDR, subtype 2, ttvn 1, ttl 50, ARP, Request who-has 10.254.0.12 tell 10.254.0.1" in out
    out = batmanctl("td", "-r", str(PCAP_DIR / "batman_iv-2node-tt-request-response.pcapng"), "-p", "64").stdout
    assert "\tTVLV TTv1: TT RESPONSE [F] ttvn=4 vlan_num=1 entry_num=8" in out
    assert "OGM IV" not in out  # -p 64: unicast TVLV only


def test_json_has_every_field_with_names():
    out = batmanctl("td", "--json", "-r", str(PCAP_DIR / "batman_iv-2node-fragmentation.pcapng")).stdout
    objs = [json.loads(line) for line in out.splitlines()]
    types = {p["packet_type"] for o in objs for p in o["packets"]}
    assert {"iv_ogm", "unicast", "unicast_frag"} <= types
    frag = next(p for o in objs for p in o["packets"] if p["packet_type"] == "unicast_frag")
    assert frag["orig"] == "02:00:00:00:01:01" and frag["total_size"] == 1452 and frag["no"] == 0
    ogm = next(p for o in objs for p in o["packets"] if p["packet_type"] == "iv_ogm")
    assert {"seqno", "orig", "prev_sender", "tq", "tvlv_len", "ttl", "flags", "tvlvs"} <= set(ogm)


def test_malformed_frames_print_a_reason_and_decoding_goes_on(tmp_path):
    good = build_frame(BROADCAST, A, Elp(orig=A, seqno=1), padding=ELP_TVLV_PADDING)
    ogm = build_frame(BROADCAST, A, IvOgm(seqno=5, orig=A, prev_sender=A))
    not_batman = bytes(B) + bytes(A) + b"\x08\x00" + bytes(40)
    frames = [good, ogm[:30], not_batman, bytes(B) + bytes(A) + b"\x43\x05\x99\x0f", good[:5], good]
    path = tmp_path / "mixed.pcap"
    write_pcap(str(path), frames)
    result = batmanctl("td", "-r", str(path))
    lines = result.stdout.splitlines()
    assert result.returncode == 0
    assert len(lines) == 6
    assert "ELP via iface" in lines[0] and "ELP via iface" in lines[5]
    assert "malformed batman-adv frame, length 30: IV OGM header truncated" in lines[1]
    assert lines[2].endswith(" IP, truncated")  # a non-batman frame, shown as batctl does (type 256)
    assert "unknown packet type 0x99" in lines[3]
    assert "Ethernet header truncated" in lines[4]
    jlines = [json.loads(x) for x in batmanctl("td", "--json", "-r", str(path)).stdout.splitlines()]
    assert [("error" in j) for j in jlines] == [False, True, False, True, True, False]
    assert len(batmanctl("td", "-x", "256", "-r", str(path)).stdout.splitlines()) == 5


def test_bla_claim_frames_are_named_as_batctl_names_them(tmp_path):
    """Claim frames (on bat0 or a LAN port) in batctl's words; a VLAN's with its tag; a
    plain ARP reply stays one; -p 256 (non batman packets) selects them."""
    gw, client, other = Mac("02:bb:00:00:01:00"), Mac("02:00:00:00:00:aa"), Mac("02:bb:00:00:02:00")
    group_dst = Mac("ff:43:05:00:be:ef")
    frames = [
        claim_frame(CLAIM, eth_dst=group_dst, eth_src=client, sender_hw=gw, group=0xBEEF, vid=0),
        claim_frame(UNCLAIM, eth_dst=group_dst, eth_src=gw, sender_hw=client, group=0xBEEF, vid=0),
        claim_frame(ANNOUNCE, eth_dst=group_dst, eth_src=gw, sender_hw=bytes.fromhex("430543051234"),
                    group=0xBEEF, vid=0x8000 | 7),
        claim_frame(REQUEST, eth_dst=other, eth_src=gw, sender_hw=gw, group=0xBEEF, vid=0),
        claim_frame(LOOPDETECT, eth_dst=Mac("ff:ff:ff:ff:ff:ff"), eth_src=Mac("ba:be:00:00:00:01"),
                    sender_hw=Mac("ba:be:00:00:00:01"), group=0xBEEF, vid=0),
        bytes(B) + bytes(A) + b"\x08\x06" + bytes.fromhex("0001080006040002") + bytes(A) + bytes([10, 0, 0, 1])
        + bytes(B) + bytes([10, 0, 0, 2]),
    ]
    path = tmp_path / "claims.pcap"
    write_pcap(str(path), frames)
    lines = [line.split(" ", 1)[1] for line in batmanctl("td", "-p", "256", "-r", str(path)).stdout.splitlines()]
    assert lines == [
        f"BLA CLAIM, backbone {gw}, client {client}, bla group beef",
        f"BLA UNCLAIM, backbone {gw}, client {client}, bla group beef",
        f"vlan 7, p 0, BLA ANNOUNCE, backbone {gw}, bla group beef, crc 1234",
        f"BLA REQUEST, src backbone {gw}, dst backbone {other}",
        "BLA LOOPDETECT, src backbone ba:be:00:00:00:01, dst backbone ff:ff:ff:ff:ff:ff",
        f"ARP, Reply 10.0.0.1 is-at {A}, length 28",
    ]
    assert batmanctl("td", "-p", "1", "-r", str(path)).stdout == ""


def test_unreadable_file_is_a_clear_error(tmp_path):
    path = tmp_path / "junk.pcap"
    path.write_bytes(b"this is not a capture file")
    result = batmanctl("td", "-r", str(path))
    assert result.returncode == 1 and "cannot read" in result.stderr


def test_format_frame_shows_non_batman_frames_unless_excluded():
    frame = bytes(B) + bytes(A) + b"\x86\xdd" + bytes(50)
    assert format_frame(frame, 0.0).endswith("IP6 :: > :: hop-by-hop options, length 0")
    assert format_frame(frame, 0.0, type_mask=0xFFFF & ~256) is None


def test_live_capture_on_a_veth():
    with namespace() as ns:
        ip("link", "add", "tda", "type", "veth", "peer", "name", "tdb", netns=ns)
        ip("link", "set", "tda", "up", netns=ns)
        ip("link", "set", "tdb", "up", netns=ns)
        capture = subprocess.Popen(in_netns(ns, BATMANCTL + ["td", "--json", "--count", "3", "-x", "256", "tda"]),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            frames = [build_frame(BROADCAST, A, Elp(orig=A, seqno=n), padding=ELP_TVLV_PADDING) for n in range(3)]
            sender = (
                "import socket,sys,time\n"
                "s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n"
                "s.bind(('tdb',0))\n"
                "frames=[bytes.fromhex(h) for h in sys.argv[1:]]\n"
                "for _ in range(50):\n"
                "    [s.send(f) for f in frames]; time.sleep(0.1)\n"
            )
            time.sleep(0.5)  # let the capture socket open
            subprocess.run(in_netns(ns, [sys.executable, "-c", sender] + [f.hex() for f in frames]),
                           timeout=30, check=True)
            out, err = capture.communicate(timeout=30)
        finally:
            if capture.poll() is None:
                capture.kill()
                capture.wait()
    objs = [json.loads(line) for line in out.splitlines()]
    assert len(objs) == 3, err
    assert all(o["ifname"] == "tda" and o["packets"][0]["packet_type"] == "elp" for o in objs)


def test_missing_interface_is_a_clear_error():
    result = batmanctl("td", "no-such-if0")
    assert result.returncode == 1 and "cannot capture" in result.stderr


def test_capture_file_cut_in_the_middle_of_a_record(tmp_path):
    path = tmp_path / "cut.pcap"
    frame = build_frame(BROADCAST, A, Elp(orig=A, seqno=1), padding=ELP_TVLV_PADDING)
    write_pcap(str(path), [frame, frame])
    path.write_bytes(path.read_bytes()[:-10])
    result = batmanctl("td", "-r", str(path))
    assert "ELP via iface" in result.stdout  # the complete first frame is still shown
    assert "Traceback" not in result.stderr


def test_bat_hosts_names_unless_n(tmp_path):
    """As batctl td: addresses in bat-hosts print as names (cwd's bat-hosts is one of the
    files batctl reads), -n prints the addresses."""
    (tmp_path / "bat-hosts").write_text("02:00:00:00:01:01 node-one\n02:00:00:00:03:01 node-three\n")
    path = str(PCAP_DIR / "batman_iv-3node-line-batctl-ping-traceroute.pcapng")
    named = batmanctl("td", "-r", path, cwd=tmp_path).stdout
    assert "BAT node-one > node-three: ICMP echo request, id " in named and "02:00:00:00:01:01" not in named
    assert "02:00:00:00:02:01" in named  # not in the file: the address
    plain = batmanctl("td", "-n", "-r", path, cwd=tmp_path).stdout
    assert "BAT 02:00:00:00:01:01 > 02:00:00:00:03:01: ICMP echo request" in plain and "node-one" not in plain


def test_roaming_clients_keep_their_address():
    from batmand.cli.tcpdump import with_names

    names = {"02:00:00:00:01:01": "one"}
    text = "BAT 02:00:00:00:01:01: OGM\n\tTVLV ROAMv1: client 02:00:00:00:01:01, VLAN ID -1"
    assert with_names(text, names) == "BAT one: OGM\n\tTVLV ROAMv1: client 02:00:00:00:01:01, VLAN ID -1"
