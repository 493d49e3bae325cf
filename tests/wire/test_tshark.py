"""Wireshark's batadv dissector (tshark) and our codec agree on every field of every
batman-adv frame in the kernel reference captures.

tshark is a decoder written independently of ours, so this checks field meaning, offsets and
byte order, which a byte-exact round trip cannot. The tables below list every field compared:
tshark field name -> (how to read tshark's string, how to get the value from our objects).
Each tshark object must show exactly the fields of its table (no more, no fewer), so a field
tshark adds or drops fails the test instead of being skipped.
"""

from __future__ import annotations

import collections
import functools
import json
import operator
import re
import shutil
import subprocess

import pytest

from batmand.wire import (VLAN_HAS_TAG, Bcast, DatTvlv, Elp, GatewayTvlv, IcmpPacket, IcmpRRPacket, IvOgm,
                          McastFlags, McastTvlv, Ogm2, OgmFlags, RoamTvlv, TtChange, TtClientFlags, TtDataFlags,
                          TtTvlv, TtVlan, Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, tt_vlan_crc)
from batmand.wire.constants import TT_DATA_TYPE_MASK
from batmand.wire.tvlv import tvlv_type, tvlv_version
from tests.conftest import PCAP_DIR
from tests.wire.captures import decoded, pcap_names


# --- reading tshark's strings: every value in its JSON is a string ------------------------------

def DEC(s: str) -> int:
    """Decimal integer ("50")."""
    if not re.fullmatch(r"0|[1-9][0-9]*", s):
        raise ValueError(f"not a decimal string: {s!r}")
    return int(s)


def HEX(s: str) -> int:
    """BASE_HEX integer, zero-padded and lower-case ("0x8014")."""
    if not re.fullmatch(r"0x[0-9a-f]+", s):
        raise ValueError(f"not a hex string: {s!r}")
    return int(s, 16)


def BOOL(s: str) -> int:
    """One bit of a flags field ("0"/"1")."""
    if s not in ("0", "1"):
        raise ValueError(f"not a bit: {s!r}")
    return int(s)


def MAC(s: str) -> str:
    """Lower-case colon hex; our Mac prints the same way."""
    if not re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", s):
        raise ValueError(f"not a MAC: {s!r}")
    return s


def BYTES(s: str) -> bytes:
    """data.data: colon-separated hex bytes ("00:00:00:00")."""
    return bytes.fromhex(s.replace(":", ""))


# --- getters on our objects ----------------------------------------------------------------------

attr = operator.attrgetter


def mac(name):
    return lambda obj: str(getattr(obj, name))


def bit(name, mask):
    return lambda obj: int(bool(getattr(obj, name) & mask))


# tshark's vid_vlan child uses mask 0x7fff (the kernel's VLAN_VID_MASK is 0x0fff); both give the
# same VID for the values on the wire. vid_tagged is BATADV_VLAN_HAS_TAG.
VID_FIELDS = {
    "batadv.tvlv.vid_vlan": (DEC, lambda obj: obj.vid & 0x7FFF),
    "batadv.tvlv.vid_tagged": (BOOL, bit("vid", VLAN_HAS_TAG)),
}

# --- the comparison tables -------------------------------------------------------------------------

# Outer Ethernet header. Its "*_tree" children (resolved names, OUI, LG/IG bits) are derived
# from the addresses and not compared.
ETHERNET = {
    "eth.dst": (MAC, mac("h_dest")),
    "eth.src": (MAC, mac("h_source")),
    "eth.type": (HEX, attr("h_proto")),
}

IV_OGM = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.iv_ogm.version": (DEC, attr("version")),
    "batadv.iv_ogm.ttl": (DEC, attr("ttl")),
    "batadv.iv_ogm.flags": (HEX, attr("flags")),
    "batadv.iv_ogm.flags.not_best_next_hop": (BOOL, bit("flags", OgmFlags.NOT_BEST_NEXT_HOP)),
    "batadv.iv_ogm.flags.primaries_first_hop": (BOOL, bit("flags", OgmFlags.PRIMARIES_FIRST_HOP)),
    "batadv.iv_ogm.flags.directlink": (BOOL, bit("flags", OgmFlags.DIRECTLINK)),
    "batadv.iv_ogm.seq": (DEC, attr("seqno")),
    "batadv.iv_ogm.orig": (MAC, mac("orig")),
    "batadv.iv_ogm.prev_sender": (MAC, mac("prev_sender")),
    "batadv.iv_ogm.tq": (DEC, attr("tq")),
    "batadv.iv_ogm.tvlv_len": (DEC, attr("tvlv_len")),
}

