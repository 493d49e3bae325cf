"""A data-plane worker process: one TAP queue, one receive ring per hard interface in
that interface's fanout group, its own transmit rings, and an Engine. It shares nothing
with the other workers; the control process sends it tables and descriptors over the
channel, and it sends back frames for the slow path and, twice a second, counters and
the local clients it saw.

Started by pool.worker_command with the channel socket inherited (FD)."""

from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import sys
import time

from batmand.core.forwarding import ForwardingTable

from . import messages as m
from .channel import PART_ENTRIES, BadMessage, Channel
from .engine import Engine, Port, table_sizes
from .rings import RxRing, TxRing, statistics

REPORT_INTERVAL = 0.5
CHANNEL_BATCH = 32  # messages per wake-up


class Worker:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.engine: Engine | None = None
        self.epoll = select.epoll()
        self.epoll.register(channel.fileno(), select.EPOLLIN)
        self.by_fd: dict[int, Port] = {}
        self.ring_drops: dict[str, int] = {}  # per hard interface: frames lost for lack of ring slots
        self.bad_messages = 0  # from the control process, undecodable
        self.new_table: ForwardingTable | None = None  # a whole table arriving in parts
        self.running = True

    def run(self) -> None:
        next_report = time.monotonic() + REPORT_INTERVAL
        channel_fd = self.channel.fileno()
        while self.running:
            for fd, events in self.epoll.poll(REPORT_INTERVAL):
                if fd == channel_fd:
                    self.on_channel()
                elif self.engine is not None and fd == self.engine.tap_fd:
                    self.engine.on_tap()
                else:
                    port = self.by_fd.get(fd)
                    if port is not None:
                        if events & select.EPOLLERR:
                            self.engine.port_error(port)  # else epoll reports it again at once
                        if events & select.EPOLLIN:
                            self.engine.on_port(port)
            now = time.monotonic()
            if now >= next_report:
                next_report = now + REPORT_INTERVAL
                self.report()

    def report(self) -> None:
        if self.engine is None:
            return
        for name, port in self.engine.ports.items():
            self.ring_drops[name] = self.ring_drops.get(name, 0) + statistics(port.rx.sock)[1]
        seen = iter(self.engine.take_seen().items())
        while part := dict(itertools.islice(seen, PART_ENTRIES)):  # any number of clients
            self.channel.send(m.Seen(part), must=True)
        counters = dict(self.engine.counters)
        counters["drop_slow_path_queue"] = self.channel.dropped  # the control process lagged behind
        counters["channel_bad_messages"] = self.bad_messages
        self.channel.send(m.Stats(counters, dict(self.ring_drops), table_sizes(self.engine.fwd)), must=True)

    def on_channel(self) -> None:
        for _ in range(CHANNEL_BATCH):  # a whole table in parts: frames are served in between
            try:
                got = self.channel.recv()
            except EOFError:
                self.running = False  # the control process is gone
                return
            except BadMessage as exc:
                # Lost, whatever it was; if a table update, our table is stale: ask for it all.
                self.bad_messages += 1
                if self.bad_messages == 1:
                    print(f"batmand worker {os.getpid()}: {exc}; asking for the whole table", file=sys.stderr)
                self.new_table = None
                self.channel.send(m.Resync(), must=True)
                continue
            if got is None:
                return
            message, fds = got
            self.HANDLERS[type(message)](self, message, fds)

    # --- messages from the control process ------------------------------------------------------

    def configure(self, message: m.Configure, fds) -> None:
        tap_fd = fds[0]
        os.set_blocking(tap_fd, False)
        self.engine = Engine(tap_fd, self._slow_host, self._slow_mesh, gro=message.gro,
                             csum_offload=message.csum_offload)
        self.epoll.register(tap_fd, select.EPOLLIN)

    def add_port(self, message: m.AddPort, fds) -> None:
        self._remove_port(message.name)
        ring = message.ring
        rx = RxRing(message.name, sock=socket.socket(fileno=fds[0]), **ring)
        tx = TxRing(message.name, mtu=ring["mtu"], vnet_hdr=self.engine.csum_offload,
                    sock=socket.socket(fileno=fds[1]))
        port = Port(message.name, message.mac, message.mtu, rx, tx)
        self.engine.add_port(port)
        self.by_fd[rx.fileno()] = port
        self.epoll.register(rx.fileno(), select.EPOLLIN)

    def remove_port(self, message: m.RemovePort, fds) -> None:
        self._remove_port(message.name)

    def _remove_port(self, name: str) -> None:
        port = self.engine.remove_port(name)
        if port is not None:
            self.epoll.unregister(port.rx.fileno())
            self.by_fd.pop(port.rx.fileno(), None)
            port.rx.close()
            port.tx.close()

    def set_ports(self, message: m.SetPorts, fds) -> None:
        self.engine.set_ports(message.ports, message.primary, message.wifi)

    def table_update(self, message: m.TableUpdate, fds) -> None:
        self.engine.apply(message.update)

    def table_begin(self, message: m.TableBegin, fds) -> None:
        self.new_table = ForwardingTable()

    def table_part(self, message: m.TablePart, fds) -> None:
        if self.new_table is not None:  # else a part of a table cut short: a new one follows
            self.new_table.apply(message.update)

    def table_end(self, message: m.TableEnd, fds) -> None:
        """The whole table arrived: it replaces ours (until now, frames used the old one)."""
        if self.new_table is not None:
            self.engine.set_table(self.new_table)
            self.new_table = None

    def report_now(self, message: m.Report, fds) -> None:
        self.report()

    def stop(self, message: m.Stop, fds) -> None:
        self.running = False

    HANDLERS = {m.Configure: configure, m.AddPort: add_port, m.RemovePort: remove_port, m.SetPorts: set_ports,
                m.TableUpdate: table_update, m.TableBegin: table_begin, m.TablePart: table_part,
                m.TableEnd: table_end, m.Report: report_now, m.Stop: stop}

    # --- frames for the control process ------------------------------------------------------

    def _slow_host(self, frame: bytes) -> None:
        self.channel.send(m.SlowHost(frame))

    def _slow_mesh(self, ifname: str, frame: bytes) -> None:
        self.channel.send(m.SlowMesh(ifname, frame))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the control process decides when we stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    channel = Channel(socket.socket(fileno=int(argv[0])), m.TO_WORKER)
    Worker(channel).run()


if __name__ == "__main__":
    main()
