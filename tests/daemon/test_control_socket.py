"""The control socket under hostile or careless clients: ping arguments out of range, a
ping past the 16-bit seqno, JSON nested 100,000 deep, args that are not an object, more
connections than the daemon serves, a connection that sends nothing. Real daemons in
namespaces; the daemon keeps serving after each."""

import contextlib
import os
import sys
import time

import pytest

from batmand.core.ping import PingSession
from batmand.daemon import protocol
from batmand.wire import Mac
from tests.daemon.control_client import RawClient
from tests.daemon.daemons import start, stop
from tests.daemon.labs import wait_for
from tests.netns import ip, namespace

BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
NOBODY = "02:00:00:00:00:09"  # no such originator: every probe is answered "unreachable" at once


@contextlib.contextmanager
def _daemon(ns: str, sock: str, log_path, *args: str):
    proc = start(ns, ["-i", "e0", "--workers", "0", "--control-socket", sock, "--set", "orig_interval_ms=200", *args],
                 log_path)
    try:
        wait_for(lambda: os.path.exists(sock) or proc.poll() is not None, timeout=15)
        assert proc.poll() is None, log_path.read_text()
        yield proc
        assert proc.poll() is None, log_path.read_text()  # still running after the test's abuse
    finally:
        stop(proc)


@pytest.fixture
def node(tmp_path):
    """One daemon on a veth; yields (control socket path, log path)."""
    with namespace() as ns:
        ip("link", "add", "e0", "mtu", "1560", "type", "veth", "peer", "name", "p0", "mtu", "1560", netns=ns)
        ip("link", "set", "p0", "up", netns=ns)
        sock, log_path = str(tmp_path / "bat0.sock"), tmp_path / "batmand.log"
        with _daemon(ns, sock, log_path, "--set", "control_max_request=1048576"):
            yield sock, log_path


def _mesh_info_works(sock: str) -> bool:
    with RawClient(sock) as ctl:
        return ctl.request("mesh_info")[1]["ok"]


# --- ping ----------------------------------------------------------------------------------


def test_a_ping_session_wraps_its_seqno_at_16_bits():
    """batctl's ping without -c goes on past probe 65535: the seqno wraps to 0 (the field
    has 16 bits); nothing may ask for seqno 65536."""
    session = PingSession(dst=Mac(NOBODY), uid=1, count=65_540, interval=0.5, timeout=1.0)
    seqnos, now = [], 0.0
    while len(seqnos) < 65_540:
        seqnos += session.due(now)
        now += 0.5
    assert max(seqnos) == 65_535 and seqnos[:2] == [1, 2]
    assert seqnos[65_533:65_539] == [65_534, 65_535, 0, 1, 2, 3]
    assert session.summary()["transmitted"] == 65_540


def test_ping_replies_are_matched_across_the_seqno_wrap(tmp_path):
    with namespace() as n1, namespace() as n2:
        ip("link", "add", "e0", "netns", n1, "type", "veth", "peer", "name", "e0", "netns", n2)
        for ns in (n1, n2):
            ip("link", "set", "e0", "mtu", "1560", "up", netns=ns)
        s1, s2 = str(tmp_path / "n1.sock"), str(tmp_path / "n2.sock")
        with _daemon(n1, s1, tmp_path / "n1.log"), _daemon(n2, s2, tmp_path / "n2.log"):
            with RawClient(s2) as ctl:
                far = next(i["mac"] for i in ctl.request("interfaces")[1]["result"])
            with RawClient(s1) as ctl:
                # both ways routed: n2 answers
                wait_for(lambda: ctl.request("ping", dst=far, count=1, timeout=0.5)[1]["result"]["received"],
                         timeout=20)
                # a session that starts three probes before the wrap (a batctl ping at probe 65533)
                events, reply = ctl.request("ping", dst=far, count=5, interval=0.05, timeout=2, seqno=65_533)
    assert [(e["type"], e["seqno"]) for e in events] == [("reply", 65_533), ("reply", 65_534), ("reply", 65_535),
                                                         ("reply", 0), ("reply", 1)], events
    assert reply["ok"] and reply["result"]["transmitted"] == 5 and reply["result"]["received"] == 5


BAD_PING_ARGS = [
    ("count", -1, "count: -1 is out of range (1..2147483647)"),
    ("count", 0, "count: 0 is out of range (1..2147483647)"),
    ("count", 2**31, "count: 2147483648 is out of range (1..2147483647)"),
    ("count", 1.5, "count: expected an integer"),
    ("count", True, "count: expected an integer"),
    ("interval", -1, "interval: -1 is out of range (0.001..2147483647 s)"),
    ("interval", 0, "interval: 0 is out of range (0.001..2147483647 s)"),
    ("interval", 1e300, "interval: 1e+300 is out of range (0.001..2147483647 s)"),
    ("interval", "soon", "interval: expected a number"),
    ("timeout", -0.5, "timeout: -0.5 is out of range (0.001..2147483647 s)"),
    ("timeout", 1e300, "timeout: 1e+300 is out of range"),
    ("ttl", 0, "ttl: 0 is out of range (1..255)"),
    ("ttl", 256, "ttl: 256 is out of range (1..255)"),
    ("seqno", 65_536, "seqno: 65536 is out of range (0..65535)"),
    ("record_route", "maybe", "record_route: expected a boolean"),
]


