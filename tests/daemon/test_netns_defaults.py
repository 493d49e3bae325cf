"""One daemon per mesh interface per network namespace, as the kernel has one bat0 per
namespace: two nodes started the way a new user starts them (`ip netns exec nX batmand -m
bat0 -i eth0`, no other option) both run, `ip netns exec nX batmanctl` reaches nX's daemon,
and each keeps its own seqno state."""

import contextlib
import json
import os
import subprocess
from pathlib import Path

from tests.daemon.daemons import BATMAND, answers, ctl, ctl_json, link_mac, linked_namespaces, start, stop
from tests.daemon.labs import wait_for
from tests.netns import in_netns, namespace

STATE_DIR = Path("/var/lib/batmand")  # the default
DEFAULTS = ["-m", "bat0", "-i", "eth0"]  # nothing else


def test_two_namespaces_with_default_paths(tmp_path):
    procs = []
    with linked_namespaces() as (n1, n2):
        state_files = [STATE_DIR / f"bat0.{link_mac(ns, 'eth0').replace(':', '')}.state" for ns in (n1, n2)]
        try:
            for i, ns in enumerate((n1, n2)):
                procs.append(start(ns, DEFAULTS, tmp_path / f"n{i + 1}.log"))
            wait_for(lambda: answers(n1) and answers(n2), timeout=20)
            assert all(p.poll() is None for p in procs), "a daemon exited"
            # each namespace's batmanctl reaches its own daemon, which sees the other node
            for ns, other in ((n1, n2), (n2, n1)):
                assert ctl(ns, "if").stdout.split() == ["eth0:", "active"]
                wait_for(lambda: any(r["orig_address"] == link_mac(other, "eth0") for r in ctl_json(ns, "o")),
                         timeout=15)
            # a second daemon for bat0 in the same namespace is refused, naming why
            second = subprocess.run(in_netns(n1, [*BATMAND, *DEFAULTS]), capture_output=True, text=True, timeout=30)
            assert second.returncode == 1
            assert "another batmand already runs bat0 in this network namespace" in second.stderr
            assert procs[0].poll() is None and answers(n1)
            # a namespace without a daemon says so
            with namespace() as empty:
                out = ctl(empty, "o")
            assert out.returncode == 1 and "no batmand running for bat0 in this network namespace" in out.stderr
        finally:
            for proc in procs:
                stop(proc)
        try:
            # each node saved its own seqnos, named by its originator address
            for path, ns in zip(state_files, (n1, n2)):
                saved = json.loads(path.read_text())
                assert saved["originator"] == link_mac(ns, "eth0")
            # and continues its own sequence on restart, not the other node's
            restarted = start(n1, DEFAULTS, tmp_path / "n1-again.log")
            try:
                wait_for(lambda: answers(n1), timeout=20)
            finally:
                stop(restarted)
            log = (tmp_path / "n1-again.log").read_text()
            assert f"continuing the sequence numbers saved in {state_files[0]}" in log
            assert str(state_files[1]) not in log
        finally:
            for path in state_files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
