"""Prometheus metrics (`metrics_listen`): batctl s, the table sizes, the selected gateway and
the data plane per worker, served as Prometheus text at /metrics.

Nothing is counted for the metrics: a scrape reads what the daemon keeps anyway (the core's
counters, the tables' sizes, the workers' last reports, which they send twice a second).
The HTTP server is a small asyncio one on the daemon's own loop, not prometheus_client's
start_http_server: that one answers from a thread per connection, and the collector would
then read the core's dicts while the loop changes them, and PACKET_STATISTICS (reset by
every read, summed on the loop) from two threads at once. On the loop a scrape reads a
consistent state without locks; it costs the loop the formatting (about a millisecond
for the few hundred samples), which a thread would cost it just the same under the GIL.
Connections are bounded (MAX_CLIENTS), each request head too (MAX_HEAD) and the time a client
may take to send it (IDLE_TIMEOUT).

Label values come from the daemon's code, never from peers: drop reasons, counter names,
table names, worker indexes (at most 64), drop places; the one exception is the MAC of the
selected gateway (one series)."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder

from batmand import __version__

from . import tables
from .options import listen_address

log = logging.getLogger("batmand.metrics")

MAX_CLIENTS = 16
MAX_HEAD = 8192  # bytes of request line and headers
IDLE_TIMEOUT = 30.0  # seconds a connection may wait for its next request (Prometheus keeps it open)
REFUSE_TIMEOUT = 2.0  # seconds a refused client has to send its request, for its 503
PATH = "/metrics"

# batctl s counters that count something other than packets (the rest count packets, or
# bytes when they end in _bytes)
OTHER_UNITS = {"rx_batches": "batmand_rx_batches", "internal_error": "batmand_internal_errors",
               "channel_bad_messages": "batmand_channel_bad_messages", "tso_segments": "batmand_tso_segments"}
DROP_PREFIX = "drop_"
SOCKET_ERROR_PREFIX = "rx_socket_error_"
# the per-worker figures of `batmanctl dp`: key -> (metric name, help, counter or gauge)
WORKER_METRICS = {
    "rx_frames": ("batmand_dataplane_rx_packets", "frames a worker received (delivered or forwarded)", True),
    "tx_frames": ("batmand_dataplane_tx_packets", "frames a worker sent to the mesh (sent or forwarded)", True),
    "forward_frames": ("batmand_dataplane_forward_packets", "frames a worker forwarded", True),
    "slow_path": ("batmand_dataplane_slow_path_packets", "frames a worker left to the control process", True),
    "gro_merged": ("batmand_dataplane_gro_merged_packets", "TCP segments a worker merged into GSO frames", True),
    "tso_segments": ("batmand_dataplane_tso_segments", "segments a worker cut from TSO frames", True),
    "socket_drops": ("batmand_dataplane_socket_dropped_packets", "frames a worker's receive rings lost", True),
    "restarts": ("batmand_dataplane_worker_restarts", "times a worker was restarted", True),
    "resyncs": ("batmand_dataplane_table_resyncs", "whole forwarding tables sent to a worker again", True),
    "bad_messages": ("batmand_dataplane_bad_messages", "undecodable messages between a worker and the daemon", True),
    "channel_backlog": ("batmand_dataplane_channel_backlog_messages", "messages waiting to go to a worker", False),
}
# the kernel path's parts as the metrics label them, and their keys in `batmanctl dp --json`
KERNEL_PARTS = (("forward", "forward"), ("deliver", "rx"), ("send", "tx"))
_NAME = re.compile(r"[^a-zA-Z0-9_]")


@dataclass
class Readings:
    """What one scrape shows, read on the loop."""

    meshif: str
    algo: str
    statistics: dict  # batctl s
    tables: dict  # table -> entries
    limits: dict  # table -> its limit
    gw_mode: str
    gw_selected: str | None  # the selected gateway's originator address
    dataplane: dict  # batmanctl dp (tables.dataplane_now)


def read(service) -> Readings:
    return readings(service.mesh, service.options.meshif, tables.statistics_now(service),
                    tables.dataplane_now(service))


def readings(mesh, meshif: str, statistics: dict, dataplane: dict) -> Readings:
    selected = mesh.gateway.selected
    return Readings(meshif=meshif, algo=mesh.algo.name, statistics=statistics, tables=tables.table_sizes(mesh),
                    limits=tables.table_limits(mesh), gw_mode=mesh.gateway.mode,
                    gw_selected=str(selected.orig_node.orig) if selected is not None else None, dataplane=dataplane)


def counter_name(key: str) -> str:
    """The metric name of a batctl s counter (without _total, which the family adds)."""
    key = _NAME.sub("_", key)
    if key in OTHER_UNITS:
        return OTHER_UNITS[key]
    return f"batmand_{key}" if key.endswith("_bytes") else f"batmand_{key}_packets"


class DaemonCollector:
    """A prometheus_client collector of one daemon's Readings (`read` is called per scrape)."""

    def __init__(self, read_now) -> None:
        self.read_now = read_now

    def collect(self):
        r = self.read_now()
        info = InfoMetricFamily("batmand", "the daemon", labels=["version", "meshif", "algo"])
        info.add_metric([__version__, r.meshif, r.algo], {})
        yield info
        yield from self._statistics(r.statistics)
        entries = GaugeMetricFamily("batmand_table_entries", "entries of each table batmanctl lists",
                                    labels=["table"])
        for name, size in r.tables.items():
            entries.add_metric([name], size)
        yield entries
        limits = GaugeMetricFamily("batmand_table_limit_entries", "the most entries a table keeps (settings max_*)",
                                   labels=["table"])
        for name, size in r.limits.items():
            limits.add_metric([name], size)
        yield limits
        gateway = InfoMetricFamily("batmand_gateway", "gateway mode and the selected gateway (\"\": none)",
                                   labels=["mode", "selected"])
        gateway.add_metric([r.gw_mode, r.gw_selected or ""], {})
        yield gateway
        yield from self._dataplane(r.dataplane)

    @staticmethod
    def _statistics(stats: dict):
        drops = CounterMetricFamily("batmand_dropped_packets", "frames dropped, by reason (batctl s drop_*)",
                                    labels=["reason"])
        errors = CounterMetricFamily("batmand_rx_socket_errors", "receive errors of the packet sockets, by errno",
                                     labels=["error"])
        counters = []
        for key, value in stats.items():
            if key.startswith(DROP_PREFIX):
                drops.add_metric([key[len(DROP_PREFIX):]], value)
            elif key.startswith(SOCKET_ERROR_PREFIX):
                errors.add_metric([key[len(SOCKET_ERROR_PREFIX):]], value)
            else:
                family = CounterMetricFamily(counter_name(key), f"batctl s {key}")
                family.add_metric([], value)
                counters.append(family)
        yield from counters
        yield drops
        yield errors

    @staticmethod
    def _dataplane(status: dict):
        workers = status.get("workers") or []
        yield GaugeMetricFamily("batmand_dataplane_workers", "data-plane worker processes (0: inline)",
                                value=len(workers))
        families = {key: (CounterMetricFamily if counter else GaugeMetricFamily)(name, about, labels=["worker"])
                    for key, (name, about, counter) in WORKER_METRICS.items()}
        for row in workers:
            for key, family in families.items():
                family.add_metric([str(row["index"])], row.get(key, 0))
        yield from families.values()
        drops = CounterMetricFamily("batmand_dataplane_dropped_packets",
                                    "frames the data plane lost, by place (batmanctl dp)", labels=["place"])
        for place, count in sorted((status.get("drops") or {}).items()):
            drops.add_metric([place], count)
        yield drops
        kernel = status.get("kernel_forward")
        if kernel and not kernel.get("error"):  # (None: kernel_forward off)
            frames = CounterMetricFamily("batmand_kernel_path_packets",
                                         "frames the kernel path moved, by part (batmanctl dp)", labels=["part"])
            octets = CounterMetricFamily("batmand_kernel_path_bytes",
                                         "bytes the kernel path moved, by part (batmanctl dp)", labels=["part"])
            for part, key in KERNEL_PARTS:
                frames.add_metric([part], kernel.get(key, 0))
                octets.add_metric([part], kernel.get(key + "_bytes", 0))
            yield frames
            yield octets
            yield CounterMetricFamily("batmand_kernel_path_dropped_packets",
                                      "frames the kernel path's passage dropped", value=kernel.get("dropped", 0))


