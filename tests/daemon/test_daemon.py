"""The daemon process itself: start-up, warnings, one daemon per mesh interface, run-time
interfaces, clean shutdown. Real namespaces, veths and TAPs."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.daemon.labs import wait_for
from tests.netns import in_netns, ip, namespace

BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]


@pytest.fixture
def node(tmp_path):
    """A namespace with two veth pairs (e0/p0, e1/p1) and a way to run batmand in it."""
    with namespace() as ns:
        for n, mtu in ((0, 1560), (1, 1400)):
            ip("link", "add", f"e{n}", "mtu", str(mtu), "type", "veth", "peer", "name", f"p{n}", "mtu", str(mtu), netns=ns)
            ip("link", "set", f"p{n}", "up", netns=ns)
        sock = str(tmp_path / "bat0.sock")
        procs = []

        def start(*args):
            log = open(tmp_path / f"log{len(procs)}", "w+")
            proc = subprocess.Popen(in_netns(ns, BATMAND + ["--control-socket", sock, *args]), stdout=log,
                                    stderr=subprocess.STDOUT, text=True)
            procs.append((proc, log))
            return proc, log

        def ctl(*args):
            return subprocess.run(in_netns(ns, BATMANCTL + ["--socket", sock, *args]), capture_output=True, text=True,
                                  timeout=30)

        try:
            yield ns, sock, start, ctl
        finally:
            for proc, log in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                log.close()


def _read(log) -> str:
    log.flush()
    log.seek(0)
    return log.read()


def test_lifecycle(node):
    ns, sock, start, ctl = node
    proc, log = start("-i", "e0", "-i", "e1")
    wait_for(lambda: os.path.exists(sock), timeout=15)
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    # the kernel's advice for the 1400-byte interface, and none for the 1560-byte one
    wait_for(lambda: "MTU of interface e1 is too small (1400)" in _read(log), timeout=5)
    assert "interface e0" in _read(log) and "MTU of interface e0" not in _read(log)
    links = ip("-j", "link", "show", netns=ns)
    assert "bat0" in links
    bat0 = json.loads(ip("-j", "link", "show", "bat0", netns=ns))[0]
    assert bat0["mtu"] == 1500 and int(bat0["address"][:2], 16) & 0x02  # locally administered
    # one daemon per mesh interface
    second, second_log = start("-i", "e0")
    assert second.wait(timeout=15) == 1
    assert "another batmand already runs bat0" in _read(second_log)
    # the first interface is primary; removing it moves the originator to the next one
    e0 = json.loads(ip("-j", "link", "show", "e0", netns=ns))[0]["address"]
    e1 = json.loads(ip("-j", "link", "show", "e1", netns=ns))[0]["address"]
    assert f"MainIF/MAC: e0/{e0}" in ctl("o").stdout
    assert ctl("if", "del", "e0").returncode == 0
    assert f"MainIF/MAC: e1/{e1}" in ctl("o").stdout
    assert ctl("if").stdout.strip() == "e1: active"
    assert ctl("if", "add", "e0").returncode == 0
    assert ctl("if").stdout.split() == ["e1:", "active", "e0:", "active"]
    bad = ctl("if", "add", "nonexistent0")
    assert bad.returncode == 1 and "no such interface: nonexistent0" in bad.stderr
    # SIGTERM: clean exit, TAP and control socket gone
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert "bat0" not in ip("-j", "link", "show", netns=ns)
    assert not os.path.exists(sock)
    gone = ctl("o")
    assert gone.returncode == 1 and "no batmand running" in gone.stderr


def test_bad_options_are_clear_errors(node):
    ns, sock, start, ctl = node
    proc, log = start("--set", "hop_penalty=lots")
    assert proc.wait(timeout=15) == 2
    assert "hop_penalty: expected an integer" in _read(log)
    proc, log = start("-i", "nosuch0")
    assert proc.wait(timeout=15) == 1
    assert "no such interface: nosuch0" in _read(log)
    assert "bat0" not in ip("-j", "link", "show", netns=ns)


def test_settings_over_the_control_socket(node):
    ns, sock, start, ctl = node
    start("-i", "e0")
    wait_for(lambda: os.path.exists(sock), timeout=15)
    assert ctl("it").stdout.strip() == "1000" and ctl("hp").stdout.strip() == "30"
    assert ctl("ag").stdout.strip() == "enabled"
    assert ctl("it", "250").returncode == 0 and ctl("it").stdout.strip() == "250"
    assert ctl("ag", "0").returncode == 0 and ctl("ag").stdout.strip() == "disabled"
    assert ctl("hp", "300").returncode != 0
    ra = ctl("ra").stdout
    assert "bat0: BATMAN_IV" in ra and "BATMAN_IV" in ra


def _raw_request(ns, sock, payload: bytes, user: str | None = None) -> bytes:
    code = ("import socket,sys\n"
            "s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "try:\n    s.sendall(sys.stdin.buffer.read()); s.shutdown(socket.SHUT_WR)\n"
            "except BrokenPipeError:\n    pass\n"
            "sys.stdout.write(s.makefile('rb').read().decode())\n")
    # the system python: an unprivileged user cannot reach the venv's interpreter under /root
    argv = ["/usr/bin/python3", "-c", code, sock]
    if user:
        argv = ["setpriv", f"--reuid={user}", "--regid=65534", "--clear-groups"] + argv
    return subprocess.run(in_netns(ns, argv), input=payload, capture_output=True, timeout=30).stdout


def test_control_socket_is_guarded(node):
    ns, _, start, ctl = node
    # a directory everyone may enter, so that only the socket itself guards the daemon
    import tempfile
    shared = tempfile.mkdtemp(prefix="bmd-guard-")
    os.chmod(shared, 0o755)
    sock = os.path.join(shared, "bat0.sock")
    proc, log = start("-i", "e0", "--control-socket", sock)
    wait_for(lambda: os.path.exists(sock), timeout=15)
    # malformed requests get an error (and one log line), the connection stays usable
    out = _raw_request(ns, sock, b"{not json\n" + b"[1,2]\n" + b'{"cmd": "mesh_info"}\n')
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["ok"] for x in lines] == [False, False, True]
    assert _read(log).count("malformed request") == 1
    # a request over the size limit ends the connection with an error
    out = _raw_request(ns, sock, b'{"cmd": "' + b"x" * 100_000 + b'"}\n')
    assert b"larger than" in out
    # another (unprivileged) user may not talk to the daemon: the socket is 0600, and with
    # the file mode out of the way the peer-credential check still refuses
    os.chmod(sock, 0o666)
    os.chmod(sock, 0o600)
    assert _raw_request(ns, sock, b'{"cmd": "mesh_info"}\n', user="nobody") == b""  # the file mode refuses
    os.chmod(sock, 0o666)
    out = _raw_request(ns, sock, b'{"cmd": "mesh_info"}\n', user="nobody")
    assert b"permission denied" in out
    assert proc.poll() is None
    proc.terminate()
    proc.wait(timeout=15)
    os.rmdir(shared) if not os.listdir(shared) else None
