import os
import signal
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BATMAND_SHARED", REPO.parent / "shared"))
PCAP_DIR = SHARED / "reference" / "pcaps"


def pytest_configure(config) -> None:
    # A run stopped by SIGTERM (a CI timeout, kill) unwinds as after Ctrl-C: the tests'
    # context managers and fixtures still remove their namespaces, daemons and VMs.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop_run(os.getpid()))


def _stop_run(run_pid: int):
    def stop(signum, frame):
        if os.getpid() != run_pid:
            # a fork of the run that never exec'd (pyroute2's helper in a namespace): it
            # dies as SIGTERM kills it, instead of unwinding the run's tests and fixtures
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        raise KeyboardInterrupt
    return stop


def reference_pcaps() -> list[Path]:
    return sorted(PCAP_DIR.glob("*.pcapng"))


@pytest.fixture(scope="session")
def pcap_dir() -> Path:
    if not PCAP_DIR.is_dir():
        pytest.fail(f"reference captures not found at {PCAP_DIR} (set BATMAND_SHARED)")
    return PCAP_DIR
