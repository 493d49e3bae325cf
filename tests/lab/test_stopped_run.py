"""A test run stopped with SIGTERM (CI's timeout does that) still removes what its tests
made: here a namespace held by a test that is still running when the signal comes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from batmand.lab.net import namespace_exists, wait_gone
from tests.conftest import REPO

HOLDER = textwrap.dedent("""
    import os
    import time
    from tests.netns import namespace

    def test_hold():
        with namespace() as ns:
            child = os.fork()  # as pyroute2 forks a helper into a namespace
            if child == 0:
                time.sleep(120)
                os._exit(0)
            print("HOLDING", ns, child, flush=True)
            time.sleep(120)
""")


def test_a_run_stopped_by_sigterm_removes_its_namespaces(tmp_path):
    (tmp_path / "test_holder.py").write_text(HOLDER)
    # the suite's conftest as a plugin: the holder lives outside tests/
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                             "-p", "tests.conftest", "--rootdir", str(tmp_path), str(tmp_path / "test_holder.py")],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    held = None
    try:
        for line in proc.stdout:
            if line.startswith("HOLDING"):
                held, child = line.split()[1], int(line.split()[2])
                break
        assert held is not None and namespace_exists(held), "the holder test did not start"
        # a fork of the run dies of SIGTERM at once, without running the run's teardown
        os.kill(child, signal.SIGTERM)
        assert not wait_gone([child], 5.0), "the fork outlived SIGTERM"
        time.sleep(0.5)
        assert namespace_exists(held), "the fork removed the run's namespace"
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
        assert proc.returncode != 0, rest
        assert not namespace_exists(held), f"{held} left behind:\n{rest}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if held is not None and namespace_exists(held):
            subprocess.run(["ip", "netns", "del", held], check=False)