# tshark 4.0 stops dissecting OGMv2 after the flags byte ("Dissector bug ... Illegal call of
# proto_item_add_bitmask_tree without fields"), so seqno, orig, throughput and the TVLVs of
# OGMv2 are not compared here (test_captures / the .ogm2.txt decodes cover them).
OGM2 = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.ogm2.version": (DEC, attr("version")),
    "batadv.ogm2.ttl": (DEC, attr("ttl")),
    "batadv.ogm2.flags": (HEX, attr("flags")),
}

ELP = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.elp.version": (DEC, attr("version")),
    "batadv.elp.orig": (MAC, mac("orig")),
    "batadv.elp.seq": (DEC, attr("seqno")),
    "batadv.elp.interval": (DEC, attr("elp_interval")),
}

BCAST = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.bcast.version": (DEC, attr("version")),
    "batadv.bcast.ttl": (DEC, attr("ttl")),
    "batadv.bcast.seq": (DEC, attr("seqno")),
    "batadv.bcast.orig": (MAC, mac("orig")),
}

UNICAST = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.unicast.version": (DEC, attr("version")),
    "batadv.unicast.ttl": (DEC, attr("ttl")),
    "batadv.unicast.ttvn": (DEC, attr("ttvn")),
    "batadv.unicast.dst": (MAC, mac("dest")),
}

UNICAST_4ADDR = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.unicast_4addr.version": (DEC, attr("version")),
    "batadv.unicast_4addr.ttl": (DEC, attr("ttl")),
    "batadv.unicast_4addr.ttvn": (DEC, attr("ttvn")),
    "batadv.unicast_4addr.dst": (MAC, mac("dest")),
    "batadv.unicast_4addr.src": (MAC, mac("src")),
    "batadv.unicast_4addr.subtype": (DEC, attr("subtype")),
}

# no and priority are shown already shifted out of byte 3 (masks 0xf0 and 0x0e).
UNICAST_FRAG = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.unicast_frag.version": (DEC, attr("version")),
    "batadv.unicast_frag.ttl": (DEC, attr("ttl")),
    "batadv.unicast_frag.no": (DEC, attr("no")),
    "batadv.unicast_frag.priority": (DEC, attr("priority")),
    "batadv.unicast_frag.dst": (MAC, mac("dest")),
    "batadv.unicast_frag.orig": (MAC, mac("orig")),
    "batadv.unicast_frag.seq": (DEC, attr("seqno")),
    "batadv.unicast_frag.total_size": (DEC, attr("total_size")),
}

# tshark calls byte 17 rr_pointer: the kernel's `reserved` (20-byte form) or `rr_cur`
# (record-route form).
ICMP = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.icmp.version": (DEC, attr("version")),
    "batadv.icmp.ttl": (DEC, attr("ttl")),
    "batadv.icmp.msg_type": (DEC, attr("msg_type")),
    "batadv.icmp.dst": (MAC, mac("dst")),
    "batadv.icmp.orig": (MAC, mac("orig")),
    "batadv.icmp.uid": (DEC, attr("uid")),
    "batadv.icmp.rr_pointer": (DEC, lambda p: p.rr_cur if isinstance(p, IcmpRRPacket) else p.reserved),
    "batadv.icmp.seq": (DEC, attr("seqno")),
}

UNICAST_TVLV = {
    "batadv.batman.packet_type": (DEC, attr("packet_type")),
    "batadv.unicast_tvlv.version": (DEC, attr("version")),
    "batadv.unicast_tvlv.ttl": (DEC, attr("ttl")),
    "batadv.unicast_tvlv.dst": (MAC, mac("dst")),
    "batadv.unicast_tvlv.src": (MAC, mac("src")),
    "batadv.unicast_tvlv.len": (DEC, attr("tvlv_len")),
}

