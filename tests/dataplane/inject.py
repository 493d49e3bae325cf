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


class FakeOriginators:
    """Originators that exist only as OGMs relayed by a real neighbour (the frames carry
    its address: it is the node our packet socket sends from), each announcing clients in
    TT diffs, as a mesh of many nodes with many clients would look to the node beyond:
    every OGM is a new seqno and the next TT version, with the VLAN CRC of the result."""

    PER_OGM = 36  # TT changes per OGM, 12 bytes each: an OGM over 512 bytes is dropped (the kernel's walk)

    def __init__(self, relay: bytes, count: int) -> None:
        self.relay = relay
        self.origs = [bytes([0x02, 0x5e, 0, 0, i >> 8, i & 0xFF]) for i in range(count)]
        self.seqno = [1000] * count
        self.ttvn = [0] * count
        self.crc = [0] * count
        self.clients: list[list[bytes]] = [[] for _ in range(count)]
        self._next = 0

    def new_clients(self, n: int) -> list[bytes]:
        out = [bytes([0x06, 0xc1]) + (self._next + k).to_bytes(4, "big") for k in range(n)]
        self._next += n
        return out

    def ogm(self, i: int, add: list[bytes] = (), remove: list[bytes] = ()) -> bytes:
        """Originator i's next OGM: its clients `remove`d and `add`ed (at most PER_OGM)."""
        from batmand.wire import BROADCAST, IvOgm, Mac, TtChange, TtTvlv, TtVlan, build_frame, tt_entry_crc
        from batmand.wire.constants import TtClientFlags, TtDataFlags

        assert len(add) + len(remove) <= self.PER_OGM
        gone = set(remove)
        self.clients[i] = [c for c in self.clients[i] if c not in gone] + list(add)
        for client in [*remove, *add]:
            self.crc[i] ^= tt_entry_crc(client, 0, 0)
        self.ttvn[i] = (self.ttvn[i] + 1) & 0xFF
        self.seqno[i] += 1
        changes = [TtChange(flags=TtClientFlags.DEL, addr=Mac(c), vid=0) for c in remove]
        changes += [TtChange(flags=0, addr=Mac(c), vid=0) for c in add]
        tt = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=self.ttvn[i], vlans=[TtVlan(crc=self.crc[i], vid=0)],
                    changes=changes)
        orig = Mac(self.origs[i])
        ogm = IvOgm(ttl=49, flags=0, seqno=self.seqno[i], orig=orig, prev_sender=orig, tq=255, tvlvs=[tt])
        return build_frame(BROADCAST, Mac(self.relay), ogm)

    def grow(self, per_orig: int) -> list[bytes]:
        """OGMs that give every originator `per_orig` more clients."""
        frames = []
        for _ in range(0, per_orig, self.PER_OGM):
            for i in range(len(self.origs)):
                frames.append(self.ogm(i, add=self.new_clients(min(self.PER_OGM, per_orig))))
        return frames

    def churn(self, rounds: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """OGMs in which every originator replaces its oldest PER_OGM / 2 clients with new
        ones, `rounds` times; and the clients removed and added."""
        frames, removed, added = [], [], []
        half = self.PER_OGM // 2
        for _ in range(rounds):
            for i in range(len(self.origs)):
                old, new = self.clients[i][:half], self.new_clients(half)
                frames.append(self.ogm(i, add=new, remove=old))
                removed += old
                added += new
        return frames, removed, added


class Sniffer:
    """Every frame arriving on an interface of a namespace (a packet socket opened inside
    it); unicast() picks the batman-adv UNICAST frames for given inner destinations."""

    def __init__(self, ns: str, ifname: str) -> None:
        from tests.netns import entered

        with entered(ns):
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self.sock.bind((ifname, 0))
        self.sock.setblocking(False)
        self.frames: list[bytes] = []

    def take(self) -> list[bytes]:
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] != socket.PACKET_OUTGOING:
                self.frames.append(data)
        frames, self.frames = self.frames, []
        return frames

    def unicast(self, inner_dsts) -> list[bytes]:
        wanted = set(inner_dsts)
        return [f for f in self.take() if f[12:14] == b"\x43\x05" and f[14] == 0x40 and f[24:30] in wanted]

    def close(self) -> None:
        self.sock.close()
