"""batctl's output formats as pure functions: rows from the daemon in, lines out.

Every format string here is batctl's `printf` format (cmd/*.c, netlink.c), translated to
Python's % operator, which has the same width and padding semantics. The rows are the
dicts of the control protocol (batmand.daemon.protocol), keyed by batctl's netlink/JSON
attribute names. `names` maps a MAC address to a bat-hosts name (batctl's /etc/bat-hosts);
None or an empty mapping prints plain addresses, as `batctl -n` does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from batmand.wire import TtClientFlags

Names = Mapping[str, str] | None  # None: batctl -n (no bat-hosts lookups at all)

# ---------------------------------------------------------------------------------------
# addresses


def norm_mac(mac) -> str:
    """A MAC address as batctl prints it: six lower-case, zero-padded hex pairs."""
    if mac is None:
        return "00:00:00:00:00:00"
    text = str(mac).strip().lower()
    parts = text.replace("-", ":").split(":")
    if len(parts) == 6:
        try:
            return ":".join("%02x" % int(p, 16) for p in parts)
        except ValueError:
            pass
    return text


def mac_or_name(mac, names: Names = None) -> str:
    """batctl's `%02x:...` or, when the address has a bat-hosts name, `%17s` of the name."""
    text = norm_mac(mac)
    if names:
        name = names.get(text)
        if name:
            return "%17s" % name
    return text


def _secs_msecs(msecs) -> tuple[int, int]:
    msecs = int(msecs or 0)
    return msecs // 1000, msecs % 1000


def _kbit(row) -> tuple[int, int]:
    kbits = int(row.get("throughput") or 0)
    return kbits // 1000, (kbits % 1000) // 100


# ---------------------------------------------------------------------------------------
# the info line of every debug table (netlink.c: info_callback)


def is_disabled(info: Mapping) -> bool:
    """batctl prints "BATMAN mesh bat0 disabled" when the mesh has no primary interface."""
    return not info.get("primary_if")


def info_line(info: Mapping, meshif: str | None = None, extra: str = "") -> str:
    meshif = info.get("meshif") or meshif or "bat0"
    if is_disabled(info):
        return "BATMAN mesh %s disabled" % meshif
    return "[B.A.T.M.A.N. adv %s, MainIF/MAC: %s/%s (%s/%s %s)%s]" % (
        info.get("version", ""), info["primary_if"], norm_mac(info.get("primary_mac")),
        meshif, norm_mac(info.get("meshif_mac")), info.get("algo", ""), extra)


def translocal_extra(info: Mapping) -> str:
    return ", TTVN: %u" % int(info.get("ttvn") or 0)


def header_lines(info: Mapping, column_header: str | None, meshif: str | None = None, extra: str = "") -> list[str]:
    """The info line and the table's column header; only the "disabled" line when the
    mesh has no primary interface (batctl gets no algorithm name then)."""
    if is_disabled(info):
        return [info_line(info, meshif)]
    lines = [info_line(info, meshif, extra)]
    if column_header is not None:
        lines.append(column_header)
    return lines


# ---------------------------------------------------------------------------------------
# batctl o (cmd/originators.c)

ORIGINATORS_HEADER_IV = "   Originator        last-seen (#/255) Nexthop           [outgoingIF]"
ORIGINATORS_HEADER_V = "   Originator        last-seen ( throughput)  Nexthop           [outgoingIF]"


def originators_header(algo: str) -> str:
    return ORIGINATORS_HEADER_V if algo == "BATMAN_V" else ORIGINATORS_HEADER_IV


def originator_line(row: Mapping, names: Names = None) -> str:
    best = "*" if row.get("best") else " "
    secs, msecs = _secs_msecs(row.get("last_seen_msecs"))
    orig = mac_or_name(row.get("orig_address"), names)
    neigh = mac_or_name(row.get("neigh_address"), names)
    ifname = row.get("hard_ifname") or ""
    if row.get("tq") is None and row.get("throughput") is not None:
        mbits, decimal = _kbit(row)
        if names is not None:
            # batctl's V line with bat-hosts lookups on (no -n) puts " " before the next hop,
            # and " * " (the best marker again) before a next hop that has a name
            text = norm_mac(row.get("neigh_address"))
            neigh = " %c %17s" % (best, names[text]) if names.get(text) else " " + text
        return " %c %s %4i.%03is (%9u.%1u) %s [%10s]" % (best, orig, secs, msecs, mbits, decimal, neigh, ifname)
    return " %c %s %4i.%03is   (%3i) %s [%10s]" % (best, orig, secs, msecs, int(row.get("tq") or 0), neigh, ifname)


