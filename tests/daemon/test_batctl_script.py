"""A Gluon-style set-up script, unchanged, through the `batctl` name (batmanctl install-batctl):
create the mesh interface with its routing algorithm, add the hard interface, set
orig_interval, hop_penalty and gw_mode, then read o/n/gwl/dc/tg with -H -n and the JSON
verbs. Two plain namespaces and a veth pair, every daemon option at its default: nothing
but the script makes the mesh."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from batmand.cli import install_batctl
from tests.daemon.labs import wait_for
from tests.netns import ip, namespace

MAC = r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}"


def _remove_logs(ns: str) -> None:
    """The background daemons' logs in /run/batmand (destroy removes them; a failed test may not)."""
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                    "from batmand.cli import meshes; meshes.remove_logs('bat0')"], check=False)


def _kill_namespace_processes(ns: str) -> None:
    """Whatever the script started in `ns` (the daemons of `interface create`), by PID."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                                         text=True).stdout.split():
        time.sleep(0.1)
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def batctl(tmp_path):
    return install_batctl.install(str(tmp_path / "sbin"), force=True)


@pytest.fixture
def pair():
    with namespace() as a, namespace() as b:
        try:
            ip("link", "add", "mesh0", "netns", a, "type", "veth", "peer", "name", "mesh0", "netns", b)
            for ns in (a, b):
                ip("link", "set", "mesh0", "up", netns=ns)
            yield a, b
        finally:
            for ns in (a, b):
                _kill_namespace_processes(ns)
                _remove_logs(ns)


def run(batctl, ns, line: str, check=True) -> subprocess.CompletedProcess:
    """One line of the script, as a shell would split it."""
    result = subprocess.run(["ip", "netns", "exec", ns, batctl, *line.split()], capture_output=True, text=True,
                            timeout=60)
    if check:
        assert result.returncode == 0, f"batctl {line}: {result.returncode}\n{result.stdout}{result.stderr}"
    return result


SCRIPT = {  # per node: what Gluon's set-up runs
    "gw": ["meshif bat0 interface create routing_algo BATMAN_IV",
           "meshif bat0 interface add mesh0",
           "meshif bat0 orig_interval 500",
           "hardif mesh0 hop_penalty 15",
           "meshif bat0 gw_mode server 50mbit/10mbit"],
    "client": ["meshif bat0 interface create ra BATMAN_IV",
               "meshif bat0 interface add mesh0",
               "meshif bat0 it 500",
               "meshif bat0 gw_mode client"],
}


def test_gluon_style_script_through_the_batctl_name(batctl, pair):
    gw, client = pair
    for ns, role in ((gw, "gw"), (client, "client")):
        for line in SCRIPT[role]:
            run(batctl, ns, line)
    for ns, addr in ((gw, "10.77.0.1/24"), (client, "10.77.0.2/24")):
        ip("link", "set", "bat0", "up", netns=ns)
        ip("addr", "add", addr, "dev", "bat0", netns=ns)
    gw_orig = ip("-br", "link", "show", "mesh0", netns=gw).split()[2]
    gw_bat0 = ip("-br", "link", "show", "bat0", netns=gw).split()[2]

    # the settings read back as batctl prints them
    assert run(batctl, gw, "meshif bat0 interface").stdout == "mesh0: active\n"
    assert run(batctl, gw, "meshif bat0 orig_interval").stdout == "500\n"
    assert run(batctl, gw, "hardif mesh0 hop_penalty").stdout == "15\n"
    assert run(batctl, gw, "mesh0 hp").stdout == "15\n"  # a bare hard interface name: its scope
    assert run(batctl, gw, "gw").stdout == "server (announced bw: 50.0/10.0 MBit)\n"
    assert run(batctl, client, "gw_mode").stdout.startswith("client (selection class: 20")
    assert "* bat0: BATMAN_IV" in run(batctl, gw, "ra").stdout

    # the mesh forms; traffic fills the client's DAT cache and global table
    wait_for(lambda: re.search(rf"\* {gw_orig} .*\[\s*mesh0\]", run(batctl, client, "o -H -n").stdout), timeout=60)
    wait_for(lambda: subprocess.run(["ip", "netns", "exec", client, "ping", "-c1", "-W1", "10.77.0.1"],
                                    capture_output=True).returncode == 0, timeout=30)

    o = run(batctl, client, "o -H -n").stdout.splitlines()
    assert any(re.fullmatch(rf" \* {gw_orig}\s+\d+\.\d{{3}}s\s+\(\s*\d+\) {gw_orig} \[\s+mesh0\]", line) for line in o), o
    per_iface = run(batctl, client, "o -i mesh0 -H -n").stdout.splitlines()  # one interface: the same routes
    assert [line.split()[1::3] for line in per_iface] == [line.split()[1::3] for line in o], (per_iface, o)
    assert run(batctl, client, "o -i lo", check=False).stderr.startswith("batctl: interface lo is not part of bat0")
    n = run(batctl, client, "meshif bat0 n -H -n").stdout.splitlines()
    assert any(re.fullmatch(rf"\s*mesh0\s+{gw_orig}\s+\d+\.\d{{3}}s", line) for line in n), n
    gwl = run(batctl, client, "gwl -H -n").stdout.splitlines()
    assert any(line.startswith("*") and gw_orig in line and "50.0/10.0 MBit" in line for line in gwl), gwl
    wait_for(lambda: "10.77.0.1" in run(batctl, client, "dc -H -n").stdout, timeout=30)
    dc = run(batctl, client, "dc -H -n").stdout
    assert re.search(rf"^ \* 10\.77\.0\.1\s+{gw_bat0}\s+-1\s+\d+\.\d{{3}}s? ?", dc, re.M) or gw_bat0 in dc, dc
    wait_for(lambda: gw_bat0 in run(batctl, client, "tg -H -n").stdout, timeout=30)
    tg = run(batctl, client, "tg -H -n").stdout
    assert re.search(rf"^ \* {gw_bat0}\s+-1 \[\.\.\.\.\]\s+\(\s*\d+\) {gw_orig} \(\s*\d+\) \(0x[0-9a-f]{{8}}\)",
                     tg, re.M), tg

    # the JSON verbs: batctl's keys
    oj = json.loads(run(batctl, client, "oj").stdout)
    assert any(r["orig_address"] == gw_orig and r.get("best") for r in oj), oj
    nj = json.loads(run(batctl, client, "nj").stdout)
    assert [r["neigh_address"] for r in nj] == [gw_orig] and nj[0]["hard_ifname"] == "mesh0"
    gwj = json.loads(run(batctl, client, "gwj").stdout)
    assert [r["orig_address"] for r in gwj] == [gw_orig] and gwj[0]["bandwidth_down"] == 500
    dcj = json.loads(run(batctl, client, "dcj").stdout)
    assert any(r["dat_cache_ip4address"] == "10.77.0.1" and r["dat_cache_hwaddress"] == gw_bat0 for r in dcj), dcj
    tgj = json.loads(run(batctl, client, "tgj").stdout)
    assert any(r["tt_address"] == gw_bat0 and r["orig_address"] == gw_orig for r in tgj), tgj
    mj = json.loads(run(batctl, gw, "meshif bat0 mj").stdout)
    assert mj["mesh_ifname"] == "bat0" and mj["algo_name"] == "BATMAN_IV" and mj["orig_interval"] == 500
    assert mj["gw_mode"] == "server" and mj["gw_bandwidth_down"] == 500 and mj["gw_bandwidth_up"] == 100
    hj = json.loads(run(batctl, gw, "hardif mesh0 hj").stdout)
    assert hj["hard_ifname"] == "mesh0" and hj["hop_penalty"] == 15

    # batctl event: a setting changed, as the kernel notifies it
    events = subprocess.Popen(["ip", "netns", "exec", gw, batctl, "event", "-t"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,  # Ctrl-C as at a terminal, also under nohup
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.0)  # it is listening
        run(batctl, gw, "it 600")
        run(batctl, gw, "hardif mesh0 hp 16")
        first = [events.stdout.readline() for _ in range(13)]
        hardif = [events.stdout.readline() for _ in range(4)]
    finally:
        events.send_signal(signal.SIGINT)
        events.communicate(timeout=10)
    assert re.fullmatch(r"\d+\.\d{6}: bat0: set mesh:\n", first[0]), first
    assert "* orig_interval 600 ms\n" in first and "* gw_mode server\n" in first, first
    assert re.fullmatch(r"\d+\.\d{6}: bat0 \(mesh0\): set hardif:\n", hardif[0]) and hardif[1] == "* hop_penalty 16\n"

    # batctl's refusals and errors, with its exit status
    wrong = run(batctl, gw, "meshif bat0 event", check=False)
    assert wrong.returncode == 1 and wrong.stderr.startswith(
        "Error - no valid command or debug table/JSON specified: event")
    again = run(batctl, gw, "meshif bat0 interface create", check=False)
    assert (again.returncode, again.stderr) == (1, "Error - failed to add create batman-adv interface: File exists\n")

    # taking it down again: del warns as batctl does, destroy removes bat0
    left = run(batctl, client, "meshif bat0 interface del mesh0")
    assert left.stderr == ("Warning: bat0 has no interfaces and can be destroyed with: "
                           "batctl meshif bat0 interface destroy\n")
    for ns in (gw, client):
        run(batctl, ns, "meshif bat0 interface destroy")
        assert "bat0" not in ip("-br", "link", netns=ns)
    gone = run(batctl, gw, "meshif bat0 interface destroy", check=False)
    assert (gone.returncode, gone.stderr) == (1, "Error - failed to destroy batman-adv interface: No such device\n")


def test_vlan_selectors_find_a_real_vlan_device(batctl, pair):
    """vlan bat0.10 CMD, bat0.10 CMD and meshif bat0 vid 10 CMD: the VLAN of an 802.1Q device."""
    gw, _ = pair
    run(batctl, gw, "interface add mesh0")  # creates bat0 with the defaults
    vlan = subprocess.run(["ip", "-n", gw, "link", "add", "link", "bat0", "name", "bat0.10", "type", "vlan", "id",
                           "10"], capture_output=True, text=True)
    if vlan.returncode != 0:
        pytest.skip(f"this kernel cannot make VLAN devices: {vlan.stderr.strip()}")
    ip("link", "set", "bat0", "up", netns=gw)
    ip("link", "set", "bat0.10", "up", netns=gw)
    wait_for(lambda: run(batctl, gw, "meshif bat0 vid 10 vj", check=False).returncode == 0, timeout=10)
    for line in ("vlan bat0.10 ap", "bat0.10 ap", "meshif bat0 vid 10 ap"):
        refused = run(batctl, gw, line, check=False)
        assert (refused.returncode, refused.stderr.split(":")[0]) == (1, "Error - ap_isolation"), (line, refused)
    for line in ("vlan bat0.10 vj", "bat0.10 vj", "meshif bat0 vid 10 vj"):
        vj = json.loads(run(batctl, gw, line).stdout)
        assert vj["vlanid"] == 10 and vj["mesh_ifname"] == "bat0", (line, vj)
    wrong_scope = run(batctl, gw, "vlan bat0.10 o", check=False)
    assert wrong_scope.stderr.startswith("Error - no valid command or debug table/JSON specified: o")


def test_event_hears_a_mesh_created_after_it_started(batctl, pair):
    """batctl event listens before there is any bat0, as batctl does, and then hears it."""
    ns, _ = pair
    events = subprocess.Popen(["ip", "netns", "exec", ns, batctl, "event"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(0.5)
        assert events.poll() is None  # no mesh yet: it waits
        run(batctl, ns, "interface create")
        run(batctl, ns, "interface add mesh0")
        time.sleep(2.5)  # the follower looks for new meshes every 2 s
        run(batctl, ns, "it 800")
        lines = []
        while "* orig_interval 800 ms\n" not in lines:
            line = events.stdout.readline()
            assert line, (lines, events.stderr.read())
            lines.append(line)
    finally:
        events.send_signal(signal.SIGINT)
        events.communicate(timeout=10)
    assert "bat0: set mesh:\n" in lines
