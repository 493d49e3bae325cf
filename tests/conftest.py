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
        signal.signal(signal.SIGTERM, signal.default_int_handler)


def reference_pcaps() -> list[Path]:
    return sorted(PCAP_DIR.glob("*.pcapng"))


@pytest.fixture(scope="session")
def pcap_dir() -> Path:
    if not PCAP_DIR.is_dir():
        pytest.fail(f"reference captures not found at {PCAP_DIR} (set BATMAND_SHARED)")
    return PCAP_DIR