# packet_type -> (kind, our classes, table)
PACKETS = {
    0x00: ("IV_OGM", IvOgm, IV_OGM),
    0x01: ("BCAST", Bcast, BCAST),
    0x03: ("ELP", Elp, ELP),
    0x04: ("OGM2", Ogm2, OGM2),
    0x40: ("UNICAST", Unicast, UNICAST),
    0x41: ("UNICAST_FRAG", UnicastFrag, UNICAST_FRAG),
    0x42: ("UNICAST_4ADDR", Unicast4Addr, UNICAST_4ADDR),
    0x43: ("ICMP", (IcmpPacket, IcmpRRPacket), ICMP),
    0x44: ("UNICAST_TVLV", UnicastTvlv, UNICAST_TVLV),
}

# batadv_tvlv_hdr. tshark names the type byte "length" (its label says "Type").
TVLV_HEADER = {
    "batadv.tvlv.length": (HEX, tvlv_type),
    "batadv.tvlv.version": (HEX, tvlv_version),
    "batadv.tvlv.len": (DEC, lambda t: len(t.encode_value())),
}

TT = {
    "batadv.tvlv.tt.flags": (HEX, attr("flags")),
    "batadv.tvlv.tt.flags.type": (HEX, lambda t: t.flags & TT_DATA_TYPE_MASK),
    "batadv.tvlv.tt.flags.full_table": (BOOL, bit("flags", TtDataFlags.FULL_TABLE)),
    "batadv.tvlv.tt.ttvn": (DEC, attr("ttvn")),
    "batadv.tvlv.tt.num_vlan": (DEC, attr("num_vlan")),
}

TT_VLAN = {
    "batadv.tvlv.tt.vlan.crc": (HEX, attr("crc")),
    "batadv.tvlv.tt.vlan.vid": (HEX, attr("vid")),  # raw, with 0x8000 for tagged VLANs
    **VID_FIELDS,
}
# Generated, not a wire field: tshark's own check of the VLAN CRC over a full table. Compared
# separately against the CRC we compute over the same entries.
CRC_STATUS = "batadv.tvlv.tt.vlan.crc.status"

TT_CHANGE = {
    "batadv.tvlv.tt.change.flags": (HEX, attr("flags")),
    "batadv.tvlv.tt.change.flags.del": (BOOL, bit("flags", TtClientFlags.DEL)),
    "batadv.tvlv.tt.change.flags.roam": (BOOL, bit("flags", TtClientFlags.ROAM)),
    "batadv.tvlv.tt.change.flags.wifi": (BOOL, bit("flags", TtClientFlags.WIFI)),
    "batadv.tvlv.tt.change.flags.isolate": (BOOL, bit("flags", TtClientFlags.ISOLA)),
    "batadv.tvlv.tt.change.addr": (MAC, mac("addr")),
    "batadv.tvlv.tt.change.vid": (HEX, attr("vid")),
    **VID_FIELDS,
}

ROAM = {
    "batadv.batman.addr": (MAC, mac("client")),  # tshark reuses a generic field name here
    "batadv.tvlv.roam.vid": (HEX, attr("vid")),
    **VID_FIELDS,
}

# raw units of 100 kbit/s
GW = {
    "batadv.tvlv.gw.dl_speed": (DEC, attr("bandwidth_down")),
    "batadv.tvlv.gw.ul_speed": (DEC, attr("bandwidth_up")),
}

MCAST = {
    "batadv.tvlv.mcast.flags": (HEX, attr("flags")),
    "batadv.tvlv.mcast.flags.unsnoopables": (BOOL, bit("flags", McastFlags.WANT_ALL_UNSNOOPABLES)),
    "batadv.tvlv.mcast.flags.ipv4": (BOOL, bit("flags", McastFlags.WANT_ALL_IPV4)),
    "batadv.tvlv.mcast.flags.ipv6": (BOOL, bit("flags", McastFlags.WANT_ALL_IPV6)),
    "batadv.tvlv.mcast.flags.no_rtr4": (BOOL, bit("flags", McastFlags.WANT_NO_RTR4)),
    "batadv.tvlv.mcast.flags.no_rtr6": (BOOL, bit("flags", McastFlags.WANT_NO_RTR6)),
}