def originators_lines(rows: Iterable[Mapping], names: Names = None, max_age: float | None = None) -> list[str]:
    """One line per originator x neighbour; `max_age` is batctl o's -t (hide older, seconds)."""
    lines = []
    for row in rows:
        if max_age is not None and int(row.get("last_seen_msecs") or 0) / 1000.0 > max_age:
            continue
        lines.append(originator_line(row, names))
    return lines


# ---------------------------------------------------------------------------------------
# batctl n (cmd/neighbors.c)

NEIGHBORS_HEADER_IV = "IF             Neighbor              last-seen"
NEIGHBORS_HEADER_V = "         Neighbor   last-seen      speed           IF"


def neighbors_header(algo: str) -> str:
    return NEIGHBORS_HEADER_V if algo == "BATMAN_V" else NEIGHBORS_HEADER_IV


def neighbor_line(row: Mapping, names: Names = None) -> str:
    secs, msecs = _secs_msecs(row.get("last_seen_msecs"))
    neigh = mac_or_name(row.get("neigh_address"), names)
    ifname = row.get("hard_ifname") or ""
    if row.get("throughput") is not None:
        mbits, decimal = _kbit(row)
        return "%s %4i.%03is (%9u.%1u) [%10s]" % (neigh, secs, msecs, mbits, decimal, ifname)
    return "   %10s\t  %s %4i.%03is" % (ifname, neigh, secs, msecs)


# ---------------------------------------------------------------------------------------
# batctl tl / tg (cmd/translocal.c, cmd/transglobal.c)

TRANSLOCAL_HEADER = "Client             VID Flags    Last seen (CRC       )"
TRANSGLOBAL_HEADER = "   Client             VID Flags Last ttvn     Via        ttvn  (CRC       )"


def _vid(row: Mapping) -> int:
    vid = row.get("tt_vid")
    return -1 if vid is None else int(vid)


def _flag_chars(flags: int, spec) -> str:
    return "".join(ch if flags & bit else "." for ch, bit in spec)


TL_FLAGS = (("R", TtClientFlags.ROAM), ("P", TtClientFlags.NOPURGE), ("N", TtClientFlags.NEW),
            ("X", TtClientFlags.PENDING), ("W", TtClientFlags.WIFI), ("I", TtClientFlags.ISOLA))
TG_FLAGS = (("R", TtClientFlags.ROAM), ("W", TtClientFlags.WIFI), ("I", TtClientFlags.ISOLA),
            ("T", TtClientFlags.TEMP))


def translocal_line(row: Mapping, names: Names = None) -> str:
    flags = _flag_chars(int(row.get("tt_flags") or 0), TL_FLAGS)
    secs, msecs = _secs_msecs(row.get("last_seen_msecs"))  # absent for no-purge entries: 0.000
    return "%s %4i [%s] %3u.%03u   (0x%.8x)" % (mac_or_name(row.get("tt_address"), names), _vid(row), flags,
                                                 secs, msecs, int(row.get("tt_crc32") or 0))


def transglobal_line(row: Mapping, names: Names = None) -> str:
    best = "*" if row.get("best") else " "
    flags = _flag_chars(int(row.get("tt_flags") or 0), TG_FLAGS)
    return " %c %s %4i [%s] (%3u) %s (%3u) (0x%.8x)" % (
        best, mac_or_name(row.get("tt_address"), names), _vid(row), flags, int(row.get("tt_ttvn") or 0),
        mac_or_name(row.get("orig_address"), names), int(row.get("tt_last_ttvn") or 0),
        int(row.get("tt_crc32") or 0))


def tt_filter(rows: Iterable[Mapping], unicast_only: bool = False, multicast_only: bool = False) -> list[Mapping]:
    """batctl tl/tg -u (unicast only) and -m (multicast only)."""
    out = []
    for row in rows:
        multicast = bool(int(norm_mac(row.get("tt_address"))[:2], 16) & 1)
        if (unicast_only and multicast) or (multicast_only and not multicast):
            continue
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------
# batctl if, s, ra, settings


