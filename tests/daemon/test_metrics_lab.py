"""metrics_listen with real daemons: two batmand nodes (n1 with two data-plane workers and
metrics on 127.0.0.1:9140, n2 with the default: off), iperf3 across bat0 while n1's
/metrics is scraped every 0.2 s from inside its namespace over one keep-alive connection.
The counters move with the traffic and agree with batmanctl s, the tables hold the one
peer, the workers show up, and nothing breaks; n2 listens on no TCP port at all."""

from __future__ import annotations

import http.client
import json
import subprocess
import time

from prometheus_client.parser import text_string_to_metric_families

from batmand.lab import Lab
from batmand.lab.topology import from_dict
from tests.daemon.labs import prefix, stats, wait_for
from tests.netns import entered

LISTEN = ("127.0.0.1", 9140)
SCRAPE_EVERY = 0.2
IPERF_SECONDS = 4
TRAFFIC = ("tx", "tx_bytes", "rx", "rx_bytes")


def _lab() -> Lab:
    topology = from_dict({"lab": {"name": "metrics"}, "batmand": {"orig_interval_ms": 200},
                          "node": [{"name": "n1", "batmand": {"workers": 2,
                                                              "metrics_listen": "%s:%d" % LISTEN}},
                                   {"name": "n2", "batmand": {"workers": 0}}],
                          "link": [{"a": "n1", "b": "n2"}]})
    return Lab(topology, prefix())


class Scraper:
    """GET /metrics over one connection made inside a node's namespace."""

    def __init__(self, ns: str) -> None:
        with entered(ns):
            self.conn = http.client.HTTPConnection(*LISTEN, timeout=5)
            self.conn.connect()
        self.durations: list[float] = []

    def scrape(self) -> dict:
        """{(sample name, sorted labels): value}."""
        t0 = time.monotonic()
        self.conn.request("GET", "/metrics")
        reply = self.conn.getresponse()
        body = reply.read().decode()
        self.durations.append(time.monotonic() - t0)
        assert reply.status == 200, body
        assert reply.getheader("Connection") == "keep-alive"
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(body) for s in f.samples}

    def close(self) -> None:
        self.conn.close()


def _counter(sample: dict, key: str) -> float:
    name = f"batmand_{key}_total" if key.endswith("_bytes") else f"batmand_{key}_packets_total"
    return sample[(name, ())]


def _by_label(sample: dict, name: str, label: str) -> dict:
    return {dict(labels)[label]: v for (n, labels), v in sample.items() if n == name}


def _rows(lab: Lab, node: str, table: str) -> list[dict]:
    return json.loads(lab.batmanctl(node, table, "--json", check=True).stdout)


def _listening(lab: Lab, node: str) -> list[str]:
    return lab.exec(node, ["ss", "-ltnpH"], check=True).stdout.splitlines()


