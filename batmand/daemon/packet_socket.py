"""The control process's AF_PACKET socket on a hard interface: every batman-adv frame
except UNICAST (which the data plane's rings take, see batmand.dataplane.bpf), and the
socket the protocol core transmits on."""

from __future__ import annotations

import collections
import socket

from batmand.dataplane import bpf, rings
from batmand.dataplane.offload import (VIRTIO_NET_HDR_F_NEEDS_CSUM, VNET_HDR, VNET_HDR_LEN, VNET_PLAIN,
                                       finish_checksum)
from batmand.dataplane.rings import PACKET_IGNORE_OUTGOING, PACKET_VNET_HDR, SOL_PACKET
from batmand.wire import ETH_P_BATMAN

RCVBUF = 4 * 1024 * 1024


class PacketSocket:
    def __init__(self, ifname: str, counters=None) -> None:
        self.ifname = ifname
        self.counters = counters if counters is not None else {}
        self.kernel_drops = 0  # frames the kernel dropped at this socket (buffer full)
        self.errors: collections.Counter = collections.Counter()  # read errors by errno name (ENETDOWN)
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        try:
            bpf.attach(self.sock, bpf.ALL_BUT_UNICAST)
            # partial checksums (from a sender on this host) are told, and finished here
            self.sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
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
        """One frame, or None when nothing is waiting. (The filter already dropped what the
        kernel's handler ignores: frames for other hosts, our own outgoing frames.)"""
        while True:
            try:
                data = self.sock.recv(65535)
            except BlockingIOError:
                return None
            except OSError as exc:
                # ENETDOWN once after the interface went down (the kernel's sk_err; reading
                # it clears it, and the socket receives again once the interface is up)
                self.errors[rings.error_name(exc.errno)] += 1
                return None
            if len(data) <= VNET_HDR_LEN:
                continue
            flags, _gso, _hlen, _size, csum_start, csum_offset = VNET_HDR.unpack_from(data)
            if not flags & VIRTIO_NET_HDR_F_NEEDS_CSUM:
                return data[VNET_HDR_LEN:]
            frame = bytearray(data[VNET_HDR_LEN:])
            if csum_start + csum_offset + 2 <= len(frame):
                finish_checksum(frame, csum_start, csum_offset)
            return bytes(frame)

    def clear_error(self) -> int:
        """Read (and so clear) the socket's pending error, e.g. the ENETDOWN the kernel sets
        when the interface goes down; 0 when there is none."""
        return rings.take_error(self.sock)

    def statistics(self) -> tuple[int, int]:
        """PACKET_STATISTICS (reset by every read): (frames seen, frames dropped), summed here."""
        packets, drops = rings.statistics(self.sock)
        self.kernel_drops += drops
        return packets, self.kernel_drops

    def send(self, frame) -> bool:
        try:
            self.sock.sendmsg((VNET_PLAIN, frame))
            return True
        except (BlockingIOError, OSError):
            return False

    def close(self) -> None:
        self.sock.close()