def registry_for(read_now) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(read_now))
    # the daemon's own CPU, memory and fds (batmand_process_*; the workers are processes of their own)
    registry.register(ProcessCollector(namespace="batmand", registry=None))
    return registry


class MetricsServer:
    """HTTP/1.1 GET /metrics on the daemon's loop (keep-alive, as Prometheus scrapes)."""

    def __init__(self, listen: str, registry: CollectorRegistry) -> None:
        self.listen = listen
        self.registry = registry
        self.server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        self._refusing = False

    async def start(self) -> None:
        host, port = listen_address(self.listen)
        try:
            self.server = await asyncio.start_server(self._client, host, port, limit=MAX_HEAD, reuse_address=True)
        except OSError as exc:
            raise OSError(exc.errno, f"metrics_listen: cannot listen on {self.listen}: {exc.strerror}") from None

    @property
    def addresses(self) -> list:
        return [s.getsockname() for s in self.server.sockets] if self.server else []

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.server.wait_closed()
            self.server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            if len(self._clients) >= MAX_CLIENTS:
                if not self._refusing:
                    log.warning("metrics: %d connections open; refusing more until one closes", MAX_CLIENTS)
                    self._refusing = True
                # read the request first: closing on unread data would reset the connection
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REFUSE_TIMEOUT)
                writer.write(_response(503, b"too many connections\n", close=True))
                await writer.drain()
                return
            self._refusing = False
            self._clients.add(writer)
            while await self._request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:  # close(): the connection ends with the server
            pass
        finally:
            self._clients.discard(writer)
            self._tasks.discard(task)
            writer.close()

    async def _request(self, reader, writer) -> bool:
        """Answer one request; False: close the connection."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
        except asyncio.LimitOverrunError:
            writer.write(_response(431, b"request head too large\n", close=True))
            await writer.drain()
            return False
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            writer.write(_response(400, b"bad request\n", close=True))
            await writer.drain()
            return False
        method, target, version = parts
        close = version == "HTTP/1.0" or headers.get("connection", "").lower() == "close"
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            writer.write(_response(400, b"a request body is not expected\n", close=True))
            await writer.drain()
            return False
        if method not in ("GET", "HEAD"):
            writer.write(_response(405, b"only GET\n", close=close, extra=[("Allow", "GET, HEAD")]))
        elif target.split("?", 1)[0] != PATH:
            writer.write(_response(404, f"not found; the metrics are at {PATH}\n".encode(), close=close))
        else:
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            try:
                body = encoder(self.registry)
            except Exception:  # a bug: the scrape fails, the daemon goes on
                log.exception("metrics: collecting failed")
                writer.write(_response(500, b"collecting the metrics failed (see the daemon's log)\n", close=close))
            else:
                writer.write(_response(200, body, close=close, content_type=content_type, head=method == "HEAD"))
        await writer.drain()
        return not close


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}


def _response(status: int, body: bytes, *, close: bool, content_type: str = "text/plain; charset=utf-8",
              head: bool = False, extra=()) -> bytes:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body))),
               ("Connection", "close" if close else "keep-alive"), *extra]
    text = f"HTTP/1.1 {status} {_REASONS[status]}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return text.encode("latin-1") + (b"" if head else body)
