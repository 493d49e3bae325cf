"""Summaries of a bench/dataplane.py run: medians per configuration, the ratios the
data-plane work is judged by, a markdown report and a PNG chart."""

from __future__ import annotations

import statistics

CHART_ERROR: str | None = None

# (test, path inside the test's result, label)
METRICS = [
    ("tcp1", "gbps", "TCP 1 stream Gbit/s"),
    ("tcp8", "gbps", "TCP -P 8 Gbit/s"),
    ("udp64", "rx_pps", "UDP 64 B received pkt/s"),
    ("udp64", "tx_pps", "UDP 64 B offered pkt/s"),
    ("udp64", "loss_pct", "UDP 64 B iperf3 loss %"),
    ("ping", "p50_ms", "ping p50 ms"),
    ("ping", "p99_ms", "ping p99 ms"),
    ("ping1k", "p50_ms", "ping 1 ms p50 ms"),
    ("ping1k", "p99_ms", "ping 1 ms p99 ms"),
    ("tcp1", "daemon_cpu_s_per_gb", "TCP1 daemon CPU-s/GB"),
    ("tcp8", "daemon_cpu_s_per_gb", "TCP8 daemon CPU-s/GB"),
    ("udp64", "daemon_cpu_us_per_pkt", "UDP daemon CPU-us/pkt"),
    ("tcp1", "machine_cpu_s_per_gb", "TCP1 machine CPU-s/GB"),
    ("tcp8", "machine_cpu_s_per_gb", "TCP8 machine CPU-s/GB"),
    ("tcp1", "daemon_cores", "TCP1 daemon cores"),
    ("tcp8", "daemon_cores", "TCP8 daemon cores"),
    ("tcp1", "retransmits", "TCP1 retransmits"),
    ("tcp8", "retransmits", "TCP8 retransmits"),
    ("tcp8", "drops.veth", "TCP8 drops veth"),
    ("tcp8", "drops.tap_queue", "TCP8 drops TAP queue"),
    ("tcp8", "drops.socket", "TCP8 drops socket"),
    ("tcp8", "drops.daemon", "TCP8 drops daemon"),
    ("udp64", "drops.veth", "UDP drops veth"),
    ("udp64", "drops.tap_queue", "UDP drops TAP queue"),
    ("udp64", "drops.socket", "UDP drops socket"),
    ("udp64", "drops.daemon", "UDP drops daemon"),
    ("udp64", "drops.daemon_tap", "UDP drops TAP (daemon's count)"),
    ("udp64", "drops.iperf_udp_lost", "UDP iperf3 lost"),
    ("tcp8", "rx_share_min", "8-flow worker rx share min"),
    ("tcp8", "rx_share_max", "8-flow worker rx share max"),
    ("flows", "gbps", "32-flow TCP Gbit/s"),
    ("flows", "rx_share_min", "worker rx share min"),
    ("flows", "rx_share_max", "worker rx share max"),
    ("flows", "tx_share_min", "worker tx share min"),
    ("flows", "tx_share_max", "worker tx share max"),
    ("flows", "daemon_cpu_s_per_gb", "32-flow daemon CPU-s/GB"),
]


