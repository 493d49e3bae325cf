"""The seqno state file: written every 10 s (small boards' flash), durably (fsync before
the rename), and never the reason a start fails."""

import json
import re
import subprocess
import time

import pytest

from batmand.lab.net import namespace_pids, terminate
from tests.daemon.daemons import BATMAND, answers, link_mac, start, stop, veth_namespace
from tests.daemon.labs import wait_for
from tests.netns import in_netns


@pytest.fixture
def ns():
    with veth_namespace() as name:
        yield name


def test_saved_every_ten_seconds_and_fsynced_before_the_rename(ns, tmp_path):
    trace = tmp_path / "trace"
    proc = subprocess.Popen(["strace", "-f", "-e", "trace=openat,write,fsync,rename,close", "-o", str(trace),
                             *in_netns(ns, [*BATMAND, "-i", "e0", "--workers", "0", "--state-dir", str(tmp_path)])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: answers(ns), timeout=30)
        time.sleep(13)  # a save soon after the start, then one 10 s later
    finally:
        # the daemon by its PID (a signal to strace would only detach it), then strace
        terminate(namespace_pids(ns), timeout=15)
        stop(proc)
    lines = trace.read_text().splitlines()
    renames = [i for i, line in enumerate(lines) if re.search(r'rename\(".*\.state\.tmp", ".*\.state"\) = 0', line)]
    # two while running (the first after 1 s, the next after 10 more), one at the stop
    assert 2 <= len(renames) <= 3, len(renames)
    for at in renames:
        pid = lines[at].split()[0]
        before = [line for line in lines[:at] if line.split()[0] == pid]
        opened = max(i for i, line in enumerate(before) if ".state.tmp" in line and "openat" in line)
        fd = re.search(r"= (\d+)$", before[opened]).group(1)
        assert any(re.search(rf"fsync\({fd}\)\s+= 0", line) for line in before[opened:]), \
            "the new state was not fsynced before it replaced the old"


def test_a_state_file_of_wrong_types_does_not_stop_the_start(ns, tmp_path):
    mac = link_mac(ns, "e0")
    path = tmp_path / f"bat0.{mac.replace(':', '')}.state"
    path.write_text(json.dumps({"saved_at": time.time(), "orig_interval_ms": "fast", "ogm_seqno": [1, 2],
                                "elp_seqno": {mac: "x"}, "bcast_seqno": None, "frag_seqno": 1 << 40}))
    log = tmp_path / "log"
    proc = start(ns, ["-i", "e0", "--workers", "0", "--state-dir", str(tmp_path)], log)
    try:
        wait_for(lambda: answers(ns), timeout=30)
        assert proc.poll() is None
    finally:
        stop(proc)
    assert proc.returncode == 0, log.read_text()
    assert "ogm_seqno is not a seqno or a table of seqnos; ignored" in log.read_text()
    saved = json.loads(path.read_text())  # and a good one replaced it
    assert isinstance(saved["ogm_seqno"][mac], int) and isinstance(saved["bcast_seqno"], int)
