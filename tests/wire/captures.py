"""Shared access to the kernel reference captures, decoded once per test session."""

from __future__ import annotations

import functools
from pathlib import Path

from batmand.capture import read_capture
from batmand.wire import decode_frame
from batmand.wire.errors import NotBatmanError
from tests.conftest import PCAP_DIR


@functools.cache
def raw_frames(name: str) -> list:
    return list(read_capture(str(PCAP_DIR / name)))


@functools.cache
def decoded(name: str) -> list:
    """[(captured frame, Frame)] for every batman-adv frame of a capture."""
    out = []
    for cf in raw_frames(name):
        try:
            out.append((cf, decode_frame(cf.data)))
        except NotBatmanError:
            continue
    return out


def pcap_names() -> list[str]:
    return sorted(p.name for p in Path(PCAP_DIR).glob("*.pcapng"))
