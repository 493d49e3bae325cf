"""`batmanctl td`: decode batman-adv frames from interfaces (AF_PACKET) or capture files,
one line per packet in batctl td's style, or one JSON object per frame with --json."""

from __future__ import annotations

import json
import re
import selectors
import socket
import sys
import time
from collections.abc import Iterable, Iterator

from batmand.wire import (Bcast, InnerFrame, DatTvlv, Elp, GatewayTvlv, IcmpMsgType, IcmpPacket, IcmpRRPacket, IcmpTpPacket,
                          IvOgm, McastTrackerTvlv, McastTvlv, Mcast, NotBatmanError, Ogm2, RoamTvlv, TtDataFlags,
                          TtTvlv, Unicast, Unicast4Addr, UnicastFrag, UnicastTvlv, UnknownTvlv, UnknownUnicast,
                          WireError, decode_frame, VLAN_HAS_TAG)
from batmand.capture import CaptureFileError
from batmand.wire.constants import COMPAT_VERSION

from .hosts import load_bat_hosts
from batmand.wire.frame import Frame

from .inner import summarize_inner

ETH_P_ALL = 0x0003

# batctl's -p / -x type masks
TYPE_BITS = {"ogm": 1, "ogm2": 2, "elp": 4, "icmp": 8, "unicast": 16, "bcast": 32, "unicast_tvlv": 64,
             "frag": 128, "nonbat": 256, "mcast": 1024}


def _type_bit(packet) -> int:
    if isinstance(packet, IvOgm):
        return TYPE_BITS["ogm"]
    if isinstance(packet, Ogm2):
        return TYPE_BITS["ogm2"]
    if isinstance(packet, Elp):
        return TYPE_BITS["elp"]
    if isinstance(packet, (IcmpPacket, IcmpRRPacket, IcmpTpPacket)):
        return TYPE_BITS["icmp"]
    if isinstance(packet, Bcast):
        return TYPE_BITS["bcast"]
    if isinstance(packet, UnicastTvlv):
        return TYPE_BITS["unicast_tvlv"]
    if isinstance(packet, UnicastFrag):
        return TYPE_BITS["frag"]
    if isinstance(packet, Mcast):
        return TYPE_BITS["mcast"]
    return TYPE_BITS["unicast"]


def _vlan_id(vid: int) -> int:
    return vid & 0x0FFF if vid & VLAN_HAS_TAG else -1


def _tt_kind(flags: int) -> str:
    if flags & TtDataFlags.OGM_DIFF:
        return "OGM DIFF"
    if flags & TtDataFlags.REQUEST:
        return "TT REQUEST"
    if flags & TtDataFlags.RESPONSE:
        return "TT RESPONSE"
    return "UNKNOWN"


def tvlv_lines(tvlvs) -> list[str]:
    lines = []
    for tvlv in tvlvs:
        if isinstance(tvlv, GatewayTvlv):
            down, up = tvlv.bandwidth_down, tvlv.bandwidth_up
            lines.append(f"\tTVLV GWv1: down {down // 10}.{down % 10}Mbps, up {up // 10}.{up % 10}Mbps")
        elif isinstance(tvlv, DatTvlv):
            lines.append("\tTVLV DATv1: enabled")
        elif isinstance(tvlv, TtTvlv):
            full = "F" if tvlv.flags & TtDataFlags.FULL_TABLE else "."
            lines.append(f"\tTVLV TTv1: {_tt_kind(tvlv.flags)} [{full}] ttvn={tvlv.ttvn} "
                         f"vlan_num={tvlv.num_vlan} entry_num={len(tvlv.changes)}")
            for vlan in tvlv.vlans:
                lines.append(f"\t\tVLAN ID {_vlan_id(vlan.vid)}, crc 0x{vlan.crc:08x}")
            for change in tvlv.changes:
                flags = "".join(ch if change.flags & bit else "." for ch, bit in (("D", 1), ("R", 2), ("W", 0x10), ("I", 0x20)))
                lines.append(f"\t\t{change.addr} VLAN ID {_vlan_id(change.vid)} [{flags}]")
        elif isinstance(tvlv, RoamTvlv):
            lines.append(f"\tTVLV ROAMv1: client {tvlv.client}, VLAN ID {_vlan_id(tvlv.vid)}")
        elif isinstance(tvlv, McastTvlv):
            f = tvlv.flags
            lines.append("\tTVLV MCASTv2: [%s%s%s%s%s%s]" % (
                "U" if f & 0x01 else ".", "4" if f & 0x02 else ".", "6" if f & 0x04 else ".",
                "R4" if not f & 0x08 else ". ", "R6" if not f & 0x10 else ". ", "P" if not f & 0x20 else "."))
        elif isinstance(tvlv, McastTrackerTvlv):
            lines.append(f"\tTVLV MCAST TRACKER v1, destinations ({tvlv.num_dests}):")
            lines += [f"\t\t{dest}" for dest in tvlv.dests]
        elif isinstance(tvlv, UnknownTvlv):
            lines.append(f"\tTVLV type {tvlv.type} v{tvlv.version}, len {len(tvlv.value)}")
    return lines


