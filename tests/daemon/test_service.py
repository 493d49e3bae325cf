"""batmand as a system service: the unit, the notify protocol, reload, vanished interfaces,
seqnos across restarts, and running with only CAP_NET_ADMIN + CAP_NET_RAW."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from batmand.daemon.install import sample_config
from tests.daemon.daemons import stop
from tests.daemon.labs import wait_for
from tests.netns import in_netns, ip, namespace

REPO = Path(__file__).resolve().parents[2]
BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    result = subprocess.run([*BATMAND, "install-unit", "--unit-dir", str(tmp_path / "units"),
                             "--config-dir", str(tmp_path / "etc")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "units" / "batmand@.service"
    text = unit.read_text()
    assert "Type=notify" in text and "WatchdogSec=" in text and "CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW" in text
    assert "RestrictAddressFamilies=AF_UNIX AF_NETLINK AF_PACKET AF_INET" in text.splitlines()
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert (tmp_path / "etc" / "batmand.toml.example").read_text() == sample_config()


def test_sample_config_is_current_and_every_key_loads(tmp_path):
    assert (REPO / "systemd" / "batmand.toml.example").read_text() == sample_config()
    mesh_part = sample_config().split("# per hard interface")[0]
    uncommented = "\n".join(line[2:] for line in mesh_part.splitlines()
                            if line.startswith("# ") and "=" in line and not line.startswith("# /")
                            and "Every key" not in line)
    values = tomllib.loads(uncommented)
    assert values["orig_interval_ms"] == 1000 and values["hop_penalty"] == 30
    from batmand.daemon.options import load

    path = tmp_path / "bat0.toml"
    path.write_text(uncommented)
    assert load(["--config", str(path)]).mesh.orig_interval_ms == 1000


@pytest.fixture
def netns_with_veths():
    with namespace() as ns:
        for n in (0, 1):
            ip("link", "add", f"e{n}", "mtu", "1560", "type", "veth", "peer", "name", f"p{n}", "mtu", "1560", netns=ns)
            ip("link", "set", f"p{n}", "up", netns=ns)
        yield ns


def _spawn(ns, args, env=None, prefix=()):
    return subprocess.Popen(in_netns(ns, [*prefix, *BATMAND, *args]), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _ctl(ns, sock, *args):
    return subprocess.run(in_netns(ns, [*BATMANCTL, "--socket", sock, *args]), capture_output=True, text=True,
                          timeout=30)


def _stop(proc):
    """Stop it (by PID); its output."""
    stop(proc)
    return proc.stdout.read()


def test_notify_watchdog_reload_and_stop(netns_with_veths, tmp_path):
    ns = netns_with_veths
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = str(tmp_path / "notify")
    notify.bind(notify_path)
    notify.settimeout(0.2)
    config = tmp_path / "bat0.toml"
    config.write_text('interfaces = ["e0"]\norig_interval_ms = 1000\n')
    sock = str(tmp_path / "bat0.sock")
    env = dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="1000000")
    proc = _spawn(ns, ["--config", str(config), "--control-socket", sock], env=env)
    messages = []

    def received(text):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                messages.append(notify.recv(4096).decode())
            except socket.timeout:
                pass
            if any(text in m for m in messages):
                return True
        return False

    try:
        assert received("READY=1"), messages
        assert any("STATUS=BATMAN_IV, 1 interfaces" in m for m in messages)
        messages.clear()
        assert received("WATCHDOG=1")  # every half watchdog period (0.5 s) at most
        # SIGHUP: a changed key takes effect without a restart
        config.write_text('interfaces = ["e0", "e1"]\norig_interval_ms = 300\n')
        messages.clear()
        proc.send_signal(signal.SIGHUP)
        assert received("RELOADING=1") and received("READY=1")
        assert _ctl(ns, sock, "it").stdout.strip() == "300"
        assert _ctl(ns, sock, "if").stdout.split() == ["e0:", "active", "e1:", "active"]
        messages.clear()
        proc.send_signal(signal.SIGTERM)
        assert received("STOPPING=1")
        assert proc.wait(timeout=15) == 0
    finally:
        output = _stop(proc)
        notify.close()
    assert "configuration reloaded" in output


def test_vanished_interface_is_reattached(netns_with_veths, tmp_path):
    ns = netns_with_veths
    sock = str(tmp_path / "bat0.sock")
    proc = _spawn(ns, ["-i", "e0", "-i", "e1", "--control-socket", sock])
    try:
        wait_for(lambda: _ctl(ns, sock, "if").stdout.split() == ["e0:", "active", "e1:", "active"], timeout=15)
        ip("link", "del", "e1", netns=ns)
        wait_for(lambda: _ctl(ns, sock, "if").stdout.split() == ["e0:", "active"], timeout=10)
        ip("link", "add", "e1", "mtu", "1560", "type", "veth", "peer", "name", "p1", netns=ns)
        wait_for(lambda: _ctl(ns, sock, "if").stdout.split() == ["e0:", "active", "e1:", "active"], timeout=10)
        assert proc.poll() is None
    finally:
        output = _stop(proc)
    assert "interface e1 disappeared" in output and "interface e1 is back" in output


def test_runs_with_only_net_admin_and_net_raw(netns_with_veths, tmp_path):
    """The capability set of the unit, enforced with setpriv (this machine's PID 1 is not
    systemd): the daemon comes up, answers and shuts down cleanly."""
    ns = netns_with_veths
    sock = str(tmp_path / "bat0.sock")
    caps = "-all,+net_admin,+net_raw"
    prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", f"--ambient-caps={caps}"]
    proc = _spawn(ns, ["-i", "e0", "--control-socket", sock], prefix=prefix)
    try:
        wait_for(lambda: _ctl(ns, sock, "if").stdout.strip() == "e0: active", timeout=15)
        status = Path(f"/proc/{_daemon_pid(proc)}/status").read_text()
        effective = int(next(l for l in status.splitlines() if l.startswith("CapEff")).split()[1], 16)
        assert effective == (1 << 12) | (1 << 13)  # CAP_NET_ADMIN | CAP_NET_RAW, nothing else
    finally:
        output = _stop(proc)
    assert proc.returncode == 0, output


def _daemon_pid(proc) -> int:
    """ip netns exec and setpriv exec in place, so the Popen PID is the daemon's."""
    return proc.pid


def test_seqnos_survive_a_restart(netns_with_veths, tmp_path):
    ns = netns_with_veths
    sock = str(tmp_path / "bat0.sock")
    args = ["-i", "e0", "--control-socket", sock, "--set", "orig_interval_ms=100"]
    proc = _spawn(ns, args)
    try:
        wait_for(lambda: _ctl(ns, sock, "if").returncode == 0, timeout=15)
        time.sleep(1)
    finally:
        _stop(proc)
    e0 = json.loads(ip("-j", "link", "show", "e0", netns=ns))[0]["address"]
    path = tmp_path / f"bat0.{e0.replace(':', '')}.state"  # named by the originator
    saved = json.loads(path.read_text())
    proc = _spawn(ns, args)
    try:
        wait_for(lambda: _ctl(ns, sock, "if").returncode == 0, timeout=15)
    finally:
        output = _stop(proc)
    assert "continuing the sequence numbers saved" in output
    again = json.loads(path.read_text())
    # continued forward (a little ahead), not a random new start
    assert 0 < (again["ogm_seqno"][e0] - saved["ogm_seqno"][e0]) % 2**32 < 1000
    assert 0 < (again["bcast_seqno"] - saved["bcast_seqno"]) % 2**32 < 5000
