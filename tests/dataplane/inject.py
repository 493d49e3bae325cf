"""Helpers for the data-plane lab tests: crafted frames sent from inside a namespace,
labs of two daemons, the data-plane status and the CPU time of processes."""

from __future__ import annotations

import json
import os
import socket

from pyroute2 import netns

from batmand.dataplane.rings import PACKET_VNET_HDR, SOL_PACKET
from batmand.lab import Lab, from_dict
from batmand.wire.fastpath import unicast_prefix
from tests.daemon.labs import prefix

INTERVAL_MS = 200


def pair_lab(workers_a: int = 0, workers_b: int = 2, **batmand) -> Lab:
    """Two daemons a - b on one veth (a: e-b, b: e-a), short OGM intervals."""
    settings = {"orig_interval_ms": INTERVAL_MS, **batmand}
    topo = from_dict({"lab": {"mtu": 1560}, "batmand": settings,
                      "node": [{"name": "a", "batmand": {"workers": workers_a}},
                               {"name": "b", "batmand": {"workers": workers_b}}],
                      "link": [{"a": "a", "b": "b"}]})
    return Lab(topo, prefix())


def dp(lab: Lab, node: str) -> dict:
    return json.loads(lab.batmanctl(node, "dp", "--json", check=True).stdout)


def send_frames(ns: str, ifname: str, frames: list[bytes], vnet_hdr: bool = False) -> None:
    """Send each frame out of `ifname` in namespace `ns` from a forked child (a packet
    socket; with vnet_hdr each frame starts with the 10-byte virtio header the kernel
    takes from the sender, as a VM's or container's virtio device would hand it over)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            netns.setns(ns)
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            if vnet_hdr:
                s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
            s.bind((ifname, 0))
            for frame in frames:
                s.send(frame)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"sending from {ns} failed"


def unicast(dst: bytes, src: bytes, orig: bytes, inner: bytes, ttvn: int = 0) -> bytes:
    """A batman-adv UNICAST frame dst <- src for originator `orig` carrying `inner`."""
    return unicast_prefix(dst, src, orig, ttvn) + inner


def mac(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