def test_metrics_during_iperf3():
    with _lab() as lab:
        lab.start()
        n2_address = lab.address("n2")
        wait_for(lambda: lab.exec("n1", ["ping", "-c", "1", "-W", "1", n2_address]).returncode == 0, timeout=30)
        # off by default: n2's daemon listens on nothing (before iperf3's server is there)
        assert _listening(lab, "n2") == []
        listening = _listening(lab, "n1")
        assert len(listening) == 1 and "127.0.0.1:9140" in listening[0] and f"pid={lab.pids['n1']}," in listening[0], \
            listening
        scraper = Scraper(lab.ns("n1"))
        try:
            first = scraper.scrape()
            assert _by_label(first, "batmand_table_entries", "table")["originators"] == 1
            assert _by_label(first, "batmand_table_entries", "table")["neighbours"] == 1
            assert first[("batmand_dataplane_workers", ())] == 2
            server = lab.spawn("n2", ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_for(lambda: any(":5201" in line for line in _listening(lab, "n2")), timeout=10)
            client = lab.spawn("n1", ["iperf3", "-c", n2_address, "-t", str(IPERF_SECONDS), "-J"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            samples = []
            while client.poll() is None:
                samples.append(scraper.scrape())
                time.sleep(SCRAPE_EVERY)
            result = json.loads(client.communicate(timeout=30)[0])
            server.wait(timeout=10)
            time.sleep(1.0)  # the workers' next reports (twice a second)
            before = stats(lab, "n1")
            last = scraper.scrape()
            after = stats(lab, "n1")
        finally:
            scraper.close()
        sent = result["end"]["sum_sent"]["bytes"]
        mbit = result["end"]["sum_received"]["bits_per_second"] / 1e6
        durations = sorted(scraper.durations)
        print(f"metrics lab: {len(samples)} scrapes during {IPERF_SECONDS} s of iperf3 at {mbit:.0f} Mbit/s; "
              f"scrape p50 {durations[len(durations) // 2] * 1000:.1f} ms, max {durations[-1] * 1000:.1f} ms")
        assert len(samples) >= IPERF_SECONDS / (SCRAPE_EVERY + 0.1)
        # the counters move with the traffic, never back, and agree with batmanctl s
        for key in TRAFFIC:
            series = [_counter(s, key) for s in [first, *samples, last]]
            assert series == sorted(series), (key, series)
            assert before[key] <= _counter(last, key) <= after[key], (key, before[key], after[key])
        assert _counter(last, "tx_bytes") - _counter(first, "tx_bytes") >= sent  # payload plus headers
        assert _counter(last, "rx") - _counter(first, "rx") > 100  # the ACKs
        moving = [_counter(s, "tx_bytes") for s in samples]
        assert len(set(moving)) >= 3, moving  # seen moving during the run, not only at its end
        # drops by reason as batmanctl s has them
        drops = _by_label(last, "batmand_dropped_packets_total", "reason")
        assert all(before["drop_" + r] <= v <= after["drop_" + r] for r, v in drops.items()), (drops, after)
        # the kernel path carried it (the defaults), the workers are there (per worker,
        # bounded labels), and the tables are right
        rx = _by_label(last, "batmand_dataplane_rx_packets_total", "worker")
        tx = _by_label(last, "batmand_dataplane_tx_packets_total", "worker")
        assert set(rx) == set(tx) == {"0", "1"}, (rx, tx)
        kernel = _by_label(last, "batmand_kernel_path_packets_total", "part")
        octets = _by_label(last, "batmand_kernel_path_bytes_total", "part")
        assert set(kernel) == {"forward", "deliver", "send"} and kernel["send"] > 1000, kernel
        assert octets["send"] >= sent and last[("batmand_kernel_path_dropped_packets_total", ())] == 0
        assert _by_label(last, "batmand_dataplane_worker_restarts_total", "worker") == {"0": 0, "1": 0}
        assert set(_by_label(last, "batmand_dataplane_dropped_packets_total", "place")) == {
            "socket", "tap", "tap_write", "daemon"}
        entries = _by_label(last, "batmand_table_entries", "table")
        clients = {(r["tt_address"], r["tt_vid"]) for r in _rows(lab, "n1", "tg")}
        assert (entries["originators"], entries["neighbours"]) == (1, 1), entries
        assert entries["tt_global"] == len(clients) >= 1 and entries["tt_local"] == len(_rows(lab, "n1", "tl"))
        assert last[("batmand_gateway_info", (("mode", "off"), ("selected", "")))] == 1
        # scraping broke nothing: both daemons run, the mesh still carries pings
        assert lab.daemon_running("n1") and lab.daemon_running("n2")
        assert lab.exec("n1", ["ping", "-c", "3", "-i", "0.2", "-W", "1", n2_address]).returncode == 0
        assert "internal error" not in lab.log_path("n1").read_text()
        assert "collecting failed" not in lab.log_path("n1").read_text()
