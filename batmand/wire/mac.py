"""MAC addresses as immutable 6-byte values that print as lower-case colon hex."""

from __future__ import annotations


class Mac(bytes):
    """A 6-byte MAC address; compares equal to the plain `bytes` it holds."""

    __slots__ = ()

    def __new__(cls, value: bytes | bytearray | memoryview | str) -> "Mac":
        if isinstance(value, str):
            text = value.replace(":", "").replace("-", "")
            try:
                value = bytes.fromhex(text)
            except ValueError:
                raise ValueError(f"not a MAC address: {value!r}") from None
        mac = super().__new__(cls, value)
        if len(mac) != 6:
            raise ValueError(f"a MAC address has 6 bytes, got {len(mac)}")
        return mac

    def __str__(self) -> str:
        return self.hex(":")

    def __repr__(self) -> str:
        return f"Mac('{self}')"

    @property
    def is_multicast(self) -> bool:
        """Group bit set (includes broadcast)."""
        return bool(self[0] & 0x01)

    @property
    def is_broadcast(self) -> bool:
        return self == BROADCAST


BROADCAST = Mac(b"\xff" * 6)
ZERO = Mac(b"\x00" * 6)
