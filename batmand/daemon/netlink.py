"""The network interfaces of this namespace as rtnetlink reports them, kept current by its
link notifications (RTMGRP_LINK) on a non-blocking socket read by the event loop.

The daemon reads link state from here (index, MAC, MTU, administratively up, carrier,
VLAN devices on bat0) instead of asking, so no netlink query ever blocks the event loop,
and it is told of every change: an interface set down or up, a new MTU or MAC, a VLAN
device created on bat0, an interface that vanished or came back. pyroute2 builds and
parses the messages; uvloop cannot host pyroute2's own netlink endpoint, and a plain
socket with add_reader is all this needs."""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Callable

from batmand import lazy_package

lazy_package.register("pyroute2")  # its message classes only, not every API it has

from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_GETLINK, RTM_NEWLINK, RTMGRP_LINK
from pyroute2.netlink.rtnl.ifinfmsg import IFF_LOWER_UP, IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

log = logging.getLogger("batmand.netlink")

RCVBUF = 1 << 20  # a burst of link changes (a bridge with many ports) must not overrun it
DUMP_TIMEOUT = 5.0
ACK_TIMEOUT = 1.0


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: bytes
    mtu: int
    up: bool  # IFF_UP: administratively up (what the kernel's batman-adv follows)
    carrier: bool  # IFF_LOWER_UP
    kind: str | None = None  # "veth", "vlan", ...
    parent: int | None = None  # IFLA_LINK: the device a VLAN device sits on
    vlan_id: int | None = None


def link_from_message(msg) -> Link | None:
    """A Link from an RTM_NEWLINK/RTM_DELLINK message (None if it names no interface)."""
    name = msg.get_attr("IFLA_IFNAME")
    if name is None:
        return None
    address = msg.get_attr("IFLA_ADDRESS") or "00:00:00:00:00:00"
    kind = vlan_id = None
    info = msg.get_attr("IFLA_LINKINFO")
    if info is not None:
        kind = info.get_attr("IFLA_INFO_KIND")
        data = info.get_attr("IFLA_INFO_DATA")
        if kind == "vlan" and data is not None and hasattr(data, "get_attr"):
            vlan_id = data.get_attr("IFLA_VLAN_ID")
    flags = msg["flags"]
    return Link(index=msg["index"], name=name, mac=bytes.fromhex(address.replace(":", "")),
                mtu=msg.get_attr("IFLA_MTU") or 0, up=bool(flags & IFF_UP), carrier=bool(flags & IFF_LOWER_UP),
                kind=kind, parent=msg.get_attr("IFLA_LINK"), vlan_id=vlan_id)


