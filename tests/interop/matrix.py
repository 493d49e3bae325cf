"""The interop checks between kernel batman-adv nodes and batmand nodes, one lab at a time."""

from __future__ import annotations

import json
import re
import time

from tests.daemon.labs import wait_for


def ok(proc) -> str:
    """A command's output, after asserting that it succeeded (saying what it printed)."""
    assert proc.returncode == 0, f"{proc.args}: {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def kernel_json(lab, node: str, command: str) -> list[dict]:
    """One of batctl's JSON dumps on a kernel node: one array, or one object per line."""
    out = ok(lab.exec(node, ["batctl", command]))
    try:
        rows = json.loads(out)
    except ValueError:
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return rows if isinstance(rows, list) else [rows]


def _o_rows(lab, node) -> list[dict]:
    if lab.is_kernel(node):
        out = lab.exec(node, ["batctl", "o", "-H"]).stdout
        rows = []
        for line in out.splitlines():
            m = re.match(r"\s*(\*)?\s*([0-9a-f:]{17})\s+([\d.]+)s\s+\(\s*([\d.]+)\)\s+([0-9a-f:]{17})", line)
            if m:
                rows.append({"best": bool(m[1]), "orig_address": m[2], "metric": float(m[4]), "neigh_address": m[5]})
        return rows
    out = lab.batmanctl(node, "o", "--json").stdout
    rows = json.loads(out) if out.strip() else []
    for r in rows:
        r["metric"] = r.get("tq", r.get("throughput", 0))
    return rows


def originator(lab, node) -> str:
    """A node's originator address (the MAC of its first hard interface)."""
    if lab.is_kernel(node):
        return lab.exec(node, ["cat", "/sys/class/net/eth0/address"]).stdout.strip()
    ifname = next(link.ifname_a if link.a == node else link.ifname_b
                  for link in lab.topology.links if node in (link.a, link.b))
    return lab.exec(node, ["cat", f"/sys/class/net/{ifname}/address"], check=True).stdout.strip()


def bat0_mac(lab, node) -> str:
    return lab.exec(node, ["cat", "/sys/class/net/bat0/address"]).stdout.strip()


def tt_requests(lab, node) -> tuple[int, int]:
    if lab.is_kernel(node):
        out = lab.exec(node, ["batctl", "s"]).stdout
        values = dict(re.findall(r"(\w+): (\d+)", out))
    else:
        values = json.loads(lab.batmanctl(node, "s", "--json", check=True).stdout)
    return int(values["tt_request_tx"]), int(values["tt_request_rx"])


def ping(lab, src, dst_node, *extra, count=3) -> bool:
    args = ["ping", "-c", str(count), "-W", "2", *extra, lab.address(dst_node)]
    return lab.exec(src, args).returncode == 0


def tg_text(lab, node) -> str:
    """batctl tg as the node prints it (batmanctl prints the same lines)."""
    return (lab.exec(node, ["batctl", "tg"]) if lab.is_kernel(node) else lab.batmanctl(node, "tg")).stdout


def converge(lab, timeout=90) -> float:
    """Every node knows every other node's originator, and holds its bat0 MAC in its global
    TT. The second can lag the first by a TT request timeout (3 s): a kernel running V asks
    for a new originator's table before it has a route to it, and that first request is lost."""
    nodes = lab.topology.nodes
    origs = {n: originator(lab, n) for n in nodes}
    macs = {n: bat0_mac(lab, n) for n in nodes}

    def routes():
        for n in nodes:
            best = {r["orig_address"] for r in _o_rows(lab, n) if r["best"] and r["metric"] > 0}
            if not {origs[m] for m in nodes if m != n} <= best:
                return False
        return True

    def tables():
        for n in nodes:
            lines = [line for line in tg_text(lab, n).splitlines() if line.lstrip().startswith("*")]
            if not all(any(macs[m] in line and origs[m] in line for line in lines) for m in nodes if m != n):
                return False
        return True

    _, waited = wait_for(routes, timeout=timeout, step=1.0)
    _, tt_waited = wait_for(tables, timeout=timeout, step=0.5)
    return waited + tt_waited


