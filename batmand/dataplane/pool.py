"""The control process's side of the data plane, in two forms with one interface:

- InlineDataPlane (`--workers 0`): one Engine in the control process, driven by the
  event loop's readers.
- WorkerPool (`--workers N`): N worker processes. The control process owns every
  descriptor (TAP queues, the fanout receive rings) and keeps them open across a
  worker's restart, so flows keep their worker; it mirrors the forwarding table to
  bring a restarted worker up to date, or one that missed updates (its channel stayed
  full): such a worker gets the whole table again, in parts (channel.Outbox).

Both take the same calls from the daemon: add_port / remove_port / set_ports when hard
interfaces change, apply() for forwarding-table updates, take_seen() and counters()."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator

import batmand
from batmand.core.events import ForwardingUpdate
from batmand.core.forwarding import ForwardingTable

from . import bpf
from . import messages as m
from .channel import BadMessage, Channel, Outbox, encode, pair, split_update
from .engine import Engine, Port, table_sizes
from .rings import RxRing, TxRing, statistics

log = logging.getLogger("batmand")

# Receive-ring slots per worker and hard interface: one TCP flow's burst (bench/memory.py
# --iperf: 1024 slots dropped frames at 1 Gbit/s, 2048 none there but some at 1.6 Gbit/s,
# 4096 none; bench/memory-profile.md). The bytes follow the MTU: 5.2 MB at MTU 1560 (the
# 4096 power-of-two slots of before took 8 MB). A ring starts with a third of that (an
# idle mesh sends the daemon OGMs and broadcasts, and with the kernel path little else)
# and grows to it after the first burst that fills half of it (RxRing.grow).
RX_FRAMES = 3072
RX_FRAMES_AT_FIRST = 1024
RESTART_BACKOFF = 1.0  # seconds between restarts of a worker that keeps dying
SILENCE_LIMIT = 5.0  # a worker that has not reported for this long is stuck: killed and restarted


# How a worker starts: isolated (-I: neither the current directory nor PYTHONPATH nor the
# user's site-packages on sys.path, so nothing planted where the daemon was started runs
# as root), from "/", with the batmand package this daemon runs loaded from its directory.
# batmand.wire is registered bare, its __init__ not run: the worker needs three of its
# small modules, not every packet's codec and crc32c (with importlib.metadata) behind them.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(batmand.__file__))
_WORKER_BOOTSTRAP = """
import importlib.machinery, importlib.util, sys
spec = importlib.util.spec_from_file_location("batmand", sys.argv[1] + "/__init__.py",
                                              submodule_search_locations=[sys.argv[1]])
