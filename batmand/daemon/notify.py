"""The systemd notify protocol (sd_notify), written out: a datagram to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get("NOTIFY_SOCKET")
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        valid = usec and usec.isdigit() and (not pid or pid == str(os.getpid()))
        # ping at half the watchdog period, as sd_watchdog_enabled() advises
        self.watchdog_interval = int(usec) / 2e6 if valid else None

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def send(self, **fields) -> bool:
        """notify(READY=1, STATUS="...") sends "READY=1\\nSTATUS=..." ; False if not under systemd."""
        if not self.path:
            return False
        address = "\0" + self.path[1:] if self.path.startswith("@") else self.path
        message = "\n".join(f"{key}={value}" for key, value in fields.items()).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto(message, address)
            except OSError:
                return False
        return True
