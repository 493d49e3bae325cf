"""AF_PACKET sockets on hard interfaces for ethertype 0x4305."""

from __future__ import annotations

import socket
import struct

from batmand.wire import ETH_P_BATMAN

SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_IGNORE_OUTGOING = 23
RCVBUF = 4 * 1024 * 1024


class PacketSocket:
    def __init__(self, ifname: str, counters=None) -> None:
        self.ifname = ifname
        self.counters = counters if counters is not None else {}
        self.kernel_drops = 0  # frames the kernel dropped at this socket (buffer full)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_BATMAN))
        try:
            self.sock.bind((ifname, ETH_P_BATMAN))
            self.sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv(self) -> bytes | None:
        """One frame, or None when nothing is waiting. Frames seen only because the
        interface is promiscuous are dropped here, as the kernel's handler drops them."""
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                return None
            if addr[2] != socket.PACKET_OTHERHOST:
                return data
            self.counters["drop_other_host"] = self.counters.get("drop_other_host", 0) + 1

    def statistics(self) -> tuple[int, int]:
        """PACKET_STATISTICS (reset by every read): (frames seen, frames dropped), summed here."""
        try:
            raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        except OSError:
            return 0, self.kernel_drops
        packets, drops = struct.unpack("II", raw)
        self.kernel_drops += drops
        return packets, self.kernel_drops

    def send(self, frame) -> bool:
        try:
            self.sock.send(frame)
            return True
        except (BlockingIOError, OSError):
            return False

    def close(self) -> None:
        self.sock.close()
