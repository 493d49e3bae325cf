"""The soft interface: a TAP device (python-pytun) that the host uses like bat0.

It is opened with IFF_VNET_HDR (every frame carries a virtio-net header, so checksum
and segmentation work can be handed over) and IFF_MULTI_QUEUE: one queue per data-plane
worker; the kernel keeps each flow on one queue."""

from __future__ import annotations

import fcntl
import os
import random

import pytun

from batmand.dataplane.offload import VNET_PLAIN
from batmand.dataplane.rings import error_name

TUNSETOFFLOAD = 0x400454D0
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04


def random_mac() -> bytes:
    """A random locally administered unicast MAC, as the kernel gives a new bat0."""
    mac = bytearray(random.getrandbits(8) for _ in range(6))
    mac[0] = (mac[0] & 0xFE) | 0x02
    return bytes(mac)


class SoftInterface:
    def __init__(self, name: str, mac: bytes | None = None, mtu: int = 1500, queues: int = 1) -> None:
        flags = pytun.IFF_TAP | pytun.IFF_NO_PI | pytun.IFF_VNET_HDR | pytun.IFF_MULTI_QUEUE
        self.queues = [pytun.TunTapDevice(name=name, flags=flags)]
        self.tap = self.queues[0]
        self.name = self.tap.name
        try:
            for _ in range(queues - 1):
                self.queues.append(pytun.TunTapDevice(name=self.name, flags=flags))
        except Exception:
            self.close()
            raise
        self.mac = mac or random_mac()
        self.tap.hwaddr = self.mac
        self.tap.mtu = mtu
        self.fds = [q.fileno() for q in self.queues]
        self.fd = self.fds[0]
        for fd in self.fds:
            os.set_blocking(fd, False)
        self.write_dropped = 0  # frames for the host that could not be written, whatever the reason

    def set_offload(self, csum: bool, tso: bool) -> None:
        """What the host may hand us: partial checksums, TSO super-frames (needs csum)."""
        flags = (TUN_F_CSUM if csum or tso else 0) | (TUN_F_TSO4 | TUN_F_TSO6 if tso else 0)
        fcntl.ioctl(self.fd, TUNSETOFFLOAD, flags)

    def up(self) -> None:
        self.tap.up()

    def write(self, frame) -> str | None:
        """A frame for the host, with a plain virtio-net header (checksums complete).
        Never raises: a frame the TAP does not take is dropped and counted, and the
        reason returned ("tap_full": the host is not reading fast enough, as a full
        queue would drop it; "tap_write_eio": bat0 is down; ...)."""
        try:
            os.writev(self.fd, (VNET_PLAIN, frame))
            return None
        except BlockingIOError:
            reason = "tap_full"
        except OSError as exc:
            reason = "tap_write_" + error_name(exc.errno)
        self.write_dropped += 1
        return reason

    def close(self) -> None:
        for queue in self.queues:
            queue.close()
