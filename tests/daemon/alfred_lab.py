"""Debian's alfred (and, on kernel nodes, `batadv-vis -s`) in the nodes of a lab, started
and stopped by PID, and the batadv-vis client's picture read back."""

from __future__ import annotations

import json
import os
import subprocess

from tests.daemon.labs import wait_for

GUEST_SOCKET = "/run/alfred.sock"  # a kernel node's guest: alone in its file system


class Alfreds:
    """One alfred per node: primary mode (-m: every alfred keeps and passes on everything),
    syncing every second (-p 1). On batmand nodes with -b none: there is no batman-adv
    module to ask, and without it alfred exits ("batman-adv interface bat0 not found")."""

    def __init__(self, lab) -> None:
        self.lab = lab
        self.procs: dict[str, object] = {}  # subprocess.Popen, or a kernel node's GuestJob
        self.servers: dict[str, object] = {}  # kernel nodes: batadv-vis -s

    def socket(self, node: str) -> str:
        if self.lab.is_kernel(node):
            return GUEST_SOCKET
        return str(self.lab.lab_dir / f"{node}-alfred.sock")  # a file: one per namespace

    def _socket_ready(self, node: str) -> bool:
        if self.lab.is_kernel(node):
            return self.lab.exec(node, ["test", "-S", GUEST_SOCKET]).returncode == 0
        return os.path.exists(self.socket(node))

    def _link_local_ready(self, node: str) -> bool:
        """alfred binds bat0's EUI-64 link-local address: it must be there and past DAD."""
        for line in self.lab.exec(node, ["cat", "/proc/net/if_inet6"]).stdout.splitlines():
            addr, _, _, scope, flags, name = line.split()
            if name == "bat0" and addr.startswith("fe80") and scope == "20" and not int(flags, 16) & 0x40:
                return True
        return False

    def start(self, node: str) -> None:
        lab = self.lab
        wait_for(lambda: self._link_local_ready(node), timeout=15)
        if lab.is_kernel(node):  # alfred asks batman-adv for originators: it needs an active primary first
            wait_for(lambda: lab.exec(node, ["batctl", "o"]).returncode == 0, timeout=30, step=0.5)
        argv = ["alfred", "-i", "bat0", "-m", "-p", "1", "-u", self.socket(node)]
        if lab.is_kernel(node):
            self.procs[node] = lab.spawn(node, argv)
        else:
            argv[3:3] = ["-b", "none"]
            with open(lab.lab_dir / f"{node}-alfred.log", "ab") as log:
                self.procs[node] = lab.spawn(node, argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: self._socket_ready(node) or self.procs[node].poll() is not None, timeout=20)
        proc = self.procs[node]
        if proc.poll() is not None:
            said = " ".join(proc.output()) if lab.is_kernel(node) else \
                (lab.lab_dir / f"{node}-alfred.log").read_text()
            raise AssertionError(f"{node}: alfred exited ({proc.returncode}): {said.strip()}")
        if lab.is_kernel(node):  # what a kernel node runs to publish its record
            self.servers[node] = lab.spawn(node, ["batadv-vis", "-s", "-u", GUEST_SOCKET])

    def stop(self, node: str) -> None:
        for table in (self.servers, self.procs):
            proc = table.pop(node, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def stop_all(self) -> None:
        for node in list(self.procs):
            self.stop(node)

    def vis(self, node: str, form: str) -> str:
        """`batadv-vis -f FORM` on the node (in a kernel node's guest: Debian's too)."""
        out = self.lab.exec(node, ["batadv-vis", "-u", self.socket(node), "-f", form], timeout=20)
        assert out.returncode == 0, out.stderr
        return out.stdout


def drawn(doc: dict) -> dict:
    """batadv-vis -f jsondoc as primary -> (secondaries, {(router, neighbour)})."""
    return {v["primary"]: (v.get("secondary", []), {(n["router"], n["neighbor"]) for n in v["neighbors"]})
            for v in doc["vis"]}


def wait_drawn(alfreds: Alfreds, node: str, complete, timeout: float) -> tuple[dict, float]:
    """batadv-vis -f jsondoc on `node` until complete(drawn picture); the last one in the error."""
    last = {}

    def check():
        last["doc"] = json.loads(alfreds.vis(node, "jsondoc"))
        return last["doc"] if complete(drawn(last["doc"])) else None

    try:
        return wait_for(check, timeout=timeout, step=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: batadv-vis on {node} drew {drawn(last['doc'])}; {last['doc']}") from None