def _get(d: dict, path: str):
    for part in path.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def summarize(runs: list[dict], configs: list[str]) -> dict:
    """Median, min, max per metric and configuration. Tests that other programs disturbed
    (> 0.1 cores of theirs on average) are left out when two undisturbed values remain;
    otherwise all values count and the cell says so (basis "all")."""
    out = {}
    for cfg in configs:
        rs = [r for r in runs if r["config"] == cfg]
        s: dict = {"metrics": {}}
        for test, path, _ in METRICS:
            pairs = []
            for r in rs:
                t = r.get("tests", {}).get(test)
                if t and not t.get("error"):
                    v = _get(t, path)
                    if v is not None:
                        pairs.append((v, bool(t.get("disturbed"))))
            if not pairs:
                continue
            clean = [v for v, d in pairs if not d]
            vals, basis = (clean, "clean") if len(clean) >= 2 or len(clean) == len(pairs) else \
                ([v for v, _ in pairs], "all")
            s["metrics"][f"{test}.{path}"] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                                              "n": len(vals), "basis": basis, "values": [v for v, _ in pairs]}
        tests = [t for r in rs for t in r.get("tests", {}).values()]
        loads = [float(t["loadavg_before"].split()[0]) for t in tests if t.get("loadavg_before")]
        neighbours = [t["neighbour_cores"] for t in tests if "neighbour_cores" in t]
        s["load1_range"] = [min(loads), max(loads)] if loads else None
        s["neighbour_cores_range"] = [min(neighbours), max(neighbours)] if neighbours else None
        s["tests"] = len(tests)
        s["tests_disturbed"] = sum(1 for t in tests if t.get("disturbed"))
        s["reps_ok"] = sum(1 for r in rs if not r.get("error"))
        s["errors"] = [f"rep {r['rep']}: {r['error']}" for r in rs if r.get("error")]
        s["errors"] += [f"rep {r['rep']} {name}: {t['error']}" for r in rs
                        for name, t in r.get("tests", {}).items() if t.get("error")]
        dp_err = [t["dataplane_error"] for t in tests if t.get("dataplane_error")]
        if dp_err:
            asked = sum(1 for t in tests if "dataplane" in t)
            s["dataplane_command_error"] = f"failed around {len(dp_err)} of {asked} tests, e.g. {dp_err[0]}"
        # per-node worker shares of the flows test, from each rep
        s["worker_shares"] = [r["tests"]["flows"].get("worker_shares") for r in rs
                              if "flows" in r.get("tests", {}) and r["tests"]["flows"].get("worker_shares")]
        out[cfg] = s
    return out


def _median(summary: dict, cfg: str, key: str):
    m = summary.get(cfg, {}).get("metrics", {}).get(key)
    return m["median"] if m else None