package = importlib.util.module_from_spec(spec)
sys.modules["batmand"] = package
spec.loader.exec_module(package)
wire = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("batmand.wire", None, is_package=True))
wire.__path__ = [sys.argv[1] + "/wire"]
sys.modules["batmand.wire"] = package.wire = wire
from batmand.dataplane.worker import main
main(sys.argv[2:])
"""


def worker_command(channel_fd: int) -> list[str]:
    return [sys.executable, "-I", "-c", _WORKER_BOOTSTRAP, _PACKAGE_DIR, str(channel_fd)]


def _ring_settings(mtu: int, version: int) -> dict:
    return {"mtu": max(mtu, 1560), "frames": RX_FRAMES_AT_FIRST, "max_frames": RX_FRAMES, "version": version,
            "vnet_hdr": True}


class InlineDataPlane:
    def __init__(self, loop, tap_fd: int, slow_host, slow_mesh, settings: dict) -> None:
        self.loop = loop
        self.settings = settings
        self.engine = Engine(tap_fd, slow_host, slow_mesh, gro=settings["gro"],
                             csum_offload=settings["csum_offload"])
        self.ring_drops: collections.Counter = collections.Counter()  # per hard interface
        loop.add_reader(tap_fd, self.engine.on_tap)

    def add_port(self, name: str, mac: bytes, mtu: int) -> None:
        self.remove_port(name)
        rx = RxRing(name, program=bpf.UNICAST_ONLY, **_ring_settings(mtu, self.settings["rx_ring"]))
        tx = TxRing(name, mtu=max(mtu, 1560), vnet_hdr=self.settings["csum_offload"])
        port = Port(name, mac, mtu, rx, tx)
        self.engine.add_port(port)
        self.loop.add_reader(rx.fileno(), self._on_port, port)

    def _on_port(self, port: Port) -> None:
        self.engine.on_port(port)
        if self.engine.port_error(port):
            # The socket reported an error (its interface went down): uvloop, like libuv,
            # stops watching a descriptor whose poll returned POLLERR after this last
            # call, so the ring is watched again once the loop has dropped it.
            self.loop.call_soon(self._watch_again, port)

    def _watch_again(self, port: Port) -> None:
        if self.engine.ports.get(port.name) is port:
            self.loop.remove_reader(port.rx.fileno())
            self.loop.add_reader(port.rx.fileno(), self._on_port, port)

    def remove_port(self, name: str) -> None:
        port = self.engine.remove_port(name)
        if port is not None:
            self.loop.remove_reader(port.rx.fileno())
            self.ring_drops[name] += statistics(port.rx.sock)[1]
            port.rx.close()
            port.tx.close()

    def set_ports(self, ports: dict, primary: bytes | None, wifi: bool) -> None:
        self.engine.set_ports(ports, primary, wifi)

    def apply(self, update: ForwardingUpdate) -> None:
        self.engine.apply(update)

    def take_seen(self) -> dict:
        return self.engine.take_seen()

    async def refresh(self) -> None:
        """Counters are always current inline."""

    def check(self) -> None:
        """Nothing to watch inline (the daemon's own watchdog covers it)."""

    def counters(self) -> dict:
        return dict(self.engine.counters)

    def status(self) -> dict:
        for name, port in self.engine.ports.items():
            self.ring_drops[name] += statistics(port.rx.sock)[1]
        counters = self.engine.counters
        return {"workers": [], "ring_drops": dict(self.ring_drops), "table": table_sizes(self.engine.fwd),
                "drops": {"socket": sum(self.ring_drops.values()), "daemon": counters["tx_ring_full"],
                          "tap_write": counters["tap_write_dropped"]}}

    def close(self) -> None:
        self.loop.remove_reader(self.engine.tap_fd)
        for name in list(self.engine.ports):
            self.remove_port(name)


class _Descriptor:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


class _Worker:
    def __init__(self, index: int, tap_fd: int) -> None:
        self.index = index
        self.tap_fd = tap_fd
        self.proc: subprocess.Popen | None = None
        self.channel: Channel | None = None
        self.outbox: Outbox | None = None
        self.restarts = 0
        self.resyncs = 0  # whole tables sent again after an update could not be delivered
        self.bad_messages = 0  # from the worker, undecodable (and those it reported)
        self.started = 0.0
        self.counters: dict = {}
        self.counters_before: collections.Counter = collections.Counter()  # of earlier lives
        self.ring_drops: dict = {}  # per hard interface, this life
        self.ring_drops_before: collections.Counter = collections.Counter()  # earlier lives
        self.table: dict = {}  # the sizes of the worker's forwarding table, as last reported
        self.reported: asyncio.Event | None = None  # set by the next report after refresh() asked
        self.last_report = 0.0

    def alive(self) -> bool:
        return self.outbox is not None and self.proc.poll() is None

    def totals(self) -> collections.Counter:
        """Counters over all its lives (counters at 0 kept: batmanctl s lists them)."""
        total = collections.Counter(self.counters_before)
        total.update(self.counters)
        return total

    def ring_drop_totals(self) -> collections.Counter:
        """Ring drops per hard interface over all its lives."""
        total = collections.Counter(self.ring_drops_before)
        total.update(self.ring_drops)
        return total


class WorkerPool:
    def __init__(self, loop, tap_fds: list[int], slow_host, slow_mesh, settings: dict) -> None:
        self.loop = loop
        self.settings = settings
        self.slow_host = slow_host
        self.slow_mesh = slow_mesh
        self.table = ForwardingTable()  # a mirror, to bring restarted workers up to date
        self.ports: dict[str, tuple[bytes, int, list[RxRing]]] = {}
        self.port_state: tuple = ({}, None, False)
        self.seen: dict = {}
        self.closing = False
        self.workers = [_Worker(i, fd) for i, fd in enumerate(tap_fds)]
        for worker in self.workers:
            self._spawn(worker)

    # --- worker life cycle ----------------------------------------------------------------------------

    def _spawn(self, worker: _Worker) -> None:
        channel, theirs = pair()
        worker.proc = subprocess.Popen(worker_command(theirs.fileno()), pass_fds=[theirs.fileno()], cwd="/")
        theirs.close()
        worker.channel = channel
        worker.outbox = Outbox(self.loop, channel, lambda: self._resync(worker))
        worker.started = worker.last_report = time.monotonic()
        self.loop.add_reader(channel.fileno(), self._on_channel, worker)
        self._send(worker, m.Configure(self.settings["gro"], self.settings["csum_offload"]), [worker.tap_fd])
        for name in self.ports:
            self._send_port(worker, name)
        self._send(worker, m.SetPorts(*self.port_state))
        worker.outbox.put_stream(self._table_stream())

    def _send(self, worker: _Worker, message, fds=(), owned=()) -> None:
        worker.outbox.put(encode(message), fds, owned=owned)

    def _send_port(self, worker: _Worker, name: str) -> None:
        mac, mtu, rings = self.ports[name]
        tx = TxRing(name, mtu=max(mtu, 1560), vnet_hdr=self.settings["csum_offload"])
        # Both are closed here once the message went out (the worker has its own descriptors
        # then); the receive ring's is a copy, as the ring may be closed before that.
        rx = _Descriptor(os.dup(rings[worker.index].fileno()))
        self._send(worker, m.AddPort(name, mac, mtu, _ring_settings(mtu, self.settings["rx_ring"])),
                   [rx.fd, tx.fileno()], owned=(rx, tx))

    def _table_stream(self) -> Iterator[bytes]:
        """The whole forwarding table as messages, made when the first one is taken (so
        it is the table of that moment) and part by part after that."""
        yield encode(m.TableBegin())
        for part in split_update(self.table.snapshot()):
            yield encode(m.TablePart(part))
        yield encode(m.TableEnd())

    def _resync(self, worker: _Worker) -> None:
        """The worker missed a table update (its channel stayed full, or the update was
        lost): forget the updates waiting for it and send it the whole table instead."""
        if not worker.alive():
            return
        worker.resyncs += 1
        worker.outbox.drop_tables()
        worker.outbox.put_stream(self._table_stream())

    def _on_channel(self, worker: _Worker) -> None:
        channel = worker.channel
        for _ in range(256):
            try:
                got = channel.recv()
            except EOFError:
                self._lost(worker)
                return
            except BadMessage as exc:
                worker.bad_messages += 1
                if worker.bad_messages == 1:
                    log.warning("data-plane worker %d: %s", worker.index, exc)
                continue
            if got is None:
                return
            message, _fds = got
            self.HANDLERS[type(message)](self, worker, message)

    # --- messages from a worker -------------------------------------------------------------------------

    def _slow_host(self, worker: _Worker, message: m.SlowHost) -> None:
        self.slow_host(message.frame)

    def _slow_mesh(self, worker: _Worker, message: m.SlowMesh) -> None:
        self.slow_mesh(message.ifname, message.frame)

    def _seen(self, worker: _Worker, message: m.Seen) -> None:
        self.seen.update(message.clients)

    def _stats(self, worker: _Worker, message: m.Stats) -> None:
        worker.counters, worker.ring_drops, worker.table = message.counters, message.ring_drops, message.table
        worker.last_report = time.monotonic()
        if worker.reported is not None:
            worker.reported.set()

    def _resync_asked(self, worker: _Worker, message: m.Resync) -> None:
        """The worker could not decode a message of ours."""
        self._resync(worker)

    HANDLERS = {m.SlowHost: _slow_host, m.SlowMesh: _slow_mesh, m.Seen: _seen, m.Stats: _stats,
                m.Resync: _resync_asked}

    def _lost(self, worker: _Worker) -> None:
        """A worker died: restart it on the same TAP queue and receive rings."""
        self.loop.remove_reader(worker.channel.fileno())
        worker.outbox.close()
        worker.outbox = None
        worker.channel.close()
        code = worker.proc.poll()
        if code is None:
            worker.proc.kill()
            code = worker.proc.wait()
        worker.counters_before.update(worker.counters)
        worker.counters = {}
        worker.ring_drops_before.update(worker.ring_drops)
        worker.ring_drops = {}
        worker.table = {}
        if self.closing:
            return
        worker.restarts += 1
        log.warning("data-plane worker %d (pid %d) exited with %s; restarting it", worker.index, worker.proc.pid, code)
        delay = RESTART_BACKOFF if time.monotonic() - worker.started < RESTART_BACKOFF else 0.0
        self.loop.call_later(delay, self._respawn, worker)

    def check(self) -> None:
        """Called once a second: a worker that stopped reporting (stuck, or stopped) is
        killed; its channel's end then restarts it like any worker that died."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.alive() and now - worker.last_report > SILENCE_LIMIT:
                log.warning("data-plane worker %d (pid %d) silent for %.0f s; killing it", worker.index,
                            worker.proc.pid, now - worker.last_report)
                worker.proc.kill()
                worker.last_report = now  # once: the restart follows the channel's end

    def _respawn(self, worker: _Worker) -> None:
        if not self.closing:
            self._spawn(worker)

    # --- the daemon's calls -----------------------------------------------------------------------------

    def _broadcast(self, message) -> None:
        data = encode(message)
        for worker in self.workers:
            if worker.alive():
                worker.outbox.put(data)

    def add_port(self, name: str, mac: bytes, mtu: int) -> None:
        self.remove_port(name)
        group = random.randrange(1, 0xFFFF)
        rings = []
        try:
            for _ in self.workers:
                rings.append(RxRing(name, program=bpf.UNICAST_ONLY, fanout_group=group, mapped=False,
                                    **_ring_settings(mtu, self.settings["rx_ring"])))
        except OSError:
            for ring in rings:
                ring.close()
            raise
        self.ports[name] = (mac, mtu, rings)
        for worker in self.workers:
            if worker.alive():
                self._send_port(worker, name)

    def remove_port(self, name: str) -> None:
        entry = self.ports.pop(name, None)
        if entry is None:
            return
        self._broadcast(m.RemovePort(name))
        for ring in entry[2]:
            ring.close()

    def set_ports(self, ports: dict, primary: bytes | None, wifi: bool) -> None:
        self.port_state = (dict(ports), primary, wifi)
        self._broadcast(m.SetPorts(*self.port_state))

    def apply(self, update: ForwardingUpdate) -> None:
        """A table update for every worker, in parts of bounded size (encoded once)."""
        self.table.apply(update)
        parts = [encode(m.TableUpdate(part)) for part in split_update(update)]
        for worker in self.workers:
            if worker.alive():
                for data in parts:
                    worker.outbox.put(data, table=True)

    def take_seen(self) -> dict:
        seen, self.seen = self.seen, {}
        return seen

    async def refresh(self, timeout: float = 0.5) -> None:
        """Ask every worker for its counters now (they report on their own twice a second)."""
        waits = []
        for worker in self.workers:
            if worker.alive():
                worker.reported = asyncio.Event()
                self._send(worker, m.Report())
                waits.append(worker.reported.wait())
        if waits:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    def counters(self) -> dict:
        total = collections.Counter()
        for worker in self.workers:
            total.update(worker.totals())
        return dict(total)

    def status(self) -> dict:
        rows = []
        ring_drops = collections.Counter()
        for w in self.workers:
            counters = w.totals()
            drops = w.ring_drop_totals()
            ring_drops.update(drops)
            rows.append({"index": w.index, "pid": w.proc.pid if w.proc else None, "restarts": w.restarts,
                         "rx_frames": counters["rx"] + counters["forward"], "tx_frames": counters["tx"] + counters["forward"],
                         "forward_frames": counters["forward"], "slow_path": counters["slow_host"] + counters["slow_mesh"],
                         "gro_merged": counters["gro_merged"], "tso_segments": counters["tso_segments"],
                         "socket_drops": sum(drops.values()), "table": dict(w.table), "resyncs": w.resyncs,
                         "channel_backlog": w.outbox.backlog() if w.outbox else 0,
                         "bad_messages": w.bad_messages + counters["channel_bad_messages"]})
        total = self.counters()
        return {"workers": rows, "ring_drops": dict(ring_drops), "table": table_sizes(self.table),
                "drops": {"socket": sum(r["socket_drops"] for r in rows),
                          "tap_write": total.get("tap_write_dropped", 0),
                          "daemon": total.get("tx_ring_full", 0)}}

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.poll() is None]

    def close(self) -> None:
        self.closing = True
        for worker in self.workers:
            if worker.alive():
                self._send(worker, m.Stop())
        deadline = time.monotonic() + 2.0
        for worker in self.workers:
            if worker.proc is None:
                continue
            try:
                worker.proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
            if worker.channel is not None and worker.outbox is not None:
                self.loop.remove_reader(worker.channel.fileno())
                worker.outbox.close()
                worker.outbox = None
                worker.channel.close()
                worker.channel = None
        for name in list(self.ports):
            for ring in self.ports.pop(name)[2]:
                ring.close()
