"""A veth pair made, brought up and removed through rtnetlink, each request blocking and
bounded. The daemon's event loop (uvloop) cannot host pyroute2's own netlink endpoint,
so pyroute2 only builds and parses the messages, as in daemon.netlink."""

from __future__ import annotations

import errno
import os
import socket
import time

from batmand import lazy_package

lazy_package.register("pyroute2")  # its message classes only, not every API it has

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_DELLINK, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import IFF_UP, ifinfmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

ACK_TIMEOUT = 1.0


def _request(msg_type: int, nlm_flags: int, **fields) -> None:
    """One rtnetlink request, waiting for its answer; OSError when the kernel refuses."""
    msg = ifinfmsg()
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | nlm_flags
    msg["header"]["sequence_number"] = 1
    msg["family"] = socket.AF_UNSPEC
    for key, value in fields.items():
        msg[key] = value
    msg.encode()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(ACK_TIMEOUT)
        sock.send(msg.data)
        deadline = time.monotonic() + ACK_TIMEOUT
        while time.monotonic() < deadline:
            for reply in MarshalRtnl().parse(sock.recv(1 << 16)):
                if reply["header"]["type"] == NLMSG_ERROR and reply["header"]["sequence_number"] == 1:
                    code = reply.get("error") or 0
                    if code:
                        raise OSError(-code, os.strerror(-code))
                    return
    raise OSError(errno.ETIMEDOUT, "no answer from rtnetlink")


IN6_ADDR_GEN_MODE_NONE = 1  # (linux/if_link.h) no IPv6 link-local address of its own


def add_pair(name: str, peer: str, address: str, mtu: int) -> None:
    """Both ends down, with the same address and MTU, and no IPv6 address of their own
    (so the host sends no neighbour discovery into them)."""
    same = [("IFLA_ADDRESS", address), ("IFLA_MTU", mtu)]
    _request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, attrs=[
        ("IFLA_IFNAME", name), *same,
        ("IFLA_LINKINFO", {"attrs": [
            ("IFLA_INFO_KIND", "veth"),
            ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", {"attrs": [("IFLA_IFNAME", peer), *same]})]})]})])
    try:
        for end in (name, peer):  # (the kernel takes this only once the device exists)
            _request(RTM_NEWLINK, 0, index=socket.if_nametoindex(end), attrs=[("IFLA_AF_SPEC", {"attrs": [
                ("AF_INET6", {"attrs": [("IFLA_INET6_ADDR_GEN_MODE", IN6_ADDR_GEN_MODE_NONE)]})]})])
    except OSError as exc:
        if exc.errno != errno.EAFNOSUPPORT:  # (no IPv6 in this kernel: nothing to turn off)
            delete(name)
            raise


def set_up(name: str) -> None:
    _request(RTM_NEWLINK, 0, index=socket.if_nametoindex(name), flags=IFF_UP, change=IFF_UP)


def delete(name: str) -> bool:
    """Removes the link (a veth: both ends); False when there is none."""
    try:
        index = socket.if_nametoindex(name)
    except OSError:
        return False
    try:
        _request(RTM_DELLINK, 0, index=index)
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return False
        raise
    return True
