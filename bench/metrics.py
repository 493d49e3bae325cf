#!/usr/bin/env python3
"""What a Prometheus scrape costs batmand (metrics_listen): iperf3 throughput and the
daemons' CPU with and without /metrics scraped every 0.1 s, side by side in one run.

Per data-plane mode (--workers, default 0 and N = one per CPU) one two-node lab A - B is
built as bench/dataplane.py builds it (bench/peers.py), both daemons with metrics_listen
on 127.0.0.1:9140 in their namespaces. Then, --reps times and alternating which goes first,
iperf3 TCP from A to B (--tcp-time s) runs once idle and once while a scraper in each
namespace GETs /metrics every --interval s over one keep-alive connection (the scrapers are
separate processes: their own CPU is not the daemons'). Measured around each run as
bench/dataplane.py does (dataplane.measured): the daemons' process trees' CPU, the machine's,
the drops. The ratios are scraped / idle, of the medians.

Writes bench/results/metrics-<stamp>/{results.json,logs/} and prints the JSON document on
stdout (progress on stderr). Run as root: .venv/bin/python bench/metrics.py [--quick]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dataplane  # noqa: E402
import harness as h  # noqa: E402
import peers  # noqa: E402

LISTEN = ("127.0.0.1", 9140)
N_WORKERS = os.cpu_count() or 1

# runs in a node's namespace: GET /metrics every INTERVAL s until SIGTERM, then one JSON line
SCRAPER = r"""
import http.client, json, signal, sys, time
host, port, interval = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
conn = http.client.HTTPConnection(host, port, timeout=5)
took, failures, size, errors = [], 0, 0, []
next_at = time.monotonic()
while not stop:
    t0 = time.monotonic()
    try:
        conn.request("GET", "/metrics")
        reply = conn.getresponse()
        body = reply.read()
        if reply.status != 200:
            raise OSError(f"HTTP {reply.status}")
        took.append(time.monotonic() - t0)
        size = len(body)
    except (OSError, http.client.HTTPException) as exc:
        failures += 1
        errors = (errors + [str(exc)])[-3:]
        conn.close()
        conn = http.client.HTTPConnection(host, port, timeout=5)
    next_at += interval
    time.sleep(max(0.0, next_at - time.monotonic()))
