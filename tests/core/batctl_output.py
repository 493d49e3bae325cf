"""Parse what `batctl o` / `batctl tg` printed in the reference captures' .commands.txt."""

from __future__ import annotations

import re

from tests.conftest import PCAP_DIR

_O_LINE = re.compile(r"^ (\*| ) ([0-9a-f:]{17})\s+([\d.]+)s\s+\(\s*(\d+)\)\s+([0-9a-f:]{17}) \[\s*(\S+)\]")
_O_LINE_V = re.compile(r"^ (\*| ) ([0-9a-f:]{17})\s+([\d.]+)s \(\s*([\d.]+)\)\s+([0-9a-f:]{17}) \[\s*(\S+)\]")
_TG_LINE = re.compile(r"^ (\*| ) ([0-9a-f:]{17})\s+(-?\d+) \[([.RWIT]{4})\] \(\s*(\d+)\) ([0-9a-f:]{17}) \(\s*(\d+)\) "
                      r"\((0x[0-9a-f]{8})\)")


def section(name: str, node: str, command: str) -> list[str]:
    """Lines printed by `command` on `node` after the capture."""
    lines = (PCAP_DIR / f"{name}.commands.txt").read_text().splitlines()
    header = f"### [after the capture] {node}# {command}"
    if header not in lines:
        return []
    start = lines.index(header) + 1
    out = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("###"):
            break
        out.append(line)
    return out


def originators(name: str, node: str) -> list[dict]:
    out = []
    for line in section(name, node, "batctl o"):
        m = _O_LINE.match(line)
        if m:
            out.append({"best": m[1] == "*", "orig": m[2], "last_seen": float(m[3]), "tq": int(m[4]),
                        "next_hop": m[5], "iface": m[6]})
        m = _O_LINE_V.match(line)
        if m:  # B.A.T.M.A.N. V: throughput in Mbit/s with one decimal
            out.append({"best": m[1] == "*", "orig": m[2], "last_seen": float(m[3]),
                        "throughput_mbit": float(m[4]), "next_hop": m[5], "iface": m[6]})
    return out


def global_tt(name: str, node: str) -> list[dict]:
    out = []
    for line in section(name, node, "batctl tg"):
        m = _TG_LINE.match(line)
        if m:
            vid = int(m[3])
            out.append({"best": m[1] == "*", "client": m[2], "vid": 0 if vid == -1 else 0x8000 | vid,
                        "flags": m[4], "last_ttvn": int(m[5]), "via": m[6], "orig_ttvn": int(m[7]), "crc": int(m[8], 16)})
    return out
