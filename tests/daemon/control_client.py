"""A raw control-socket client for tests: requests as any program may send them, also
malformed ones, on one connection."""

from __future__ import annotations

import json
import socket

from batmand.daemon import protocol
from tests.netns import entered


class RawClient:
    def __init__(self, endpoint: str, netns: str | None = None, timeout: float = 10.0):
        if netns is not None:  # an abstract name is looked up in the namespace the socket was made in
            with entered(netns):
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(protocol.sockaddr(endpoint))
        self.file = self.sock.makefile("rb")

    def send(self, message: dict | bytes) -> None:
        self.sock.sendall(message if isinstance(message, bytes) else protocol.encode(message))

    def line(self) -> dict | None:
        """The next line from the daemon, or None when it closed the connection."""
        raw = self.file.readline()
        return json.loads(raw) if raw else None

    def request(self, cmd: str, **args) -> tuple[list[dict], dict]:
        """(events, final reply) of one request."""
        self.send({"cmd": cmd, "args": args})
        events = []
        while True:
            message = self.line()
            assert message is not None, f"{cmd}: the daemon closed the connection without an answer"
            if "event" in message:
                events.append(message["event"])
            else:
                return events, message

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