# DAT has no value: only its header (i.e. its presence) is compared.
DAT: dict = {}

# TVLV type -> (kind, our class, table for the value); the header is compared for all.
TVLVS = {
    0x01: ("GW", GatewayTvlv, GW),
    0x02: ("DAT", DatTvlv, DAT),
    0x04: ("TT", TtTvlv, TT),
    0x05: ("ROAM", RoamTvlv, ROAM),
    0x06: ("MCAST", McastTvlv, MCAST),
}

# The trailing bytes of a frame after the last batman-adv packet (ELP: 4 zero bytes of TVLV
# padding) are shown by tshark as a "data" layer; ours are Frame.padding.
TRAILER = {
    "data.data": (BYTES, attr("padding")),
    "data.len": (DEC, lambda f: len(f.padding)),
}

# Generated by tshark's reassembly (fragment frame numbers, reassembled length): not wire data.
GENERATED_SUBTREES = {"batadv.unicast_frag.fragments"}

PT_UNICAST_FRAG = "65"


# --- running tshark ----------------------------------------------------------------------------------

def _tshark() -> str:
    path = shutil.which("tshark")
    if path is None:
        pytest.fail("tshark is not installed (not on PATH): the project's set-up installs it "
                    "(apt-get install tshark); this test compares our codec with it and must not be skipped")
    return path


@functools.cache
def tshark_frames(name: str) -> dict[int, list]:
    """{frame number: layers} for every frame with a batadv layer; layers is a list of
    (protocol, fields) pairs, fields again lists of pairs.

    tshark writes the same key several times in one JSON object (one "batadv" per aggregated
    OGM, per TVLV and per TT entry); plain json.loads would keep only the last of each, so
    object_pairs_hook keeps every (key, value) pair in order."""
    proc = subprocess.run(
        # -n: no name resolution; -J: full subtrees of these protocols only (others are
        # reduced to {"filtered": ...}). Not -2: two-pass output adds more generated fields.
        [_tshark(), "-r", str(PCAP_DIR / name), "-n", "-T", "json", "-J", "frame eth batadv data"],
        capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"tshark failed on {name}: {proc.stderr}"
    out = {}
    for packet in json.loads(proc.stdout, object_pairs_hook=lambda pairs: pairs):
        layers = dict(dict(packet)["_source"])["layers"]
        if any(key == "batadv" for key, _ in layers):
            frame = _fields(next(v for k, v in layers if k == "frame"))
            out[int(frame["frame.number"])] = layers
    return out


def _is_object(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, tuple) for item in value)


def _fields(obj) -> dict[str, str]:
    """The leaf fields of one tshark object, with bit-field subtrees ("*_tree") merged in.
    Child objects keyed "batadv" (TVLVs, TT entries) are left for _children()."""
    out = {}
    for key, value in obj:
        if key == "batadv" or key in GENERATED_SUBTREES:
            continue
        items = _fields(value).items() if _is_object(value) else [(key, value)]
        for k, v in items:
            if k in out:
                raise AssertionError(f"duplicate tshark field {k} would be lost: {obj}")
            out[k] = v
    return out


def _children(obj) -> list:
    return [value for key, value in obj if key == "batadv"]


# --- comparing ----------------------------------------------------------------------------------------

