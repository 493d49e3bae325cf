"""Kernel nodes in netns-lab: the Linux kernel's batman-adv (Debian's kernel 6.1, batman-adv
2022.3, in a QEMU VM) as a lab node next to batmand.

One VM boot for the whole file: the module-scoped `pair` fixture starts interop-pair
(b1 = batmand, k2 = kernel node); the last test tears it down by prefix and checks that no
QEMU, TAP or namespace is left. Tests that need no VM (topology rules, the wiring of a
kernel node's namespace, the image's pieces) run first. If kernel nodes cannot run here
(no QEMU, no image, QEMU cannot boot the guest), the VM tests are skipped and the reason is
printed (not a silent skip).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyroute2 import netns as pr_netns

from batmand.lab import Lab, LabError, TopologyError, down, from_dict, load, net
from batmand.lab import kernel_image, kernel_node
from batmand.lab.kernel_node import kernel_nodes_available
from batmand.lab.topology import to_dict

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="netns-lab tests need root and iproute2"
)

PREFIX = f"knt{os.getpid() % 100000}"
INTEROP = ["interop-pair", "interop-kbk", "interop-bkb", "interop-ring"]


_config = None


@pytest.fixture(autouse=True, scope="module")
def _remember_config(pytestconfig):
    global _config
    _config = pytestconfig


def say(msg: str) -> None:
    """Straight to the terminal (and the CI log), past pytest's output capture."""
    capman = _config.pluginmanager.getplugin("capturemanager") if _config else None
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print(f"\n[kernel-node] {msg}", file=sys.stderr, flush=True)


# --- without a VM -----------------------------------------------------------------------------


def test_interop_topologies():
    kinds = {name: {n: node.kind for n, node in load(name).nodes.items()} for name in INTEROP}
    assert kinds["interop-pair"] == {"b1": "batmand", "k2": "kernel"}
    assert kinds["interop-kbk"] == {"k1": "kernel", "b2": "batmand", "k3": "kernel"}
    assert kinds["interop-bkb"] == {"b1": "batmand", "k2": "kernel", "b3": "batmand"}
    ring = load("interop-ring")
    assert list(kinds["interop-ring"].values()).count("kernel") == 2 and len(ring.links) == 5
    assert all(len(ring.node_links(n)) == 2 for n in ring.nodes)
    assert ring.kernel_wiring("k2") == [("e-b1", "kt0", "kb0", 1560), ("e-b3", "kt1", "kb1", 1560)]
    for name in INTEROP:
        t = load(name)
        assert to_dict(from_dict(to_dict(t))) == to_dict(t)


@pytest.mark.parametrize("data, message", [
    ({"node": [{"name": "k", "kind": "kernel"}, {"name": "b"}], "link": [{"a": "k", "b": "b"}],
      "client": [{"name": "c", "node": "k"}]}, "clients behind kernel nodes"),
    ({"node": [{"name": "k", "kind": "kernel", "interfaces": ["x0"]}, {"name": "b"}], "link": [{"a": "k", "b": "b"}]},
     "no extra interfaces"),
    ({"node": [{"name": "k", "kind": "kernel"}]}, "needs at least one link"),
    ({"node": [{"name": "b", "kernel": {"memory_mb": 128}}]}, "needs kind"),
    ({"node": [{"name": "k", "kind": "kernel", "kernel": {"memory_mb": 16}}, {"name": "b"}],
      "link": [{"a": "k", "b": "b"}]}, "memory_mb"),
    ({"node": [{"name": "k", "kind": "kernel"}, {"name": "b"}], "link": [{"a": "k", "b": "b", "ifname_a": "kt0"}]},
     "clashes with the VM's TAP"),
    ({"node": [{"name": "k", "kind": "kernel", "kernel": {"lan": "yes"}}, {"name": "b"}],
      "link": [{"a": "k", "b": "b"}]}, "kernel.lan must be true or false"),
    ({"node": [{"name": "k", "kind": "kernel", "kernel": {"lan": True}}, {"name": "b"}],
      "link": [{"a": "k", "b": "b", "ifname_a": "kbl"}]}, "clashes with the VM's bridge"),
])
def test_kernel_node_topology_errors(data, message):
    with pytest.raises(TopologyError, match=re.escape(message)):
        from_dict(data)


