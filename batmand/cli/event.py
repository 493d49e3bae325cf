"""batctl event|e: what the mesh interfaces of this namespace report (also those created
after it started), as batctl prints the
kernel's generic-netlink events (event.c): settings changed (set mesh / set hardif), a
throughput meter's result; plus the uevents (gateway add/change/del), which batctl does not
show (the kernel sends them to udev), in the form `bat0: uevent gw add MAC`."""

from __future__ import annotations

import queue
import threading
import time

from . import grammar, tables
from .client import Client, ControlError, socket_path
from .commands import client_for, dumps, emit

BOOL = ("disabled", "enabled")  # batctl's u8_to_boolstr


def _mbit(value) -> str:
    """A value in 100 kbit/s as batctl prints it: %u.%01u MBit/s."""
    value = int(value or 0)
    return "%u.%01u MBit/s" % (value // 10, value % 10)


def set_mesh_lines(event: dict) -> list[str]:
    """batctl's event_parse_set_mesh: the attributes it knows, in its order. Our bandwidths are
    in kbit/s; the kernel's attributes in 100 kbit/s."""
    s = event.get("settings") or {}
    lines = [f"{event.get('meshif')}: set mesh:"]

    def flag(key, label):
        if key in s:
            lines.append(f"* {label} {BOOL[bool(s[key])]}")

    flag("aggregation", "aggregated_ogms")
    flag("bridge_loop_avoidance", "bridge_loop_avoidance")
    flag("distributed_arp_table", "distributed_arp_table")
    flag("fragmentation", "fragmentation")
    if "gw_bandwidth_down" in s:
        lines.append(f"* gw_bandwidth_down {_mbit(int(s['gw_bandwidth_down']) // 100)}")
    if "gw_bandwidth_up" in s:
        lines.append(f"* gw_bandwidth_up {_mbit(int(s['gw_bandwidth_up']) // 100)}")
    if "gw_mode" in s:
        lines.append(f"* gw_mode {s['gw_mode']}")
    if s.get("gw_sel_class") is not None:
        if event.get("algo") == "BATMAN_V":
            lines.append(f"* gw_sel_class {_mbit(s['gw_sel_class'])}")
        else:
            lines.append(f"* gw_sel_class {int(s['gw_sel_class'])}")
    if "hop_penalty" in s:
        lines.append(f"* hop_penalty {int(s['hop_penalty'])}")
    if "multicast_fanout" in s:
        lines.append(f"* multicast_fanout {int(s['multicast_fanout'])}")
    if "multicast_mode" in s:
        lines.append(f"* multicast_forceflood {BOOL[not s['multicast_mode']]}")
    if "orig_interval_ms" in s:
        lines.append(f"* orig_interval {int(s['orig_interval_ms'])} ms")
    return lines


def set_hardif_lines(event: dict) -> list[str]:
    s = event.get("settings") or {}
    lines = [f"{event.get('meshif')} ({event.get('hardif')}): set hardif:"]
    if "hop_penalty" in s:
        lines.append(f"* hop_penalty {int(s['hop_penalty'])}")
    if "elp_interval" in s:
        lines.append(f"* elp_interval {int(s['elp_interval'])} ms")
    if "throughput_override" in s:  # ours in kbit/s
        lines.append(f"* throughput_override {_mbit(int(s['throughput_override']) // 100)}")
    return lines


FORMATS = {"set_mesh": set_mesh_lines, "set_hardif": set_hardif_lines}


def event_lines(event: dict) -> list[str]:
    kind = event.get("kind")
    if kind in FORMATS:
        return FORMATS[kind](event)
    return [tables.event_line(event)]


RESCAN = 2.0  # seconds between looks for mesh interfaces that came up


class Follower:
    """The event streams of the namespace's mesh interfaces, one reader thread each, opened
    as the interfaces appear and dropped as they go: batctl event listens to the kernel's
    multicast group and so hears every batX, also one created after it started."""

    def __init__(self, args) -> None:
        self.args = args
        self.arrived: queue.Queue = queue.Queue()
        self.streams: dict[str, object] = {}

    def refresh(self) -> None:
        for meshif in grammar.meshes_to_ask(self.args.meshif, self.args.socket):  # batctl event is global
            if meshif in self.streams:
                continue
            client = client_for(self.args) if self.args.socket else Client(socket_path(meshif), meshif)
            try:
                stream = client.stream("events")
            except ControlError:
                continue  # not (or no longer) there: the next look tries again
            self.streams[meshif] = stream
            threading.Thread(target=self._pump, args=(meshif, stream), daemon=True).start()

    def _pump(self, meshif: str, stream) -> None:
        try:
            for event in stream:
                self.arrived.put((meshif, event))
        except (ControlError, OSError, ValueError):
            pass
        self.arrived.put((meshif, None))

    def events(self):
        """Events as they arrive, until interrupted."""
        next_scan = 0.0
        while True:
            if time.monotonic() >= next_scan:
                self.refresh()
                next_scan = time.monotonic() + RESCAN
            try:
                meshif, event = self.arrived.get(timeout=0.5)  # a bounded wait: Ctrl-C is seen at once
            except queue.Empty:
                continue
            if event is None:
                self.streams.pop(meshif, None)
                continue
            yield event

    def close(self) -> None:
        for stream in self.streams.values():
            stream.interrupt()  # the reader threads end; their streams close themselves


def run_event(args) -> int:
    follower = Follower(args)
    last = time.time()
    try:
        for event in follower.events():
            if args.json:
                emit([dumps(event)])
                continue
            prefix = ""
            now = time.time()
            if args.timestamp or args.relative:  # batctl: the time it printed, not the event's
                shown = now - last if args.relative else now
                last = now
                prefix = "%.6f: " % shown
            lines = event_lines(event)
            emit([prefix + lines[0], *lines[1:]])
    except KeyboardInterrupt:
        follower.close()
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("event", aliases=["e"], help="display events from batmand (settings, throughput "
                                                         "meter, gateway uevents)")
    p.add_argument("-t", dest="timestamp", action="store_true", help="print local timestamp")
    p.add_argument("-r", dest="relative", action="store_true", help="print relative timestamp")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.set_defaults(func=run_event)
