"""The Prometheus collector (batmand/daemon/metrics.py) and its HTTP server: the text a
scrape gets, parsed with prometheus_client's own parser, from a simulated mesh's core; the
server's answers to good and bad requests on a real loopback socket."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batmand.core.config import MeshConfig
from batmand.core.counters import TRAFFIC_COUNTERS
from batmand.daemon import metrics, tables
from batmand.sim.network import Network


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(families: dict, name: str) -> dict:
    """{labels as a sorted tuple: value} of one family's samples named `name`."""
    family_name = name.removesuffix("_total").removesuffix("_info")
    family = families.get(family_name) or families[name]
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if s.name == name}


def _gateway_pair():
    """A (gateway client) and B (gateway server) on one simulated link, after 20 s."""
    net = Network(seed=3, config=MeshConfig(orig_interval_ms=200))
    net.add_node("A")
    net.add_node("B")
    net.link("A", "B")
    net.set_option("B", "gw_mode", "server")
    net.set_option("A", "gw_mode", "client")
    net.run_for(20.0)
    return net


# what WorkerPool.status() (through tables.dataplane_now) gives for two workers
DATAPLANE = {
    "workers": [
        {"index": 0, "pid": 101, "restarts": 0, "rx_frames": 500, "tx_frames": 400, "forward_frames": 7,
         "slow_path": 3, "gro_merged": 80, "tso_segments": 90, "socket_drops": 1, "table": {"dests": 2},
         "resyncs": 0, "channel_backlog": 0, "bad_messages": 0},
        {"index": 1, "pid": 102, "restarts": 2, "rx_frames": 50, "tx_frames": 40, "forward_frames": 0,
         "slow_path": 0, "gro_merged": 0, "tso_segments": 0, "socket_drops": 0, "table": {"dests": 2},
         "resyncs": 1, "channel_backlog": 4, "bad_messages": 0},
    ],
    "ring_drops": {"e0": 1}, "table": {"dests": 2}, "mode": "2 workers", "counters": {},
    "drops": {"socket": 1, "tap_write": 0, "daemon": 5, "tap": 2},
}


def test_the_collector_shows_batctl_s_tables_gateway_and_workers():
    net = _gateway_pair()
    a, b = net.nodes["A"], net.nodes["B"]
    stats = dict(a.mesh.counters)
    stats.update(drop_socket_buffer=3, rx_socket_error_ENETDOWN=1, rx_batches=12, tx=stats["tx"] + 9)
    a.mesh.counters.drop("ttl_exceeded")
    stats["drop_ttl_exceeded"] = a.mesh.counters["drop_ttl_exceeded"]
    registry = metrics.registry_for(lambda: metrics.readings(a.mesh, "bat0", stats, DATAPLANE))
    text = generate_latest(registry).decode()
    families = _families(text)
    # every batctl s counter, one metric each, with its unit in the name
    for key in TRAFFIC_COUNTERS:
        name = f"batmand_{key}_total" if key.endswith("_bytes") else f"batmand_{key}_packets_total"
        assert _samples(families, name) == {(): stats[key]}, key
        assert families[name.removesuffix("_total")].type == "counter"
    assert _samples(families, "batmand_rx_batches_total") == {(): 12}
    # drops by reason as a label, socket errors by errno
    drops = _samples(families, "batmand_dropped_packets_total")
    assert drops[(("reason", "ttl_exceeded"),)] == 1 and drops[(("reason", "socket_buffer"),)] == 3
    assert set(drops) == {(("reason", k[5:]),) for k in stats if k.startswith("drop_")}
    assert _samples(families, "batmand_rx_socket_errors_total") == {(("error", "ENETDOWN"),): 1}
    # table sizes: B is A's one originator and neighbour, and its gateway
    entries = {dict(k)["table"]: v for k, v in _samples(families, "batmand_table_entries").items()}
    assert entries == {**{t: 0 for t in ("dat", "bla_claims", "bla_backbones")}, "originators": 1,
                       "neighbours": 1, "gateways": 1, "tt_local": len(a.mesh.tt.local),
                       "tt_global": len(a.mesh.tt.global_), "mcast": len(a.mesh.multicast.peers)}
    assert entries["tt_global"] >= 1  # B's bat0 MAC
    limits = {dict(k)["table"]: v for k, v in _samples(families, "batmand_table_limit_entries").items()}
    assert limits["originators"] == MeshConfig().max_originators and set(limits) <= set(entries)
    gateway = _samples(families, "batmand_gateway_info")
    assert gateway == {(("mode", "client"), ("selected", str(b.orig))): 1}
    info = _samples(families, "batmand_info")
    assert [dict(k)["algo"] for k in info] == ["BATMAN_IV"] and [dict(k)["meshif"] for k in info] == ["bat0"]
    # the data plane per worker, and its drops by place
    assert _samples(families, "batmand_dataplane_workers") == {(): 2}
    assert _samples(families, "batmand_dataplane_rx_packets_total") == {(("worker", "0"),): 500,
                                                                        (("worker", "1"),): 50}
    assert _samples(families, "batmand_dataplane_worker_restarts_total")[(("worker", "1"),)] == 2
    assert _samples(families, "batmand_dataplane_channel_backlog_messages")[(("worker", "1"),)] == 4
    assert families["batmand_dataplane_channel_backlog_messages"].type == "gauge"
    assert _samples(families, "batmand_dataplane_dropped_packets_total") == {
        (("place", "daemon"),): 5, (("place", "socket"),): 1, (("place", "tap"),): 2, (("place", "tap_write"),): 0}
    assert _samples(families, "batmand_process_cpu_seconds_total")[()] >= 0
    # every name is ours, every label bounded: no MAC but the selected gateway's
    for family in families.values():
        assert family.name.startswith("batmand_"), family.name
        for sample in family.samples:
            for label, value in sample.labels.items():
                assert label in ("reason", "error", "table", "worker", "place", "mode", "selected", "version",
                                 "meshif", "algo"), (sample.name, label)
                if ":" in value and label != "selected":
                    raise AssertionError(f"{sample.name}: {label}={value} looks like an address")