def test_macs_and_settings():
    assert kernel_node.node_macs(2, 2) == (["02:ba:00:00:02:01", "02:ba:00:00:02:02"], "02:bb:00:00:02:00")
    assert kernel_node.node_macs(0x10203, 1)[0] == ["02:ba:01:02:03:01"]
    algo, settings, ignored = kernel_node.mesh_settings(
        {"orig_interval_ms": 250, "aggregation": False, "multicast_mode": True, "purge_timeout_ms": 1000})
    assert algo == "BATMAN_IV" and ignored == ["purge_timeout_ms"]
    assert dict(settings) == {"bridge_loop_avoidance": "0", "orig_interval": "250", "aggregation": "0",
                              "multicast_forceflood": "0"}
    assert kernel_node.mesh_settings({"routing_algo": "BATMAN_V"})[0] == "BATMAN_V"  # for the BATMAN_V issue
    with pytest.raises(kernel_node.KernelNodeError, match="routing_algo"):
        kernel_node.mesh_settings({"routing_algo": "OLSR"})
    # [hardif.<veth>] of the config applies to the guest NIC behind that veth (B.A.T.M.A.N. V)
    config = {"hardif": {"e-b3": {"throughput_override": "100mbit", "elp_interval": 500}, "e-x": {"hop_penalty": 1}}}
    assert kernel_node.hardif_settings(config, ["e-b1", "e-b3"]) == [(1, "throughput_override", "100000kbit"),
                                                                       (1, "elp_interval", "500")]
    assert "hardif" not in kernel_node.mesh_settings(config)[2]


def test_availability_says_why(tmp_path, monkeypatch):
    ok, why = kernel_nodes_available()
    assert isinstance(ok, bool) and why
    say(f"kernel_nodes_available(): {ok}: {why}")
    monkeypatch.setenv(kernel_image.CACHE_ENV, str(tmp_path))
    (tmp_path / "build-error.txt").write_text("apt-get download linux-image-6.1.0-57-amd64 failed: no network\n")
    ok, why = kernel_nodes_available()
    if shutil.which(kernel_image.QEMU):
        assert not ok and "no kernel-node image" in why and "no network" in why
    with pytest.raises(LabError, match="cannot start kernel node"):
        lab = Lab("interop-pair", f"{PREFIX}a")
        try:
            lab.up()
            lab.start()
        finally:
            lab.down()


def test_cpio_writer_roundtrip(tmp_path):
    """Our newc archives unpack with GNU cpio (the kernel reads the same format)."""
    if shutil.which("cpio") is None:
        pytest.skip("cpio not installed")
    a = kernel_image.Cpio()
    a.file("etc/bm/x", b"hello\n", 0o640)
    a.symlink("bin/sh", "/bin/busybox")
    a.file("odd", b"abc")
    data = gzip.compress(a.finish())
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet"], input=gzip.decompress(data), cwd=out, check=True)
    assert (out / "etc/bm/x").read_bytes() == b"hello\n" and (out / "etc/bm/x").stat().st_mode & 0o777 == 0o640
    assert os.readlink(out / "bin/sh") == "/bin/busybox" and (out / "odd").read_bytes() == b"abc"


