"""batmanctl tp between batmand daemons in namespaces (real veths, sockets, timers): the
result lines as batctl prints them with plausible numbers, to a neighbour and across a
relay; Ctrl-C cancels and reports what was measured; a client that goes away ends its
test; errors; the result in `batmanctl event`."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from tests.daemon.labs import best_routes, make_lab, orig_mac, wait_for

RESULT = re.compile(r"Test duration (\d+)ms\.\nSent (\d+) Bytes\.\nThroughput: ([\d.]+) (KB|MB|GB)/s "
                    r"\(([\d.]+) (Kbps|Mbps|Gbps)\)\n$")
FLOOR_MBPS = 10  # Python at both ends, veths: tens of Mbit/s at least


def parse(stdout: str) -> tuple[int, int, float]:
    """(ms, bytes, Mbit/s) of batctl's three result lines; the printed rate checked against them."""
    match = RESULT.search(stdout)
    assert match, stdout
    ms, total = int(match[1]), int(match[2])
    bits = float(match[5]) * {"Kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9}[match[6]]
    assert bits == pytest.approx(total * 1000 // ms * 8, rel=0.01)
    return ms, total, bits / 1e6


@pytest.fixture(scope="module")
def line3():
    with make_lab("line3", orig_interval_ms=250) as lab:
        lab.start()
        origs = {n: orig_mac(lab, n) for n in lab.nodes}
        wait_for(lambda: set(best_routes(lab, "n1")) >= {origs["n2"], origs["n3"]}
                 and origs["n1"] in best_routes(lab, "n3"), timeout=30)
        lab.origs = origs
        yield lab


def test_tp_to_a_neighbour(line3):
    events = line3.spawn("n1", line3.batmanctl_command("n1", "event"), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        out = line3.batmanctl("n1", "tp", "-t", "2000", line3.origs["n2"])
        assert out.returncode == 0, out.stdout + out.stderr
        ms, total, mbps = parse(out.stdout)
        print(f"n1 -> n2: {mbps:.1f} Mbit/s ({total} bytes in {ms} ms)")
        assert 2000 <= ms <= 2300 and total % 1476 == 0
        assert mbps >= FLOOR_MBPS
    finally:
        events.send_signal(signal.SIGINT)
        lines = events.communicate(timeout=10)[0]
    assert re.search(r"^tp_meter 0x[0-9a-f]{8}: complete$", lines, re.M), lines


def test_tp_across_a_relay_with_the_default_test_length_cut_short_by_ctrl_c(line3):
    started = time.monotonic()
    proc = line3.spawn("n1", line3.batmanctl_command("n1", "tp", line3.origs["n3"]), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)  # batctl: cancel, then print what was measured
    out, err = proc.communicate(timeout=10)
    assert time.monotonic() - started < 5  # not the 10 s default
    assert proc.returncode == 0, out + err
    ms, total, mbps = parse(out)
    print(f"n1 -> n3 (via n2): {mbps:.1f} Mbit/s ({total} bytes in {ms} ms)")
    assert 700 <= ms <= 2500 and mbps >= FLOOR_MBPS / 2  # started after batmanctl did (~0.3 s), cut at 1.5 s


def test_a_client_that_goes_away_ends_its_test(line3):
    proc = line3.spawn("n1", line3.batmanctl_command("n1", "tp", "-t", "20000", line3.origs["n2"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    proc.kill()  # no Ctrl-C handler runs: the daemon sees the connection go
    proc.wait()
    time.sleep(1.0)  # the stream notices within its progress interval
    out = line3.batmanctl("n1", "tp", "-t", "500", line3.origs["n2"])
    assert out.returncode == 0, out.stdout + out.stderr  # not "Cannot run two test towards the same node"
    parse(out.stdout)


def test_errors_as_batctl_prints_them(line3):
    out = line3.batmanctl("n1", "tp", "-t", "500", "02:00:de:ad:be:ef")
    assert (out.returncode, out.stdout, out.stderr) == (1, "", "Destination unreachable\n")
    # one test per peer: the second is refused while the first runs
    first = line3.spawn("n1", line3.batmanctl_command("n1", "tp", "-t", "1500", line3.origs["n3"]),
                        stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    second = line3.batmanctl("n1", "tp", "-t", "500", line3.origs["n3"])
    assert (second.returncode, second.stderr) == (1, "Cannot run two test towards the same node\n")
    # n3 receives from n1: n3 cannot test toward n1 meanwhile either
    reverse = line3.batmanctl("n3", "tp", "-t", "500", line3.origs["n1"])
    assert (reverse.returncode, reverse.stderr) == (1, "Cannot run two test towards the same node\n")
    assert first.communicate(timeout=10)[0].startswith("Test duration ")
    out = line3.batmanctl("n1", "tp", "-t", "5x", line3.origs["n3"])
    assert out.returncode == 1 and out.stderr.startswith("Error - the supplied test duration is invalid: 5x\n")
