"""batmanctl's daemon commands: batctl's formats (pure functions, checked against the
sample lines of the batctl research notes) and the client against a real unix-socket
server speaking the control protocol with canned answers."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from batmand.cli import commands, hosts, tables
from batmand.cli.main import main
from batmand.daemon import options, protocol
from tests.conftest import SHARED

BATCTL_MD = SHARED / "research" / "batctl.md"

INFO = {"version": "2026.2", "algo": "BATMAN_IV", "meshif": "bat0", "meshif_mac": "5e:2a:00:11:22:33",
        "primary_if": "eth0", "primary_mac": "02:ba:de:af:fe:01", "ttvn": 5}
INFO_LINE = "[B.A.T.M.A.N. adv 2026.2, MainIF/MAC: eth0/02:ba:de:af:fe:01 (bat0/5e:2a:00:11:22:33 BATMAN_IV)]"
ORIGINATORS = [
    {"orig_address": "02:ba:de:af:fe:02", "neigh_address": "02:ba:de:af:fe:02", "hard_ifname": "eth0",
     "hard_ifindex": 2, "last_seen_msecs": 370, "tq": 255, "best": True},
    {"orig_address": "02:ba:de:af:fe:03", "neigh_address": "02:ba:de:af:fe:02", "hard_ifname": "eth0",
     "hard_ifindex": 2, "last_seen_msecs": 1040, "tq": 201, "best": True},
]
ORIGINATORS[1]["best"] = False
TRANSLOCAL = [
    {"tt_address": "5e:2a:00:11:22:33", "tt_vid": -1, "tt_flags": 0x100, "last_seen_msecs": 0,
     "tt_crc32": 0x29E723C0},
    {"tt_address": "8a:11:22:33:44:55", "tt_vid": -1, "tt_flags": 0x10, "last_seen_msecs": 12340,
     "tt_crc32": 0x29E723C0},
]
TRANSGLOBAL = [
    {"tt_address": "8a:11:22:33:44:66", "tt_vid": -1, "tt_flags": 0, "tt_last_ttvn": 5,
     "orig_address": "02:ba:de:af:fe:03", "tt_ttvn": 3, "tt_crc32": 0x1350F3F4, "best": True},
]

# sample lines of batctl.md §4, copied byte for byte (test_samples_are_the_notes_lines checks)
SAMPLE_O = [
    "   Originator        last-seen (#/255) Nexthop           [outgoingIF]",
    " * 02:ba:de:af:fe:02    0.370s   (255) 02:ba:de:af:fe:02 [      eth0]",
    "   02:ba:de:af:fe:03    1.040s   (201) 02:ba:de:af:fe:02 [      eth0]",
]
SAMPLE_O_V = [
    "   Originator        last-seen ( throughput)  Nexthop           [outgoingIF]",
    " * 02:ba:de:af:fe:03    0.560s (     9000.0) 02:ba:de:af:fe:02 [      eth0]",
]
SAMPLE_N = ["IF             Neighbor              last-seen", "         eth0\t  02:ba:de:af:fe:02    0.370s"]
SAMPLE_N_V = ["         Neighbor   last-seen      speed           IF",
              "02:ba:de:af:fe:02    0.370s (    10000.0) [      eth0]"]
SAMPLE_TL = [
    "Client             VID Flags    Last seen (CRC       )",
    "5e:2a:00:11:22:33   -1 [.P....]   0.000   (0x29e723c0)",
    "8a:11:22:33:44:55   -1 [....W.]  12.340   (0x29e723c0)",
]
SAMPLE_TG = [
    "   Client             VID Flags Last ttvn     Via        ttvn  (CRC       )",
    " * 8a:11:22:33:44:66   -1 [....] (  3) 02:ba:de:af:fe:03 (  5) (0x1350f3f4)",
]
SAMPLE_IF = ["eth0: active", "wlan0-mesh: inactive"]
SAMPLE_RA = [
    "Active routing protocol configuration:",
    " * bat0: BATMAN_IV",
    "",
    "Selected routing algorithm (used when next batX interface is created):",
    " => BATMAN_IV",
    "",
    "Available routing algorithms:",
    " * BATMAN_IV",
    " * BATMAN_V",
]
SAMPLE_S = ["\ttx: 14", "\ttx_bytes: 1316"]
SAMPLE_PING = [
    "PING 02:ba:de:af:fe:03 (02:ba:de:af:fe:03) 20(48) bytes of data",
    "20 bytes from 02:ba:de:af:fe:03 icmp_seq=1 ttl=50 time=1.21 ms",
    "--- 02:ba:de:af:fe:03 ping statistics ---",
    "1 packets transmitted, 1 received, 0% packet loss",
    "rtt min/avg/max/mdev = 1.210/1.210/1.210/0.000 ms",
]
SAMPLE_TR = [
    "traceroute to 02:ba:de:af:fe:03 (02:ba:de:af:fe:03), 50 hops max, 20 byte packets",
    " 1: 02:ba:de:af:fe:02  0.512 ms  0.433 ms  0.401 ms",
    " 2: 02:ba:de:af:fe:03  1.020 ms  0.980 ms  0.951 ms",
]


@pytest.fixture(autouse=True)
def no_bat_hosts(monkeypatch):
    """Tests see no bat-hosts file of the machine or the user."""
    monkeypatch.setattr(hosts, "BAT_HOSTS_PATHS", ())
    monkeypatch.delenv("BATMAND_SOCKET", raising=False)


# ---------------------------------------------------------------------------------------
# formats (pure)


@pytest.mark.skipif(not BATCTL_MD.is_file(), reason="research notes not present")
def test_samples_are_the_notes_lines():
    text = BATCTL_MD.read_text().splitlines()
    samples = (SAMPLE_O + SAMPLE_O_V + SAMPLE_N + SAMPLE_N_V + SAMPLE_TL + SAMPLE_TG + SAMPLE_IF
               + [line for line in SAMPLE_RA if line] + SAMPLE_S + SAMPLE_TR + [INFO_LINE])
    for line in samples:
        assert line in text, line
    joined = "\n".join(text)
    for line in SAMPLE_PING:
        assert line in joined, line


def test_info_header_and_disabled():
    assert tables.info_line(INFO) == INFO_LINE
    assert tables.info_line(INFO, extra=tables.translocal_extra(INFO)) == INFO_LINE[:-1] + ", TTVN: 5]"
    disabled = dict(INFO, primary_if=None, primary_mac=None)
    assert tables.header_lines(disabled, "ignored") == ["BATMAN mesh bat0 disabled"]
    assert tables.info_line({"meshif_mac": "5e:2a:00:11:22:33"}, "bat7") == "BATMAN mesh bat7 disabled"


def test_originators_iv_and_v_as_batctl():
    assert [tables.originators_header("BATMAN_IV")] + tables.originators_lines(ORIGINATORS) == SAMPLE_O
    row = {"orig_address": "02:ba:de:af:fe:03", "neigh_address": "02:ba:de:af:fe:02", "hard_ifname": "eth0",
           "last_seen_msecs": 560, "throughput": 9000000, "best": True}
    assert [tables.originators_header("BATMAN_V"), tables.originator_line(row)] == SAMPLE_O_V
    # -t hides old entries; long interface names and large ages are not cut (printf widths)
    assert len(tables.originators_lines(ORIGINATORS, max_age=1.0)) == 1
    old = dict(ORIGINATORS[0], last_seen_msecs=123456789, tq=7, hard_ifname="a-very-long-ifname")
    assert tables.originator_line(old) == \
        " * 02:ba:de:af:fe:02 123456.789s   (  7) 02:ba:de:af:fe:02 [a-very-long-ifname]"


def test_neighbors_iv_and_v_as_batctl():
    row = {"neigh_address": "02:ba:de:af:fe:02", "hard_ifname": "eth0", "hard_ifindex": 2, "last_seen_msecs": 370}
    assert [tables.neighbors_header("BATMAN_IV"), tables.neighbor_line(row)] == SAMPLE_N
    assert [tables.neighbors_header("BATMAN_V"), tables.neighbor_line(dict(row, throughput=10000000))] == SAMPLE_N_V


def test_translation_tables_as_batctl():
    assert [tables.TRANSLOCAL_HEADER] + [tables.translocal_line(r) for r in TRANSLOCAL] == SAMPLE_TL
    assert [tables.TRANSGLOBAL_HEADER] + [tables.transglobal_line(r) for r in TRANSGLOBAL] == SAMPLE_TG


def test_translation_table_flags_vids_and_filters():
    every = 0x02 | 0x100 | 0x200 | 0x400 | 0x10 | 0x20
    row = {"tt_address": "33:33:00:00:00:01", "tt_vid": 10, "tt_flags": every, "tt_crc32": 0xAB}
    assert tables.translocal_line(row) == "33:33:00:00:00:01   10 [RPNXWI]   0.000   (0x000000ab)"
    grow = dict(row, tt_flags=0x02 | 0x10 | 0x20 | 0x800, tt_ttvn=200, tt_last_ttvn=255,
                orig_address="02:00:00:00:00:09", best=False)
    assert tables.transglobal_line(grow) == \
        "   33:33:00:00:00:01   10 [RWIT] (200) 02:00:00:00:00:09 (255) (0x000000ab)"
    rows = TRANSLOCAL + [row]
    assert tables.tt_filter(rows, multicast_only=True) == [row]
    assert tables.tt_filter(rows, unicast_only=True) == TRANSLOCAL


def test_bat_hosts_names(tmp_path):
    path = tmp_path / "bat-hosts"
    path.write_text("# comment\n02:ba:de:af:fe:02 node2\n\n2:ba:de:af:fe:3\tnode3\nbogus\n")
    names = hosts.load_bat_hosts([str(path)])
    assert names == {"02:ba:de:af:fe:02": "node2", "02:ba:de:af:fe:03": "node3"}
    assert tables.originator_line(ORIGINATORS[0], names) == \
        " *             node2    0.370s   (255)             node2 [      eth0]"
    assert hosts.resolve_destination("node3", names) == "02:ba:de:af:fe:03"
    probes = [{"from": "02:ba:de:af:fe:03", "rtt_ms": 1.0}] * 3
    assert tables.traceroute_hop_line(2, probes, names) == " 2: node3 (02:ba:de:af:fe:03)  1.000 ms  1.000 ms  1.000 ms"


def test_interfaces_statistics_routing_algos_settings():
    assert tables.interfaces_lines([{"hard_ifname": "eth0", "active": True},
                                    {"hard_ifname": "wlan0-mesh", "active": False}]) == SAMPLE_IF
    assert tables.statistics_lines({"tx": 14, "tx_bytes": 1316}) == SAMPLE_S
    ra = {"active": {"bat0": "BATMAN_IV"}, "selected": "BATMAN_IV", "available": ["BATMAN_IV", "BATMAN_V"]}
    assert tables.routing_algos_lines(ra) == SAMPLE_RA
    assert [tables.setting_line(v, True) for v in (1, 0, True, False, "enabled")] == \
        ["enabled", "disabled", "enabled", "disabled", "enabled"]
    assert tables.setting_line(1000) == "1000"
    for value in ("batman tt", ["batman", "tt"], 5):
        lines = tables.loglevel_lines(value)
        assert lines[0] == "[ ] all debug output disabled (none)"
        assert lines[1] == "[x] messages related to routing / flooding / broadcasting (batman)"
        assert lines[3] == "[x] messages related to translation table operations (tt)"
        assert lines[2].startswith("[ ]")
    assert tables.loglevel_lines("none")[0] == "[x] all debug output disabled (none)"
    assert all(line.startswith("[x]") for line in tables.loglevel_lines("all")[1:])


def test_ping_and_traceroute_lines_as_batctl():
    printer = tables.PingPrinter("02:ba:de:af:fe:03", "02:ba:de:af:fe:03")
    lines = [tables.ping_header("02:ba:de:af:fe:03", "02:ba:de:af:fe:03")]
    lines += printer.event_lines({"type": "reply", "seqno": 1, "ttl": 50, "rtt_ms": 1.21, "from": "02:ba:de:af:fe:03"})
    lines += tables.ping_statistics_lines("02:ba:de:af:fe:03", 1, 1, printer.rtts)
    assert lines == SAMPLE_PING
    assert printer.event_lines({"type": "timeout", "seqno": 2}) == ["Reply from host 02:ba:de:af:fe:03 timed out"]
    assert printer.event_lines({"type": "unreachable", "seqno": 3, "from": "02:ba:de:af:fe:02"}) == \
        ["From 02:ba:de:af:fe:03: Destination Host Unreachable (icmp_seq 3)"]
    assert printer.event_lines({"type": "ttl_exceeded", "seqno": 4}) == \
        ["From 02:ba:de:af:fe:03: Time to live exceeded (icmp_seq 4)"]
    # batctl's loss is an integer division; mdev the population deviation
    assert tables.ping_statistics_lines("x", 3, 1, [2.0])[1] == "3 packets transmitted, 1 received, 66% packet loss"
    assert tables.ping_statistics_lines("x", 2, 2, [1.0, 3.0])[2] == "rtt min/avg/max/mdev = 1.000/2.000/3.000/1.000 ms"
    assert tables.ping_statistics_lines("x", 2, 0)[2] == "rtt min/avg/max/mdev = 0.000/0.000/0.000/0.000 ms"

    probes = [{"hop": 1, "from": "02:ba:de:af:fe:02", "rtt_ms": r, "kind": "ttl_exceeded"}
              for r in (0.512, 0.433, 0.401)]
    probes2 = [{"hop": 2, "from": "02:ba:de:af:fe:03", "rtt_ms": r, "kind": "reply"} for r in (1.02, 0.98, 0.951)]
    assert [tables.traceroute_header("02:ba:de:af:fe:03", "02:ba:de:af:fe:03"),
            tables.traceroute_hop_line(1, probes), tables.traceroute_hop_line(2, probes2)] == SAMPLE_TR
    timeout = {"hop": 3, "from": None, "rtt_ms": None, "kind": "timeout"}
    assert tables.traceroute_hop_line(3, [timeout] * 3) == " 3: *   *   *   *"
    assert tables.traceroute_hop_line(3, [timeout, probes2[0], timeout]) == \
        " 3: 02:ba:de:af:fe:03   *  1.020 ms   *"


def test_record_route_lines_as_batctl():
    dst = "02:00:00:00:03:01"
    route = ["02:00:00:00:01:01", "02:00:00:00:02:01", dst, "02:00:00:00:02:01"]
    printer = tables.PingPrinter(dst, dst, record_route=True)
    assert tables.ping_header(dst, dst, True) == f"PING {dst} ({dst}) 116(144) bytes of data"
    first = printer.event_lines({"type": "reply", "seqno": 1, "ttl": 48, "rtt_ms": 2.5, "rr": route})
    assert first == [f"116 bytes from {dst} icmp_seq=1 ttl=48 time=2.50 ms", "RR: \t02:00:00:00:01:01",
                     "\t02:00:00:00:02:01", f"\t{dst}", f"\t{dst}", "\t02:00:00:00:02:01", ""]
    again = printer.event_lines({"type": "reply", "seqno": 2, "ttl": 48, "rtt_ms": 2.0, "rr": route})
    assert again == [f"116 bytes from {dst} icmp_seq=2 ttl=48 time=2.00 ms\t(same route)"]


def test_destinations():
    assert hosts.parse_mac("2:BA:de:af:fe:3") == "02:ba:de:af:fe:03"
    assert hosts.parse_mac("02-ba-de-af-fe-03") == "02:ba:de:af:fe:03"
    assert hosts.parse_mac("10.0.0.1") is None
    assert hosts.parse_ip_neigh("10.0.0.3 dev bat0 lladdr 5E:2A:00:11:22:44 REACHABLE\n") == "5e:2a:00:11:22:44"
    assert hosts.parse_ip_neigh("10.0.0.3 dev bat0 FAILED\n") is None
    assert not hosts.is_valid_unicast("33:33:00:00:00:01") and not hosts.is_valid_unicast("00:00:00:00:00:00")
    assert hosts.is_valid_unicast("02:00:00:00:00:01")


# ---------------------------------------------------------------------------------------
# a daemon on a real unix socket


class FakeDaemon:
    """Speaks batmand's control protocol with canned answers: `answers[cmd]` is a result,
    or a function (args, send) that sends the lines itself (events, then the final one)."""

    def __init__(self, path: str, answers: dict):
        self.path = path
        self.answers = answers
        self.requests: list[dict] = []
        daemon = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                line = self.rfile.readline()
                if not line:
                    return
                message = protocol.decode(line)
                daemon.requests.append(message)

                def send(obj):
                    self.wfile.write(protocol.encode(obj))
                    self.wfile.flush()

                answer = daemon.answers.get(message["cmd"])
                try:
                    if answer is None:
                        send({"ok": False, "error": f"unknown command {message['cmd']!r}"})
                    elif callable(answer):
                        answer(message.get("args", {}), send)
                    else:
                        send({"ok": True, "result": answer})
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def commands(self) -> list[str]:
        return [r["cmd"] for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sockdir():
    with tempfile.TemporaryDirectory(prefix="bm", dir="/tmp") as d:  # short: sun_path has 108 bytes
        yield d


@pytest.fixture
def daemon(sockdir):
    answers = {"mesh_info": INFO, "originators": ORIGINATORS, "neighbors": [], "transtable_local": TRANSLOCAL,
               "transtable_global": TRANSGLOBAL, "interfaces": [{"hard_ifname": "eth0", "hard_ifindex": 2,
                                                                 "active": True, "mac": "02:ba:de:af:fe:01",
                                                                 "mtu": 1560}],
               "statistics": {"tx": 14, "tx_bytes": 1316, "drop_no_route": 2},
               "routing_algos": {"active": {"bat0": "BATMAN_IV"}, "selected": "BATMAN_IV",
                                 "available": ["BATMAN_IV"]}}
    d = FakeDaemon(os.path.join(sockdir, "bat0.sock"), answers)
    yield d
    d.close()


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tables_through_the_socket(daemon, capsys):
    rc, out, err = run(capsys, "--socket", daemon.path, "o")
    assert rc == 0 and err == ""
    assert out.splitlines() == [INFO_LINE] + SAMPLE_O
    rc, out, _ = run(capsys, "--socket", daemon.path, "translocal")
    assert out.splitlines() == [INFO_LINE[:-1] + ", TTVN: 5]"] + SAMPLE_TL
    rc, out, _ = run(capsys, "--socket", daemon.path, "tg")
    assert out.splitlines() == [INFO_LINE] + SAMPLE_TG
    rc, out, _ = run(capsys, "--socket", daemon.path, "n")
    assert out.splitlines() == [INFO_LINE, tables.NEIGHBORS_HEADER_IV]  # the header even without rows
    rc, out, _ = run(capsys, "--socket", daemon.path, "if")
    assert out == "eth0: active\n"
    rc, out, _ = run(capsys, "--socket", daemon.path, "s")
    assert out == "\ttx: 14\n\ttx_bytes: 1316\n\tdrop_no_route: 2\n"
    rc, out, _ = run(capsys, "--socket", daemon.path, "ra")
    assert out.splitlines()[:2] == ["Active routing protocol configuration:", " * bat0: BATMAN_IV"]
    assert daemon.requests[0] == {"cmd": "mesh_info", "args": {}}


def test_no_header_and_json(daemon, capsys):
    rc, out, _ = run(capsys, "--socket", daemon.path, "o", "-H")
    assert rc == 0 and out.splitlines() == SAMPLE_O[1:]
    rc, out, _ = run(capsys, "--socket", daemon.path, "tl", "-H")
    assert out.splitlines() == SAMPLE_TL[1:]
    assert daemon.commands()[-1] == "transtable_local" and daemon.commands()[-2] != "mesh_info"
    rc, out, _ = run(capsys, "--socket", daemon.path, "originators", "--json")
    assert rc == 0 and len(out.splitlines()) == 1 and json.loads(out) == ORIGINATORS
    assert json.loads(out)[0]["orig_address"] == "02:ba:de:af:fe:02" and json.loads(out)[0]["last_seen_msecs"] == 370
    rc, out, _ = run(capsys, "--socket", daemon.path, "tg", "--json", "-m")
    assert json.loads(out) == []
    rc, out, _ = run(capsys, "--socket", daemon.path, "s", "--json")
    assert json.loads(out)["tx_bytes"] == 1316
    rc, out, _ = run(capsys, "--socket", daemon.path, "if", "--json")
    assert json.loads(out)[0]["hard_ifname"] == "eth0"


def test_disabled_mesh(daemon, capsys):
    daemon.answers["mesh_info"] = dict(INFO, primary_if=None, primary_mac=None)
    rc, out, _ = run(capsys, "--socket", daemon.path, "o")
    assert rc == 1 and out == "BATMAN mesh bat0 disabled\n"
    assert "originators" not in daemon.commands()


def test_watch_reprints_until_ctrl_c(daemon, capsys, monkeypatch):
    pauses = []

    def pause(seconds):
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(commands, "sleep", pause)
    rc, out, _ = run(capsys, "--socket", daemon.path, "o", "-w", "0.5")
    assert rc == 0 and pauses == [0.5, 0.5]
    assert out.count(commands.CLEAR_SCREEN) == 2 and out.count(SAMPLE_O[1]) == 2
    assert daemon.commands().count("originators") == 2
    pauses.clear()
    rc, out, _ = run(capsys, "--socket", daemon.path, "s", "-w")
    assert pauses == [1.0, 1.0] and out.count("\ttx: 14") == 2


def test_no_daemon(sockdir, capsys, monkeypatch):
    path = os.path.join(sockdir, "none.sock")
    rc, out, err = run(capsys, "--socket", path, "o")
    assert rc == 1 and out == ""
    assert err == f"batmanctl: no batmand running for bat0 ({path}: No such file or directory)\n"
    # a socket file that nobody listens on any more
    stale = os.path.join(sockdir, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    rc, out, err = run(capsys, "-m", "bat1", "--socket", stale, "ping", "02:00:00:00:00:01")
    assert rc == 1 and err == f"batmanctl: no batmand running for bat1 ({stale}: Connection refused)\n"


def test_socket_from_environment(daemon, sockdir, capsys, monkeypatch):
    monkeypatch.setenv("BATMAND_SOCKET", daemon.path)
    rc, out, _ = run(capsys, "if")
    assert rc == 0 and out == "eth0: active\n"
    rc, out, _ = run(capsys, "--socket", os.path.join(sockdir, "x.sock"), "if")  # --socket wins
    assert rc == 1
    monkeypatch.delenv("BATMAND_SOCKET")
    assert commands.socket_path("bat3") == protocol.default_socket_path("bat3") == "@batmand/bat3"


def test_daemon_error(daemon, capsys):
    daemon.answers["get"] = lambda args, send: send({"ok": False, "error": f"no setting {args['setting']}"})
    rc, out, err = run(capsys, "--socket", daemon.path, "it")
    assert rc == 1 and out == "" and err == "batmanctl: no setting orig_interval\n"
    del daemon.answers["neighbors"]
    rc, out, err = run(capsys, "--socket", daemon.path, "n")
    assert rc == 1 and err == "batmanctl: unknown command 'neighbors'\n"


def test_settings(daemon, capsys):
    values = {"orig_interval": 1000, "hop_penalty": 30, "aggregation": True, "fragmentation": 0}
    daemon.answers["get"] = lambda args, send: send({"ok": True, "result": values[args["setting"]]})

    def set_(args, send):
        values[args["setting"]] = args["value"]
        send({"ok": True, "result": args["value"]})

    daemon.answers["set"] = set_
    assert run(capsys, "--socket", daemon.path, "it")[1] == "1000\n"
    assert run(capsys, "--socket", daemon.path, "hop_penalty")[1] == "30\n"
    assert run(capsys, "--socket", daemon.path, "ag")[1] == "enabled\n"
    assert run(capsys, "--socket", daemon.path, "fragmentation")[1] == "disabled\n"
    assert run(capsys, "--socket", daemon.path, "ag", "disable") == (0, "", "")
    assert run(capsys, "--socket", daemon.path, "it", "0x1f4") == (0, "", "")
    assert run(capsys, "--socket", daemon.path, "hp", "15") == (0, "", "")
    assert values["aggregation"] == 0 and values["orig_interval"] == 500 and values["hop_penalty"] == 15
    assert run(capsys, "--socket", daemon.path, "ag")[1] == "disabled\n"
    rc, _, err = run(capsys, "--socket", daemon.path, "hp", "256")
    assert rc == 1 and "hop_penalty: 256 is out of range (0..255)" in err
    assert run(capsys, "--socket", daemon.path, "f", "enable") == (0, "", "")
    assert values["fragmentation"] == 1
    rc, _, err = run(capsys, "--socket", daemon.path, "f", "maybe")
    assert rc == 1 and "the supplied argument is invalid: maybe" in err
    # multicast_forceflood is the kernel's inverse of multicast_mode (one netlink value)
    values["multicast_mode"] = True
    assert run(capsys, "--socket", daemon.path, "mff")[1] == "disabled\n"
    assert run(capsys, "--socket", daemon.path, "mff", "1") == (0, "", "")
    assert values["multicast_mode"] == 0 and run(capsys, "--socket", daemon.path, "mm")[1] == "disabled\n"
    assert run(capsys, "--socket", daemon.path, "mff")[1] == "enabled\n"
    # batctl's loglevel words as the daemon's value (for when batmand has a debug log)
    assert commands.loglevel_value(["tt", "batman"]) == "batman tt"
    assert commands.loglevel_value(["all"]) == "all" and commands.loglevel_value(["none", "tt"]) == "none"
    with pytest.raises(commands.UsageError, match="unknown log level: loud"):
        commands.loglevel_value(["loud"])


def test_settings_batmand_lacks_say_so(daemon, capsys):
    """batctl's ap, b and ll exist, and say that batmand does not implement
    them yet: neither a value read (it would look like a switch that works) nor a value set
    (users would believe it). The daemon is not asked."""
    daemon.answers["get"] = lambda args, send: send({"ok": True, "result": 0})
    daemon.answers["set"] = lambda args, send: send({"ok": True, "result": args["value"]})
    rc, out, err = run(capsys, "--socket", daemon.path, "ap")
    assert (rc, out, err) == (1, "", "Error - ap_isolation: batmand does not implement AP isolation yet "
                                     "(the kernel's default is disabled)\n")
    refused = [s for s in (*commands.SETTINGS, commands.LOGLEVEL) if s.refused]
    assert {s.abbr for s in refused} == {k.spec.batctl[1] for k in options.SETTINGS.values()
                                         if k.spec.batctl and not k.implemented}
    for s in refused:
        for argv in ((s.abbr,), (s.name,), (s.abbr, "1"), (s.abbr, "0")):
            assert run(capsys, "--socket", daemon.path, *argv) == (1, "", f"Error - {s.refused}\n"), argv
        assert s.refused.startswith(f"{s.name}: batmand does not implement ")
    assert run(capsys, "--socket", daemon.path, "ll", "tt", "batman")[0] == 1
    assert daemon.requests == []


def test_setting_ranges_are_the_daemons(daemon, capsys):
    """batmanctl checks a value against the daemon's schema before sending it: the same
    range, and a message naming the setting and the range."""
    daemon.answers["set"] = lambda args, send: send({"ok": True, "result": args["value"]})
    daemon.answers["hardif_set"] = lambda args, send: send({"ok": True, "result": args["value"]})
    daemon.answers["interfaces"] = lambda args, send: send({"ok": True, "result": [{"hard_ifname": "e0"}]})
    refused = [
        (("it", "2147483648"), "orig_interval: 2147483648 is out of range (40..2147483647 ms)"),
        (("it", "39"), "orig_interval: 39 is out of range (40..2147483647 ms)"),
        (("hp", "256"), "hop_penalty: 256 is out of range (0..255)"),
        (("hardif", "e0", "hp", "256"), "hop_penalty: 256 is out of range (0..255)"),
        (("hardif", "e0", "et", "39"), "elp_interval: 39 is out of range (40..2147483647 ms)"),
        (("hardif", "e0", "to", "5tbit"), "throughput_override: expected a throughput"),
        (("hardif", "e0", "to", "500000gbit"), "throughput_override: 500000000000 is out of range"),
    ]
    for argv, message in refused:
        rc, _, err = run(capsys, "--socket", daemon.path, *argv)
        assert rc == 1 and err.startswith(f"Error - {message}"), (argv, err)
    assert "set" not in daemon.commands() and "hardif_set" not in daemon.commands()
    assert run(capsys, "--socket", daemon.path, "it", "2147483647") == (0, "", "")
    assert run(capsys, "--socket", daemon.path, "hardif", "e0", "et", "40") == (0, "", "")
    assert [r["args"]["value"] for r in daemon.requests if r["cmd"] in ("set", "hardif_set")] == [2147483647, 40]


@pytest.mark.parametrize("option,value,message", [
    ("-i", "0.0001", "argument -i: 0.0001 is out of range (0.001..2147483647 s)"),
    ("-i", "1e12", "argument -i: 1000000000000 is out of range (0.001..2147483647 s)"),
    ("-i", "-1", "argument -i: -1 is out of range"),
    ("-i", "nan", "argument -i: expected a finite number"),
    ("-c", "0", "argument -c: 0 is out of range (1..2147483647)"),
    ("-c", "2147483648", "argument -c: 2147483648 is out of range (1..2147483647)"),
    ("-t", "0", "argument -t: 0 is out of range (0.001..2147483647 s)"),
    ("-t", "1.5", "argument -t: expected a whole number, got '1.5'"),
])
def test_ping_options_out_of_range(daemon, capsys, option, value, message):
    assert main(["--socket", daemon.path, "ping", option, value, "02:ba:de:af:fe:03"]) == 1
    assert f"Error - {message}" in capsys.readouterr().err
    assert "ping" not in daemon.commands()


def test_interface_add_del_and_translate(daemon, capsys):
    daemon.answers["if_add"] = lambda args, send: send({"ok": True, "result": []})
    daemon.answers["if_del"] = lambda args, send: send({"ok": False, "error": f"{args['ifname']}: not in the mesh"})
    assert run(capsys, "--socket", daemon.path, "if", "add", "eth1", "eth2") == (0, "", "")
    assert [r["args"] for r in daemon.requests if r["cmd"] == "if_add"] == [{"ifname": "eth1"}, {"ifname": "eth2"}]
    assert run(capsys, "--socket", daemon.path, "interface", "del", "eth9") == \
        (1, "", "Error - failed to delete interface eth9: eth9: not in the mesh\n")
    clients = {"8a:11:22:33:44:66": "02:ba:de:af:fe:03"}

    def translate(args, send):  # batmand's answers: the originator, or an error
        if args["target"] in clients:
            send({"ok": True, "result": {"orig_address": clients[args["target"]]}})
        else:
            send({"ok": False, "error": f"no originator known for {args['target']}"})

    daemon.answers["translate"] = translate
    assert run(capsys, "--socket", daemon.path, "t", "8A:11:22:33:44:66") == (0, "02:ba:de:af:fe:03\n", "")
    # batctl prints an address it cannot translate as it is
    assert run(capsys, "--socket", daemon.path, "translate", "02:00:00:00:00:07") == (0, "02:00:00:00:00:07\n", "")
    daemon.answers["translate"] = {"orig_address": None}
    assert run(capsys, "--socket", daemon.path, "t", "02:00:00:00:00:08") == (0, "02:00:00:00:00:08\n", "")
    rc, _, err = run(capsys, "--socket", daemon.path, "t", "no-such-host.invalid")
    assert rc == 1 and "could not be resolved" in err


class Tee(io.StringIO):
    """stdout that tells the fake daemon when a text has been printed."""

    def __init__(self):
        super().__init__()
        self.seen = threading.Condition()

    def write(self, s):
        with self.seen:
            n = super().write(s)
            self.seen.notify_all()
        return n

    def wait_for(self, text, timeout=2.0) -> bool:
        with self.seen:
            return self.seen.wait_for(lambda: text in self.getvalue(), timeout)


def test_ping_streams_replies_timeouts_and_statistics(daemon, monkeypatch):
    tee = Tee()
    monkeypatch.setattr(sys, "stdout", tee)
    streamed = []
    dst = "02:ba:de:af:fe:03"

    def ping(args, send):
        send({"event": {"type": "reply", "seqno": 1, "ttl": 49, "rtt_ms": 1.5, "from": dst, "rr": []}})
        streamed.append(tee.wait_for("icmp_seq=1 "))  # printed before anything else arrives
        send({"event": {"type": "timeout", "seqno": 2, "ttl": None, "rtt_ms": None, "from": None}})
        streamed.append(tee.wait_for("timed out"))
        send({"event": {"type": "unreachable", "seqno": 3, "ttl": 50, "rtt_ms": 0.3, "from": "02:ba:de:af:fe:02"}})
        send({"ok": True, "result": {"transmitted": 3, "received": 1, "loss_percent": 67, "min": 1.5, "avg": 1.5,
                                     "max": 1.5, "mdev": 0.0}})

    daemon.answers["ping"] = ping
    daemon.answers["translate"] = {"orig_address": dst}
    rc = main(["--socket", daemon.path, "ping", "-c", "3", "-i", "0.2", "-t", "2", dst])
    assert rc == 0 and streamed == [True, True]
    assert tee.getvalue().splitlines() == [
        f"PING {dst} ({dst}) 20(48) bytes of data",
        f"20 bytes from {dst} icmp_seq=1 ttl=49 time=1.50 ms",
        f"Reply from host {dst} timed out",
        f"From {dst}: Destination Host Unreachable (icmp_seq 3)",
        f"--- {dst} ping statistics ---",
        "3 packets transmitted, 1 received, 66% packet loss",
        "rtt min/avg/max/mdev = 1.500/1.500/1.500/0.000 ms",
    ]
    request = next(r for r in daemon.requests if r["cmd"] == "ping")
    assert request["args"] == {"dst": dst, "count": 3, "interval": 0.2, "timeout": 2, "ttl": 50,
                               "record_route": False}


def test_ping_without_reply_and_by_ip(daemon, capsys, tmp_path, monkeypatch):
    arp = tmp_path / "arp"
    arp.write_text("IP address       HW type     Flags       HW address            Mask     Device\n"
                   "10.0.0.9         0x1         0x0         00:00:00:00:00:00     *        bat0\n"
                   "10.0.0.3         0x1         0x2         8a:11:22:33:44:66     *        bat0\n")
    monkeypatch.setattr(hosts, "ARP_TABLE", str(arp))

    def ping(args, send):
        send({"event": {"type": "timeout", "seqno": 1}})
        send({"ok": True, "result": {"transmitted": 1, "received": 0, "loss_percent": 100}})

    daemon.answers["ping"] = ping
    daemon.answers["translate"] = lambda args, send: send({"ok": True, "result": {"orig_address": "02:ba:de:af:fe:03"}})
    rc, out, err = run(capsys, "--socket", daemon.path, "p", "-c", "1", "10.0.0.3")
    assert rc == 1, err
    assert out.splitlines() == [
        "PING 10.0.0.3 (02:ba:de:af:fe:03) 20(48) bytes of data",
        "Reply from host 10.0.0.3 timed out",
        "--- 10.0.0.3 ping statistics ---",
        "1 packets transmitted, 0 received, 100% packet loss",
        "rtt min/avg/max/mdev = 0.000/0.000/0.000/0.000 ms",
    ]
    assert {"cmd": "translate", "args": {"target": "8a:11:22:33:44:66"}} in daemon.requests
    assert next(r for r in daemon.requests if r["cmd"] == "ping")["args"]["dst"] == "02:ba:de:af:fe:03"


def test_ping_record_route_and_no_translate(daemon, capsys):
    dst = "02:ba:de:af:fe:03"
    route = ["02:ba:de:af:fe:01", dst, "02:ba:de:af:fe:01"]

    def ping(args, send):
        assert args["record_route"] is True
        for seqno in (1, 2):
            send({"event": {"type": "reply", "seqno": seqno, "ttl": 50, "rtt_ms": 0.5, "from": dst, "rr": route}})
        send({"ok": True, "result": {"transmitted": 2, "received": 2, "loss_percent": 0, "min": 0.5, "avg": 0.5,
                                     "max": 0.5, "mdev": 0.0}})

    daemon.answers["ping"] = ping
    rc, out, _ = run(capsys, "--socket", daemon.path, "ping", "-R", "-T", "-c", "2", dst)
    assert rc == 0 and "translate" not in daemon.commands()
    assert out.splitlines()[:8] == [
        f"PING {dst} ({dst}) 116(144) bytes of data",
        f"116 bytes from {dst} icmp_seq=1 ttl=50 time=0.50 ms",
        "RR: \t02:ba:de:af:fe:01", f"\t{dst}", f"\t{dst}", "\t02:ba:de:af:fe:01", "",
        f"116 bytes from {dst} icmp_seq=2 ttl=50 time=0.50 ms\t(same route)",
    ]


def test_ping_interrupted_prints_statistics(daemon, capsys, monkeypatch):
    dst = "02:ba:de:af:fe:03"
    printed = threading.Event()  # the client printed the reply line: now Ctrl-C
    real_emit = commands.emit

    def emit(lines):
        real_emit(lines)
        if any("icmp_seq" in line for line in lines):
            printed.set()

    def ping(args, send):
        assert args["count"] == commands.PING_COUNT_FOREVER  # no -c: until Ctrl-C
        send({"event": {"type": "reply", "seqno": 1, "ttl": 50, "rtt_ms": 2.0, "from": dst}})
        printed.wait(5)
        time.sleep(0.5)  # the client is interrupted meanwhile

    monkeypatch.setattr(commands, "emit", emit)
    daemon.answers["ping"] = ping
    daemon.answers["translate"] = {"orig_address": dst}
    timer = threading.Timer(0.0, lambda: (printed.wait(5), _interrupt_main()))
    # Ctrl-C raises KeyboardInterrupt as in a terminal, also when this run was started as a
    # background job (the shell then ignores SIGINT for it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        rc, out, _ = run(capsys, "--socket", daemon.path, "ping", dst)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert rc == 0
    assert out.splitlines()[-3:] == [f"--- {dst} ping statistics ---",
                                      "1 packets transmitted, 1 received, 0% packet loss",
                                      "rtt min/avg/max/mdev = 2.000/2.000/2.000/0.000 ms"]


def _interrupt_main():
    """Ctrl-C: SIGINT to the main thread, which waits in recv() for the next event."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_traceroute(daemon, capsys):
    dst = "02:ba:de:af:fe:03"

    def traceroute(args, send):
        for rtt in (0.512, 0.433, 0.401):
            send({"event": {"type": "probe", "hop": 1, "from": "02:ba:de:af:fe:02", "rtt_ms": rtt,
                            "kind": "ttl_exceeded"}})
        send({"event": {"type": "probe", "hop": 2, "from": None, "rtt_ms": None, "kind": "timeout"}})
        for rtt in (1.02, 0.98):
            send({"event": {"type": "probe", "hop": 2, "from": dst, "rtt_ms": rtt, "kind": "reply"}})
        send({"ok": True, "result": {"hops": 2, "reached": True}})

    daemon.answers["traceroute"] = traceroute
    daemon.answers["translate"] = {"orig_address": dst}
    rc, out, _ = run(capsys, "--socket", daemon.path, "tr", dst)
    assert rc == 0
    assert out.splitlines() == [SAMPLE_TR[0], SAMPLE_TR[1], f" 2: {dst}   *  1.020 ms  0.980 ms"]
    assert next(r for r in daemon.requests if r["cmd"] == "traceroute")["args"]["dst"] == dst

    def unreachable(args, send):
        send({"event": {"type": "probe", "hop": 1, "from": "02:ba:de:af:fe:02", "rtt_ms": 0.1, "kind": "unreachable"}})
        send({"ok": True, "result": {"hops": 1, "reached": False}})

    daemon.answers["traceroute"] = unreachable
    rc, out, _ = run(capsys, "--socket", daemon.path, "traceroute", "-T", dst)
    assert rc == 1 and out.splitlines()[-1] == f"{dst}: Destination Host Unreachable"


def test_meshif_prefix_and_entry_point(daemon):
    env = dict(os.environ, BATMAND_SOCKET=daemon.path)
    result = subprocess.run([sys.executable, "-m", "batmand.cli.main", "meshif", "bat0", "o", "-H", "-n"],
                            capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == SAMPLE_O[1:]
