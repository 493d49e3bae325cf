"""The README's main command runs the demo lab: it must work and leave nothing behind."""

import os
import subprocess
import sys

from batmand.lab.net import list_namespaces


def test_demo_runs_and_cleans_up():
    prefix = f"dm{os.getpid() % 100000}"
    result = subprocess.run([sys.executable, "-m", "batmand.demo", "--prefix", prefix, "--iperf-seconds", "1"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "Originator        last-seen (#/255) Nexthop" in out
    assert "4 packets transmitted, 4 received" in out
    assert "iperf Done." in out and "forward:" in out
    assert not list_namespaces(prefix + "-")


def test_capture_decoding_mode():
    result = subprocess.run([sys.executable, "-m", "batmand.demo", "captures"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "==> summary (packets per type)" in result.stdout
    assert "0 malformed" in result.stdout
