"""The message channel between the control process and one worker: a SOCK_SEQPACKET
socket pair (message boundaries kept, file descriptors passed with SCM_RIGHTS).
Messages are the records of messages.py, pickled between two processes of the same
daemon as (kind number, *fields).

No message is larger than a few tens of KiB: forwarding tables travel in parts
(split_update), so a table of any size fits. The control process never waits for a
worker: its Outbox keeps what the socket has no room for and sends it when the socket is
writable again, and gives up waiting table updates beyond a bound, in which case the
worker gets the whole table again (a resync) once it reads again."""

from __future__ import annotations

import collections
import itertools
import logging
import pickle
import socket
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from batmand.core.events import ForwardingUpdate

from .messages import FROM_WORKER, KINDS

if TYPE_CHECKING:  # workers never load asyncio: only the control process's Outbox uses it
    import asyncio

log = logging.getLogger("batmand")

MAX_MESSAGE = 1 << 18  # what a receive takes; a message was never meant to be longer
MAX_FDS = 8
PART_ENTRIES = 512  # table entries per message: about 25 KiB pickled, about 1.5 ms to pickle
WORKER_BUFFER = 4 * 1024 * 1024  # worker -> control: bursts of slow-path frames
CONTROL_BUFFER = 256 * 1024  # control -> worker: table parts and control messages
TABLE_BACKLOG = 256 * 1024  # table updates the Outbox keeps for a worker that does not read
PUMP_BUDGET = 0.002  # seconds of sending per turn of the event loop
RETRY_DELAY = 0.1  # after a send failed for another reason than a full socket
SO_SNDBUFFORCE = 32


class BadMessage(Exception):
    """A message that cannot be decoded (cut short, or not a pickle of ours)."""


def pair() -> tuple["Channel", socket.socket]:
    """(the control process's end, the socket to hand to the worker)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    _send_buffer(ours, CONTROL_BUFFER)
    _send_buffer(theirs, WORKER_BUFFER)
    return Channel(ours, FROM_WORKER), theirs


def _send_buffer(sock: socket.socket, size: int) -> None:
    """An AF_UNIX sender's buffer bounds what waits for the receiver. Forced (we have
    CAP_NET_ADMIN) past net.core.wmem_max, which is 208 KiB by default."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


_KIND_NUMBER = {kind: number for number, kind in enumerate(KINDS)}


def encode(message) -> bytes:
    """A message of messages.py as it goes on the wire: plain tuples pickle fastest."""
    return pickle.dumps((_KIND_NUMBER[type(message)], *message), pickle.HIGHEST_PROTOCOL)


def decode(data: bytes, accepts: tuple = KINDS):
    """The message `data` encodes; BadMessage unless it is one of `accepts`."""
    try:
        wire = pickle.loads(data)
    except Exception as exc:  # whatever unpickling bytes that are not ours raises
        raise BadMessage(f"undecodable message: {exc!r}") from None
    if not isinstance(wire, tuple) or not wire or type(wire[0]) is not int or not 0 <= wire[0] < len(KINDS):
        raise BadMessage(f"not a message: {type(wire).__name__}")
    kind = KINDS[wire[0]]
    if kind not in accepts:
        raise BadMessage(f"{kind.__name__} is not a message for this side")
    try:
        return kind(*wire[1:])
    except TypeError:
        raise BadMessage(f"{kind.__name__} with {len(wire) - 1} fields") from None


def split_update(update: ForwardingUpdate, entries: int = PART_ENTRIES) -> Iterator[ForwardingUpdate]:
    """The update in parts of at most `entries` entries, made as they are taken; applied
    in order, they change a table as the whole update does (originators first: clients
    refer to them; the first part carries our TT version and the slow-path rules)."""
    if len(update.origs) + len(update.clients) + len(update.local_clients) <= entries:
        yield update
        return
    ttvn, slow_path = update.own_ttvn, update.slow_path
    for field in ("origs", "clients", "local_clients"):
        items = iter(getattr(update, field).items())
        while chunk := dict(itertools.islice(items, entries)):
            tables = {"origs": {}, "clients": {}, "local_clients": {}}
            tables[field] = chunk
            yield ForwardingUpdate(**tables, own_ttvn=ttvn, slow_path=slow_path)
            ttvn = slow_path = None


class Channel:
    def __init__(self, sock: socket.socket, accepts: tuple) -> None:
        """`accepts`: the kinds this end receives (messages.TO_WORKER or FROM_WORKER)."""
        self.sock = sock
        self.sock.setblocking(False)
        self.accepts = accepts
        self.dropped = 0  # messages not sent because the peer's buffer was full

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message, fds: list[int] = (), *, must: bool = False) -> bool:
        """Send one message. A full buffer drops it (False) unless `must`: then wait up
        to a second for room. (The worker's side; the control process uses an Outbox.)"""
        data = encode(message)
        try:
            self.send_data(data, fds)
            return True
        except BlockingIOError:
            if must:
                self.sock.settimeout(1.0)
                try:
                    self.send_data(data, fds)
                    return True
                except OSError:
                    pass
                finally:
                    self.sock.setblocking(False)
        except OSError:
            pass
        self.dropped += 1
        return False

    def send_data(self, data: bytes, fds=()) -> None:
        """One encoded message, now: BlockingIOError when the socket is full."""
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.send(data)

    def recv(self) -> tuple[object, list[int]] | None:
        """One message and any descriptors with it; None when nothing waits. EOFError
        when the other end is gone; BadMessage (its descriptors closed) for a message
        that cannot be decoded."""
        try:
            data, fds, flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except BlockingIOError:
            return None
        except OSError:  # reset: the other end died with our messages unread
            raise EOFError from None
        if not data and not flags & socket.MSG_TRUNC:
            _close_all(fds)
            raise EOFError
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            _close_all(fds)
            raise BadMessage(f"message cut short (flags {flags:#x})")
        try:
            return decode(data, self.accepts), fds
        except BadMessage:
            _close_all(fds)
            raise

    def close(self) -> None:
        self.sock.close()