def ratios(summary: dict, configs: list[str], n_workers: int) -> list[dict]:
    """Ratios of medians from this run. Each entry: what, numerator and denominator
    config, metric, their medians and the ratio (None when either side is missing)."""
    out: list[dict] = []

    def add(group, what, num, den, key, invert_hint=""):
        if num not in configs or den not in configs:
            return
        a, b = _median(summary, num, key), _median(summary, den, key)
        out.append({"group": group, "what": what, "num": num, "den": den, "metric": key, "num_value": a,
                    "den_value": b, "ratio": (a / b) if a is not None and b else None, "note": invert_hint})

    ours = [c for c in configs if c.startswith("batmand-")]
    for c in ours:
        for peer in ("tinc-switch", "fastd-null"):
            add("vs peers", f"{c} TCP1 Gbit/s / {peer}", c, peer, "tcp1.gbps", "higher is better")
            add("vs peers", f"{c} TCP8 Gbit/s / {peer}", c, peer, "tcp8.gbps", "higher is better")
            add("vs peers", f"{c} TCP1 daemon CPU-s/GB / {peer}", c, peer, "tcp1.daemon_cpu_s_per_gb",
                "lower is better")
            add("vs peers", f"{c} TCP1 machine CPU-s/GB / {peer}", c, peer, "tcp1.machine_cpu_s_per_gb",
                "lower is better")
            add("vs peers", f"{c} UDP 64 B pkt/s / {peer}", c, peer, "udp64.rx_pps", "higher is better")
            add("vs peers", f"{c} ping p50 / {peer}", c, peer, "ping.p50_ms", "lower is better")
            add("vs peers", f"{c} ping p99 / {peer}", c, peer, "ping.p99_ms", "lower is better")
    for w in ("w0", "w1", "wN"):
        on, off = f"batmand-{w}", f"batmand-{w}-nooffload"
        add("offloads on / off", f"{w}: TCP1 Gbit/s, offloads on / off", on, off, "tcp1.gbps", "higher = offloads help")
        add("offloads on / off", f"{w}: TCP8 Gbit/s, offloads on / off", on, off, "tcp8.gbps", "higher = offloads help")
        add("offloads on / off", f"{w}: TCP1 daemon CPU-s/GB, offloads on / off", on, off,
            "tcp1.daemon_cpu_s_per_gb", "lower = offloads help")
    # GRO alone (TSO and checksum offload stay on): what coalescing brings at the receiver
    add("GRO on / off", "w0: TCP1 Gbit/s, gro on / off", "batmand-w0", "batmand-w0-nogro", "tcp1.gbps",
        "higher = GRO helps")
    add("GRO on / off", "w0: TCP1 daemon CPU-s/GB, gro on / off", "batmand-w0", "batmand-w0-nogro",
        "tcp1.daemon_cpu_s_per_gb", "lower = GRO helps")
    for switch in ("tso", "csum"):
        add(f"{switch} on / off", f"w0: TCP1 Gbit/s, {switch} on / off", "batmand-w0", f"batmand-w0-no{switch}",
            "tcp1.gbps", "higher = it helps")
        add(f"{switch} on / off", f"w0: TCP1 daemon CPU-s/GB, {switch} on / off", "batmand-w0", f"batmand-w0-no{switch}",
            "tcp1.daemon_cpu_s_per_gb", "lower = it helps")
    for base in ("batmand", "batmand-wN-nooffload", "line3-batmand"):
        if base == "batmand-wN-nooffload":
            wn, w0 = base, "batmand-w0-nooffload"
        else:
            wn, w0 = f"{base}-wN", f"{base}-w0"
        add(f"workers N={n_workers} / workers 0", f"{wn} / {w0}: TCP1 daemon CPU-s/GB", wn, w0,
            "tcp1.daemon_cpu_s_per_gb", "below 1 = workers cost less per byte")
        add(f"workers N={n_workers} / workers 0", f"{wn} / {w0}: TCP8 daemon CPU-s/GB", wn, w0,
            "tcp8.daemon_cpu_s_per_gb", "below 1 = workers cost less per byte")
        add(f"workers N={n_workers} / workers 0", f"{wn} / {w0}: TCP8 Gbit/s", wn, w0, "tcp8.gbps",
            "higher is better")
    # the kernel fast path (kernel_forward) against every frame through the daemon
    for on, off in (("batmand-w0", "batmand-w0-userspace"), ("batmand-wN", "batmand-wN-userspace"),
                    ("line3-batmand-w0", "line3-batmand-w0-userspace")):
        for key, what, hint in (("tcp1.gbps", "TCP1 Gbit/s", "higher = the kernel path helps"),
                                ("tcp1.machine_cpu_s_per_gb", "TCP1 machine CPU-s/GB", "lower = it helps"),
                                ("udp64.rx_pps", "UDP 64 B pkt/s", "higher = it helps"),
                                ("ping.p50_ms", "ping p50", "lower = it helps")):
            add("kernel path on / off", f"{on}: {what}, kernel_forward on / off", on, off, key, hint)
    for c in ("line3-batmand-w0", "line3-batmand-wN"):
        add("line A-M-B", f"{c} TCP1 Gbit/s / line3-kernel", c, "line3-kernel", "tcp1.gbps", "higher is better")
    # what the middle node costs: the line against the same thing on two nodes
    for line, two in (("line3-batmand-w0", "batmand-w0"), ("line3-batmand-wN", "batmand-wN"),
                      ("line3-kernel", "veth-direct"), ("line3-kernel-segmented", "veth-direct-segmented")):
        add("line A-M-B / two nodes", f"TCP1 Gbit/s, {line} / {two}", line, two, "tcp1.gbps",
            "1 = the middle node costs nothing")
    for c in configs:
        s = summary.get(c, {}).get("metrics", {})
        for test, flows, k in (("tcp8", 8, "rx"), ("flows", 32, "rx"), ("flows", 32, "tx")):
            lo, hi = s.get(f"{test}.{k}_share_min"), s.get(f"{test}.{k}_share_max")
            if lo or hi:
                out.append({"group": f"worker share, {flows} flows",
                            "what": f"{c}: {k}_frames per worker / mean, min..max",
                            "num": c, "den": None, "metric": f"{test}.{k}_share",
                            "num_value": lo["median"] if lo else None, "den_value": hi["median"] if hi else None,
                            "ratio": None, "note": "1.00..1.00 = perfectly even"})
    return out


