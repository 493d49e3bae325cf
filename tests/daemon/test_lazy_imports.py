"""The daemon's imports leave out what it does not use (bench/memory-*.md): pyroute2's
APIs beyond its netlink messages, and crc32c's __init__ with importlib.metadata; code in
the same process that wants the whole package still gets it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

CHECK = """
import sys
import batmand.daemon_main
from batmand.wire.tt_crc import crc32c_raw
left_out = [m for m in ("importlib.metadata", "sqlite3", "pyroute2.ndb", "pyroute2.iproute") if m in sys.modules]
assert not left_out, left_out
assert crc32c_raw(b"123456789", 0xFFFFFFFF) ^ 0xFFFFFFFF == 0xE3069283  # CRC-32C's check value
import crc32c
from pyroute2 import IPRoute
assert crc32c.__version__ and crc32c.crc32c(b"123456789") == 0xE3069283 and IPRoute
print("ok")
"""


def test_the_daemon_imports_only_what_it_uses():
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=REPO, capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