def _close_all(fds) -> None:
    for fd in fds:
        socket.close(fd)


class _Item:
    __slots__ = ("data", "fds", "owned", "table", "stream")

    def __init__(self, data: bytes | None, fds=(), owned=(), table: bool = False,
                 stream: Iterator[bytes] | None = None) -> None:
        self.data = data  # the next message to send (a stream's current part)
        self.fds = fds
        self.owned = owned  # objects to close() once the message is sent or given up
        self.table = table
        self.stream = stream

    def done(self) -> None:
        for obj in self.owned:
            obj.close()
        if self.stream is not None:
            self.stream.close()


class Outbox:
    """The control process's sending side of one worker's channel.

    Messages go out in order. What finds the socket full waits here and is sent when the
    socket is writable again (the event loop's writer), at most PUMP_BUDGET of work per
    turn of the loop, so a slow or stopped worker never holds the loop up. Table updates
    (put with table=True) waiting beyond TABLE_BACKLOG bytes, or one whose send fails,
    are given up: on_stale() is then called, and its owner drops the waiting updates
    (drop_tables) and queues the whole table as a stream (put_stream), encoded part by
    part as the socket takes them."""

    def __init__(self, loop, channel: Channel, on_stale) -> None:
        self.loop = loop
        self.channel = channel
        self.on_stale = on_stale
        self.items: collections.deque[_Item] = collections.deque()
        self.table_bytes = 0  # of the table updates waiting
        self.writing = False  # the loop watches the socket for room
        self.retry: asyncio.TimerHandle | None = None
        self.closed = False

    def backlog(self) -> int:
        """Bytes waiting (streams not counted: they are encoded as they go)."""
        return sum(len(item.data) for item in self.items if item.data is not None and item.stream is None)

    def put(self, data: bytes, fds=(), *, owned=(), table: bool = False) -> None:
        """Queue one encoded message (with descriptors; `owned` objects are closed once
        it is sent); `table`: a table update, which may be given up (see above)."""
        item = _Item(data, fds, owned, table)
        if self.closed:
            item.done()
            return
        if table:
            self.table_bytes += len(data)
            if self.table_bytes > TABLE_BACKLOG:
                self.on_stale()  # the table stream it queues covers this update too
                return
        self.items.append(item)
        self._pump()

    def put_stream(self, parts: Iterator[bytes]) -> None:
        """A sequence of table messages, taken from `parts` only when the socket has
        room for them (so it reflects the table when it starts to go out)."""
        if self.closed:
            parts.close()
        else:
            self.items.append(_Item(None, table=True, stream=parts))
            self._pump()

    def drop_tables(self) -> None:
        """Forget every waiting table message and stream (a fresh stream follows)."""
        kept = collections.deque()
        for item in self.items:
            if item.table:
                item.done()
            else:
                kept.append(item)
        self.items = kept
        self.table_bytes = 0

    def _pump(self) -> None:
        if self.writing or self.retry is not None or self.closed:
            return  # the writer (or the retry) sends in order
        self._send_waiting()

    def _send_waiting(self) -> None:
        deadline = time.monotonic() + PUMP_BUDGET
        items = self.items
        while items:
            item = items[0]
            if item.data is None:  # a stream: its next part
                item.data = next(item.stream, None)
                if item.data is None:
                    items.popleft()
                    continue
            try:
                self.channel.send_data(item.data, item.fds)
            except BlockingIOError:
                self._watch(True)
                return
            except OSError as exc:
                self._failed(item, exc)
                return
            if item.stream is not None:
                item.data = None
            else:
                items.popleft()
                item.done()
                if item.table:
                    self.table_bytes -= len(item.data)
            if time.monotonic() > deadline:
                self._watch(True)  # more on the next turn of the loop
                return
        self._watch(False)

    def _failed(self, item: _Item, exc: OSError) -> None:
        """A send failed for another reason than a full socket (EMSGSIZE, ENOBUFS, the
        worker gone): the message is lost. A lost table message makes the worker's table
        stale: it gets the whole table again. Sending resumes after RETRY_DELAY (the
        channel's end, if the worker died, ends it first)."""
        self.items.popleft()
        item.done()
        if item.table and item.stream is None:
            self.table_bytes -= len(item.data)
        self._watch(False)
        self.retry = self.loop.call_later(RETRY_DELAY, self._retry)  # before a resync is queued
        if item.table:
            self.on_stale()
        else:
            log.warning("data-plane channel: message lost (%s)", exc)

    def _retry(self) -> None:
        self.retry = None
        self._pump()

    def _watch(self, on: bool) -> None:
        if on and not self.writing:
            self.loop.add_writer(self.channel.fileno(), self._on_writable)
        elif not on and self.writing:
            self.loop.remove_writer(self.channel.fileno())
        self.writing = on

    def _on_writable(self) -> None:
        self._send_waiting()

    def close(self) -> None:
        """Stop sending (the channel is about to close)."""
        if not self.closed:
            self._watch(False)
            if self.retry is not None:
                self.retry.cancel()
            for item in self.items:
                item.done()
            self.items.clear()
            self.closed = True