# ------------------------------------------------------------------ markdown
def fmt(v, key: str = "") -> str:
    if v is None:
        return "-"
    if "pps" in key:
        return f"{v / 1000:.0f}k"
    if "gbps" in key:
        return f"{v:.2f}"
    if "drops" in key or "retransmits" in key:
        return f"{v:.0f}"
    if "share" in key:
        return f"{v:.2f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def cell(summary: dict, cfg: str, key: str) -> str:
    m = summary.get(cfg, {}).get("metrics", {}).get(key)
    if not m:
        return "-"
    mark = "*" if m["basis"] == "all" and len(m["values"]) > 1 else ""
    if m["n"] > 1:
        return f"{fmt(m['median'], key)} ({fmt(m['min'], key)}-{fmt(m['max'], key)}){mark}"
    return fmt(m["median"], key) + mark


def _table(lines: list[str], summary: dict, configs: list[str], cols: list[tuple[str, str]]) -> None:
    rows = [c for c in configs if any(summary[c]["metrics"].get(k) for k, _ in cols)]
    if not rows:
        lines.append("(no data)\n")
        return
    lines.append("| config | " + " | ".join(label for _, label in cols) + " |")
    lines.append("|---|" + "---|" * len(cols))
    for c in rows:
        lines.append(f"| {c} | " + " | ".join(cell(summary, c, k) for k, _ in cols) + " |")
    lines.append("")


