"""The message channel between the control process and one worker: a SOCK_SEQPACKET
socket pair (message boundaries kept, file descriptors passed with SCM_RIGHTS).
Messages are tuples pickled between two processes of the same daemon."""

from __future__ import annotations

import pickle
import socket

MAX_MESSAGE = 1 << 18
MAX_FDS = 8
BUFFER = 4 * 1024 * 1024


def pair() -> tuple["Channel", socket.socket]:
    """(the control process's end, the socket to hand to the worker)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
    return Channel(ours), theirs


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.dropped = 0  # messages not sent because the peer's buffer was full

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: tuple, fds: list[int] = (), *, must: bool = False) -> bool:
        """Send one message. A full buffer drops it (False) unless `must`: then wait up
        to a second for room (tables and descriptors must arrive)."""
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        try:
            self._send(data, fds)
            return True
        except BlockingIOError:
            if must:
                self.sock.settimeout(1.0)
                try:
                    self._send(data, fds)
                    return True
                except OSError:
                    pass
                finally:
                    self.sock.setblocking(False)
        except OSError:
            pass
        self.dropped += 1
        return False

    def _send(self, data: bytes, fds) -> None:
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv(self) -> tuple[tuple, list[int]] | None:
        """One message and any descriptors with it; None when nothing waits. EOFError
        when the other end is gone."""
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except BlockingIOError:
            return None
        except OSError:  # reset: the other end died with our messages unread
            raise EOFError from None
        if not data:
            for fd in fds:
                socket.close(fd)
            raise EOFError
        return pickle.loads(data), fds

    def close(self) -> None:
        self.sock.close()
