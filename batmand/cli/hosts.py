"""Names and destinations as batctl handles them: bat-hosts files (MAC <-> name) and
ping/traceroute/translate targets given as a MAC, a bat-hosts name, an IP address or a
host name (resolved to a MAC through the host's neighbour table, as batctl does)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time

from .tables import norm_mac

BAT_HOSTS_PATHS = ("/etc/bat-hosts", "~/bat-hosts", "bat-hosts")  # batctl's bat-hosts.c
ARP_TABLE = "/proc/net/arp"

_MAC_RE = re.compile(r"^[0-9a-fA-F]{1,2}([:-][0-9a-fA-F]{1,2}){5}$")


def parse_mac(text: str) -> str | None:
    """ether_aton: six groups of one or two hex digits; also accepts '-' separators."""
    text = text.strip()
    if not _MAC_RE.match(text):
        return None
    return norm_mac(text)


def load_bat_hosts(paths=None) -> dict[str, str]:
    """MAC -> name from every bat-hosts file that exists (later files win, as in batctl)."""
    paths = BAT_HOSTS_PATHS if paths is None else paths
    names: dict[str, str] = {}
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(os.path.expanduser(path))
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        try:
            with open(real, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError:
            continue
        for line in lines:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) < 2:
                continue
            mac = parse_mac(parts[0])
            if mac is None:
                continue
            name = parts[1][:49]
            for other in [m for m, n in names.items() if n == name and m != mac]:
                del names[other]
            names[mac] = name
    return names


def is_valid_unicast(mac: str) -> bool:
    """batctl's ether_addr_valid: not multicast, not all zero (only those are translated)."""
    octets = [int(x, 16) for x in norm_mac(mac).split(":")]
    return not (octets[0] & 1) and any(octets)


def _resolve_ip(text: str, family: int) -> str | None:
    try:
        infos = socket.getaddrinfo(text, None, family)
    except (socket.gaierror, UnicodeError, OSError):
        return None
    for info in infos:
        return info[4][0].split("%")[0]
    return None


def _arp_table(ip: str) -> str | None:
    """IPv4 neighbour from /proc/net/arp (complete entries only)."""
    try:
        with open(ARP_TABLE) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) >= 4 and fields[0] == ip and int(fields[2], 16) & 0x2:
                    mac = parse_mac(fields[3])
                    if mac and mac != "00:00:00:00:00:00":
                        return mac
    except (OSError, ValueError):
        pass
    return None


def _ip_neigh(ip: str, family: int) -> str | None:
    """`ip neigh show <ip>`: the lladdr of an entry that is not FAILED/INCOMPLETE."""
    cmd = ["ip", "-6" if family == socket.AF_INET6 else "-4", "neigh", "show", ip]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ip_neigh(out)


def parse_ip_neigh(out: str) -> str | None:
    """The first usable lladdr in `ip neigh show` output."""
    for line in out.splitlines():
        match = re.search(r"\blladdr\s+(\S+)", line)
        if match and "FAILED" not in line and "INCOMPLETE" not in line:
            mac = parse_mac(match.group(1))
            if mac:
                return mac
    return None


def neighbour_mac(ip: str, family: int) -> str | None:
    if family == socket.AF_INET:
        return _arp_table(ip) or _ip_neigh(ip, family)
    return _ip_neigh(ip, family)


def _solicit(ip: str, family: int) -> None:
    """batctl's request_mac_resolve: one UDP byte to port 9 makes the kernel ARP/ND."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"\0", (ip, 9))
    except OSError:
        pass


def resolve_destination(text: str, names: dict[str, str] | None = None, retries: int = 5,
                        wait: float = 0.2) -> str | None:
    """A MAC address for a bat-hosts name, a MAC, or an IPv4/IPv6 address or host name
    (neighbour table; solicited and retried 5 x 200 ms like batctl). None if unresolved."""
    if names:
        for mac, name in names.items():
            if name == text:
                return mac
    mac = parse_mac(text)
    if mac:
        return mac
    for family in (socket.AF_INET, socket.AF_INET6):
        ip = _resolve_ip(text, family)
        if ip is None:
            continue
        for attempt in range(retries):
            mac = neighbour_mac(ip, family)
            if mac:
                return mac
            _solicit(ip, family)
            if attempt < retries - 1:
                time.sleep(wait)
    return None