def test_ping_arguments_out_of_range_are_refused(node):
    sock, _ = node
    with RawClient(sock, timeout=5) as ctl:
        for name, value, message in BAD_PING_ARGS:
            events, reply = ctl.request("ping", **{"dst": NOBODY, "count": 2, "interval": 0.01, name: value})
            assert not reply["ok"] and reply["error"].startswith(message), (name, value, reply)
            assert events == []  # refused before any probe
        # NaN and infinity: JSON as Python's json module (and a careless client) writes it
        for name in ("interval", "timeout"):
            for literal in (b"NaN", b"Infinity", b"-Infinity"):
                ctl.send(b'{"cmd": "ping", "args": {"dst": "%s", "count": 2, "%s": %s}}\n'
                         % (NOBODY.encode(), name.encode(), literal))
                reply = ctl.line()
                assert not reply["ok"] and reply["error"].startswith(f"{name}: expected a finite number"), reply
        _, reply = ctl.request("traceroute", dst=NOBODY, timeout=-1)
        assert reply == {"ok": False, "error": "timeout: -1 is out of range (0.001..2147483647 s)"}
        # in range, the same connection still pings
        events, reply = ctl.request("ping", dst=NOBODY, count=2, interval=0.01, ttl=1, seqno=65_535)
        assert [(e["type"], e["seqno"]) for e in events] == [("unreachable", 65_535), ("unreachable", 0)]
        assert reply["ok"] and reply["result"]["transmitted"] == 2


# --- malformed requests ------------------------------------------------------------------------


def test_deeply_nested_json_and_args_that_are_no_object(node):
    sock, log_path = node
    with RawClient(sock) as ctl:
        ctl.send(b"[" * 100_000 + b"]" * 100_000 + b"\n")
        assert ctl.line() == {"ok": False, "error": "bad request: JSON nested too deeply"}
        deep_args = b'{"cmd": "mesh_info", "args": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n"
        ctl.send(deep_args)
        assert ctl.line() == {"ok": False, "error": "bad request: JSON nested too deeply"}
        for args, kind in (([1], "list"), ("x", "str"), (7, "int")):
            for cmd in ("mesh_info", "ping", "get", "hardif_set"):
                ctl.send({"cmd": cmd, "args": args})
                reply = ctl.line()
                assert reply == {"ok": False, "error": f"{cmd}: args must be a JSON object, got {kind}"}, reply
        assert ctl.request("mesh_info")[1]["ok"]  # the same connection still serves
    assert _mesh_info_works(sock)
    assert log_path.read_text().count("Traceback") == 0


# --- connections -----------------------------------------------------------------------------


def test_connections_beyond_the_cap_are_refused_politely(node):
    sock, log_path = node
    with contextlib.ExitStack() as held:
        clients = [held.enter_context(RawClient(sock)) for _ in range(protocol.MAX_CLIENTS)]
        for ctl in clients:  # each one served, so the daemon counts it
            assert ctl.request("mesh_info")[1]["ok"]
        for _ in range(3):
            with RawClient(sock) as extra:
                assert extra.line() == {"ok": False, "error": f"batmand serves at most {protocol.MAX_CLIENTS} "
                                                              "control connections at once; try again later"}
                assert extra.line() is None  # and closed
        assert clients[0].request("mesh_info")[1]["ok"]  # the ones it took still work
        clients[0].close()
        wait_for(lambda: _mesh_info_works(sock), timeout=5)  # a freed slot is taken again
    assert log_path.read_text().count("connections open; refusing more") == 1


def test_an_idle_connection_is_closed_and_a_stream_is_not(node):
    sock, _ = node
    with RawClient(sock, timeout=30) as idle, RawClient(sock, timeout=30) as stream:
        started = time.monotonic()
        # a ping that runs longer than the idle timeout: 12 probes a second apart
        count = int(protocol.IDLE_TIMEOUT) + 2
        stream.send({"cmd": "ping", "args": {"dst": NOBODY, "count": count, "interval": 1.0}})
        assert idle.line() == {"ok": False, "error": f"no request for {protocol.IDLE_TIMEOUT:g} s; "
                                                     "connection closed"}
        assert idle.line() is None
        closed_after = time.monotonic() - started
        assert protocol.IDLE_TIMEOUT - 1 <= closed_after <= protocol.IDLE_TIMEOUT + 5
        lines = []
        while not lines or "event" in lines[-1]:
            lines.append(stream.line())
        assert len(lines) == count + 1 and lines[-1]["ok"], lines[-1]
        assert time.monotonic() - started > protocol.IDLE_TIMEOUT
        assert stream.request("mesh_info")[1]["ok"]  # the stream's connection was never cut