def interfaces_lines(rows: Iterable[Mapping]) -> list[str]:
    return ["%s: %s" % (row.get("hard_ifname"), "active" if row.get("active") else "inactive") for row in rows]


def statistics_lines(stats: Mapping) -> list[str]:
    return ["\t%s: %d" % (name, int(value)) for name, value in stats.items()]


def dataplane_lines(status: Mapping) -> list[str]:
    lines = ["Data plane: %s" % status.get("mode", "?")]
    workers = status.get("workers") or []
    if workers:
        lines.append("%6s %8s %9s %12s %12s %12s %10s" % ("worker", "pid", "restarts", "rx frames", "tx frames",
                                                          "gro merged", "slow path"))
        for w in workers:
            lines.append("%6d %8s %9d %12d %12d %12d %10d" % (w["index"], w.get("pid"), w["restarts"], w["rx_frames"],
                                                              w["tx_frames"], w["gro_merged"], w["slow_path"]))
    drops = status.get("drops") or {}
    lines.append("Drops: " + ", ".join("%s %d" % (place, count) for place, count in sorted(drops.items())))
    kernel = status.get("kernel_forward")
    if kernel is None:
        lines.append("Kernel forwarding: off")
    elif kernel.get("error"):
        lines.append("Kernel forwarding: unavailable (%s)" % kernel["error"])
    else:
        lines.append("Kernel forwarding: %s; %d routes; forwarded %d frames, %d bytes" % (
            ", ".join(kernel["interfaces"]) or "no interface", kernel["routes"], kernel["forward"],
            kernel["forward_bytes"]))
        deliver, send = kernel.get("deliver", "off"), kernel.get("send", "off")
        lines.append("Kernel delivery: %s; delivered %d frames, %d bytes; %d dropped" % (
            deliver if deliver == "on" else "off (%s)" % deliver, kernel.get("rx", 0), kernel.get("rx_bytes", 0),
            kernel.get("dropped", 0)))
        lines.append("Kernel sending: %s; %d clients; sent %d frames, %d bytes" % (
            send if send == "on" else "off (%s)" % send, kernel.get("clients", 0), kernel.get("tx", 0),
            kernel.get("tx_bytes", 0)))
    return lines


def routing_algos_lines(ra: Mapping) -> list[str]:
    lines = []
    active = ra.get("active") or {}
    if active:
        lines.append("Active routing protocol configuration:")
        lines.extend(" * %s: %s" % (meshif, algo) for meshif, algo in active.items())
        lines.append("")
    lines.append("Selected routing algorithm (used when next batX interface is created):")
    lines.append(" => %s" % ra.get("selected", ""))
    lines.append("")  # batctl prints the sysfs value with its newline
    lines.append("Available routing algorithms:")
    lines.extend(" * %s" % algo for algo in ra.get("available") or [])
    return lines


# ---------------------------------------------------------------------------------------
# batctl dc (cmd/dat_cache.c)

DAT_CACHE_HEADER = "          IPv4             MAC        VID   last-seen"


def dat_cache_title(meshif: str) -> str:
    return "Distributed ARP Table (%s):" % meshif