def test_no_gateway_selected_and_inline_data_plane():
    net = Network(seed=1, config=MeshConfig(orig_interval_ms=200))
    net.add_node("A")
    net.add_interface(net.nodes["A"], "if0")
    mesh = net.nodes["A"].mesh
    inline = {"workers": [], "ring_drops": {}, "table": {}, "drops": {"socket": 0, "daemon": 0, "tap_write": 0,
                                                                        "tap": 0}}
    text = generate_latest(metrics.registry_for(lambda: metrics.readings(mesh, "bat0", dict(mesh.counters),
                                                                          inline))).decode()
    families = _families(text)
    assert _samples(families, "batmand_gateway_info") == {(("mode", "off"), ("selected", "")): 1}
    assert _samples(families, "batmand_dataplane_workers") == {(): 0}
    assert _samples(families, "batmand_dataplane_rx_packets_total") == {}
    assert {dict(k)["table"]: v for k, v in _samples(families, "batmand_table_entries").items()}["originators"] == 0


def test_counter_names():
    assert metrics.counter_name("tx") == "batmand_tx_packets"
    assert metrics.counter_name("mcast_rx_local_bytes") == "batmand_mcast_rx_local_bytes"
    assert metrics.counter_name("tt_request_tx") == "batmand_tt_request_tx_packets"
    assert metrics.counter_name("internal_error") == "batmand_internal_errors"
    assert tables.table_limits(Network().add_node("x").mesh)["tt_local"] == MeshConfig().max_local_tt_entries


# --- the HTTP server -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def server():
    net = Network(seed=1)
    net.add_node("A")
    mesh = net.nodes["A"].mesh
    inline = {"workers": [], "drops": {"socket": 0}}
    calls = []

    def read():
        calls.append(1)
        return metrics.readings(mesh, "bat0", dict(mesh.counters), inline)

    srv = metrics.MetricsServer(f"127.0.0.1:{_free_port()}", metrics.registry_for(read))
    await srv.start()
    srv.calls = calls
    try:
        yield srv
    finally:
        await srv.close()


async def _exchange(srv, data: bytes, replies: int = 1) -> list[tuple[str, dict, bytes]]:
    host, port = srv.addresses[0][:2]
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(data)
    out = []
    try:
        for _ in range(replies):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            length = int(headers.get("content-length", 0))
            body = await reader.readexactly(length) if not data.startswith(b"HEAD") else b""
            out.append((lines[0], headers, body))
    finally:
        writer.close()
    return out


async def test_scrapes_on_one_connection(server):
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n"
    replies = await _exchange(server, request * 3, replies=3)
    assert [r[0] for r in replies] == ["HTTP/1.1 200 OK"] * 3
    status, headers, body = replies[0]
    assert headers["content-type"].startswith("text/plain") and headers["connection"] == "keep-alive"
    assert _samples(_families(body.decode()), "batmand_tx_packets_total") == {(): 0}
    assert len(server.calls) == 3  # read at every scrape
    # OpenMetrics when asked for
    (status, headers, body), = await _exchange(
        server, b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n")
    assert headers["content-type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found"),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 Method Not Allowed"),
    (b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", "HTTP/1.1 400 Bad Request"),
    (b"nonsense\r\n\r\n", "HTTP/1.1 400 Bad Request"),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n", "HTTP/1.1 431 Request Header Fields Too Large"),
    (b"HEAD /metrics HTTP/1.0\r\n\r\n", "HTTP/1.1 200 OK"),
])
async def test_bad_requests_are_answered(server, request_bytes, status):
    (line, headers, body), = await _exchange(server, request_bytes)
    assert line == status


async def test_connections_are_bounded(server):
    host, port = server.addresses[0][:2]
    held = [await asyncio.open_connection(host, port) for _ in range(metrics.MAX_CLIENTS)]
    await asyncio.sleep(0.1)
    (line, headers, body), = await _exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert line == "HTTP/1.1 503 Service Unavailable"
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.1)
    (line, headers, body), = await _exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")
    assert line == "HTTP/1.1 200 OK"


async def test_a_port_in_use_names_the_key():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = metrics.MetricsServer(f"127.0.0.1:{port}", metrics.registry_for(lambda: None))
        with pytest.raises(OSError, match=f"metrics_listen: cannot listen on 127.0.0.1:{port}"):
            await srv.start()


@pytest.mark.parametrize("form,connect", [("[::1]:{}", ["::1"]), (":{}", ["127.0.0.1", "::1"])])
async def test_listen_addresses(form, connect):
    net = Network(seed=1)
    net.add_node("A")
    mesh = net.nodes["A"].mesh
    registry = metrics.registry_for(lambda: metrics.readings(mesh, "bat0", dict(mesh.counters), {"workers": []}))
    srv = metrics.MetricsServer(form.format(_free_port()), registry)
    await srv.start()
    try:
        port = srv.addresses[0][1]
        for host in connect:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
            reply = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            assert reply.startswith(b"HTTP/1.1 200 OK") and b"batmand_info{" in reply, host
    finally:
        await srv.close()
