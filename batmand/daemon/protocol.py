"""The control protocol between batmand and batmanctl.

Transport: a SOCK_STREAM unix socket. By default the abstract socket "@batmand/<meshif>":
Linux scopes abstract names to the network namespace, so each namespace has its own
endpoint for its own bat0, as each has its own kernel bat0 (no file, no directory; the
daemon checks every client's credentials). `--control-socket PATH` puts it at a file path
instead; a name starting with "@" is abstract wherever an endpoint is given.
Messages are JSON objects, one per line (UTF-8, "\\n" terminated).

Request:   {"cmd": NAME, "args": {...}}
Response:  {"ok": true, "result": ...}  or  {"ok": false, "error": "message"}
Streaming commands (ping, traceroute) first send any number of {"event": {...}} lines,
then the final {"ok": ...} line. A connection may carry many requests, one after the other.
The daemon serves at most MAX_CLIENTS connections at once (more are answered with an error
and closed) and closes one that sends no request for IDLE_TIMEOUT seconds (a stream in
progress is not idle).

Commands and results (keys follow batctl's netlink/JSON attribute names):
- mesh_info -> {"version", "algo", "meshif", "meshif_mac", "primary_if", "primary_mac", "ttvn"}
- interfaces -> [{"hard_ifname", "hard_ifindex", "active", "mac", "mtu"}]
- originators -> [{"orig_address", "neigh_address", "hard_ifname", "hard_ifindex",
  "last_seen_msecs", "tq", "best"}]  (one row per originator x neighbour)
- neighbors -> [{"neigh_address", "hard_ifname", "hard_ifindex", "last_seen_msecs"}]
- transtable_local -> [{"tt_address", "tt_vid", "tt_flags", "last_seen_msecs", "tt_crc32"}]
- transtable_global -> [{"tt_address", "tt_vid", "tt_flags", "tt_ttvn" (the entry's), "orig_address",
  "tt_last_ttvn" (the originator's current ttvn), "tt_crc32", "best"}]
  tt_vid: -1 for untagged, else the 12-bit VLAN id; tt_flags: the kernel's client flag bits
  (batmand.wire.TtClientFlags: 0x01 DEL, 0x02 ROAM, 0x10 WIFI, 0x20 ISOLA, 0x100 NOPURGE,
  0x200 NEW, 0x400 PENDING, 0x800 TEMP)
- statistics -> {"tx": n, ..., "drop_<reason>": n}  (batctl s names first)
- routing_algos -> {"active": {meshif: algo}, "selected": algo, "available": [algo, ...]}
- get {"setting"} -> value;  set {"setting", "value"} -> value
  setting: any configuration key (batmand.daemon.options.SETTINGS; booleans read as 0/1), or
  batctl's name for it (orig_interval is orig_interval_ms). `set` takes the keys that change
  while running (live), checked against the key's range; the others take effect after a
  restart and are refused. A key of a feature batmand does not implement yet (`feature=` in
  batmand.core.config) is an error for both, naming the key and the kernel's default.
- hardif_get {"ifname", "setting"} / hardif_set {"ifname", "setting", "value"} -> value
  setting: elp_interval (ms), throughput_override (kbit/s), hop_penalty
- translate {"target": MAC} -> {"orig_address": MAC} (an originator itself, or the best
  originator announcing that client MAC)
- if_add {"ifname"} / if_del {"ifname"} -> interfaces
- ping {"dst": MAC, "count", "interval", "timeout", "ttl", "record_route", "seqno"}
  count 1..2**31-1 (default 5), interval and timeout in seconds 0.001..2**31-1 (default 1),
  ttl 1..255 (default 50), seqno: the first probe's (0..65535, default 1; seqnos wrap at 16 bits)
  events: {"type": "reply"|"timeout"|"unreachable"|"ttl_exceeded", "seqno", "ttl", "rtt_ms", "from", "rr": [MAC]}
  result: {"transmitted", "received", "loss_percent", "min", "avg", "max", "mdev"}
- traceroute {"dst": MAC, "timeout"}
  events: {"type": "probe", "hop": n, "from": MAC|null, "rtt_ms": float|null, "kind"}
  result: {"hops": n, "reached": bool}
"""

from __future__ import annotations

import json

ENCODING = "utf-8"


def encode(message: dict) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode(ENCODING) + b"\n"


MAX_CLIENTS = 64
IDLE_TIMEOUT = 10.0  # seconds; batmanctl sends its request right after connecting


def decode(line: bytes) -> dict:
    """A request or answer; ValueError if it is not one (also when nested too deeply for
    the parser)."""
    try:
        message = json.loads(line.decode(ENCODING))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(message, dict):
        raise ValueError("a control message is a JSON object")
    return message


def default_socket_path(meshif: str) -> str:
    return f"@batmand/{meshif}"


def lock_name(meshif: str) -> str:
    """The one-daemon-per-mesh-interface lock of this network namespace: an abstract name
    bound (never listened on) by the running daemon; the kernel frees it when it exits."""
    return f"@batmand/{meshif}.lock"


def is_abstract(endpoint: str) -> bool:
    return endpoint.startswith("@")


def sockaddr(endpoint: str) -> str:
    """The address to bind or connect: "@name" is the abstract name "\\0name"."""
    return "\0" + endpoint[1:] if is_abstract(endpoint) else endpoint