def check_all(lab, report: dict, *, tcp_pair: tuple[str, str] | None = None, algo: str = "BATMAN_IV") -> None:
    """The matrix cell: every check of the interop issue between every kernel/batmand pair."""
    nodes = list(lab.topology.nodes)
    kernels = [n for n in nodes if lab.is_kernel(n)]
    ours = [n for n in nodes if not lab.is_kernel(n)]
    origs = {n: originator(lab, n) for n in nodes}
    report["converged_s"] = round(converge(lab), 1)

    # originator tables both ways, with a plausible metric
    for k in kernels:
        rows = _o_rows(lab, k)
        for b in ours:
            best = [r for r in rows if r["orig_address"] == origs[b] and r["best"]]
            assert best and best[0]["metric"] > 0, (k, b, rows)
        neighbours = lab.exec(k, ["batctl", "n"]).stdout
        assert any(origs[b] in neighbours or _iface_macs(lab, b) & set(re.findall(r"[0-9a-f:]{17}", neighbours))
                   for b in ours), neighbours
    for b in ours:
        known = {r["orig_address"] for r in _o_rows(lab, b) if r["best"]}
        assert {origs[k] for k in kernels} <= known

    # IP over bat0 both ways (ARP included: neighbour caches flushed first)
    for a in nodes:
        lab.exec(a, ["ip", "neigh", "flush", "dev", "bat0"])
    for a in nodes:
        for z in nodes:
            if a != z and (lab.is_kernel(a) != lab.is_kernel(z)):
                assert ping(lab, a, z), f"ping {a} -> {z}"
    report["ip_ping"] = "pass"

    # batctl ping / traceroute from kernel nodes to us, batmanctl ping / traceroute to them
    for k in kernels:
        for b in ours:
            out = lab.exec(k, ["batctl", "ping", "-c", "2", origs[b]]).stdout
            assert "2 received" in out or "2 packets received" in out, out
            tr = lab.exec(k, ["batctl", "tr", origs[b]]).stdout
            assert origs[b] in tr.splitlines()[-1], tr
            out = lab.batmanctl(b, "ping", "-c", "2", "-i", "0.3", origs[k])
            assert out.returncode == 0 and "2 received" in out.stdout, out.stdout
            tr = lab.batmanctl(b, "traceroute", origs[k])
            assert tr.returncode == 0 and origs[k] in tr.stdout.splitlines()[-1], tr.stdout
    report["batctl_ping_traceroute"] = "pass"

    # translation tables: each side announces the other's bat0 MAC with the right ttvn
    for k in kernels:
        tg = lab.exec(k, ["batctl", "tg"]).stdout
        for b in ours:
            line = next((l for l in tg.splitlines() if bat0_mac(lab, b) in l), None)
            assert line is not None and "[....]" in line, (k, b, tg)
            ttvn = json.loads(lab.batmanctl(b, "tl", "--json", check=True).stdout)
            assert ttvn  # our local table is not empty
    for b in ours:
        tg = json.loads(lab.batmanctl(b, "tg", "--json", check=True).stdout)
        for k in kernels:
            assert any(r["tt_address"] == bat0_mac(lab, k) for r in tg), (b, k, tg)
    report["tt"] = "pass"

    # 30 s of steady state: no TT request storm anywhere
    before = {n: tt_requests(lab, n) for n in nodes}
    time.sleep(30)
    after = {n: tt_requests(lab, n) for n in nodes}
    assert before == after, (before, after)
    report["tt_steady_30s"] = "pass (no TT requests)"

    # TCP / bulk data through the mesh
    if tcp_pair:  # both ways: a batmand sender's segments are cut by its kernel path (the default)
        a, z = tcp_pair
        report["bulk"] = bulk_transfer(lab, a, z)
        report["bulk_back"] = bulk_transfer(lab, z, a)

    # a 1400-byte hard-interface MTU: 1500-byte pings over bat0 both ways (fragmentation)
    report["fragmentation"] = fragmented_pings(lab)


def _iface_macs(lab, node) -> set[str]:
    out = lab.exec(node, ["ip", "-o", "link"]).stdout
    return set(re.findall(r"link/ether ([0-9a-f:]{17})", out))


def bulk_transfer(lab, a: str, z: str, seconds: int = 5) -> str:
    """iperf3 TCP from a to z through the mesh (the kernel guests carry iperf3 too)."""
    server = lab.spawn(z, ["iperf3", "-s", "-1"])
    try:
        time.sleep(1.5)
        out = lab.exec(a, ["iperf3", "-c", lab.address(z), "-t", str(seconds)], timeout=seconds + 60)
    finally:
        try:
            server.communicate(timeout=15)
        except Exception:  # noqa: BLE001 - a server that did not finish is killed
            server.kill() if hasattr(server, "kill") else server.send_signal(9)
    assert out.returncode == 0, out.stdout + out.stderr
    receiver = next(line for line in out.stdout.splitlines() if "receiver" in line)
    rate = re.search(r"([\d.]+ [KMG]bits/sec)", receiver)[1]
    return f"pass ({rate} over {seconds} s)"


def fragmented_pings(lab) -> str:
    """Lower every hard interface's MTU to 1400 and ping with 1500-byte IP packets."""
    for link in lab.topology.links:
        for node, ifname in ((link.a, link.ifname_a), (link.b, link.ifname_b)):
            if lab.is_kernel(node):
                lab.exec(node, ["sh", "-c", "for i in /sys/class/net/eth*; do ip link set ${i##*/} mtu 1400; done"])
            else:
                lab.exec(node, ["ip", "link", "set", ifname, "mtu", "1400"], check=True)
    time.sleep(2)
    kernels = [n for n in lab.topology.nodes if lab.is_kernel(n)]
    ours = [n for n in lab.topology.nodes if not lab.is_kernel(n)]
    for k in kernels:
        for b in ours:
            assert ping(lab, b, k, "-s", "1472", count=2), f"1500-byte ping {b} -> {k}"
            assert ping(lab, k, b, "-s", "1472", count=2), f"1500-byte ping {k} -> {b}"
    frag = {b: json.loads(lab.batmanctl(b, "s", "--json", check=True).stdout) for b in ours}
    assert all(s["frag_tx"] > 0 or s["frag_fwd"] > 0 for s in frag.values()), frag
    assert any(s["frag_rx"] > 0 for s in frag.values()), frag
    return "pass (" + ", ".join(f"{b}: frag_tx {s['frag_tx']} rx {s['frag_rx']} fwd {s['frag_fwd']}"
                               for b, s in frag.items()) + ")"
