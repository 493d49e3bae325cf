"""The batmanctl side of the control socket (protocol: batmand.daemon.protocol).

One connection per request: connect, send one request line, read `{"event": ...}` lines
(streaming commands) until the final `{"ok": ...}` line, close."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator, Mapping

from batmand.daemon import protocol

SOCKET_ENV = "BATMAND_SOCKET"
REQUEST_TIMEOUT = 10.0  # seconds a plain request may take; streams (ping, traceroute) wait forever


class ControlError(Exception):
    """Anything that ends a batmanctl command with `batmanctl: <message>` and exit status 1."""


class NoDaemon(ControlError):
    """Nothing listens on the control socket."""


class DaemonError(ControlError):
    """The daemon answered {"ok": false, "error": ...}."""


def socket_path(meshif: str, explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """--socket PATH, else $BATMAND_SOCKET, else the daemon of this network namespace
    (@batmand/<meshif>)."""
    if explicit:
        return explicit
    environ = os.environ if environ is None else environ
    return environ.get(SOCKET_ENV) or protocol.default_socket_path(meshif)


class Stream:
    """One request on its own connection. Iterate for the events; `result` holds the final
    result afterwards. A daemon error raises DaemonError at the end of the iteration."""

    def __init__(self, sock: socket.socket, meshif: str):
        self._sock = sock
        self._file = sock.makefile("rb")
        self._meshif = meshif
        self.result = None
        self.done = False

    def __iter__(self) -> Iterator[dict]:
        try:
            while True:
                try:
                    line = self._file.readline()
                except socket.timeout:
                    raise ControlError(f"batmand for {self._meshif} did not answer in time") from None
                except OSError as exc:
                    raise ControlError(f"lost the connection to batmand: {exc.strerror or exc}") from None
                if not line:
                    raise ControlError(f"batmand for {self._meshif} closed the connection without an answer")
                if not line.strip():
                    continue
                try:
                    message = protocol.decode(line)
                except ValueError as exc:
                    raise ControlError(f"invalid answer from batmand: {exc}") from None
                if "event" in message and "ok" not in message:
                    yield message["event"] if isinstance(message["event"], dict) else {"value": message["event"]}
                    continue
                self.done = True
                if message.get("ok"):
                    self.result = message.get("result")
                    return
                raise DaemonError(str(message.get("error") or "unknown error"))
        finally:
            self.close()

    def interrupt(self) -> None:
        """Wake a reader blocked in another thread (close() would wait for its read)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    def __init__(self, path: str, meshif: str = "bat0", timeout: float | None = REQUEST_TIMEOUT):
        self.path = path
        self.meshif = meshif
        self.timeout = timeout

    def _connect(self, timeout: float | None) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout if timeout is not None else REQUEST_TIMEOUT)
        try:
            sock.connect(protocol.sockaddr(self.path))
        except OSError as exc:
            sock.close()
            reason = exc.strerror or str(exc)
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTDIR):
                where = " in this network namespace" if protocol.is_abstract(self.path) else ""
                raise NoDaemon(f"no batmand running for {self.meshif}{where} ({self.path}: {reason})") from None
            raise ControlError(f"cannot connect to batmand for {self.meshif} ({self.path}: {reason})") from None
        sock.settimeout(timeout)
        return sock

    def stream(self, cmd: str, args: Mapping | None = None, timeout: float | None = None) -> Stream:
        """Send a request and return its Stream (events, then the result)."""
        sock = self._connect(timeout)
        try:
            sock.sendall(protocol.encode({"cmd": cmd, "args": dict(args or {})}))
        except OSError as exc:
            sock.close()
            raise ControlError(f"lost the connection to batmand: {exc.strerror or exc}") from None
        return Stream(sock, self.meshif)

    def request(self, cmd: str, args: Mapping | None = None):
        """A plain request: its result, or DaemonError. Events, if any, are ignored."""
        stream = self.stream(cmd, args, timeout=self.timeout)
        for _ in stream:
            pass
        return stream.result