class Comparison:
    def __init__(self):
        self.counts = collections.Counter()  # kind -> number of field values compared
        self.problems = []

    def fields(self, kind, table, fields, obj, where):
        """Compare one tshark object (its leaf fields) with one of our objects."""
        extra, missing = set(fields) - set(table), set(table) - set(fields)
        if extra or missing:
            self.problems.append(f"{where} ({kind}): tshark fields not in the table {sorted(extra)}, "
                                 f"table fields tshark did not show {sorted(missing)}")
        for name, (parse, get) in table.items():
            if name not in fields:
                continue
            try:
                theirs = parse(fields[name])
            except ValueError as exc:
                self.problems.append(f"{where} ({kind}) {name}: {exc}")
                continue
            ours = get(obj)
            if theirs != ours:
                self.problems.append(f"{where} ({kind}) {name}: tshark {fields[name]!r}, ours {ours!r}")
            self.counts[kind] += 1

    def check(self, ok, message):
        if not ok:
            self.problems.append(message)

    def tvlvs(self, layer, packet, where):
        children, ours = _children(layer), packet.tvlvs
        self.check(len(children) == len(ours), f"{where}: tshark shows {len(children)} TVLVs, we have {len(ours)}")
        for i, (child, tvlv) in enumerate(zip(children, ours)):
            here = f"{where} TVLV {i}"
            fields = _fields(child)
            kind, cls, table = TVLVS.get(HEX(fields.get("batadv.tvlv.length", "0x00")), ("?", None, {}))
            if cls is None or not isinstance(tvlv, cls):
                self.problems.append(f"{here}: tshark type {fields.get('batadv.tvlv.length')}, ours {tvlv!r}")
                continue
            self.fields(kind, {**TVLV_HEADER, **table}, fields, tvlv, here)
            if isinstance(tvlv, TtTvlv):
                self.tt_entries(child, fields, tvlv, here)

    def tt_entries(self, child, fields, tt, where):
        # Each VLAN entry and then each change entry is a child object keyed "batadv";
        # tshark's num_vlan says where the VLAN entries end.
        entries = [_fields(e) for e in _children(child)]
        num_vlan = DEC(fields["batadv.tvlv.tt.num_vlan"])
        vlans, changes = entries[:num_vlan], entries[num_vlan:]
        self.check(len(vlans) == len(tt.vlans) and len(changes) == len(tt.changes),
                   f"{where}: tshark shows {len(vlans)} VLANs/{len(changes)} changes, "
                   f"we have {len(tt.vlans)}/{len(tt.changes)}")
        for j, (entry, vlan) in enumerate(zip(vlans, tt.vlans)):
            assert isinstance(vlan, TtVlan)
            status = entry.pop(CRC_STATUS, None)
            if status is not None:  # full-table responses only: tshark checked the CRC
                ours = tt_vlan_crc([(c.addr, c.flags) for c in tt.changes if c.vid == vlan.vid], vlan.vid)
                self.check(status == ("1" if ours == vlan.crc else "0"),
                           f"{where} VLAN {j} {CRC_STATUS}: tshark {status!r}, "
                           f"our CRC 0x{ours:08x} vs announced 0x{vlan.crc:08x}")
                self.counts["TT_CRC_STATUS"] += 1
            self.fields("TT_VLAN", TT_VLAN, entry, vlan, f"{where} VLAN {j}")
        for j, (entry, change) in enumerate(zip(changes, tt.changes)):
            assert isinstance(change, TtChange)
            self.fields("TT_CHANGE", TT_CHANGE, entry, change, f"{where} change {j}")

    def frame(self, layers, frame, where):
        keys = [key for key, _ in layers]
        # Outer Ethernet header: the first "eth" layer (a later one is an inner frame).
        eth = dict(layers[keys.index("eth")][1])
        self.fields("ETHERNET", ETHERNET, {k: v for k, v in eth.items() if not k.endswith("_tree")},
                    frame.ethernet, where)

        # The batman-adv packets on the wire: the run of "batadv" layers after the outer
        # Ethernet layer (several for aggregated OGMs). tshark reassembles fragments and
        # appends the rebuilt packet's layers to the fragment that completes it: everything
        # after a UNICAST_FRAG layer is reassembled data, not this frame's bytes.
        run, i = [], keys.index("eth") + 1
        while i < len(keys) and keys[i] == "batadv":
            run.append(layers[i][1])
            i += 1
            if _fields(run[-1]).get("batadv.batman.packet_type") == PT_UNICAST_FRAG:
                break
        after = keys[i] if i < len(keys) else None
        self.check(len(run) == len(frame.packets),
                   f"{where}: tshark shows {len(run)} batman-adv packets, we decoded {len(frame.packets)}")

        for n, (layer, packet) in enumerate(zip(run, frame.packets)):
            here = f"{where} packet {n}"
            fields = _fields(layer)
            kind, cls, table = PACKETS.get(DEC(fields["batadv.batman.packet_type"]), ("?", None, {}))
            if cls is None or not isinstance(packet, cls):
                self.problems.append(f"{here}: tshark packet type {fields['batadv.batman.packet_type']}, "
                                     f"ours {type(packet).__name__}")
                continue
            self.fields(kind, table, fields, packet, here)
            if hasattr(packet, "tvlvs") and kind != "OGM2":  # tshark shows no OGMv2 TVLVs (see OGM2)
                self.tvlvs(layer, packet, here)

        # tshark's OGMv2 bug is the only malformed packet it may report.
        if "_ws.malformed" in keys:
            self.check(all(isinstance(p, Ogm2) for p in frame.packets), f"{where}: tshark reports it malformed")
        if after == "data":
            self.fields("TRAILER", TRAILER, _fields(layers[i][1]), frame, where)
        elif after is None:
            self.check(frame.padding == b"", f"{where}: tshark shows no trailing bytes, "
                                             f"our padding is {frame.padding.hex()}")