class LinkMonitor:
    """Every interface of the namespace by index. `on_change(old, new)` is called for each
    change once started (old None: appeared; new None: gone)."""

    def __init__(self) -> None:
        self.links: dict[int, Link] = {}
        self.on_change: Callable[[Link | None, Link | None], None] = lambda old, new: None
        self.overruns = 0  # notifications lost (ENOBUFS): each one triggers a fresh dump
        self._marshal = MarshalRtnl()
        self._seq = 0
        self._dump_seq: int | None = None  # the dump in progress
        self._dump_again = False  # notifications were lost while it ran: one more after it
        self._dumped: set[int] = set()  # indexes listed by the dump in progress
        self._loop = None
        self._backlog: list[bytes] = []  # read while waiting for an answer, handled afterwards
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            self.sock.bind((0, RTMGRP_LINK))
        except OSError:
            self.sock.close()
            raise

    # --- queries (from the table, never from the kernel) -----------------------------------

    def by_name(self, name: str) -> Link | None:
        return next((link for link in self.links.values() if link.name == name), None)

    def vlans_on(self, index: int) -> set[int]:
        """VIDs of the VLAN devices on top of interface `index` (802.1Q on bat0)."""
        return {link.vlan_id for link in self.links.values()
                if link.kind == "vlan" and link.parent == index and link.vlan_id}

    # --- life cycle --------------------------------------------------------------------------

    def load(self) -> None:
        """The first full table, before the event loop reads the socket (blocking, bounded)."""
        self._request_dump()
        deadline = time.monotonic() + DUMP_TIMEOUT
        self.sock.settimeout(DUMP_TIMEOUT)
        try:
            while self._dump_seq is not None:
                if time.monotonic() > deadline:
                    raise OSError(errno.ETIMEDOUT, "no answer to the rtnetlink link dump")
                self._handle(self.sock.recv(1 << 16))
        finally:
            self.sock.setblocking(False)

    def start(self, loop, on_change: Callable[[Link | None, Link | None], None]) -> None:
        self._loop = loop
        self.on_change = on_change
        self.sock.setblocking(False)
        self._watch()

    def _watch(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._loop.add_reader(self.sock.fileno(), self._readable)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._loop = None
        self.sock.close()

    # --- requests ----------------------------------------------------------------------------

    def _send(self, msg_type: int, nlm_flags: int, **fields) -> int:
        self._seq += 1
        msg = ifinfmsg()
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = nlm_flags
        msg["header"]["sequence_number"] = self._seq
        for key, value in fields.items():
            msg[key] = value
        msg.encode()
        self.sock.send(msg.data)
        return self._seq

    def _request_dump(self) -> None:
        if self._dump_seq is not None:  # one dump at a time per socket: another after this one
            self._dump_again = True
            return
        self._dump_again = False
        self._dumped = set()
        self._dump_seq = self._send(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, family=socket.AF_UNSPEC)

    def set_up(self, index: int) -> None:
        """Bring an interface administratively up, and wait for the kernel's answer: a
        local change it makes at once (bounded anyway). OSError when it refuses. What else
        arrives meanwhile is handled afterwards, from the event loop."""
        seq = self._send(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, family=socket.AF_UNSPEC, index=index,
                         flags=IFF_UP, change=IFF_UP)
        deadline = time.monotonic() + ACK_TIMEOUT
        self.sock.settimeout(ACK_TIMEOUT)
        try:
            while True:
                if time.monotonic() > deadline:
                    raise OSError(errno.ETIMEDOUT, "no answer from rtnetlink")
                data = self.sock.recv(1 << 16)
                for msg in self._marshal.parse(data):
                    if msg["header"]["type"] == NLMSG_ERROR and msg["header"]["sequence_number"] == seq:
                        code = msg.get("error") or 0
                        if code:
                            raise OSError(-code, os.strerror(-code))
                        return
                self._backlog.append(data)
        finally:
            self.sock.setblocking(False)
            if self._backlog and self._loop is not None:
                self._loop.call_soon(self._readable)

    # --- receiving -----------------------------------------------------------------------------

    def _readable(self) -> None:
        backlog, self._backlog = self._backlog, []
        for data in backlog:
            self._handle(data)
        for _ in range(64):  # bounded per wake-up; the rest waits for the next one
            try:
                data = self.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                # ENOBUFS: the kernel dropped notifications (any other error: the same doubt);
                # the table may be wrong, so read it all again
                self.overruns += 1
                log.warning("link notifications were lost (%s); reading every link again",
                            "socket buffer full" if exc.errno == errno.ENOBUFS else exc)
                self._request_dump()
                # the error came as POLLERR, after which uvloop stops watching the socket
                self._loop.call_soon(self._watch)
                return
            self._handle(data)

    def _handle(self, data: bytes) -> None:
        for msg in self._marshal.parse(data):
            kind = msg["header"]["type"]
            if kind == NLMSG_DONE and msg["header"]["sequence_number"] == self._dump_seq:
                self._dump_done()
            elif kind == NLMSG_ERROR:
                code = msg.get("error") or 0
                if code:
                    log.warning("rtnetlink refused a request: %s", errno.errorcode.get(-code, code))
            elif kind in (RTM_NEWLINK, RTM_DELLINK) and msg.get("family", 0) == socket.AF_UNSPEC:
                link = link_from_message(msg)
                if link is not None:
                    self._update(link, gone=kind == RTM_DELLINK)

    def _update(self, link: Link, gone: bool) -> None:
        old = self.links.get(link.index)
        if gone:
            if old is not None:
                del self.links[link.index]
                self.on_change(old, None)
            return
        if self._dump_seq is not None:
            self._dumped.add(link.index)
        if old != link:
            self.links[link.index] = link
            if old is not None and old.name != link.name:  # renamed: the old name is gone
                self.on_change(old, None)
                old = None
            self.on_change(old, link)

    def _dump_done(self) -> None:
        self._dump_seq = None
        for index in [i for i in self.links if i not in self._dumped]:  # deleted while we were deaf
            self.on_change(self.links.pop(index), None)
        if self._dump_again:  # notifications were lost during this one too
            self._request_dump()