def test_wiring_without_booting():
    """up() alone (no VM): per link a TAP and a bridge joining it to the veth, quiet
    (IPv6 off), MTU of the link; no daemon config for the kernel node; all gone after down."""
    prefix = f"{PREFIX}w"
    with Lab("interop-ring", prefix) as lab:
        ns = lab.ns("k2")
        info = {i["name"]: i for i in net.interfaces(ns)}
        assert set(info) == {"lo", "e-b1", "e-b3", "kt0", "kt1", "kb0", "kb1"}
        for veth, tap, bridge in (("e-b1", "kt0", "kb0"), ("e-b3", "kt1", "kb1")):
            assert info[tap]["kind"] == "tun" and info[tap]["master"] == bridge and info[veth]["master"] == bridge
            assert info[bridge]["kind"] == "bridge" and info[bridge]["mtu"] == 1560 and info[tap]["mtu"] == 1560
            assert not [a for a in info[bridge]["addresses"] + info[veth]["addresses"] if ":" in a]  # no IPv6
        assert not lab.config_path("k2").exists() and lab.config_path("b1").exists()
        assert lab.kernel_nodes == ["k2", "k4"] and lab.daemon_nodes == ["b1", "b3", "b5"]
        assert lab.originator("k4") == "02:ba:00:00:04:01" and lab.mesh_mac("k4") == "02:bb:00:00:04:00"
        cfg = lab.kernel_config("k2")
        assert [(n.tap, n.mac, n.mtu) for n in cfg.nics] == [("kt0", "02:ba:00:00:02:01", 1560),
                                                             ("kt1", "02:ba:00:00:02:02", 1560)]
        assert (cfg.ipv4, cfg.ipv6, cfg.algo) == ("10.77.0.2/24", "fd77::2/64", "BATMAN_IV")
        assert ("orig_interval", "1000") in cfg.settings and ("bridge_loop_avoidance", "0") in cfg.settings
        assert not lab.daemon_running("k2")
    assert net.list_namespaces(prefix) == []


def test_lan_nic_wiring_without_booting():
    """kernel.lan (bla-kernel's k2): one more NIC, not in the mesh, behind the TAP ktl in a
    bridge kbl of its own (nothing else in it: the test plugs its LAN in); the guest is told
    to bridge it with bat0 and to put the IPv4 address on br0, without IPv6."""
    prefix = f"{PREFIX}l"
    with Lab("bla-kernel", prefix) as lab:
        info = {i["name"]: i for i in net.interfaces(lab.ns("k2"))}
        assert set(info) == {"lo", "e-n3", "kt0", "kb0", "ktl", "kbl"}
        assert info["ktl"]["kind"] == "tun" and info["ktl"]["master"] == "kbl" and info["ktl"]["mtu"] == 1500
        assert info["kbl"]["kind"] == "bridge" and not [a for a in info["kbl"]["addresses"] if ":" in a]
        assert [i for i in info.values() if i["master"] == "kbl"] == [info["ktl"]]
        cfg = lab.kernel_config("k2")
        assert [(n.tap, n.mac) for n in cfg.nics] == [("kt0", "02:ba:00:00:02:01")]
        assert (cfg.lan.tap, cfg.lan.mac, cfg.lan.mtu) == ("ktl", "02:bc:00:00:02:00", 1500)
        assert (cfg.ipv4, cfg.ipv6) == ("10.77.0.2/24", None)
        assert ("bridge_loop_avoidance", "1") in cfg.settings
        assert "LAN_NIC=02:bc:00:00:02:00/1500\n" in cfg.guest_config()
        assert kernel_node.KernelNodeConfig.from_dict(dataclasses.asdict(cfg)) == cfg
        argv = kernel_node.KernelVM(cfg).qemu_command() if kernel_image.load_image() else []
        assert not argv or "tap,id=nic1,ifname=ktl,script=no,downscript=no,vnet_hdr=off" in argv
        # a node without kernel.lan is as before: no LAN NIC, IPv6 on bat0
        assert lab.topology.kernel_lan("g1") is None
    with Lab("interop-pair", prefix) as lab:
        cfg = lab.kernel_config("k2")
        assert cfg.lan is None and cfg.ipv6 == "fd77::2/64" and "LAN_NIC=''\n" in cfg.guest_config()
    assert net.list_namespaces(prefix) == []


