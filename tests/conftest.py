import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("BATMAND_SHARED", REPO.parent / "shared"))
PCAP_DIR = SHARED / "reference" / "pcaps"


def reference_pcaps() -> list[Path]:
    return sorted(PCAP_DIR.glob("*.pcapng"))


@pytest.fixture(scope="session")
def pcap_dir() -> Path:
    if not PCAP_DIR.is_dir():
        pytest.fail(f"reference captures not found at {PCAP_DIR} (set BATMAND_SHARED)")
    return PCAP_DIR
