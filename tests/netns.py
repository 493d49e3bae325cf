"""Network namespaces for tests: unique names per test run, always removed afterwards."""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess

RUN_PREFIX = f"bmdt{os.getpid() % 100000}-"
_counter = itertools.count()


def ip(*args: str, netns: str | None = None) -> str:
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@contextlib.contextmanager
def namespace():
    """A fresh network namespace with loopback up; deleted on exit, also on failure."""
    name = f"{RUN_PREFIX}{next(_counter)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ip("link", "set", "lo", "up", netns=name)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def in_netns(netns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns] + argv


@contextlib.contextmanager
def entered(netns: str):
    """This thread inside `netns` for the block; sockets made there stay in it."""
    from pyroute2 import netns as pyroute_netns

    pyroute_netns.pushns(netns)
    try:
        yield
    finally:
        pyroute_netns.popns()
