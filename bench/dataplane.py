#!/usr/bin/env python3
"""Data-plane benchmark: batmand against kernel references and other userspace L2 tunnels.

One command builds, measures and tears down each configuration in network namespaces
(two nodes A - B on one veth pair; a line A - M - B for forwarding through a middle
node), rotating the configuration order every repetition so that all of them see the
same machine conditions. Per configuration and repetition, from A to B:

  ping     100 x 10 ms: p50 / p99 round-trip time (--ping-count)
  ping1k   1000 x 1 ms: p50 / p99 round-trip time, a lone packet every millisecond (--ping1k-count)
  tcp1     iperf3 TCP, 1 stream (--tcp-time s)
  tcp8     iperf3 TCP, -P 8
  udp64    iperf3 UDP -l 64 -b 0 (--udp-time s): packets/s received
  flows    iperf3 TCP -P 32 (--flows), batmand with N workers only: per-worker frame share

Around each test it reads the CPU of every daemon's process tree (utime+stime of the
daemon and its children, /proc/<pid>/stat), the machine's busy CPU, drop counters at each
place a frame can be lost (veths, the TAP queue, the daemon's sockets, the daemon itself,
iperf3's own loss) and the load. It waits for a quiet machine before each test.

Writes bench/results/<stamp>/{results.json,results.md,dataplane.png,logs/} and prints
the JSON document on stdout (progress goes to stderr). Run as root, e.g.

  ./scripts/run netbench --quick --configs veth-direct,tinc-switch,batmand-w0
  ./scripts/run netbench --reps 3
  ./scripts/run netbench --configs fastd-null,batmand-w0 --code base=/tmp/base,new=.  # batmand-w0@base, @new

--code NAME=PATH,...: every batmand configuration runs once per source tree (the daemon
starts with PYTHONPATH=PATH), named CONFIG@NAME, interleaved in the same repetitions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness as h  # noqa: E402
import peers  # noqa: E402
import report  # noqa: E402

N_WORKERS = os.cpu_count() or 1
DISTURBED_CORES = 0.10  # other programs above this (cores, test average) mark a test disturbed


# ------------------------------------------------------------------ tests
def pct(sorted_vals: list[float], p: float) -> float | None:
    """Nearest-rank percentile."""
    if not sorted_vals:
        return None
    rank = max(1, -(-len(sorted_vals) * p // 100))
    return sorted_vals[int(rank) - 1]


def t_ping(net: peers.Net, count: int, interval: str) -> dict:
    """count pings, interval seconds apart (below 0.01 s: root only, which the bench is)."""
    argv = ["ping", "-n", "-c", str(count), "-i", interval, "-W", "1", net.target]
    timeout = count * (float(interval) + 0.04) + 30
    r = subprocess.run(h.in_ns(net.ns["A"], argv), capture_output=True, text=True, timeout=timeout)
    rtts = sorted(float(x) for x in re.findall(r"time=([\d.]+) ms", r.stdout))
    res = {"cmd": shlex.join(argv), "sent": count, "received": len(rtts),
           "p50_ms": pct(rtts, 50), "p99_ms": pct(rtts, 99)}
    if not rtts:
        res["error"] = "no ping replies: " + (r.stderr or r.stdout).strip()[-200:]
    return res


def iperf3(net: peers.Net, extra: list[str], duration: int) -> tuple[dict, dict | None]:
    """One iperf3 test from A against a one-off server in B (started fresh for each test,
    so that a test a tunnel broke cannot leave a busy server behind)."""
    srv = h.spawn(h.in_ns(net.ns["B"], ["iperf3", "-s", "-1", "-B", net.target]),
                  os.path.join(CTX.logdir, f"{CTX.tag}-iperf3-server.log"), record=False)
    argv = ["iperf3", "-c", net.target, "-t", str(duration), "-J", *extra]
    res: dict = {"cmd": shlex.join(argv)}
    try:
        if not h.wait_until(lambda: ":5201" in h.run(h.in_ns(net.ns["B"], ["ss", "-ltnH"]), check=False,
                                                     record=False).stdout, 10, step=0.05):
            res["error"] = "iperf3 server did not listen"
            return res, None
        try:
            r = subprocess.run(h.in_ns(net.ns["A"], argv), capture_output=True, text=True, timeout=duration + 40)
        except subprocess.TimeoutExpired:
            res["error"] = f"iperf3 did not finish within {duration + 40} s"
            return res, None
        try:
            doc = json.loads(r.stdout)
        except json.JSONDecodeError:
            res["error"] = (r.stdout + r.stderr).strip()[-300:] or f"iperf3 exited {r.returncode}"
            return res, None
        if "error" in doc:
            res["error"] = doc["error"]
            return res, None
        return res, doc
    finally:
        h.stop(srv, grace=1.0)


def t_tcp(net: peers.Net, args, streams: int, duration: int) -> dict:
    res, doc = iperf3(net, ["-P", str(streams)] if streams > 1 else [], duration)
    if doc:
        end = doc["end"]
        rx, tx = end["sum_received"], end["sum_sent"]
        res.update(streams=streams, bytes_rx=rx["bytes"], seconds=rx["seconds"], gbps=rx["bits_per_second"] / 1e9,
                   retransmits=tx.get("retransmits"),
                   intervals_gbps=[round(iv["sum"]["bits_per_second"] / 1e9, 3) for iv in doc.get("intervals", [])])
    return res


def t_udp(net: peers.Net, args) -> dict:
    res, doc = iperf3(net, ["-u", "-l", "64", "-b", "0"], args.udp_time)
    if doc:
        end = doc["end"]
        s = end.get("sum") or {}
        rx, tx = end.get("sum_received", s), end.get("sum_sent", s)
        sent = tx.get("packets", s.get("packets", 0))
        lost = rx.get("lost_packets", s.get("lost_packets", 0))
        got = rx.get("packets", sent) - lost
        secs = tx.get("seconds") or s.get("seconds") or args.udp_time
        # frames arrive only while the sender sends: rate over the sender's time (the
        # receiver's interval stretches when a flooded tunnel delays the end of the test)
        res.update(tx_packets=sent, tx_pps=sent / secs, rx_packets=got, rx_pps=got / secs,
                   lost_packets=lost, loss_pct=rx.get("lost_percent", s.get("lost_percent")))
    return res


# ------------------------------------------------------------------ accounting around one test
def counters(net: peers.Net, naive: bool) -> dict:
    c = {"links": {node: h.link_stats(ns) for node, ns in net.ns.items()},
         "udp": {node: h.udp_counters(ns) for node, ns in net.ns.items()}}
    if net.sockets:
        c["dataplane"], c["dataplane_error"] = peers.dataplane_stats(net.sockets)
    if naive:
        c["packet_stats"] = peers.naive_packet_stats(net)  # reading resets them
    return c


def daemon_cpu(net: peers.Net) -> dict[str, dict[int, tuple[str, float]]]:
    return {node: h.tree_cpu(p.pid) for node, p in net.daemons.items()}


def measured(name: str, net: peers.Net, fn) -> dict:
    naive = net.spec.build == "naive"
    c0 = counters(net, naive)
    load_before = h.loadavg()
    snap0 = h.all_procs()
    cpu0 = daemon_cpu(net)
    m0 = h.machine_cpu()
    t0 = time.monotonic()
    res = fn()
    wall = time.monotonic() - t0
    m1 = h.machine_cpu()
    cpu1 = daemon_cpu(net)
    snap1 = h.all_procs()
    c1 = counters(net, naive)
    foreign, foreign_per = h.neighbour_cpu(snap0, snap1)
    res.update(test=name, wall_s=round(wall, 3), loadavg_before=load_before, loadavg_after=h.loadavg(),
               machine_busy_cpu_s=round(m1[0] - m0[0], 3), neighbour_cpu_s=round(foreign, 3),
               neighbour_cores=round(foreign / max(wall, 1e-3), 3),
               neighbours_top=sorted(((k, round(v, 2)) for k, v in foreign_per.items() if v >= 0.05),
                                     key=lambda kv: -kv[1])[:4])
    res["disturbed"] = res["neighbour_cores"] > DISTURBED_CORES
    # CPU of each daemon's process tree (utime+stime of the daemon and its children)
    per_node, per_proc = {}, {}
    for node in net.daemons:
        before, after = cpu0.get(node, {}), cpu1.get(node, {})
        # a child reaped during the test moved its CPU into the parent's cutime/cstime: subtract
        # what it had before, and the totals stay continuous
        total = sum(v for _, v in after.values()) - sum(v for _, v in before.values())
        per_node[node] = round(total, 3)
        per_proc[node] = [[pid, comm, round(v - before.get(pid, (comm, 0.0))[1], 3)] for pid, (comm, v) in after.items()]
    if net.daemons:
        res["daemon_cpu_s"] = per_node
        res["daemon_procs"] = per_proc
    res["links"] = {node: h.delta(c1["links"][node], c0["links"].get(node, {})) for node in c1["links"]}
    res["udp_counters"] = {node: h.delta(c1["udp"][node], c0["udp"].get(node, {})) for node in c1["udp"]}
    if "dataplane" in c1:
        res["dataplane"] = dataplane_delta(c0["dataplane"], c1["dataplane"])
        if c0.get("dataplane_error") or c1.get("dataplane_error"):
            res["dataplane_error"] = c1.get("dataplane_error") or c0.get("dataplane_error")
    if naive:
        res["packet_stats"] = c1["packet_stats"]
    derive(net, res)
    return res


def dataplane_delta(before: dict, after: dict) -> dict:
    """Per node: each worker's frames during the test, and the drop counters' increase."""
    out = {}
    for node, doc in after.items():
        prev = before.get(node)
        if doc is None or prev is None:  # no answer now, or no baseline from before the test
            out[node] = None
            continue
        old_workers = {w.get("index"): w for w in prev.get("workers", []) if isinstance(w, dict)}
        workers = []
        for w in doc.get("workers", []):
            if not isinstance(w, dict):
                continue
            o = old_workers.get(w.get("index"), {})
            entry = {"index": w.get("index"), "pid": w.get("pid")}
            for k in ("rx_frames", "tx_frames", "restarts"):
                v, v0 = w.get(k), o.get(k, 0)
                if isinstance(v, (int, float)):
                    # a restarted worker starts its counters again from 0
                    entry[k] = v - v0 if isinstance(v0, (int, float)) and v >= v0 else v
            workers.append(entry)
        drops = {}
        for k, v in (doc.get("drops") or {}).items():
            v0 = (prev.get("drops") or {}).get(k, 0)
            if isinstance(v, (int, float)):
                drops[k] = v - v0 if isinstance(v0, (int, float)) and v >= v0 else v
        out[node] = {"workers": workers, "drops": drops}
    return out


def share(values: list[float]) -> list[float] | None:
    if len(values) < 1:
        return None
    mean = statistics.fmean(values)
    return [round(v / mean, 3) for v in values] if mean > 0 else None


def derive(net: peers.Net, res: dict) -> None:
    """Per-test figures: CPU per GB / per packet, drops per place, worker shares."""
    if res.get("error"):
        return
    dcpu = sum(res["daemon_cpu_s"].values()) if res.get("daemon_cpu_s") else None
    if res.get("bytes_rx"):
        gb = res["bytes_rx"] / 1e9
        res["machine_cpu_s_per_gb"] = res["machine_busy_cpu_s"] / gb
        if dcpu is not None:
            res["daemon_cpu_s_per_gb"] = dcpu / gb
            res["daemon_cores"] = dcpu / res["wall_s"]
    if res.get("rx_packets"):
        res["machine_cpu_us_per_pkt"] = res["machine_busy_cpu_s"] * 1e6 / res["rx_packets"]
        if dcpu is not None:
            res["daemon_cpu_us_per_pkt"] = dcpu * 1e6 / res["rx_packets"]
            res["daemon_cores"] = dcpu / res["wall_s"]
    links = res.get("links", {})
    veth = sum(st.get("rx_dropped", 0) + st.get("tx_dropped", 0)
               for node, devs in net.veths.items() for d, st in links.get(node, {}).items() if d in devs)
    drops: dict = {"veth": veth}
    if net.spec.kind != "kernel" and net.overlay_dev:
        # frames the kernel could not queue to the daemon (TAP queue full): the TAP's tx_dropped
        drops["tap_queue"] = sum(links.get(node, {}).get(net.overlay_dev, {}).get("tx_dropped", 0) for node in net.ns)
        drops["tap_rx"] = sum(links.get(node, {}).get(net.overlay_dev, {}).get("rx_dropped", 0) for node in net.ns)
    if net.spec.build in ("tinc", "fastd"):
        drops["socket"] = sum(c.get("RcvbufErrors", 0) for c in res.get("udp_counters", {}).values())
    elif net.spec.build == "naive":
        ps = res.get("packet_stats") or {}
        drops["socket"] = sum(v["drops"] for v in ps.values()) if ps else None
    elif net.spec.kind == "batmand":
        dp = res.get("dataplane") or {}
        # the daemon's own counts: its sockets, inside it, at the TAP (its view of the queue)
        for key, label in (("socket", "socket"), ("daemon", "daemon"), ("tap", "daemon_tap")):
            vals = [d["drops"].get(key) for d in dp.values() if d and isinstance(d.get("drops"), dict)]
            vals = [v for v in vals if isinstance(v, (int, float))]
            drops[label] = sum(vals) if vals and len(vals) == len(net.ns) else None
    if "lost_packets" in res:
        drops["iperf_udp_lost"] = res["lost_packets"]
    if "retransmits" in res:
        drops["iperf_tcp_retransmits"] = res["retransmits"]
    res["drops"] = drops
    # worker shares: each worker's frames / mean over that daemon's workers
    dp = res.get("dataplane") or {}
    shares = {}
    for node, d in dp.items():
        if not d or not d.get("workers"):
            continue
        entry = {}
        for k in ("rx_frames", "tx_frames"):
            vals = [w.get(k) for w in d["workers"]]
            if vals and all(isinstance(v, (int, float)) for v in vals):
                entry[k] = vals
                entry[k.replace("frames", "share")] = share(vals)
        entry["restarts"] = sum(w.get("restarts") or 0 for w in d["workers"])
        shares[node] = entry
    if shares:
        res["worker_shares"] = shares
        rx = [s for e in shares.values() for s in (e.get("rx_share") or [])]
        tx = [s for e in shares.values() for s in (e.get("tx_share") or [])]
        if rx:
            res["rx_share_min"], res["rx_share_max"] = min(rx), max(rx)
        if tx:
            res["tx_share_min"], res["tx_share_max"] = min(tx), max(tx)


# ------------------------------------------------------------------ one configuration, one repetition
def run_one(spec: peers.Spec, rep: int, args, cfginfo: dict, runs: list[dict]) -> None:
    """Build, measure, tear down; the result goes into runs at once, so that an
    interrupted run keeps the tests it finished."""
    info: dict = {"config": spec.name, "rep": rep, "started": time.strftime("%H:%M:%S"), "tests": {}}
    runs.append(info)
    CTX.tag = f"{spec.name}-r{rep}"
    n0 = len(h.COMMANDS)
    net = None
    try:
        tree = CODE_TREES.get(spec.name)
        if tree is None:
            net = peers.BUILDERS[spec.build](CTX, spec)
        else:  # the daemons (and their workers) import batmand from this tree
            saved = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = tree
            try:
                net = peers.BUILDERS[spec.build](CTX, spec)
            finally:
                if saved is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = saved
        if not h.wait_until(lambda: h.run(h.in_ns(net.ns["A"], ["ping", "-n", "-c1", "-W1", net.target]),
                                          check=False, record=False).returncode == 0, 20, step=0.2):
            raise RuntimeError(f"A cannot reach {net.target}")
        h.run(h.in_ns(net.ns["A"], ["ping", "-n", "-q", "-c", "20", "-i", "0.01", net.target]), check=False,
              record=False)  # warm caches, ARP, the daemons' first frames
        ci = cfginfo.setdefault(spec.name, {})
        if spec.build in peers.VERIFIERS:
            info["verify"] = peers.VERIFIERS[spec.build](net)
            ci.setdefault("verify", info["verify"])
        info["mesh_ready_s"] = net.notes.get("mesh_ready_s")
        if "setup_commands" not in ci:
            ci.update(setup_commands=[c for c in h.COMMANDS[n0:]], underlay_mtu=net.underlay_mtu,
                      overlay_mtu=net.overlay_mtu, config_files=net.notes.get("config_files"),
                      namespaces=dict(net.ns), daemon_pids_first_rep={n: p.pid for n, p in net.daemons.items()})
            feats = {}
            for node in ("A", "B"):
                for dev in {net.overlay_dev, net.veths[node][0]} - {None}:
                    feats[f"{node}:{dev}"] = h.ethtool_features(net.ns[node], dev)
            ci["ethtool"] = feats
        info["daemon_pids"] = {n: p.pid for n, p in net.daemons.items()}
        info["daemon_threads"] = {n: len(os.listdir(f"/proc/{p.pid}/task")) for n, p in net.daemons.items()
                                  if p.poll() is None}
        tests = [("ping", lambda: t_ping(net, args.ping_count, "0.01")),
                 ("ping1k", lambda: t_ping(net, args.ping1k_count, "0.001")),
                 ("tcp1", lambda: t_tcp(net, args, 1, args.tcp_time)),
                 ("tcp8", lambda: t_tcp(net, args, 8, args.tcp_time)),
                 ("udp64", lambda: t_udp(net, args))]
        if spec.flows_test and args.flows > 0:
            tests.append(("flows", lambda: t_tcp(net, args, args.flows, args.tcp_time)))
        for name, fn in tests:
            if name not in args.tests:
                continue
            waited, rate = h.quiet_wait(args.max_quiet_wait)
            h.log(f"  {spec.name} rep {rep}: {name} (load {h.loadavg().split()[0]}, other programs "
                  f"{rate:.2f} cores{f', waited {waited:.0f} s' if waited >= 1 else ''})")
            res = measured(name, net, fn)
            res["quiet_wait_s"], res["neighbour_cores_before"] = waited, rate
            info["tests"][name] = res
            if res.get("error"):
                h.log(f"  {spec.name} rep {rep}: {name}: ERROR {res['error']}")
            gone = {n: p.returncode for n, p in net.daemons.items() if p.poll() is not None}
            if gone:
                raise RuntimeError(f"daemon(s) exited during {name}: {gone}; "
                                   + "; ".join(f"{n}: {h.tail(net.daemons[n].logfile, 5)}" for n in gone))
    except Exception as exc:  # record it and go on with the next configuration
        info["error"] = f"{type(exc).__name__}: {exc}"
        h.log(f"  {spec.name} rep {rep}: ERROR {info['error']}")
    except KeyboardInterrupt:
        info["error"] = "interrupted"
        raise
    finally:
        if net is not None:
            for node, p in list(net.daemons.items()):
                rc = h.stop(p)
                if rc is not None:
                    info.setdefault("daemon_exit_status", {})[node] = rc
        for ns in list(h.Owned.namespaces):
            h.del_ns(ns)


# ------------------------------------------------------------------ main
def versions() -> dict:
    def first_line(argv):
        if not shutil.which(argv[0]) and not os.path.exists(argv[0]):
            return None
        r = subprocess.run(argv, capture_output=True, text=True)
        return ((r.stdout or r.stderr).strip().splitlines() or [None])[0]
    v = {"iperf3": first_line(["iperf3", "--version"]), "tincd": first_line(["tincd", "--version"]),
         "fastd": first_line(["fastd", "--version"]), "python": platform.python_version()}
    r = subprocess.run(["git", "-C", peers.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    v["batmand_commit"] = r.stdout.strip() or None
    r = subprocess.run(["git", "-C", peers.ROOT, "status", "--porcelain", "--", "batmand"], capture_output=True, text=True)
    v["batmand_tree_dirty"] = bool(r.stdout.strip())
    return v


def parse_args(argv=None):
    all_specs = peers.specs(N_WORKERS)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(all_specs),
                    help="comma list (default: all): " + ",".join(all_specs))
    ap.add_argument("--reps", type=int, help="repetitions per config, interleaved (default 3; --quick 1)")
    ap.add_argument("--tcp-time", type=int, help="seconds per TCP test (default 10; --quick 3)")
    ap.add_argument("--udp-time", type=int, help="seconds of the UDP test (default 5; --quick 2)")
    ap.add_argument("--ping-count", type=int, default=100, help="pings of the 10 ms series")
    ap.add_argument("--ping1k-count", type=int, default=1000, help="pings of the 1 ms series")
    ap.add_argument("--flows", type=int, default=32, help="TCP streams of the worker-share test (0 = skip)")
    ap.add_argument("--tests", default="ping,ping1k,tcp1,tcp8,udp64,flows")
    ap.add_argument("--max-quiet-wait", type=float, help="seconds to wait at most for a quiet machine "
                                                         "before each test (default 20; --quick 3)")
    ap.add_argument("--quick", action="store_true", help="smoke check: 1 rep, short tests")
    ap.add_argument("--out", default=os.path.join(peers.ROOT, "bench", "results"),
                    help="results go to OUT/<stamp>/")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument("--code", help="NAME=PATH,...: run each batmand config once per source tree, as CONFIG@NAME")
    args = ap.parse_args(argv)
    defaults = {"reps": (3, 1), "tcp_time": (10, 3), "udp_time": (5, 2), "max_quiet_wait": (20.0, 3.0)}
    for key, (full, quick) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.tests = [t for t in args.tests.split(",") if t]
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in all_specs]
    if unknown:
        ap.error(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(all_specs)}")
    if args.code:
        for item in args.code.split(","):
            code, _, path = item.partition("=")
            if not code or not os.path.isdir(os.path.join(path, "batmand")):
                ap.error(f"--code {item}: want NAME=PATH of a source tree (PATH/batmand)")
            for name in [n for n in names if all_specs[n].kind == "batmand"]:
                variant = dataclasses.replace(all_specs[name], name=f"{name}@{code}",
                                              about=f"{all_specs[name].about}, code {path}")
                all_specs[variant.name] = variant
                CODE_TREES[variant.name] = os.path.abspath(path)
        names = [v for n in names for v in ([n] if all_specs[n].kind != "batmand" else
                                           [k for k in CODE_TREES if k.partition("@")[0] == n])]
    args.config_names = names
    return args, all_specs


CTX: peers.Ctx
CODE_TREES: dict[str, str] = {}  # config@code -> the source tree its daemons run (--code)


def main(argv=None) -> int:
    global CTX
    args, all_specs = parse_args(argv)
    if args.list:
        for s in all_specs.values():
            print(f"{s.name:26} {s.about}")
        return 0
    if os.geteuid() != 0:
        print("dataplane.py: run as root (namespaces, AF_PACKET, TAP)", file=sys.stderr)
        return 2
    specs = [all_specs[c] for c in args.config_names]
    for tool in ("iperf3", "ip", "ss", "ping"):
        if not shutil.which(tool):
            print(f"dataplane.py: {tool} is missing (scripts/bench-setup.sh installs it)", file=sys.stderr)
            return 2

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(args.out, stamp)
    logdir = os.path.join(outdir, "logs")
    os.makedirs(logdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="dataplane-bench.")
    CTX = peers.Ctx(workdir, logdir, peers.python_for_naive())
    stale = h.remove_stale()
    if stale:
        h.log(f"removed namespaces of an earlier, killed run: {', '.join(stale)}")
    with open("/proc/cpuinfo") as f:
        cpu_model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "stamp": stamp, "kernel": platform.release(),
            "cpus": os.cpu_count(), "cpu_model": cpu_model, "workers_n": N_WORKERS, "versions": versions(),
            "args": {k: v for k, v in vars(args).items() if k != "list"}, "namespace_prefix": h.PREFIX,
            "loadavg_start": h.loadavg(), "naive_fwd": peers.NAIVE_FWD, "out_dir": outdir}
    runs: list[dict] = []
    cfginfo: dict = {s.name: {"about": s.about, "topology": s.topo, "kind": s.kind, "workers": s.workers,
                              "offloads": s.offloads} for s in specs}
    missing = {s.name: t for s in specs for t in peers.required_tools(s) if not shutil.which(t)}
    t_start = time.monotonic()
    try:
        for rep in range(args.reps):
            k = rep % len(specs)
            order = specs[k:] + specs[:k]
            h.log(f"rep {rep + 1}/{args.reps}: {', '.join(s.name for s in order)}")
            for spec in order:
                if spec.name in missing:
                    runs.append({"config": spec.name, "rep": rep, "tests": {},
                                 "error": f"{missing[spec.name]} is not installed (scripts/bench-setup.sh)"})
                    continue
                run_one(spec, rep, args, cfginfo, runs)
    except KeyboardInterrupt as exc:
        h.log(f"interrupted ({exc or 'Ctrl-C'}); cleaning up")
        meta["interrupted"] = True
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        h.teardown()
        shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["duration_s"] = round(time.monotonic() - t_start, 1)
    meta["loadavg_end"] = h.loadavg()
    names = [s.name for s in specs]
    summary = report.summarize(runs, names)
    ratios = report.ratios(summary, names, N_WORKERS)
    doc = {"meta": meta, "configs": cfginfo, "summary": summary, "ratios": ratios, "runs": runs}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    report.write_markdown(os.path.join(outdir, "results.md"), doc)
    png = report.write_chart(os.path.join(outdir, "dataplane.png"), doc)
    h.log(f"wrote {outdir}/results.json, results.md" + (", dataplane.png" if png else " (no chart: " + str(report.CHART_ERROR) + ")"))
    json.dump(doc, sys.stdout, indent=1, default=str)
    print()
    return 130 if meta.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
