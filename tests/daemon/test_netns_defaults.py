"""One daemon per mesh interface per network namespace, as the kernel has one bat0 per
namespace: two nodes started the way a new user starts them (`ip netns exec nX batmand -m
bat0 -i eth0`, no other option) both run, `ip netns exec nX batmanctl` reaches nX's daemon,
and each keeps its own seqno state."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.daemon.labs import wait_for
from tests.netns import in_netns, ip, namespace

BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]
STATE_DIR = Path("/var/lib/batmand")  # the default


def _start(ns: str, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")
    try:
        return subprocess.Popen(in_netns(ns, [*BATMAND, "-m", "bat0", "-i", "eth0"]), stdout=log,
                                stderr=subprocess.STDOUT)
    finally:
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ctl(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(in_netns(ns, [*BATMANCTL, *args]), capture_output=True, text=True, timeout=30)


def _mac(ns: str, ifname: str) -> str:
    return json.loads(ip("-j", "link", "show", ifname, netns=ns))[0]["address"]


@contextlib.contextmanager
def _two_nodes():
    with namespace() as n1, namespace() as n2:
        ip("link", "add", "eth0", "netns", n1, "type", "veth", "peer", "name", "eth0", "netns", n2)
        for ns in (n1, n2):
            ip("link", "set", "eth0", "mtu", "1560", "up", netns=ns)
        yield n1, n2


def test_two_namespaces_with_default_paths(tmp_path):
    procs = []
    with _two_nodes() as (n1, n2):
        state_files = [STATE_DIR / f"bat0.{_mac(ns, 'eth0').replace(':', '')}.state" for ns in (n1, n2)]
        try:
            for i, ns in enumerate((n1, n2)):
                procs.append(_start(ns, tmp_path / f"n{i + 1}.log"))
            wait_for(lambda: all(_ctl(ns, "if").returncode == 0 for ns in (n1, n2)), timeout=20)
            assert all(p.poll() is None for p in procs), "a daemon exited"
            # each namespace's batmanctl reaches its own daemon, which sees the other node
            for ns, other in ((n1, n2), (n2, n1)):
                assert _ctl(ns, "if").stdout.split() == ["eth0:", "active"]
                wait_for(lambda: any(r["orig_address"] == _mac(other, "eth0")
                                     for r in json.loads(_ctl(ns, "o", "--json").stdout or "[]")), timeout=15)
            # a second daemon for bat0 in the same namespace is refused, naming why
            second = subprocess.run(in_netns(n1, [*BATMAND, "-m", "bat0", "-i", "eth0"]), capture_output=True,
                                    text=True, timeout=30)
            assert second.returncode == 1
            assert "another batmand already runs bat0 in this network namespace" in second.stderr
            assert procs[0].poll() is None and _ctl(n1, "if").returncode == 0
            # a namespace without a daemon says so
            with namespace() as empty:
                out = _ctl(empty, "o")
            assert out.returncode == 1 and "no batmand running for bat0 in this network namespace" in out.stderr
        finally:
            for proc in procs:
                _stop(proc)
        try:
            # each node saved its own seqnos, named by its originator address
            for path, ns in zip(state_files, (n1, n2)):
                saved = json.loads(path.read_text())
                assert saved["originator"] == _mac(ns, "eth0")
            # and continues its own sequence on restart, not the other node's
            restarted = _start(n1, tmp_path / "n1-again.log")
            try:
                wait_for(lambda: _ctl(n1, "if").returncode == 0, timeout=20)
            finally:
                _stop(restarted)
            log = (tmp_path / "n1-again.log").read_text()
            assert f"continuing the sequence numbers saved in {state_files[0]}" in log
            assert str(state_files[1]) not in log
        finally:
            for path in state_files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