def dat_cache_line(row: Mapping, names: Names = None) -> str:
    msecs = int(row.get("last_seen_msecs") or 0)
    return " * %15s %s %4i %6i:%02i" % (row.get("dat_cache_ip4address"), mac_or_name(row.get("dat_cache_hwaddress"),
                                                                                     names),
                                        int(row.get("dat_cache_vid", -1)), msecs // 60000, msecs % 60000 // 1000)


# ---------------------------------------------------------------------------------------
# batctl mf (mcast_flags.c of batctl 2023, what Debian 12 ships: five slots; batctl 2024.0
# added a sixth, P, for the MCAST packet capability, which 2023 leaves unshown)


def mcast_flags_text(flags: int) -> str:
    return "[%s%s%s%s%s]" % ("U" if flags & 0x01 else ".", "4" if flags & 0x02 else ".", "6" if flags & 0x04 else ".",
                             ". " if flags & 0x08 else "R4", ". " if flags & 0x10 else "R6")


def mcast_header_lines(state: Mapping) -> list[str]:
    bridged = bool(state.get("bridged"))
    q4, q6, s4, s6 = "?", "?", "?", "?"
    if bridged:
        q4, q6 = ("." if state.get("querier4") else "4"), ("." if state.get("querier6") else "6")
        s4, s6 = ("4" if state.get("shadowing4") else "."), ("6" if state.get("shadowing6") else ".")
    return ["Multicast flags (own flags: %s)" % mcast_flags_text(int(state.get("mcast_flags") or 0)),
            "* Bridged [U]\t\t\t\t%s" % ("U" if bridged else "."),
            "* No IGMP/MLD Querier [4/6]:\t\t%s/%s" % (q4, q6),
            "* Shadowing IGMP/MLD Querier [4/6]:\t%s/%s" % (s4, s6),
            "-" * 43, "       Originator Flags"]


def mcast_flags_line(row: Mapping, names: Names = None) -> str:
    flags = row.get("mcast_flags")
    return "%s %s" % (mac_or_name(row.get("orig_address"), names), "-" if flags is None else mcast_flags_text(flags))


def mcast_flags_json(row: Mapping) -> dict:
    """batctl mfj's object for one originator."""
    out = {"orig_address": row.get("orig_address")}
    flags = row.get("mcast_flags")
    if flags is not None:
        out["mcast_flags"] = {"all_unsnoopables": bool(flags & 0x01), "want_all_ipv4": bool(flags & 0x02),
                              "want_all_ipv6": bool(flags & 0x04), "want_no_rtr_ipv4": bool(flags & 0x08),
                              "want_no_rtr_ipv6": bool(flags & 0x10), "have_mc_ptype_capa": bool(flags & 0x20),
                              "raw": flags}
    return out


# ---------------------------------------------------------------------------------------
# batctl gwl (cmd/gateways.c) and batctl gw (cmd/gw_mode.c); bandwidths in 100 kbit/s

GATEWAYS_HEADER_IV = "  Router            ( TQ) Next Hop          [outgoingIf]  Bandwidth"
GATEWAYS_HEADER_V = "  Router            ( throughput) Next Hop          [outgoingIf]  Bandwidth"


def gateways_header(algo: str) -> str:
    return GATEWAYS_HEADER_V if algo == "BATMAN_V" else GATEWAYS_HEADER_IV


def _mbit(units) -> str:
    units = int(units or 0)
    return "%u.%u" % (units // 10, units % 10)


def gateway_line(row: Mapping, names: Names = None) -> str:
    best = "*" if row.get("best") else " "
    if row.get("throughput") is not None:
        throughput = int(row["throughput"])
        metric = "(%9u.%1u)" % (throughput // 10, throughput % 10)
    else:
        metric = "(%3i)" % int(row.get("tq") or 0)
    return "%c %s %s %s [%10s]: %s/%s MBit" % (best, mac_or_name(row.get("orig_address"), names), metric,
                                               mac_or_name(row.get("router"), names), row.get("hard_ifname") or "",
                                               _mbit(row.get("bandwidth_down")), _mbit(row.get("bandwidth_up")))


def gw_mode_line(state: Mapping) -> str:
    mode = state.get("gw_mode")
    if mode == "off":
        return "off"
    if mode == "client":
        if state.get("algo") == "BATMAN_V":
            return "client (selection class: %s MBit)" % _mbit(state.get("gw_sel_class"))
        return "client (selection class: %u)" % int(state.get("gw_sel_class") or 0)
    if mode == "server":
        return "server (announced bw: %s/%s MBit)" % (_mbit(state.get("gw_bandwidth_down")),
                                                     _mbit(state.get("gw_bandwidth_up")))
    return "unknown"


def event_line(event: Mapping, prefix: str = "") -> str:
    """One event of `batmanctl event`: a uevent (bat0: uevent gw add 02:...) or, as batctl
    event prints the kernel's tpmeter notifications, a tp result (tp_meter 0x0012abcd: complete)."""
    if event.get("type") == "tp_meter":
        from .throughputmeter import event_text

        return f"{prefix}tp_meter 0x{int(event.get('cookie') or 0):08x}: {event_text(int(event.get('result') or 0))}"
    data = f" {event['data']}" if event.get("data") else ""
    return f"{prefix}{event.get('meshif')}: uevent {event.get('type')} {event.get('action')}{data}"


def setting_line(value, boolean: bool = False) -> str:
    """A setting as batctl prints it: booleans as enabled/disabled, numbers with %u."""
    if boolean:
        if isinstance(value, str):
            value = value.strip().lower() in ("1", "true", "enable", "enabled", "yes", "on")
        return "enabled" if value else "disabled"
    return str(value)


# loglevel bits as batctl's cmd/loglevel.c (BIT(5) is unused)
LOG_LEVELS = {"batman": 1 << 0, "routes": 1 << 1, "tt": 1 << 2, "bla": 1 << 3, "dat": 1 << 4,
              "mcast": 1 << 6, "tp": 1 << 7}
LOG_LEVEL_TEXT = (("batman", "messages related to routing / flooding / broadcasting"),
                  ("routes", "messages related to route added / changed / deleted"),
                  ("tt", "messages related to translation table operations"),
                  ("bla", "messages related to bridge loop avoidance"),
                  ("dat", "messages related to arp snooping and distributed arp table"),
                  ("mcast", "messages related to multicast"),
                  ("tp", "messages related to throughput meter"))


def loglevel_mask(value) -> int:
    """The level bit mask of a daemon value: level names (a string or a list) or a number."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return 255 if value else 0
    if isinstance(value, int):
        return value
    words = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    mask = 0
    for word in words:
        word = str(word).strip().lower()
        if word == "all":
            return 255
        if word == "none":
            return 0
        if word.isdigit():
            mask |= int(word)
        else:
            mask |= LOG_LEVELS.get(word, 0)
    return mask


def loglevel_lines(value) -> list[str]:
    mask = loglevel_mask(value)
    lines = ["[%c] %s (%s)" % ("x" if not mask else " ", "all debug output disabled", "none")]
    for name, text in LOG_LEVEL_TEXT:
        lines.append("[%c] %s (%s)" % ("x" if mask & LOG_LEVELS[name] else " ", text, name))
    return lines


# ---------------------------------------------------------------------------------------
# batctl ping (cmd/ping.c)

ICMP_PACKET_LEN = 20  # sizeof(struct batadv_icmp_packet)
ICMP_RR_PACKET_LEN = 116  # sizeof(struct batadv_icmp_packet_rr)


def ping_header(dst_string: str, mac: str, record_route: bool = False) -> str:
    size = ICMP_RR_PACKET_LEN if record_route else ICMP_PACKET_LEN
    return "PING %s (%s) %d(%d) bytes of data" % (dst_string, norm_mac(mac), size, size + 28)


class PingPrinter:
    """Turns the daemon's ping events into batctl's lines, remembering what batctl
    remembers between replies (the last record-route list) and the round-trip times."""

    def __init__(self, dst_string: str, dst_mac: str, record_route: bool = False, names: Names = None):
        self.dst_string = dst_string
        self.dst_mac = norm_mac(dst_mac)
        self.record_route = record_route
        self.names = names
        self.last_rr: list[str] | None = None
        self.rtts: list[float] = []
        self.events = 0

    def event_lines(self, event: Mapping) -> list[str]:
        """The lines batctl prints for one probe's outcome ([] for an unknown event)."""
        kind = event.get("type")
        seqno = int(event.get("seqno") or 0) & 0xFFFF
        if kind in ("reply", "timeout", "unreachable", "ttl_exceeded"):
            self.events += 1
        if kind == "timeout":
            return ["Reply from host %s timed out" % self.dst_string]
        if kind == "unreachable":
            return ["From %s: Destination Host Unreachable (icmp_seq %u)" % (self.dst_string, seqno)]
        if kind == "ttl_exceeded":
            return ["From %s: Time to live exceeded (icmp_seq %u)" % (self.dst_string, seqno)]
        if kind != "reply":
            return []
        rtt = float(event.get("rtt_ms") or 0.0)
        self.rtts.append(rtt)
        size = ICMP_RR_PACKET_LEN if self.record_route else ICMP_PACKET_LEN
        line = "%d bytes from %s icmp_seq=%u ttl=%d time=%.2f ms" % (size, self.dst_string, seqno,
                                                                     int(event.get("ttl") or 0), rtt)
        rr = event.get("rr")
        if not self.record_route or rr is None:
            return [line]
        route = [norm_mac(mac) for mac in rr]
        if route == self.last_rr:
            return [line + "\t(same route)"]
        self.last_rr = route
        # batctl: printf("\nRR: "), then "\t%s\n" per entry (the destination twice: it turns
        # the packet around), then the "\n" that ends every reply
        entries = []
        for mac in route:
            text = mac_or_name(mac, self.names).strip()
            entries.append(text)
            if mac == self.dst_mac:
                entries.append(text)
        lines = [line]
        for i, text in enumerate(entries):
            lines.append(("RR: \t%s" if i == 0 else "\t%s") % text)
        if not entries:
            lines.append("RR: ")
        else:
            lines.append("")
        return lines


def ping_statistics_lines(dst_string: str, transmitted: int, received: int, rtts: Iterable[float] = (),
                          summary: Mapping | None = None) -> list[str]:
    """batctl's closing block. Loss is batctl's integer division; min/avg/max/mdev come
    from the daemon's summary when it has them, else from the replies' round-trip times."""
    loss = ((transmitted - received) * 100) // transmitted if transmitted else 0
    rtts = list(rtts)
    if summary and summary.get("min") is not None:
        lo, avg, hi, mdev = (float(summary.get(k) or 0.0) for k in ("min", "avg", "max", "mdev"))
    elif rtts:
        lo, hi = min(rtts), max(rtts)
        avg = sum(rtts) / len(rtts)
        var = sum(r * r for r in rtts) / len(rtts) - avg * avg
        mdev = math.sqrt(var) if var > 0 else 0.0
    else:
        lo = avg = hi = mdev = 0.0
    return ["--- %s ping statistics ---" % dst_string,
            "%u packets transmitted, %u received, %u%% packet loss" % (transmitted, received, loss),
            "rtt min/avg/max/mdev = %.3f/%.3f/%.3f/%.3f ms" % (lo, avg, hi, mdev)]


# ---------------------------------------------------------------------------------------
# batctl traceroute (cmd/traceroute.c)

TRACEROUTE_TTL_MAX = 50
TRACEROUTE_PROBES = 3


def traceroute_header(dst_string: str, mac: str) -> str:
    return "traceroute to %s (%s), %d hops max, %d byte packets" % (dst_string, norm_mac(mac), TRACEROUTE_TTL_MAX,
                                                                  ICMP_PACKET_LEN)


def traceroute_hop_line(hop: int, probes: Iterable[Mapping], names: Names = None) -> str:
    """` 1: 02:ba:de:af:fe:02  0.512 ms  0.433 ms  0.401 ms`; `*` for a probe without answer;
    the address is the first answer's, with its bat-hosts name first when it has one."""
    probes = list(probes)
    answered = [p for p in probes if p.get("from") and p.get("rtt_ms") is not None
                and p.get("kind", "reply") != "timeout"]
    if not answered:
        line = "%2u: %s" % (hop & 0xFF, "*")
    else:
        mac = norm_mac(answered[0]["from"])
        name = names.get(mac) if names else None
        line = "%2u: %s (%s)" % (hop & 0xFF, name, mac) if name else "%2u: %s" % (hop & 0xFF, mac)
    for probe in probes:
        if probe in answered:
            line += "  %.3f ms" % float(probe["rtt_ms"])
        else:
            line += "   *"
    return line


# batctl cl / bbt (cmd/claimtable.c, cmd/backbonetable.c)
CLAIM_HEADER = "Client               VID      Originator        [o] (CRC   )"
BACKBONE_HEADER = "Originator           VID   last seen (CRC   )"


def bla_extra(info: Mapping) -> str:
    return ", group id: 0x%04x" % int(info.get("bla_crc") or 0)


def claim_line(row: Mapping, names: Names = None) -> str:
    return "%s on %5d by %s [%s] (0x%04x)" % (
        mac_or_name(row.get("bla_address"), names), int(row.get("bla_vid", -1)),
        mac_or_name(row.get("bla_backbone"), names), "*" if row.get("bla_own") else " ", int(row.get("bla_crc") or 0))


def backbone_line(row: Mapping, names: Names = None) -> str:
    msecs = int(row.get("last_seen_msecs") or 0)
    return "%s on %5d %4i.%03is (0x%04x)" % (mac_or_name(row.get("bla_backbone"), names), int(row.get("bla_vid", -1)),
                                            msecs // 1000, msecs % 1000, int(row.get("bla_crc") or 0))
