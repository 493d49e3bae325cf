"""The batadv-vis record (daemon/vis.py) and alfred's push framing (daemon/alfred.py):
byte layout against alfred's structs, what goes in from the mesh's tables, and the
renderings against the real batadv-vis client reading our bytes out of a real alfred."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import time

import pytest

from batmand.core.config import MeshConfig
from batmand.daemon import alfred, vis
from batmand.daemon.options import Options
from batmand.sim.network import Network
from tests.netns import in_netns, ip, namespace

A, B, C = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"


def sample() -> vis.Record:
    return vis.Record([A, B], [vis.Entry(C, 0, 200), vis.Entry("02:00:00:00:00:0d", 1, 255),
                               vis.Entry("02:00:00:00:00:0e", vis.TT_IFINDEX, 0)])


def test_encode_is_alfreds_struct_vis_v1():
    raw = vis.encode(sample())
    assert raw == bytes.fromhex(
        "000000000000" "02" "03"        # struct vis_v1: mac (left zero, as batadv-vis -s), iface_n, entries_n
        "02000000000a" "02000000000b"   # ifaces[]: struct vis_iface { mac }
        "02000000000c" "00" "c8"        # struct vis_entry: mac, ifindex, qual (TQ)
        "02000000000d" "01" "ff"
        "02000000000e" "ff" "00")       # a TT client: ifindex 255, qual 0
    assert len(raw) == 8 + 2 * 6 + 3 * 8  # VIS_DATA_SIZE
    assert vis.decode(raw) == sample()


def test_decode_refuses_a_wrong_length_and_encode_the_limits():
    raw = vis.encode(sample())
    for bad in (raw[:-1], raw + b"\0", raw[:5]):
        with pytest.raises(vis.VisError):
            vis.decode(bad)
    with pytest.raises(vis.VisError):
        vis.encode(vis.Record([], []))  # the client skips a record without interfaces
    with pytest.raises(vis.VisError):
        vis.encode(vis.Record([A] * 255, []))
    with pytest.raises(vis.VisError):
        vis.encode(vis.Record([A], [vis.Entry(C, 0, 1)] * 256))


def test_push_is_alfreds_push_data_v0():
    payload = vis.encode(sample())
    frame = alfred.push_data(vis.VIS_TYPE, vis.VIS_VERSION, payload, tx_id=0x1234)
    head = bytes.fromhex(
        "00" "00" f"{4 + 10 + len(payload):04x}"   # alfred_tlv: ALFRED_PUSH_DATA, version 0, length after it
        "1234" "0000"                              # alfred_transaction_mgmt: id, seqno
        "000000000000"                             # alfred_data.source: zero, alfred fills in its own
        "01" "01" f"{len(payload):04x}")           # its tlv: data type 1 (vis), version 1, payload length
    assert frame == head + payload
    assert alfred.parse_pushes(frame) == [(bytes(6), 1, 1, payload)]
    assert alfred.request(1, 0xABCD) == bytes.fromhex("0200" "0003" "01" "abcd")


def _line(algo: str = "BATMAN_IV") -> Network:
    """a - b - c, b with one interface towards each; run until everyone knows everyone."""
    net = Network(seed=3, config=MeshConfig(routing_algo=algo, orig_interval_ms=200))
    for name in "abc":
        net.add_node(name)
    net.link("a", "b")
    net.link("b", "c")
    net.run_for(10)
    return net


def test_record_holds_interfaces_one_hop_neighbours_and_local_clients():
    net = _line()
    b = net.nodes["b"]
    record = vis.build(b.mesh, net.now)
    assert record.ifaces == [str(b.macs["if0"]), str(b.macs["if1"])]  # the primary first
    links = [e for e in record.entries if not e.is_client]
    assert {(e.mac, e.ifindex) for e in links} == {(str(net.nodes["a"].orig), 0), (str(net.nodes["c"].orig), 1)}
    for e in links:
        assert e.qual == e.metric["tq"] and 200 <= e.qual <= 255  # the TQ of the route, as batctl o shows it
    clients = [e for e in record.entries if e.is_client]
    assert str(b.mesh.soft_mac) in {e.mac for e in clients} and all(e.qual == 0 for e in clients)
    # a hears c only through b: no link a -> c, as batadv-vis -s (orig != neigh) leaves it out
    a = vis.build(net.nodes["a"].mesh, net.now)
    assert {e.mac for e in a.entries if not e.is_client} == {str(b.orig)}
    # c meets b on b's second interface, an originator of its own under IV: listed by its MAC
    c = vis.build(net.nodes["c"].mesh, net.now)
    assert {e.mac for e in c.entries if not e.is_client} == {str(b.macs["if1"])}
    assert vis.decode(vis.encode(record)) == record


def test_batman_v_links_carry_quality_255_and_the_throughput_locally():
    net = _line("BATMAN_V")
    b = net.nodes["b"]
    record = vis.build(b.mesh, net.now)
    links = [e for e in record.entries if not e.is_client]
    assert {(e.mac, e.ifindex) for e in links} == {(str(net.nodes["a"].orig), 0), (str(net.nodes["c"].orig), 1)}
    assert all(e.qual == vis.V_QUALITY and e.metric["throughput"] > 0 for e in links)
    # c meets b on b's second interface: listed by that interface's MAC (V's OGMs all carry
    # b's primary address, so "its own next hop" would lose it)
    c = vis.build(net.nodes["c"].mesh, net.now)
    assert [e.mac for e in c.entries if not e.is_client] == [str(b.macs["if1"])]
    doc = vis.jsondoc([record], "x")["vis"][0]
    assert all(n["metric"] == "1.000" and n["throughput"] > 0 for n in doc["neighbors"])


def test_publisher_logs_a_missing_alfred_once(tmp_path, caplog):
    opts = Options(alfred_vis=True, alfred_socket=str(tmp_path / "no-alfred.sock"))
    publisher = alfred.VisPublisher(opts, sample)
    with caplog.at_level(logging.WARNING, logger="batmand.alfred"):
        for _ in range(3):
            assert asyncio.run(publisher.push_once()) is False
    warnings = [r for r in caplog.records if "cannot reach alfred" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path / "no-alfred.sock") in warnings[0].getMessage()
    assert publisher.pushed == 0


# --- against Debian's alfred and batadv-vis -----------------------------------------------------

needs_alfred = pytest.mark.skipif(not (shutil.which("alfred") and shutil.which("batadv-vis")) or os.geteuid() != 0,
                                  reason="needs root and Debian's alfred package (scripts/setup.sh installs it)")


def _wait(predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(0.05)


@pytest.fixture
def alfred_server(tmp_path):
    """alfred in a namespace of its own on a veth (it needs an interface with an EUI-64
    link-local address; -b none: there is no batman-adv module to ask)."""
    with namespace() as ns:
        ip("link", "add", "d0", "type", "veth", "peer", "name", "d1", netns=ns)
        ip("link", "set", "d1", "up", netns=ns)
        ip("link", "set", "d0", "up", netns=ns)
        _wait(lambda: "fe80::" in ip("-6", "addr", "show", "dev", "d0", netns=ns) and
              "tentative" not in ip("-6", "addr", "show", "dev", "d0", netns=ns), 10)
        path = str(tmp_path / "alfred.sock")
        log = open(tmp_path / "alfred.log", "w")
        proc = subprocess.Popen(in_netns(ns, ["alfred", "-i", "d0", "-b", "none", "-m", "-u", path]),
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait(lambda: os.path.exists(path) or proc.poll() is not None, 10)
            assert proc.poll() is None, (tmp_path / "alfred.log").read_text()
            yield ns, path
        finally:
            proc.terminate()
            proc.wait(5)
            log.close()


def _vis_client(ns: str, path: str, form: str) -> str:
    out = subprocess.run(in_netns(ns, ["batadv-vis", "-u", path, "-f", form]), capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0, out.stderr
    return out.stdout


@needs_alfred
def test_batadv_vis_reads_our_record_out_of_alfred_and_draws_it_as_we_do(alfred_server):
    ns, path = alfred_server
    opts = Options(alfred_vis=True, alfred_socket=path)
    record = vis.Record([A, B], [vis.Entry(C, 0, 200), vis.Entry("02:00:00:00:00:0d", 1, 77),
                                 vis.Entry("02:00:00:00:00:0e", vis.TT_IFINDEX, 0),
                                 vis.Entry("02:00:00:00:00:0f", 5, 9),   # a bad ifindex: the client skips it
                                 vis.Entry("02:00:00:00:00:10", 0, 0)])  # quality 0: skipped too
    publisher = alfred.VisPublisher(opts, lambda: record)
    # in a netns of its own, alfred's socket file is still reachable from here (same file system)
    assert asyncio.run(publisher.push_once()) is True
    assert _vis_client(ns, path, "dot") == vis.dot([record])
    assert _vis_client(ns, path, "json") == vis.json_lines([record])
    theirs = json.loads(_vis_client(ns, path, "jsondoc"))
    ours = vis.jsondoc([record], theirs["source_version"])
    assert theirs == ours
    # a newer push replaces the record (alfred keys it by source and type)
    smaller = vis.Record([A], [vis.Entry(B, 0, 255)])
    publisher.record = lambda: smaller
    assert asyncio.run(publisher.push_once()) is True
    assert _vis_client(ns, path, "json") == vis.json_lines([smaller]) == (
        f'{{ "primary" : "{A}" }}\n{{ "router" : "{A}", "neighbor" : "{B}", "label" : "1.000" }}\n')


def test_publisher_pushes_only_while_alfred_vis_is_on(tmp_path, caplog):
    """The options are read every round: SIGHUP turns publishing on and off."""
    opts = Options(alfred_vis=False, alfred_socket=str(tmp_path / "no-alfred.sock"), alfred_vis_interval_ms=1000)
    asked = []
    publisher = alfred.VisPublisher(opts, lambda: asked.append(1) or sample())

    async def run_for(seconds):
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(publisher.run(), seconds)

    with caplog.at_level(logging.WARNING, logger="batmand.alfred"):
        asyncio.run(run_for(0.2))
        assert not asked and not caplog.records
        opts.alfred_vis = True
        asyncio.run(run_for(0.2))
    assert asked and "cannot reach alfred" in caplog.records[0].getMessage()
