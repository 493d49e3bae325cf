"""batmand and batmanctl run the way a user runs them, inside a network namespace: what the
daemon tests share. (`ip netns exec` runs the command in place, so a Popen's pid is the
daemon's own.)"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.netns import in_netns, ip, namespace

BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]


def start(ns: str, args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """batmand ARGS in `ns`, stdout and stderr to `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(in_netns(ns, [*BATMAND, *args]), stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited after `timeout`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def ctl(ns: str, *args: str) -> subprocess.CompletedProcess:
    """batmanctl ARGS in `ns` (it reaches that namespace's daemon)."""
    return subprocess.run(in_netns(ns, [*BATMANCTL, *args]), capture_output=True, text=True, timeout=30)


def ctl_json(ns: str, *args: str):
    """batmanctl ARGS --json in `ns`, parsed; [] when the daemon does not answer."""
    out = ctl(ns, *args, "--json")
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else []


def answers(ns: str) -> bool:
    return ctl(ns, "if").returncode == 0


def link_mac(ns: str, ifname: str) -> str:
    return json.loads(ip("-j", "link", "show", ifname, netns=ns))[0]["address"]


@contextlib.contextmanager
def veth_namespace():
    """A namespace with a veth pair e0 (down, MTU 1560, for batmand) and p0 (up)."""
    with namespace() as ns:
        ip("link", "add", "e0", "mtu", "1560", "type", "veth", "peer", "name", "p0", "mtu", "1560", netns=ns)
        ip("link", "set", "p0", "up", netns=ns)
        yield ns


@contextlib.contextmanager
def linked_namespaces(ifname: str = "eth0"):
    """Two namespaces joined by a veth pair named `ifname` at both ends (up, MTU 1560)."""
    with namespace() as a, namespace() as b:
        ip("link", "add", ifname, "netns", a, "type", "veth", "peer", "name", ifname, "netns", b)
        for ns in (a, b):
            ip("link", "set", ifname, "mtu", "1560", "up", netns=ns)
        yield a, b