_ICMP_NAMES = {IcmpMsgType.ECHO_REPLY: "echo reply", IcmpMsgType.ECHO_REQUEST: "echo request",
               IcmpMsgType.TTL_EXCEEDED: "time exceeded in-transit",
               IcmpMsgType.DESTINATION_UNREACHABLE: "destination unreachable",
               IcmpMsgType.PARAMETER_PROBLEM: "parameter problem"}


def packet_lines(frame: Frame, packet, length: int) -> list[str]:
    """The line(s) for one batman-adv packet (without the timestamp)."""
    src = frame.ethernet.h_source
    if isinstance(packet, IvOgm):
        flags = "".join(ch if packet.flags & bit else "." for ch, bit in (("N", 1), ("D", 4), ("F", 2)))
        head = (f"BAT {packet.orig}: OGM IV via neigh {src}, seq {packet.seqno}, tq {packet.tq:3d}, "
                f"ttl {packet.ttl:2d}, v {packet.version}, flags [{flags}], length {length}, tvlv_len {packet.tvlv_len}")
        return [head] + tvlv_lines(packet.tvlvs)
    if isinstance(packet, Ogm2):
        tp = "MAX" if packet.throughput == 0xFFFFFFFF else f"{packet.throughput / 10:.1f}Mbps"
        head = (f"BAT {packet.orig}: OGM2 via neigh {src}, seq {packet.seqno}, throughput {tp}, "
                f"ttl {packet.ttl:2d}, v {packet.version}, length {length}, tvlv_len {packet.tvlv_len}")
        return [head] + tvlv_lines(packet.tvlvs)
    if isinstance(packet, Elp):
        return [f"BAT {packet.orig}: ELP via iface {src}, seq {packet.seqno}, v {packet.version}, "
                f"interval {packet.elp_interval}ms, length {length}"]
    if isinstance(packet, IcmpTpPacket):
        kind = {0: "MSG", 1: "ACK"}.get(packet.subtype, "N/A")
        return [f"BAT {packet.orig} > {packet.dst}: ICMP TP type {kind} ({packet.subtype}), id {packet.uid}, "
                f"seq {packet.seqno}, ttl {packet.ttl:2d}, v {packet.version}, length {length}"]
    if isinstance(packet, (IcmpPacket, IcmpRRPacket)):
        name = _ICMP_NAMES.get(packet.msg_type, f"type {packet.msg_type}")
        line = (f"BAT {packet.orig} > {packet.dst}: ICMP {name}, id {packet.uid}, seq {packet.seqno}, "
                f"ttl {packet.ttl:2d}, v {packet.version}, length {length}")
        if isinstance(packet, IcmpRRPacket):
            line += ", RR " + " ".join(str(mac) for mac in packet.rr[: min(packet.rr_cur, 16)])
        return [line]
    if isinstance(packet, Unicast):
        return [f"BAT {src} > {packet.dest}: UCAST, ttvn {packet.ttvn}, ttl {packet.ttl}, "
                + summarize_inner(packet.inner)]
    if isinstance(packet, Unicast4Addr):
        return [f"BAT {src} > {packet.dest}: 4ADDR, subtype {packet.subtype}, ttvn {packet.ttvn}, "
                f"ttl {packet.ttl}, " + summarize_inner(packet.inner)]
    if isinstance(packet, UnicastFrag):
        return [f"BAT {src} > {packet.dest}: UCAST FRAG, seqno {packet.seqno}, no {packet.no}, ttl {packet.ttl}, "
                f"orig {packet.orig}, total_size {packet.total_size}, length {length}"]
    if isinstance(packet, Bcast):
        return [f"BAT {src}: BCAST, orig {packet.orig}, seq {packet.seqno}, " + summarize_inner(packet.inner)]
    if isinstance(packet, UnicastTvlv):
        head = (f"BAT {packet.src} > {packet.dst}: TVLV, len {length}, tvlv_len {packet.tvlv_len}, "
                f"ttl {packet.ttl}")
        return [head] + tvlv_lines(packet.tvlvs)
    if isinstance(packet, Mcast):
        head = (f"BAT {src} > {frame.ethernet.h_dest}: MCAST, ttl {packet.ttl}, {packet.inner.h_source} > "
                f"{packet.inner.h_dest}, " + summarize_inner(packet.inner))
        return [head] + tvlv_lines(packet.tvlvs)
    if isinstance(packet, UnknownUnicast):
        return [f"BAT {src} > {packet.dest}: unknown unicast type 0x{packet.packet_type:02x}, ttl {packet.ttl}, "
                f"length {length}"]
    return [f"BAT {src}: {type(packet).__name__}"]