def write_markdown(path: str, doc: dict) -> None:
    meta, summary, configs = doc["meta"], doc["summary"], list(doc["summary"])
    args, v = meta["args"], meta["versions"]
    L = ["# Data-plane benchmark\n"]
    L.append(f"Run {meta['started']} to {meta['finished']} ({meta['duration_s']:.0f} s), {args['reps']} rep(s) per "
             f"config, order rotated each rep; TCP tests {args['tcp_time']} s, UDP {args['udp_time']} s, ping "
             f"{args['ping_count']} x 10 ms and {args.get('ping1k_count', 0)} x 1 ms, {args['flows']} flows for "
             f"the worker share. Host: {meta['kernel']}, "
             f"{meta['cpus']} CPUs ({meta['cpu_model']}); N = {meta['workers_n']} workers; {v.get('iperf3')}, "
             f"{v.get('tincd')}, {v.get('fastd')}; Python {v.get('python')}; batmand at {v.get('batmand_commit')}"
             f"{' (with uncommitted changes under batmand/)' if v.get('batmand_tree_dirty') else ''}."
             + (" **Interrupted.**" if meta.get("interrupted") else "") + "\n")
    L.append("Cells: median (min-max) over the reps; `*` = other programs disturbed some of the values and "
             "fewer than two undisturbed ones were left, so all count. GB = 1e9 bytes iperf3 received. "
             "Daemon CPU = utime+stime of every daemon's process tree (the daemon and its worker children) "
             "at both ends, plus M on the line; machine CPU = all busy CPU in /proc/stat (iperf3 and the "
             "kernel included). Drops are counts during the test, summed over the nodes: veth = rx+tx "
             "dropped on the veths; TAP queue = the TAP's tx_dropped (frames the kernel could not queue "
             "to the daemon); socket = the daemons' receive sockets (batmand: `batmanctl dataplane`; tinc/"
             "fastd: UDP RcvbufErrors; naive: PACKET_STATISTICS); daemon = dropped inside batmand.\n")
    L.append("## Throughput and latency\n")
    _table(L, summary, configs, [("tcp1.gbps", "TCP1 Gbit/s"), ("tcp8.gbps", "TCP8 Gbit/s"),
                                 ("udp64.rx_pps", "UDP 64 B rx pkt/s"), ("udp64.tx_pps", "offered pkt/s"),
                                 ("udp64.loss_pct", "iperf3 loss %"), ("ping.p50_ms", "ping p50 ms"),
                                 ("ping.p99_ms", "ping p99 ms"), ("ping1k.p50_ms", "ping 1 ms p50"),
                                 ("ping1k.p99_ms", "ping 1 ms p99")])
    L.append("## CPU\n")
    _table(L, summary, configs, [("tcp1.daemon_cpu_s_per_gb", "TCP1 daemon CPU-s/GB"),
                                 ("tcp8.daemon_cpu_s_per_gb", "TCP8 daemon CPU-s/GB"),
                                 ("udp64.daemon_cpu_us_per_pkt", "UDP daemon CPU-us/pkt"),
                                 ("tcp1.daemon_cores", "TCP1 daemon cores"),
                                 ("tcp1.machine_cpu_s_per_gb", "TCP1 machine CPU-s/GB"),
                                 ("tcp8.machine_cpu_s_per_gb", "TCP8 machine CPU-s/GB")])
    L.append("## Drops\n")
    _table(L, summary, configs, [("tcp8.drops.veth", "TCP8 veth"), ("tcp8.drops.tap_queue", "TCP8 TAP queue"),
                                 ("tcp8.drops.socket", "TCP8 socket"), ("tcp8.drops.daemon", "TCP8 daemon"),
                                 ("tcp8.retransmits", "TCP8 retransmits"), ("udp64.drops.veth", "UDP veth"),
                                 ("udp64.drops.tap_queue", "UDP TAP queue"), ("udp64.drops.socket", "UDP socket"),
                                 ("udp64.drops.daemon", "UDP daemon"), ("udp64.drops.daemon_tap", "UDP TAP (daemon's count)"),
                                 ("udp64.drops.iperf_udp_lost", "UDP iperf3 lost")])
    L.append(f"## Workers with {args['flows']} flows (iperf3 -P {args['flows']})\n")
    L.append("Share = a worker's frames during the test / the mean over that daemon's workers.\n")
    rows = [c for c in configs if summary[c]["metrics"].get("flows.gbps") or summary[c]["worker_shares"]
            or any(r["config"] == c and "flows" in r.get("tests", {}) for r in doc["runs"])]
    if rows:
        L.append("| config | Gbit/s | rx share min / max | tx share min / max | per node, each rep (rx shares; tx shares; restarts) |")
        L.append("|---|---|---|---|---|")
        for c in rows:
            per = []
            for rep in summary[c]["worker_shares"]:
                per.append(", ".join(f"{node}: {e.get('rx_share')}; {e.get('tx_share')}; {e.get('restarts')}"
                                     for node, e in rep.items()))
            L.append(f"| {c} | {cell(summary, c, 'flows.gbps')} | {cell(summary, c, 'flows.rx_share_min')} / "
                     f"{cell(summary, c, 'flows.rx_share_max')} | {cell(summary, c, 'flows.tx_share_min')} / "
                     f"{cell(summary, c, 'flows.tx_share_max')} | {' / '.join(per) or 'no per-worker counters'} |")
        L.append("")
    else:
        L.append("(not run)\n")
    L.append("## Ratios (medians of this run)\n")
    rat = doc.get("ratios") or []
    peers_ = [r for r in rat if r["group"] == "vs peers"]
    if peers_:
        # one row per batmand config, one column per (metric, peer)
        cols = []
        for r in peers_:
            col = (r["metric"], r["den"])
            if col not in cols:
                cols.append(col)
        label = {"tcp1.gbps": "TCP1", "tcp8.gbps": "TCP8", "tcp1.daemon_cpu_s_per_gb": "CPU-s/GB (TCP1)",
                 "tcp1.machine_cpu_s_per_gb": "machine CPU-s/GB (TCP1)", "udp64.rx_pps": "UDP 64 B pkt/s",
                 "ping.p50_ms": "ping p50", "ping.p99_ms": "ping p99"}
        short = {"tinc-switch": "tinc", "fastd-null": "fastd"}
        L.append("batmand against tinc and fastd: batmand's median / theirs (throughput and packets/s: higher "
                 "is better; CPU-s/GB and ping: lower is better).\n")
        L.append("| config | " + " | ".join(f"{label.get(m, m)} / {short.get(p, p)}" for m, p in cols) + " |")
        L.append("|---|" + "---|" * len(cols))
        for c in dict.fromkeys(r["num"] for r in peers_):
            vals = {(r["metric"], r["den"]): r["ratio"] for r in peers_ if r["num"] == c}
            L.append(f"| {c} | " + " | ".join("-" if vals.get(col) is None else f"{vals[col]:.2f}" for col in cols)
                     + " |")
        L.append("")
        rat = [r for r in rat if r["group"] != "vs peers"]
    if rat:
        L.append("| group | ratio | value | numerator | denominator | reading |")
        L.append("|---|---|---|---|---|---|")
        for r in rat:
            key = r["metric"]
            if r["ratio"] is None and r["den"] is None:  # min..max pair (worker share)
                L.append(f"| {r['group']} | {r['what']} | {fmt(r['num_value'], 'share')}..{fmt(r['den_value'], 'share')} "
                         f"| | | {r['note']} |")
            else:
                value = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
                L.append(f"| {r['group']} | {r['what']} | {value} | "
                         f"{fmt(r['num_value'], key)} | {fmt(r['den_value'], key)} | {r['note']} |")
        L.append("")
    elif not peers_:
        L.append("(the configs needed for the ratios were not in this run)\n")
    L.append("## Load, errors\n")
    L.append(f"loadavg at start `{meta['loadavg_start']}`, at end `{meta['loadavg_end']}`. Before each test the "
             f"bench waits up to {args['max_quiet_wait']:g} s for other programs to use < 0.1 cores; a test during "
             "which they used more on average counts as disturbed.\n")
    L.append("| config | reps ok | loadavg 1 min | other programs, cores | disturbed / tests | errors |")
    L.append("|---|---|---|---|---|---|")
    for c in configs:
        s = summary[c]
        la = "-" if not s["load1_range"] else f"{s['load1_range'][0]:.2f}-{s['load1_range'][1]:.2f}"
        nb = "-" if not s["neighbour_cores_range"] else \
            f"{s['neighbour_cores_range'][0]:.2f}-{s['neighbour_cores_range'][1]:.2f}"
        errs = "; ".join(e.replace("|", "/").replace("\n", " ")[:300] for e in s["errors"][:3]) or "-"
        if s.get("dataplane_command_error"):
            errs += f" (batmanctl dataplane: {s['dataplane_command_error'].replace('|', '/')[:160]})"
        L.append(f"| {c} | {s['reps_ok']} | {la} | {nb} | {s['tests_disturbed']}/{s['tests']} | {errs} |")
    L.append("")
    L.append("## Set-up\n")
    L.append("| config | what | veth MTU | overlay MTU | offloads of the overlay device in A (gro, tso, tx-csum) | verified |")
    L.append("|---|---|---|---|---|---|")
    for c in configs:
        ci = doc["configs"].get(c, {})
        eth = (ci.get("ethtool") or {})
        dev = next((v for k, v in eth.items() if k.startswith("A:") and not k.startswith("A:v")), None) or {}
        offl = ", ".join(dev.get(k, "?") for k in ("generic-receive-offload", "tcp-segmentation-offload",
                                                   "tx-checksumming")) if dev else "-"
        L.append(f"| {c} | {ci.get('about', '')} | {ci.get('underlay_mtu', '-')} | {ci.get('overlay_mtu') or '-'} | "
                 f"{offl} | {str(ci.get('verify') or '-').replace('|', '/')[:160]} |")
    L.append("")
    L.append("Tests, from namespace A to B: `ping -n -c 100 -i 0.01 -W 1 B`, `ping -n -c 1000 -i 0.001 -W 1 B`, "
             "`iperf3 -c B -t T -J [-P 8 | -P 32 | "
             "-u -l 64 -b 0]` against a one-off `iperf3 -s -1 -B B` in B. The set-up commands of each config "
             "(first rep) are in results.json under configs.<name>.setup_commands.\n")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


