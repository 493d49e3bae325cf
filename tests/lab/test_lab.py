"""netns-lab in real namespaces: every shipped topology builds with the right names and
MTUs, frames cross every link, loss and rate rules act, daemons start and stop (a stand-in
daemon here), and down() leaves nothing behind, also after an exception or a crash."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pyroute2 import netns as pr_netns

from batmand.lab import Lab, LabError, TopologyError, down, from_dict, load, net, shipped_names
from batmand.lab.topology import parse_rate, to_dict

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="netns-lab tests need root and iproute2"
)

FAKE = [sys.executable, str(Path(__file__).with_name("fake_batmand.py"))]
SHIPPED = ["line3", "line5", "ring5", "grid3x3", "parallel", "client"]
_ids = itertools.count()


@pytest.fixture
def prefix():
    p = f"bmt{os.getpid()}_{next(_ids)}"
    yield p
    down(p)  # whatever the test did, nothing stays
    assert net.list_namespaces(p) == []


def two_nodes(**link) -> dict:
    return {"node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b", **link}]}


def ifinfo(ns: str) -> dict[str, dict]:
    return {i["name"]: i for i in net.interfaces(ns)}


def ping(lab: Lab, node: str, addr: str, count: int = 1, size: int | None = None, df: bool = False) -> int:
    """Replies received."""
    argv = ["ping", "-n", "-q", "-c", str(count), "-i", "0.002", "-W", "1"]
    if size is not None:
        argv += ["-s", str(size)]
    if df:
        argv += ["-M", "do"]
    out = lab.exec(node, argv + [addr]).stdout
    m = re.search(r"(\d+) received", out)
    return int(m.group(1)) if m else 0


def udp_received(lab: Lab, src: str, dst: str, dst_addr: str, count: int = 2000, size: int = 64,
                 df: bool = False) -> int:
    """Send `count` UDP datagrams of `size` bytes (payload) from node src to dst_addr (in
    node dst); how many arrive. With df, an IP packet larger than the MTU raises OSError."""
    rx = pr_netns.create_socket(lab.ns(dst), socket.AF_INET, socket.SOCK_DGRAM)
    tx = pr_netns.create_socket(lab.ns(src), socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.setsockopt(socket.SOL_SOCKET, 33, 8 << 20)  # SO_RCVBUFFORCE
        rx.bind((dst_addr, 0))
        rx.setblocking(False)
        if df:
            tx.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER, IP_PMTUDISC_DO
        got = 0

        def drain():
            nonlocal got
            while True:
                try:
                    rx.recv(65536)
                    got += 1
                except BlockingIOError:
                    return

        for i in range(count):
            tx.sendto(b"x" * size, rx.getsockname())
            if i % 50 == 49:
                drain()
        last, idle_since = -1, time.monotonic()
        while got < count and time.monotonic() - idle_since < 0.05:
            drain()
            if got != last:
                last, idle_since = got, time.monotonic()
            time.sleep(0.005)
        return got
    finally:
        rx.close()
        tx.close()


@contextlib.contextmanager
def temp_addresses(lab: Lab, link, i: int):
    """10.199.i.1/30 on a's end, .2 on b's end, with static ARP entries (a lossy link
    would lose ARP too); all removed again on exit."""
    a = (lab.ns(link.a), link.ifname_a, f"10.199.{i}.1/30")
    b = (lab.ns(link.b), link.ifname_b, f"10.199.{i}.2/30")
    macs = {end: ifinfo(end[0])[end[1]]["mac"] for end in (a, b)}
    for end, peer in ((a, b), (b, a)):
        net.add_address(*end)
        with net.ipr(end[0]) as ip:
            ip.neigh("add", dst=peer[2].split("/")[0], lladdr=macs[peer], ifindex=ip.link_lookup(ifname=end[1])[0],
                     state=0x80)  # NUD_PERMANENT
    try:
        yield a[2].split("/")[0], b[2].split("/")[0]
    finally:
        for end, peer in ((a, b), (b, a)):
            net.del_address(*end)
            with net.ipr(end[0]) as ip, contextlib.suppress(Exception):
                ip.neigh("del", dst=peer[2].split("/")[0], ifindex=ip.link_lookup(ifname=end[1])[0])


# --- topology files ---------------------------------------------------------------------


def test_shipped_topologies_load():
    assert set(SHIPPED) <= set(shipped_names())
    line5 = load("line5")
    assert list(line5.nodes) == ["n1", "n2", "n3", "n4", "n5"]
    assert line5.hard_interfaces("n1") == ["e-n2"]
    assert line5.hard_interfaces("n3") == ["e-n2", "e-n4"]
    assert all(link.mtu == 1560 for link in line5.links)
    assert len(load("grid3x3").links) == 12
    assert load("ring5").hard_interfaces("n1") == ["e-n2", "e-n5"]
    par = load("parallel")
    assert {(l.a, l.b): l.loss_ab for l in par.links} == {("a", "b"): 5, ("b", "d"): 5, ("a", "c"): 30, ("c", "d"): 30}
    cl = load("client")
    assert cl.mesh_ifname("n1") == "br0" and cl.mesh_ifname("n2") == "bat0"
    assert cl.address("c1", 4, True) == "10.77.0.101/24" and cl.address("n3", 6) == "fd77::3"
    for name in SHIPPED:
        t = load(name)
        assert to_dict(from_dict(to_dict(t))) == to_dict(t)


@pytest.mark.parametrize("data, message", [
    ({"node": [{"name": "a"}], "link": [{"a": "a", "b": "x"}]}, "unknown node"),
    ({"node": [{"name": "a", "colour": 1}]}, "unknown key"),
    ({"node": [{"name": "much-too-long-name"}]}, "1-13 characters"),
    ({"node": [{"name": "a", "kind": "vm"}]}, "kind must be"),
    ({"node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b", "loss": 120}]}, "loss"),
    ({"node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b", "rate": "fast"}]}, "rate"),
    ({"node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b", "ifname_a": "br0"}]}, "clashes"),
    ({"node": [{"name": "a"}], "client": [{"name": "a", "node": "a"}]}, "already used"),
    ({"node": [{"name": "a", "id": 1}, {"name": "b", "id": 1}]}, "already used"),
    ({}, "no [[node]]"),
])
def test_topology_errors(data, message):
    with pytest.raises(TopologyError, match=re.escape(message)):
        from_dict(data)


def test_parallel_links_get_distinct_names_and_rates_parse():
    t = from_dict({"node": [{"name": "a"}, {"name": "b"}], "link": [{"a": "a", "b": "b"}, {"a": "b", "b": "a"}]})
    assert [(l.ifname_a, l.ifname_b) for l in t.links] == [("e-b", "e-a"), ("e-a-2", "e-b-2")]
    assert parse_rate("10mbit") == 10_000_000 and parse_rate("1mbps") == 8_000_000 and parse_rate("500kbit") == 500_000


# --- building the shipped topologies ------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_topology_builds(name, prefix):
    topo = load(name)
    with Lab(topo, prefix) as lab:
        expected = sorted(f"{prefix}-{n}" for n in [*topo.nodes, *topo.clients])
        assert net.list_namespaces(prefix) == expected
        # every link: both veth ends, named toward the peer, up, with the link's MTU
        for link in topo.links:
            for node, ifname, peer, peer_if in link.ends():
                info = ifinfo(lab.ns(node))[ifname]
                assert ifname == f"e-{peer}"
                assert info["kind"] == "veth" and info["up"] and info["mtu"] == link.mtu == 1560
        # nothing else in a node but lo, its link ends and (with clients) the bridge
        for node in topo.nodes:
            names = set(ifinfo(lab.ns(node))) - {"lo"}
            want = {l.ifname_in(node) for l in topo.node_links(node)}
            if topo.node_clients(node):
                want |= {"br0"} | {c.ifname for c in topo.node_clients(node)}
            assert names == want, node
            # BLA off unless a topology turns it on (its start-up hold would only slow the labs)
            assert lab.config_path(node).read_text() == "bridge_loop_avoidance = false\norig_interval_ms = 1000\n"
        # frames cross every link both ways (temporary IPv4 addresses, removed again)
        for i, link in enumerate(topo.links):
            with temp_addresses(lab, link, i) as (ip_a, ip_b):
                assert udp_received(lab, link.a, link.b, ip_b, 50) >= 20, f"{link.a} -> {link.b}"
                assert udp_received(lab, link.b, link.a, ip_a, 50) >= 20, f"{link.b} -> {link.a}"
                if i == 0:  # a full-MTU IP packet fits, one byte more does not
                    assert udp_received(lab, link.a, link.b, ip_b, 20, size=link.mtu - 28, df=True) >= 5
                    with pytest.raises(OSError, match="too long"):
                        udp_received(lab, link.a, link.b, ip_b, 1, size=link.mtu - 27, df=True)
                    if not link.loss_ab and not link.loss_ba:
                        assert ping(lab, link.a, ip_b) == 1  # and ICMP, for good measure
            for node in (link.a, link.b):
                assert not [x for x in ifinfo(lab.ns(node))[link.ifname_in(node)]["addresses"] if x.startswith("10.199.")]
        # loss rules sit on the receiving end of each direction
        for link in topo.links:
            rules_b = net.loss_counters(lab.ns(link.b))
            if link.loss_ab:
                assert rules_b[link.ifname_b]["percent"] == link.loss_ab
            else:
                assert link.ifname_b not in rules_b
        if topo.clients:
            (client,) = topo.clients.values()
            cinfo = ifinfo(lab.ns(client.name))
            assert set(cinfo) == {"lo", "eth0"}
            assert "10.77.0.101/24" in cinfo["eth0"]["addresses"] and "fd77::101/64" in cinfo["eth0"]["addresses"]
            ninfo = ifinfo(lab.ns(client.node))
            assert ninfo[client.ifname]["master"] == "br0" and ninfo["br0"]["kind"] == "bridge"
            # the client reaches the node's bridge (where the node's mesh address will live)
            net.add_address(lab.ns(client.node), "br0", "10.77.0.1/24")
            assert ping(lab, client.name, "10.77.0.1") == 1
    assert net.list_namespaces(prefix) == []
    assert not lab.lab_dir.exists() and not lab.run_dir.exists()


# --- loss and rate ----------------------------------------------------------------------


def test_loss_drops_the_configured_share(prefix):
    with Lab(from_dict(two_nodes(loss_ab=30, loss_ba=0)), prefix) as lab, \
            temp_addresses(lab, lab.topology.links[0], 1):
        n = 2000
        ab = udp_received(lab, "a", "b", "10.199.1.2", n)
        ba = udp_received(lab, "b", "a", "10.199.1.1", n)
        assert 0.60 * n <= ab <= 0.80 * n, ab  # 30 % loss a -> b (sd is ~1 %)
        assert ba >= 0.99 * n, ba  # no loss b -> a
        assert net.loss_counters(lab.ns("b"))["e-a"]["dropped_packets"] >= 0.2 * n
        lab.set_loss("b", "a", 100, direction="ab")  # arguments' order: frames b -> a
        assert udp_received(lab, "b", "a", "10.199.1.1", 200) == 0
        lab.set_loss("a", "b", 0)
        assert udp_received(lab, "a", "b", "10.199.1.2", 500) >= 495
        assert udp_received(lab, "b", "a", "10.199.1.1", 500) >= 495
        assert net.loss_counters(lab.ns("b")) == {}


def test_rate_puts_tbf_on_both_ends(prefix):
    with Lab(from_dict(two_nodes(rate="8mbit", rate_ba="2mbit", mtu=1400)), prefix) as lab:
        assert net.get_rate(lab.ns("a"), "e-b") == 8_000_000
        assert net.get_rate(lab.ns("b"), "e-a") == 2_000_000
        assert ifinfo(lab.ns("a"))["e-b"]["mtu"] == 1400
        lab.set_rate("a", "b", None)
        assert net.get_rate(lab.ns("a"), "e-b") is None and net.get_rate(lab.ns("b"), "e-a") is None


def test_extra_interfaces(prefix):
    data = two_nodes()
    data["node"][0]["interfaces"] = ["stub0"]
    with Lab(from_dict(data), prefix, daemon=["batmand"]) as lab:
        assert lab.daemon_command("a")[:7] == ["batmand", "-m", "bat0", "-i", "e-b", "-i", "stub0"]
        stub = ifinfo(lab.ns("a"))["stub0"]
        assert stub["up"] and stub["mtu"] == 1560


def test_link_down_and_up(prefix):
    with Lab(from_dict(two_nodes()), prefix) as lab:
        lab.set_link("a", "b", up=False)
        assert not ifinfo(lab.ns("a"))["e-b"]["up"] and not ifinfo(lab.ns("b"))["e-a"]["up"]
        assert not Lab.attach(prefix).status(originators=False)["links"][0]["up"]
        lab.set_link("b", "a", up=True)
        assert ifinfo(lab.ns("a"))["e-b"]["up"] and ifinfo(lab.ns("b"))["e-a"]["up"]


# --- daemons (a stand-in until batmand exists) ----------------------------------------------


def test_daemons_start_get_addresses_and_stop(prefix):
    topo = from_dict({**to_dict(load("client")), "batmand": {"orig_interval_ms": 250}})
    with Lab(topo, prefix, daemon=FAKE, batmanctl=["echo"]) as lab:
        assert lab.daemon_command("n2") == [
            *FAKE, "-m", "bat0", "-i", "e-n1", "-i", "e-n3",
            "--config", str(lab.lab_dir / "n2.toml")]
        lab.start()
        for node in lab.nodes:
            assert lab.daemon_running(node)
            assert net.pid_in_namespace(lab.pids[node], lab.ns(node))
            assert lab.control_ready(node) and lab.control_socket(node) == "@batmand/bat0"
            assert "orig_interval_ms = 250" in lab.log_path(node).read_text()
        n1, n2 = ifinfo(lab.ns("n1")), ifinfo(lab.ns("n2"))
        assert n1["bat0"]["master"] == "br0" and n1["bat0"]["up"]
        assert {"10.77.0.1/24", "fd77::1/64"} <= set(n1["br0"]["addresses"])
        assert {"10.77.0.2/24", "fd77::2/64"} <= set(n2["bat0"]["addresses"])
        assert ping(lab, "c1", "10.77.0.1") == 1  # client -> br0 of its node
        out = lab.batmanctl("n3", "o", "-H")
        assert out.stdout.split() == ["o", "-H"]  # run in n3's namespace: no socket to name
        assert "batmand pid" in lab.show()
        # another process (the CLI) sees the same daemons
        assert Lab.attach(prefix).pids == lab.pids
        lab.stop_daemons(["n2"])
        assert not lab.daemon_running("n2") and "n2" not in lab.pids
        assert "bat0" not in ifinfo(lab.ns("n2"))
        assert "@batmand/bat0" not in lab.exec("n2", ["cat", "/proc/net/unix"], check=True).stdout
        assert "fake batmand: stopped" in lab.log_path("n2").read_text()
        lab.start_daemons(["n2"])
        lab.configure_mesh_addresses(["n2"])
        assert lab.daemon_running("n2")
        pids = dict(lab.pids)
    for pid in pids.values():
        assert not net.pid_alive(pid)


def test_daemon_ignoring_sigterm_is_killed(prefix):
    with Lab(from_dict(two_nodes()), prefix, daemon=[*FAKE, "--ignore-term"], stop_timeout=0.3) as lab:
        lab.start_daemons()
        pid = lab.pids["a"]
        t = time.monotonic()
        lab.stop_daemons()
        assert time.monotonic() - t < 3
        assert not net.pid_alive(pid)


def test_daemon_failures_are_clear(prefix):
    with Lab(from_dict(two_nodes()), prefix, daemon=[*FAKE, "--fail"]) as lab:
        with pytest.raises(LabError, match=r"(?s)a: batmand exited with status 3.*failing as asked"):
            lab.start_daemons()
        with pytest.raises(LabError, match=r"a: no bat0 in .* after 0.2s"):
            Lab(lab.topology, prefix).configure_mesh_addresses(timeout=0.2)


# --- tearing down -------------------------------------------------------------------------


def test_down_when_the_body_raises(prefix):
    with pytest.raises(RuntimeError) as info:
        with Lab(from_dict(two_nodes()), prefix, daemon=FAKE) as lab:
            lab.start_daemons()
            pid = lab.pids["a"]
            raise RuntimeError("test body failed")
    assert net.list_namespaces(prefix) == []
    assert not net.pid_alive(pid)
    assert lab.log_path("a").exists()  # kept for the post-mortem ...
    assert any("logs kept" in note for note in info.value.__notes__)
    down(prefix)  # ... until the next down
    assert not lab.lab_dir.exists()


def test_up_refuses_an_existing_prefix(prefix):
    with Lab(from_dict(two_nodes()), prefix):
        with pytest.raises(LabError, match="already exists"):
            Lab(from_dict(two_nodes()), prefix).up()
        assert len(net.list_namespaces(prefix)) == 2


def test_down_by_prefix_after_a_crash(prefix):
    # forgotten in this process
    lab = Lab(load("line3"), prefix, daemon=FAKE)
    lab.up()
    lab.start_daemons()
    pids = list(lab.pids.values())
    del lab
    assert sorted(down(prefix)) == [f"{prefix}-n1", f"{prefix}-n2", f"{prefix}-n3"]
    assert net.list_namespaces(prefix) == []
    assert all(not net.pid_alive(pid) for pid in pids)
    # a process that died without any clean-up, its daemons orphaned
    script = textwrap.dedent(f"""
        import os
        from batmand.lab import Lab
        lab = Lab("client", {prefix!r}, daemon={FAKE!r})
        lab.up()
        lab.start_daemons()
        print(list(lab.pids.values()), flush=True)
        os._exit(1)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    pids = json.loads(proc.stdout)
    assert len(net.list_namespaces(prefix)) == 4 and all(net.pid_alive(p) for p in pids)
    assert len(down(prefix)) == 4
    assert net.list_namespaces(prefix) == []
    assert all(not net.pid_alive(p) for p in pids)
    assert not Path(f"/tmp/batmand-lab/{prefix}").exists() and not Path(f"/run/batmand-lab/{prefix}").exists()