# --- one VM: interop-pair ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    ok, why = kernel_nodes_available(1)
    if not ok:
        say(f"SKIPPING the kernel-node tests: {why}")
        pytest.skip(f"kernel nodes cannot run here: {why}")
    say(f"kernel nodes: {why}")
    lab = Lab("interop-pair", PREFIX)
    lab.up()
    try:
        t0 = time.monotonic()
        lab.start(timeout=15)
        vm = lab.vm("k2")
        say(f"k2 booted: ready {vm.boot_seconds:.2f}s after QEMU started (guest uptime {vm.guest_uptime:.2f}s), "
            f"lab.start() took {time.monotonic() - t0:.2f}s, VM RSS {vm.rss_kib() >> 10} MiB")
        yield lab
    finally:
        lab.down()


def guest(lab: Lab, script: str, timeout: float = 30) -> str:
    res = lab.shell("k2", script, timeout=timeout)
    assert res.returncode == 0, f"{script}: {res.returncode}\n{res.stdout}{res.stderr}"
    return res.stdout


def test_kernel_and_batctl_versions(pair):
    assert guest(pair, "cat /sys/module/batman_adv/version").strip() == "2022.3"
    out = pair.exec("k2", ["batctl", "-v"], check=True).stdout
    assert "batman-adv: 2022.3" in out, out
    assert guest(pair, "uname -r").strip() == kernel_image.load_image().kernel_release
    assert "iperf 3" in guest(pair, "iperf3 --version")
    for tool in ("nc", "md5sum", "sha256sum", "ping", "dd"):
        assert guest(pair, f"command -v {tool}").strip()


def test_guest_is_set_up_as_asked(pair):
    bat0 = guest(pair, "ip addr show dev bat0")
    assert "10.77.0.2/24" in bat0 and "fd77::2/64" in bat0 and "02:bb:00:00:02:00" in bat0
    eth0 = guest(pair, "ip link show dev eth0")
    assert "mtu 1560" in eth0 and pair.originator("k2") in eth0
    assert guest(pair, "batctl bl").strip() == "disabled"
    assert guest(pair, "batctl it").strip() == "1000"
    assert "BATMAN_IV" in guest(pair, "batctl ra")
    assert guest(pair, "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6").strip() == "1"
    # the host side: the TAP is a port of the bridge with the link's veth
    links = pair.netns_exec("k2", ["ip", "-o", "link"]).stdout
    assert re.search(r"kt0: .* master kb0", links) and re.search(r"e-b1@\S+ .* master kb0", links)


def test_each_sees_the_other_as_originator(pair):
    """batctl o in the guest lists batmand's originator (and batmanctl o the kernel's)
    within ~15 s of the start."""
    ours, theirs = pair.originator("b1"), pair.originator("k2")
    deadline = time.monotonic() + 15
    seen = {}
    while time.monotonic() < deadline and len(seen) < 2:
        if "k2" not in seen and re.search(rf"^\s*\*\s+{ours}\s", pair.batmanctl("k2", "o", "-H").stdout, re.M):
            seen["k2"] = time.monotonic()
        if "b1" not in seen and re.search(rf"^\s*\*\s+{theirs}\s", pair.batmanctl("b1", "o", "-H").stdout, re.M):
            seen["b1"] = time.monotonic()
        time.sleep(0.3)
    assert "k2" in seen, f"kernel node never listed {ours}:\n{pair.batmanctl('k2', 'o').stdout}"
    assert "b1" in seen, f"batmand never listed {theirs}:\n{pair.batmanctl('b1', 'o').stdout}"
    out = pair.batmanctl("k2", "o").stdout
    assert "B.A.T.M.A.N. adv 2022.3" in out and "[      eth0]" in out, out


def test_ping_over_bat0_both_ways(pair):
    for _ in range(20):  # routes both ways first
        if pair.exec("b1", ["ping", "-c1", "-W1", "10.77.0.2"]).returncode == 0:
            break
    assert pair.exec("b1", ["ping", "-c3", "-i0.2", "-W2", "10.77.0.2"]).returncode == 0
    assert pair.exec("k2", ["ping", "-c3", "-W2", "10.77.0.1"]).returncode == 0
    assert pair.exec("k2", ["ping6", "-c2", "-W2", "fd77::1"]).returncode == 0


