"""The soft interface: a TAP device (python-pytun) that the host uses like bat0."""

from __future__ import annotations

import os
import random

import pytun


def random_mac() -> bytes:
    """A random locally administered unicast MAC, as the kernel gives a new bat0."""
    mac = bytearray(random.getrandbits(8) for _ in range(6))
    mac[0] = (mac[0] & 0xFE) | 0x02
    return bytes(mac)


class SoftInterface:
    def __init__(self, name: str, mac: bytes | None = None, mtu: int = 1500) -> None:
        self.tap = pytun.TunTapDevice(name=name, flags=pytun.IFF_TAP | pytun.IFF_NO_PI)
        self.name = self.tap.name
        self.mac = mac or random_mac()
        self.tap.hwaddr = self.mac
        self.tap.mtu = mtu
        self.fd = self.tap.fileno()
        os.set_blocking(self.fd, False)

    def up(self) -> None:
        self.tap.up()

    def read(self) -> bytes | None:
        try:
            return os.read(self.fd, 65535)
        except BlockingIOError:
            return None

    def write(self, frame) -> None:
        try:
            os.write(self.fd, frame)
        except BlockingIOError:
            pass  # the host is not reading fast enough: drop, as a full queue would

    def close(self) -> None:
        self.tap.close()