took.sort()
pick = lambda p: round(took[min(len(took) - 1, int(len(took) * p))] * 1000, 2) if took else None
print(json.dumps({"scrapes": len(took), "failures": failures, "errors": errors, "bytes": size,
                  "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)}), flush=True)
"""


def start_scrapers(net: peers.Net, ctx: peers.Ctx, interval: float) -> dict:
    return {node: h.spawn(h.in_ns(ns, [ctx.python, "-c", SCRAPER, LISTEN[0], str(LISTEN[1]), str(interval)]),
                          ctx.logfile(f"scraper-{node}"), record=False) for node, ns in net.ns.items()}


def stop_scrapers(scrapers: dict) -> dict:
    out = {}
    for node, p in scrapers.items():
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except Exception:  # noqa: BLE001 - recorded as missing
            pass
        h.stop(p, grace=1.0)
        with open(p.logfile) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("{")]
        out[node] = json.loads(lines[-1]) if lines else {"error": h.tail(p.logfile, 5)}
    return out


def one_scrape(net: peers.Net) -> dict:
    """A's /metrics once, from inside its namespace, checked with prometheus_client's parser."""
    script = ("import urllib.request, sys; from prometheus_client.parser import text_string_to_metric_families as p; "
              f"t = urllib.request.urlopen('http://{LISTEN[0]}:{LISTEN[1]}/metrics', timeout=5).read().decode(); "
              "fs = list(p(t)); print(len(fs), sum(len(f.samples) for f in fs), len(t))")
    r = h.run(h.in_ns(net.ns["A"], [peers.python_for_naive(), "-c", script]), check=False, record=False)
    try:
        families, samples, size = map(int, r.stdout.split())
        return {"families": families, "samples": samples, "bytes": size}
    except ValueError:
        return {"error": (r.stderr or r.stdout).strip()[-300:]}


def run_mode(workers: int, args, ctx: peers.Ctx) -> dict:
    spec = peers.Spec(f"batmand-w{workers}", "pair", "batmand", "batmand", workers=workers,
                      settings=(f"metrics_listen={LISTEN[0]}:{LISTEN[1]}",),
                      about=f"batmand --workers {workers}, metrics_listen on both nodes")
    ctx.tag = spec.name
    out: dict = {"about": spec.about, "runs": []}
    net = None
    try:
        net = peers.build_batmand(ctx, spec)
        out["metrics_page"] = one_scrape(net)
        h.run(h.in_ns(net.ns["A"], ["ping", "-n", "-q", "-c", "20", "-i", "0.01", net.target]), check=False,
              record=False)
        for rep in range(args.reps):
            order = ("idle", "scraped") if rep % 2 == 0 else ("scraped", "idle")
            for phase in order:
                waited, rate = h.quiet_wait(args.max_quiet_wait)
                h.log(f"  {spec.name} rep {rep}: {phase} (other programs {rate:.2f} cores)")
                ctx.tag = f"{spec.name}-r{rep}-{phase}"
                scraped: dict = {}

                def test():
                    procs = start_scrapers(net, ctx, args.interval) if phase == "scraped" else {}
                    if procs:
                        time.sleep(0.3)  # connected and scraping before the traffic starts
                    try:
                        return dataplane.t_tcp(net, args, 1, args.tcp_time)
                    finally:
                        scraped.update(stop_scrapers(procs))

                res = dataplane.measured("tcp1", net, test)
                res.update(phase=phase, rep=rep, quiet_wait_s=waited, neighbour_cores_before=rate)
                if scraped:
                    res["scrapers"] = scraped
                out["runs"].append(res)
                if res.get("error"):
                    h.log(f"  {spec.name} rep {rep} {phase}: ERROR {res['error']}")
                gone = {n: p.returncode for n, p in net.daemons.items() if p.poll() is not None}
                if gone:
                    raise RuntimeError(f"daemon(s) exited: {gone}")
    except Exception as exc:  # recorded; the next mode still runs
        out["error"] = f"{type(exc).__name__}: {exc}"
        h.log(f"  {spec.name}: ERROR {out['error']}")
    finally:
        if net is not None:
            for p in net.daemons.values():
                h.stop(p)
        for ns in list(h.Owned.namespaces):
            h.del_ns(ns)
    out["summary"] = summarize(out["runs"])
    return out


def _median(runs: list[dict], key) -> float | None:
    vals = [key(r) for r in runs]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if not r.get("error")]
    phases = {}
    for phase in ("idle", "scraped"):
        rs = [r for r in ok if r["phase"] == phase]
        phases[phase] = {
            "runs": len(rs),
            "gbps": _median(rs, lambda r: r.get("gbps")),
            "daemon_cpu_s_per_gb": _median(rs, lambda r: r.get("daemon_cpu_s_per_gb")),
            "daemon_cores": _median(rs, lambda r: r.get("daemon_cores")),
            "daemon_cores_A": _median(rs, lambda r: (r.get("daemon_cpu_s") or {}).get("A", 0) / r["wall_s"]),
            "daemon_cores_B": _median(rs, lambda r: (r.get("daemon_cpu_s") or {}).get("B", 0) / r["wall_s"]),
            "machine_cores": _median(rs, lambda r: r["machine_busy_cpu_s"] / r["wall_s"]),
            "retransmits": _median(rs, lambda r: r.get("retransmits")),
            "disturbed_runs": sum(1 for r in rs if r.get("disturbed")),
        }
    scr = [s for r in ok if r["phase"] == "scraped" for s in (r.get("scrapers") or {}).values()]
    phases["scrapes"] = {
        "per_run_per_node": _median([{"v": s.get("scrapes")} for s in scr], lambda d: d["v"]),
        "failures": sum(s.get("failures", 0) for s in scr),
        "p50_ms": _median([{"v": s.get("p50_ms")} for s in scr], lambda d: d["v"]),
        "p99_ms": max((s["p99_ms"] for s in scr if s.get("p99_ms") is not None), default=None),
        "bytes": max((s.get("bytes", 0) for s in scr), default=None),
    }
    idle, scraped = phases["idle"], phases["scraped"]

    def ratio(key):
        a, b = idle.get(key), scraped.get(key)
        return round(b / a, 3) if a and b is not None else None

    phases["ratios_scraped_over_idle"] = {k: ratio(k) for k in ("gbps", "daemon_cpu_s_per_gb", "daemon_cores",
                                                                 "daemon_cores_A", "daemon_cores_B", "machine_cores")}
    return phases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default=f"0,{N_WORKERS}", help="data-plane modes, comma list (default 0,N)")
    ap.add_argument("--reps", type=int, default=3, help="idle/scraped pairs per mode (default 3; --quick 1)")
    ap.add_argument("--tcp-time", type=int, default=8, help="seconds per iperf3 run (default 8; --quick 3)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between two scrapes (default 0.1)")
    ap.add_argument("--max-quiet-wait", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(peers.ROOT, "bench", "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.tcp_time, args.max_quiet_wait = 1, 3, 3.0
    if os.geteuid() != 0:
        print("metrics.py: run as root (namespaces, AF_PACKET, TAP)", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(args.out, f"metrics-{stamp}")
    logdir = os.path.join(outdir, "logs")
    os.makedirs(logdir, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="metrics-bench.")
    ctx = peers.Ctx(workdir, logdir, peers.python_for_naive())
    dataplane.CTX = ctx  # its iperf3() logs there
    h.remove_stale()

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "kernel": platform.release(), "cpus": os.cpu_count(),
            "versions": dataplane.versions(), "args": vars(args), "out_dir": outdir,
            "loadavg_start": h.loadavg()}
    modes: dict = {}
    try:
        for w in [int(x) for x in args.workers.split(",") if x.strip()]:
            h.log(f"batmand --workers {w}")
            modes[f"batmand-w{w}"] = run_mode(w, args, ctx)
    except KeyboardInterrupt as exc:
        h.log(f"interrupted ({exc or 'Ctrl-C'}); cleaning up")
        meta["interrupted"] = True
    finally:
        h.teardown()
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    meta["loadavg_end"] = h.loadavg()
    doc = {"meta": meta, "summary": {m: d["summary"] for m, d in modes.items()}, "modes": modes}
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(doc, f, indent=1, default=str)
    h.log(f"wrote {outdir}/results.json")
    json.dump(doc, sys.stdout, indent=1, default=str)
    print()
    return 130 if meta.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
