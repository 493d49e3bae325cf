"""The link table the daemon reads instead of asking the kernel: kept current by rtnetlink
notifications, and read again whole when notifications were lost (a full socket buffer),
so that links created and deleted while the daemon was deaf are right afterwards."""

import asyncio
import socket
import subprocess

import uvloop

from batmand.daemon.netlink import LinkMonitor
from tests.netns import entered, ip, namespace


def _names(monitor: LinkMonitor) -> set[str]:
    return {link.name for link in monitor.links.values()}


def test_lost_notifications_are_repaired_by_reading_every_link_again():
    with namespace() as ns:
        ip("link", "add", "keep0", "type", "veth", "peer", "name", "keep1", netns=ns)
        ip("link", "add", "gone0", "type", "veth", "peer", "name", "gone1", netns=ns)
        with entered(ns):
            monitor = LinkMonitor()
        try:
            monitor.load()
            assert {"lo", "keep0", "gone0"} <= _names(monitor)
            # a buffer far too small for what follows: the kernel drops notifications
            monitor.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            batch = "\n".join(f"link add v{i} type veth peer name w{i}" for i in range(40)) + "\nlink del gone0\n"
            subprocess.run(["ip", "-n", ns, "-batch", "-"], input=batch, text=True, check=True)
            changes = []

            async def main():
                loop = asyncio.get_running_loop()
                monitor.start(loop, lambda old, new: changes.append((old, new)))
                for _ in range(100):
                    await asyncio.sleep(0.02)
                    if monitor.overruns and monitor._dump_seq is None:
                        break

            uvloop.run(main())
            assert monitor.overruns >= 1
            names = _names(monitor)
            assert {f"v{i}" for i in range(40)} | {f"w{i}" for i in range(40)} <= names
            assert not {"gone0", "gone1"} & names and {"keep0", "keep1"} <= names
            assert any(old is not None and old.name == "gone0" and new is None for old, new in changes)
        finally:
            monitor.close()


def test_link_state_and_vlan_devices():
    with namespace() as ns:
        ip("link", "add", "a0", "type", "veth", "peer", "name", "b0", netns=ns)
        with entered(ns):
            monitor = LinkMonitor()
        try:
            monitor.load()
            a0 = monitor.by_name("a0")
            assert a0 is not None and not a0.up and a0.kind == "veth" and a0.mtu == 1500
            monitor.set_up(a0.index)  # answered before it returns

            async def main():
                monitor.start(asyncio.get_running_loop(), lambda old, new: None)
                ip("link", "set", "a0", "mtu", "1400", netns=ns)
                for _ in range(50):
                    await asyncio.sleep(0.02)
                    link = monitor.by_name("a0")
                    if link.up and link.mtu == 1400:
                        return

            uvloop.run(main())
            link = monitor.by_name("a0")
            assert link.up and link.mtu == 1400
            assert monitor.vlans_on(link.index) == set()  # no 802.1Q here (see the daemon tests)
        finally:
            monitor.close()