def test_cli(prefix):
    def lab_cli(*args):
        return subprocess.run([sys.executable, "-m", "batmand.lab", *args], capture_output=True, text=True, timeout=30)

    up = lab_cli("up", "parallel", "--prefix", prefix, "--no-daemons")
    assert up.returncode == 0, up.stderr
    assert "a:e-b <-> b:e-a  mtu 1560  loss 5%/5%" in up.stdout
    ex = lab_cli("exec", "--prefix", prefix, "d", "--", "ip", "-br", "link")
    assert ex.returncode == 0 and "e-b@" in ex.stdout and "e-c@" in ex.stdout
    assert lab_cli("loss", "--prefix", prefix, "a", "c", "100", "--direction", "ab").returncode == 0
    show = json.loads(lab_cli("show", "--prefix", prefix, "--json").stdout)
    (ac,) = [l for l in show["links"] if (l["a"], l["b"]) == ("a", "c")]
    assert (ac["loss_ab"], ac["loss_ba"]) == (100, 30)
    (c,) = [n for n in show["nodes"] if n["name"] == "c"]
    assert c["loss"]["e-a"]["percent"] == 100
    assert lab_cli("up", "parallel", "--prefix", prefix, "--no-daemons").returncode == 1  # exists
    assert "already exists" in lab_cli("up", "line3", "--prefix", prefix, "--no-daemons").stderr
    assert prefix in lab_cli("list").stdout
    dn = lab_cli("down", "--prefix", prefix)
    assert dn.returncode == 0 and "removed 4 namespace(s)" in dn.stdout
    assert net.list_namespaces(prefix) == []


def _real_batmand() -> bool:
    proc = subprocess.run([*Lab("line3", "x").daemon_argv, "--help"], capture_output=True, text=True)
    return proc.returncode == 0 and "--control-socket" in proc.stdout


def test_real_batmand_starts_with_the_lab_command_line(prefix):
    """The lab's command line is one batmand accepts: bat0 appears and answers batmanctl."""
    if not _real_batmand():
        pytest.skip("batmand is not built yet")
    with Lab("line3", prefix) as lab:
        lab.start(timeout=15)
        for node in lab.nodes:
            assert lab.address(node, 4, prefixlen=True) in ifinfo(lab.ns(node))["bat0"]["addresses"]
        out = lab.batmanctl("n2", "if")
        assert out.returncode == 0 and "e-n1" in out.stdout and "e-n3" in out.stdout, out.stdout + out.stderr