# ------------------------------------------------------------------ chart
def write_chart(path: str, doc: dict) -> bool:
    """Bars: TCP1 / TCP8 Gbit/s per config (log scale), and CPU-s per GB for TCP1/TCP8
    (daemon CPU for userspace forwarders, machine CPU for the kernel references)."""
    global CHART_ERROR
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        CHART_ERROR = f"matplotlib missing ({exc}); scripts/bench-setup.sh installs it"
        return False
    summary = doc["summary"]
    configs = list(summary)
    kinds = {c: doc["configs"].get(c, {}).get("kind") for c in configs}
    med = lambda c, k: _median(summary, c, k)  # noqa: E731
    x = list(range(len(configs)))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(configs) + 3), 9), sharex=True)
    w = 0.38
    for off, key, label, color in ((-w / 2, "tcp1.gbps", "TCP 1 stream", "#4C72B0"),
                                   (w / 2, "tcp8.gbps", "TCP -P 8", "#55A868")):
        vals = [med(c, key) for c in configs]
        bars = ax1.bar([i + off for i in x], [v or 0 for v in vals], w, label=label, color=color)
        for b, v in zip(bars, vals):
            ax1.annotate("n/a" if v is None else f"{v:.2f}", (b.get_x() + b.get_width() / 2, v or 0.01),
                         ha="center", va="bottom", fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
    tops = [v for c in configs for v in (med(c, "tcp1.gbps"), med(c, "tcp8.gbps")) if v]
    if tops:
        ax1.set_yscale("log")
        ax1.set_ylim(0.01, max(tops) * 6)  # room for the value labels
    ax1.set_ylabel("Gbit/s (log)")
    ax1.set_title(f"Data plane, A to B (median of {doc['meta']['args']['reps']} rep(s); {doc['meta']['stamp']})")
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3, which="both")
    for off, test, color in ((-w / 2, "tcp1", "#C44E52"), (w / 2, "tcp8", "#DD8452")):
        vals, hatches = [], []
        for c in configs:
            if kinds.get(c) == "kernel":
                vals.append(med(c, f"{test}.machine_cpu_s_per_gb"))
                hatches.append("//")
            else:
                vals.append(med(c, f"{test}.daemon_cpu_s_per_gb"))
                hatches.append("")
        bars = ax2.bar([i + off for i in x], [v or 0 for v in vals], w, color=color,
                       label=f"{test.upper()} CPU-s/GB")
        for b, v, hatch in zip(bars, vals, hatches):
            b.set_hatch(hatch)
            ax2.annotate("n/a" if v is None else f"{v:.2f}", (b.get_x() + b.get_width() / 2, v or 0),
                         ha="center", va="bottom", fontsize=7, rotation=90, xytext=(0, 2), textcoords="offset points")
    tops2 = [b.get_height() for b in ax2.patches]
    ax2.set_ylim(0, max(tops2 + [1.0]) * 1.2)
    ax2.set_ylabel("CPU-seconds per GB received")
    ax2.set_title("CPU per GB: daemons of all nodes (hatched: kernel references, whole machine)", fontsize=10)
    from matplotlib.patches import Patch
    ax2.legend(handles=[Patch(facecolor="#C44E52", label="TCP 1 stream"), Patch(facecolor="#DD8452", label="TCP -P 8"),
                        Patch(facecolor="white", edgecolor="black", hatch="//", label="machine CPU (kernel configs)")],
               fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    ax2.set_xticks(x)
    ax2.set_xticklabels(configs, rotation=35, ha="right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