def test_exec_semantics(pair):
    res = pair.shell("k2", "echo out; echo err >&2; exit 3")
    assert (res.returncode, res.stdout, res.stderr) == (3, "out\n", "err\n")
    assert pair.exec("k2", ["cat"], input="a b\n").stdout == "a b\n"
    assert pair.exec("k2", ["echo", "two words", "$HOME"]).stdout == "two words $HOME\n"  # argv is quoted
    with pytest.raises(subprocess.CalledProcessError):
        pair.exec("k2", ["false"], check=True)
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        pair.exec("k2", ["sleep", "30"], timeout=1)
    assert time.monotonic() - t0 < 10
    assert pair.exec("k2", ["true"]).returncode == 0  # the channel still works
    big = pair.shell("k2", "head -c 200000 /dev/zero | tr '\\0' x").stdout
    assert big == "x" * 200000


def test_background_jobs_and_10mb_through_the_mesh(pair):
    """lab.spawn in the guest; 10 MB batmand -> kernel with busybox nc, checksums match."""
    job = pair.spawn("k2", ["sleep", "60"])
    assert job.poll() is None
    job.kill()
    assert job.wait(10) is not None
    job = pair.spawn("k2", ["sh", "-c", "nc -l -p 5001 | sha256sum"])
    payload = os.urandom(10 << 20)
    t0 = time.monotonic()
    for attempt in range(50):
        sock = pr_netns.create_socket(pair.ns("b1"), socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(60)
            sock.connect(("10.77.0.2", 5001))
            break
        except OSError:
            sock.close()
            time.sleep(0.2)
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)
    sock.close()
    assert job.wait(60) == 0
    out, _ = job.output()
    assert out.split()[0] == hashlib.sha256(payload).hexdigest()
    say(f"10 MB batmand -> kernel node over bat0 in {time.monotonic() - t0:.1f}s")


def test_show_and_cli(pair):
    st = pair.status()
    (k2,) = [n for n in st["nodes"] if n["name"] == "k2"]
    assert k2["kind"] == "kernel" and k2["daemon_running"] and k2["rss_kib"] > 0
    assert "2022.3" in k2["originators"]
    assert "kernel batman-adv VM pid" in pair.show(originators=False)
    cli = subprocess.run([sys.executable, "-m", "batmand.lab", "exec", "--prefix", PREFIX, "k2", "--", "batctl", "-v"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and "2022.3" in cli.stdout, cli.stderr
    cli = subprocess.run([sys.executable, "-m", "batmand.lab", "exec", "--prefix", PREFIX, "k2", "--", "sh", "-c",
                          "exit 5"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 5
    cli = subprocess.run([sys.executable, "-m", "batmand.lab", "exec", "--prefix", PREFIX, "--netns", "k2", "--",
                          "ip", "-br", "link"], capture_output=True, text=True, timeout=60)
    assert "kt0" in cli.stdout
    attached = Lab.attach(PREFIX)
    assert attached.daemon_running("k2") and attached.exec("k2", ["hostname"]).stdout.strip() == "k2"


def test_teardown_by_prefix_leaves_nothing(pair):
    """Last: down(prefix), as after a crash (no Lab object), kills the VM and removes the
    TAPs and namespaces."""
    vm = pair.vm("k2")
    pid, sock = vm.pid, vm.socket_path
    rss = vm.rss_kib()
    assert vm.alive() and rss
    say(f"k2 before teardown: pid {pid}, RSS {rss >> 10} MiB, boot {vm.boot_seconds:.2f}s")
    t0 = time.monotonic()
    removed = down(PREFIX)
    assert sorted(removed) == [f"{PREFIX}-b1", f"{PREFIX}-k2"]
    assert not net.pid_alive(pid)
    assert time.monotonic() - t0 < 10
    assert net.list_namespaces(PREFIX) == []
    # no QEMU of this lab anywhere, no TAP of it in any namespace left
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                assert sock not in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
    taps = subprocess.run(["ip", "-o", "link", "show", "type", "tun"], capture_output=True, text=True).stdout
    assert "kt0" not in taps
    assert not pair.run_dir.exists() and not pair.lab_dir.exists()