def _kinds(frame) -> set[str]:
    """What one of our frames contains, named as in the tables (what must have been compared)."""
    kinds = {"ETHERNET"}
    for packet in frame.packets:
        kinds.update(kind for kind, cls, _ in PACKETS.values() if isinstance(packet, cls))
        if isinstance(packet, Ogm2):
            continue  # tshark shows no OGMv2 TVLVs
        for tvlv in getattr(packet, "tvlvs", ()):
            kinds.update(kind for kind, cls, _ in TVLVS.values() if isinstance(tvlv, cls))
            if isinstance(tvlv, TtTvlv) and tvlv.vlans:
                kinds.add("TT_VLAN")
            if isinstance(tvlv, TtTvlv) and tvlv.changes:
                kinds.add("TT_CHANGE")
    if frame.padding:
        kinds.add("TRAILER")
    return kinds


@functools.cache
def compare(name: str):
    """(compared field counts per kind, kinds our decode contains, problems) for one capture."""
    ours = {cf.number: frame for cf, frame in decoded(name)}
    theirs = tshark_frames(name)
    result = Comparison()
    only_tshark, only_ours = sorted(theirs.keys() - ours.keys()), sorted(ours.keys() - theirs.keys())
    result.check(not only_tshark, f"{name}: frames tshark decodes as batman-adv but we do not: {only_tshark}")
    result.check(not only_ours, f"{name}: frames we decode that tshark does not see as batman-adv: {only_ours}")
    kinds = set()
    for number in sorted(theirs.keys() & ours.keys()):
        result.frame(theirs[number], ours[number], f"{name} frame {number}")
        kinds |= _kinds(ours[number])
    return result.counts, kinds, result.problems


@pytest.mark.parametrize("name", pcap_names())
def test_tshark_agrees_with_our_decoding(name):
    assert decoded(name), f"{name}: no batman-adv frames"
    counts, kinds, problems = compare(name)
    assert not problems, f"{len(problems)} disagreements with tshark:\n" + "\n".join(problems[:30])
    # every kind of packet, TVLV and TT entry this capture holds had fields compared
    assert [kind for kind in sorted(kinds) if counts[kind] == 0] == [], counts


def test_tshark_comparison_covers_every_table():
    total = collections.Counter()
    for name in pcap_names():
        total.update(compare(name)[0])
    tables = [kind for kind, _, _ in PACKETS.values()] + [kind for kind, _, _ in TVLVS.values()]
    extra = ["ETHERNET", "TT_VLAN", "TT_CRC_STATUS", "TT_CHANGE", "TRAILER"]
    assert [kind for kind in tables + extra if total[kind] == 0] == [], total
    assert total["IV_OGM"] > 10_000 and total["TT_CHANGE"] > 1_000
    assert sum(total.values()) > 40_000, total