def _timestamp(ts: float) -> str:
    local = time.localtime(ts)
    return f"{local.tm_hour:02d}:{local.tm_min:02d}:{local.tm_sec:02d}.{int(round((ts % 1) * 1e6)) % 1000000:06d}"


def format_frame(data: bytes, ts: float, *, as_json: bool = False, ifname: str | None = None,
                 type_mask: int = 0xFFFF) -> str | None:
    """Text (or a JSON line) for one captured frame; None when it is skipped."""
    try:
        frame = decode_frame(data)
    except NotBatmanError:
        return _plain_frame(data, ts, as_json=as_json, ifname=ifname, type_mask=type_mask)
    except WireError as exc:
        if as_json:
            return json.dumps({"time": ts, "ifname": ifname, "length": len(data), "error": exc.reason})
        return f"{_timestamp(ts)} malformed batman-adv frame, length {len(data)}: {exc.reason}"
    packets = [p for p in frame.packets if _type_bit(p) & type_mask]
    if not packets:
        return None
    if as_json:
        out = {"time": ts, "ifname": ifname, "length": len(data)}
        out.update(frame.to_json())
        return json.dumps(out)
    lines = []
    for packet in packets:
        length = len(data) - 14 if len(frame.packets) == 1 else len(packet.encode())
        lines += packet_lines(frame, packet, length)
    return f"{_timestamp(ts)} " + "\n".join(lines)


def _plain_frame(data: bytes, ts: float, *, as_json: bool, ifname: str | None, type_mask: int) -> str | None:
    """A frame that is not batman-adv's (on bat0 or a LAN port: ARP, IP, BLA's claim
    frames), shown as batctl shows "non batman packets" (type bit 256)."""
    if not type_mask & TYPE_BITS["nonbat"] or len(data) < 14:
        return None
    try:
        summary = summarize_inner(InnerFrame.decode(data))
    except WireError as exc:
        summary = f"malformed frame, length {len(data)}: {exc.reason}"
    if as_json:
        return json.dumps({"time": ts, "ifname": ifname, "length": len(data), "summary": summary})
    return f"{_timestamp(ts)} {summary}"


def frames_from_file(path: str) -> Iterator[tuple[bytes, float, str | None]]:
    from batmand.capture import read_capture

    for cf in read_capture(path):
        yield cf.data, cf.timestamp, cf.ifname


