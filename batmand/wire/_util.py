"""Small helpers shared by the codec modules: bounds checks and JSON conversion."""

from __future__ import annotations

import dataclasses
from enum import Enum

from .errors import WireError
from .mac import Mac


def need(buf, off: int, size: int, what: str) -> None:
    """Raise WireError unless `size` bytes of `buf` are available at `off`."""
    if len(buf) - off < size:
        raise WireError(f"{what} truncated: needs {size} bytes at offset {off}, {max(len(buf) - off, 0)} left")


def check_u8(value: int, what: str) -> None:
    if not 0 <= value <= 0xFF:
        raise WireError(f"{what} out of range for one byte: {value}")


def to_jsonable(value):
    """Turn decoded wire objects into plain JSON types (MACs as colon hex, bytes as hex)."""
    if isinstance(value, Mac):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Enum):
        return int(value.value)
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for name in getattr(value, "JSON_FIRST", ()):
            out[name] = to_jsonable(getattr(value, name))
        for field in dataclasses.fields(value):
            out[field.name] = to_jsonable(getattr(value, field.name))
        for name in getattr(value, "JSON_EXTRA", ()):
            out[name] = to_jsonable(getattr(value, name))
        return out
    return value


def pack(st, *args) -> bytes:
    """struct.pack that reports out-of-range fields as WireError."""
    import struct

    try:
        return st.pack(*args)
    except struct.error as exc:
        raise WireError(f"cannot encode field: {exc}") from None