def _open_packet_socket(ifname: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind((ifname, ETH_P_ALL))
    return sock


def open_interfaces(ifnames: Iterable[str]) -> selectors.DefaultSelector:
    """A selector over one packet socket per interface (errors surface here, not later)."""
    selector = selectors.DefaultSelector()
    try:
        for name in ifnames:
            try:
                sock = _open_packet_socket(name)
            except OSError as exc:
                raise OSError(exc.errno, f"{name}: {exc.strerror}") from None
            selector.register(sock, selectors.EVENT_READ, name)
    except OSError:
        _close(selector)
        raise
    return selector


def _close(selector: selectors.DefaultSelector) -> None:
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    selector.close()


def frames_from_interfaces(selector) -> Iterator[tuple[bytes, float, str | None]]:
    """Frames of every listed interface, in and out, until interrupted."""
    try:
        while True:
            for key, _ in selector.select():
                data = key.fileobj.recv(65535)
                yield data, time.time(), key.data
    finally:
        _close(selector)


def other_compat_version(data: bytes) -> bool:
    """td -c: a batman-adv frame (ethertype 0x4305, maybe VLAN tagged) whose version byte is
    not our compat version (batctl's COMPAT_FILTER)."""
    offset = 12
    while data[offset:offset + 2] in (b"\x81\x00", b"\x88\xa8"):
        offset += 4
    if data[offset:offset + 2] != b"\x43\x05" or len(data) < offset + 4:
        return False
    return data[offset + 3] != COMPAT_VERSION


MAC_TEXT = re.compile(r"(?<![0-9a-f])(?<![0-9a-f]:)[0-9a-f]{2}(?::[0-9a-f]{2}){5}(?![0-9a-f]|:[0-9a-f])")


def with_names(text: str, names: dict[str, str]) -> str:
    """batctl td's bat-hosts names for the addresses it prints (all but a roaming client's,
    which batctl prints as it is)."""
    if not names:
        return text
    return "\n".join(line if "TVLV ROAMv1" in line else MAC_TEXT.sub(lambda m: names.get(m.group(0), m.group(0)), line)
                     for line in text.split("\n"))


def run(args) -> int:
    type_mask = 0xFFFF
    if args.p is not None:
        type_mask = args.p
    if args.x is not None:
        type_mask &= ~args.x
    if args.read:
        source = frames_from_file(args.read)
    else:
        if not args.interfaces:
            print("batmanctl td: give one or more interfaces, or -r FILE", file=sys.stderr)
            return 2
        try:
            source = frames_from_interfaces(open_interfaces(args.interfaces))
        except OSError as exc:
            print(f"batmanctl td: cannot capture: {exc}", file=sys.stderr)
            return 1
    names = {} if args.n or args.json else load_bat_hosts()
    seen = 0
    try:
        for data, ts, ifname in source:
            if args.compat and other_compat_version(data):
                continue
            text = format_frame(data, ts, as_json=args.json, ifname=ifname, type_mask=type_mask)
            if text is None:
                continue
            print(with_names(text, names), flush=True)
            seen += 1
            if args.count and seen >= args.count:
                break
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        raise
    except OSError as exc:
        print(f"batmanctl td: {exc}", file=sys.stderr)
        return 1
    except CaptureFileError as exc:
        print(f"batmanctl td: cannot read {exc}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("td", aliases=["tcpdump"], help="decode batman-adv frames (live or from a capture file)")
    p.add_argument("interfaces", nargs="*", help="interfaces to capture on (AF_PACKET, needs CAP_NET_RAW)")
    p.add_argument("-r", "--read", metavar="FILE", help="read a pcap or pcapng file instead")
    p.add_argument("--json", action="store_true", help="one JSON object per frame")
    p.add_argument("-p", type=int, metavar="MASK", help="only these packet types (batctl bit mask)")
    p.add_argument("-x", type=int, metavar="MASK", help="all but these packet types (batctl bit mask)")
    p.add_argument("--count", type=int, default=0, help="stop after this many printed frames")
    p.add_argument("-c", dest="compat", action="store_true",
                   help=f"compat filter: only packets of our compat version ({COMPAT_VERSION})")
    p.add_argument("-n", action="store_true", help="don't replace MAC addresses with bat-hosts names")
    p.set_defaults(func=run)
