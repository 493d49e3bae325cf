"""Control-plane benchmark (issue 19): what one batmand node pays for the OGMs of a large
B.A.T.M.A.N. IV mesh.

Per cell (M originators behind N neighbours) it builds two namespaces joined by a veth
pair: the daemon under test (`batmand -m bat0 -i eth0`) and bench/ogm_load.py, which plays
the N neighbours and sends N x M + N OGMs per second (kernel-like aggregation, TT containers
with matching CRCs, echoes of the daemon's OGMs, answers to its TT requests). After a
warm-up it measures, over a window: the daemon's CPU per received OGM (the run time of its
process tree's threads from /proc/PID/task/TID/schedstat, in ns; utime+stime, in 10 ms
ticks, beside it as `us_per_ogm_ticks`), its cores and RSS, the generator's achieved OGM rate (a cell below 95% of its
target is refused, with the reason), whether the daemon kept up (socket drops, `batmanctl
s`), and what it learnt (`batmanctl oj`/`tgj`: originators with a route, global TT
entries). Prints one JSON document on stdout; progress goes to stderr. Run as root from a
checkout (the daemon runs from the tree given by --code, by default this one):

    .venv/bin/python bench/control_plane.py --cells 1000x3 --warmup 10 --measure 15
    .venv/bin/python bench/control_plane.py                   # the issue's grid, 250..2000 x 3..12
    .venv/bin/python bench/control_plane.py --cells 1000x3 --profile /tmp/cp.txt
    .venv/bin/python bench/control_plane.py --cells 1000x3 --reps 3 \\
        --code before=/path/to/old/checkout,after=.                 # ratios after/before

--code runs the same cells against several source trees (the daemon starts with
PYTHONPATH=<tree>), interleaved cell by cell in alternating order, and adds the ratios of
the last tree to the first (medians over --reps). --profile records the daemon's control
process with py-spy (raw format) during the measure window and adds its top self-time
functions (a profiled run's CPU includes the sampling's cost; py-spy comes with
scripts/bench-setup.sh). --workers N starts the daemon with N data-plane workers, --tvlvs
kernel adds the MCAST and DAT containers of a current kernel to every OGM.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median as statistics_median

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import harness as h  # noqa: E402
from profile import hot_functions  # noqa: E402  (bench/profile.py)

VENV_BIN = Path(sys.executable).parent
PY_SPY = VENV_BIN / "py-spy"
PREFIX = f"cpb{os.getpid()}"
STALE_RE = re.compile(r"^cpb(\d+)c\d+[dg]$")
DEFAULT_CELLS = [f"{m}x{n}" for n in (3, 6, 12) for m in (250, 500, 1000, 2000)]
MIN_RATE = 0.95  # achieved / target below which a cell is refused
GEN_BUSY = 0.90  # generator cores above which it may be the bottleneck


def remove_stale() -> list[str]:
    """Namespaces of an earlier run of this bench whose process is gone (a SIGKILLed run)."""
    removed = []
    for line in h.run(["ip", "netns", "list"], check=False, record=False).stdout.splitlines():
        name = (line.split() or [""])[0]
        m = STALE_RE.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            h.del_ns(name)
            removed.append(name)
    return removed


def parse_cells(text: str) -> list[tuple[int, int]]:
    out = []
    for cell in text.split(","):
        m, _, n = cell.strip().partition("x")
        out.append((int(m), int(n)))
    return out


def parse_code(text: str | None) -> dict[str, Path]:
    if not text:
        return {"this": ROOT}
    out = {}
    for item in text.split(","):
        name, _, path = item.partition("=")
        out[name.strip()] = Path(path.strip()).resolve()
    return out


def commit_of(tree: Path) -> str:
    r = h.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=False, record=False)
    dirty = h.run(["git", "-C", str(tree), "status", "--porcelain", "--", "batmand"], check=False, record=False)
    return (r.stdout.strip() or "?") + ("-dirty" if dirty.stdout.strip() else "")


# ------------------------------------------------------------------ namespaces of one cell
def add_ns(name: str) -> str:
    ns = PREFIX + name
    h.run(["ip", "netns", "add", ns])
    h.Owned.namespaces.append(ns)
    h.run(["ip", "-n", ns, "link", "set", "lo", "up"])
    return ns


def build_link(dns: str, gns: str) -> None:
    """eth0 (daemon) -- gen0 (generator); gen0 is promiscuous: it answers for many MACs."""
    h.run(["ip", "-n", dns, "link", "add", "eth0", "mtu", "1560", "type", "veth",
           "peer", "name", "gen0", "mtu", "1560", "netns", gns])
    h.run(["ip", "-n", dns, "link", "set", "eth0", "up"])
    h.run(["ip", "-n", gns, "link", "set", "gen0", "promisc", "on", "up"])


def batmanctl(ns: str, tree: Path, *args: str) -> subprocess.CompletedProcess:
    return h.run(h.in_ns(ns, ["env", f"PYTHONPATH={tree}", str(VENV_BIN / "batmanctl"), *args]),
                 check=False, record=False, timeout=30)


def statistics(ns: str, tree: Path) -> dict[str, int]:
    """`batmanctl s` as numbers, with "at": the middle of the query (monotonic)."""
    t0 = time.monotonic()
    out = {}
    for line in batmanctl(ns, tree, "s").stdout.splitlines():
        k, sep, v = line.partition(":")
        if sep and v.strip().lstrip("-").isdigit():
            out[k.strip()] = int(v)
    out["at"] = (t0 + time.monotonic()) / 2
    return out


def learnt(ns: str, tree: Path) -> dict:
    """What the daemon knows after the run: originators (with a selected router) and TT."""
    out: dict = {}
    try:
        origs = json.loads(batmanctl(ns, tree, "oj").stdout or "[]")
        out["originators"] = len({o.get("orig_address") for o in origs})
        out["originators_routed"] = len({o.get("orig_address") for o in origs if o.get("best")})
    except json.JSONDecodeError:
        out["originators"] = None
    try:
        out["tt_global"] = len(json.loads(batmanctl(ns, tree, "tgj").stdout or "[]"))
    except json.JSONDecodeError:
        out["tt_global"] = None
    return out


# ------------------------------------------------------------------ process counters
def rss_mib(pids: list[int]) -> float:
    kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                kib += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return round(kib / 1024, 1)


def cpu_s(pid: int) -> float:
    """utime+stime of the process tree (10 ms ticks)."""
    return sum(c for _, c in h.tree_cpu(pid).values())


def run_time_s(pid: int) -> float:
    """The time the process tree's live threads have run (schedstat, ns): the same CPU time
    as utime+stime, without their 10 ms ticks (0.33 µs per OGM at 1000 x 3 in a 10 s
    window). A thread that exits within the window takes its time with it."""
    total = 0
    for p in h.tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9


def read_stats(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def wait_next_stats(path: Path, after: float, timeout: float = 3.0) -> dict:
    """The generator's counters as written at its next second boundary (so both ends of
    the window are at its own schedule's timestamps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = read_stats(path)
        if s.get("t", 0) > after:
            return s
        time.sleep(0.02)
    return read_stats(path)


def check_alive(procs: dict[str, subprocess.Popen]) -> None:
    for role, p in procs.items():
        if p.poll() is not None:
            raise RuntimeError(f"{role} exited with status {p.returncode}: {h.tail(p.logfile, 10)}")


# ------------------------------------------------------------------ one cell
def run_cell(m: int, n: int, code: str, tree: Path, args, workdir: Path, index: int) -> dict:
    cell = f"{m}x{n}"
    tag = f"c{index}"
    dns, gns = add_ns(tag + "d"), add_ns(tag + "g")
    try:
        build_link(dns, gns)
        stats_path = workdir / f"{tag}-{cell}-{code}.gen.json"
        gen = h.spawn(h.in_ns(gns, ["env", f"PYTHONPATH={ROOT}", sys.executable, str(BENCH / "ogm_load.py"),
                                    "--iface", "gen0", "--neighbours", str(n), "--originators", str(m),
                                    "--slots", str(args.slots), "--tvlvs", args.tvlvs, "--stats", str(stats_path)]),
                      str(workdir / f"{tag}-{cell}-{code}.gen.log"))
        daemon = h.spawn(h.in_ns(dns, ["env", f"PYTHONPATH={tree}", str(VENV_BIN / "batmand"), "-m", "bat0",
                                       "-i", "eth0", "--state-dir", "", "--workers", str(args.workers),
                                       *sum((["--set", kv] for kv in args.set), [])]),
                         str(workdir / f"{tag}-{cell}-{code}.batmand.log"))
        procs = {"generator": gen, "batmand": daemon}
        h.log(f"{cell} [{code}]: daemon pid {daemon.pid}, generator pid {gen.pid}; warm-up {args.warmup} s")
        end = time.monotonic() + args.warmup
        while time.monotonic() < end:
            check_alive(procs)
            time.sleep(0.5)

        # the window runs between two of the generator's second boundaries; the CPU is read
        # right at them, the batmanctl queries (which cost the daemon too) just outside
        s0, l0 = statistics(dns, tree), h.link_stats(dns)
        g0 = wait_next_stats(stats_path, time.monotonic())
        r0, c0, gc0, o0 = run_time_s(daemon.pid), cpu_s(daemon.pid), cpu_s(gen.pid), h.all_procs()
        sampler = None
        if args.profile:  # the control process only: workers carry no control plane
            raw = profile_path(args.profile, f"{cell}-{code}-{tag}", args)
            sampler = subprocess.Popen([str(PY_SPY), "record", "--nonblocking", "--format", "raw", "-r", "200",
                                        "-d", str(max(int(args.measure) - 1, 1)), "-o", str(raw),
                                        "-p", str(daemon.pid)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(max(args.measure - 1, 0.5))
        g1 = wait_next_stats(stats_path, g0.get("t", 0) + args.measure - 0.5)
        r1, c1, gc1, o1 = run_time_s(daemon.pid), cpu_s(daemon.pid), cpu_s(gen.pid), h.all_procs()
        s1, l1 = statistics(dns, tree), h.link_stats(dns)
        check_alive(procs)
        pids = h.tree(daemon.pid)
        result = measure(cell, code, m, n, g0, g1, r1 - r0, gc1 - gc0, s0, s1, l0, l1, ticks_cpu=c1 - c0)
        result["rss_mib"] = rss_mib(pids[:1])
        result["rss_mib_tree"] = rss_mib(pids)
        result["processes"] = len(pids)
        result["other_cores"] = round(h.neighbour_cpu(o0, o1)[0] / max(result["window_s"], 1e-9), 3)
        result.update(learnt(dns, tree))
        # every simulated node (M originators and the N neighbours) routed, its table in
        result["converged"] = all((result.get(k) or 0) >= m + n for k in ("originators_routed", "tt_global"))
        if sampler is not None:
            try:
                _, err = sampler.communicate(timeout=args.measure + 30)
            except subprocess.TimeoutExpired:
                sampler.kill()
                err = "py-spy did not finish"
            result["profile"] = (hot_functions(raw, args.top) if raw.exists() and raw.stat().st_size
                                 else {"error": (err or "no samples").strip()[-300:]})
            result["profile"]["file"] = str(raw)
        h.stop(gen)
        h.stop(daemon)
        return result
    finally:
        for p in list(h.Owned.procs.values()):
            h.stop(p)
        for ns in (dns, gns):
            h.del_ns(ns)


def profile_path(base: str, run: str, args) -> Path:
    """FILE itself for a single run, else one file per run beside it."""
    p = Path(base)
    if len(args.cell_list) == 1 and len(args.code_map) == 1 and args.reps == 1:
        return p
    return p.with_name(f"{p.stem}-{run}{p.suffix or '.txt'}")


def measure(cell: str, code: str, m: int, n: int, g0: dict, g1: dict, daemon_cpu: float, gen_cpu: float,
            s0: dict, s1: dict, l0: dict, l1: dict, ticks_cpu: float | None = None) -> dict:
    """`daemon_cpu`: its run time (schedstat); `ticks_cpu`: its utime+stime, as earlier
    versions of this bench reported it."""
    window = g1.get("t", 0) - g0.get("t", 0)
    sent = {k: g1.get(k, 0) - g0.get(k, 0) for k in ("ogms", "frames", "echoes", "send_errors", "late_slots",
                                                       "daemon_ogms", "tt_requests", "tt_responses")}
    target = n * m + n
    achieved = sent["ogms"] / window if window > 0 else 0.0
    received = sent["ogms"] + sent["echoes"]  # every OGM the daemon was sent, echoes too
    eth = h.delta(l1.get("eth0", {}), l0.get("eth0", {}))
    stats = h.delta(s1, s0)
    stats_window = stats.pop("at", 0)
    # what the daemon itself counted, over the time between its two queries: when it
    # falls behind (socket drops), the CPU per OGM it processed is the honest figure
    processed = stats.get("rx_iv_ogm", 0) / stats_window if stats_window > 0 else 0.0
    r = {
        "cell": cell, "code": code, "originators_target": m, "neighbours": n, "window_s": round(window, 2),
        "target_ogm_per_s": target, "achieved_ogm_per_s": round(achieved, 1),
        "achieved_ratio": round(achieved / target, 3) if target else None,
        "received_ogm_per_s": round(received / window, 1) if window > 0 else None,
        "frames_per_s": round(sent["frames"] / window, 1) if window > 0 else None,
        "daemon_cores": round(daemon_cpu / window, 4) if window > 0 else None,
        "us_per_ogm": round(1e6 * daemon_cpu / received, 2) if received else None,
        "cpu_clock": "schedstat",
        "us_per_ogm_ticks": round(1e6 * ticks_cpu / received, 2) if received and ticks_cpu is not None else None,
        "processed_ogm_per_s": round(processed, 1),
        "us_per_processed_ogm": round(1e6 * daemon_cpu / (processed * window), 2) if processed and window > 0 else None,
        "generator_cores": round(gen_cpu / window, 3) if window > 0 else None,
        "generator": {k: sent[k] for k in ("send_errors", "late_slots", "echoes", "daemon_ogms", "tt_requests",
                                            "tt_responses")} | {"max_lag_ms": g1.get("max_lag_ms")},
        "daemon_kept_up": {
            "eth0_rx_frames": eth.get("rx_packets"), "eth0_rx_dropped": eth.get("rx_dropped"),
            "socket_drops": stats.get("drop_socket_buffer"),
            "own_ogms_sent": sent["daemon_ogms"],
            "statistics": {k: v for k, v in stats.items() if v},
        },
    }
    r["daemon_kept_up"]["ok"] = bool(not stats.get("drop_socket_buffer") and not eth.get("rx_dropped")
                                     and sent["daemon_ogms"] >= window * 0.8
                                     and window > 0 and processed >= MIN_RATE * received / window)
    if r["achieved_ratio"] is None or r["achieved_ratio"] < MIN_RATE:
        why = (f"generator achieved {achieved:.0f} of {target} OGM/s ({100 * achieved / max(target, 1):.1f}%, "
               f"below {100 * MIN_RATE:.0f}%); generator {r['generator_cores']} cores, "
               f"{sent['late_slots']} late slots, {sent['send_errors']} send errors")
        if r["generator_cores"] and r["generator_cores"] > GEN_BUSY:
            why += ": the generator is the bottleneck on this machine"
        r["refused"] = why
        r["us_per_ogm"] = r["daemon_cores"] = r["us_per_processed_ogm"] = r["us_per_ogm_ticks"] = None
        h.log(f"{cell} [{code}] refused: {why}")
    elif r["generator_cores"] and r["generator_cores"] > GEN_BUSY:
        r["note"] = "generator near a full core: it may delay sends"
    return r


# ------------------------------------------------------------------ report
def ratios(results: list[dict], codes: list[str]) -> list[dict]:
    """Per cell, the last tree's figures over the first's (after/before), each the median
    of its repetitions; refused cells have no figures and give no ratio."""
    if len(codes) < 2:
        return []
    first, last = codes[0], codes[-1]
    out = []
    for cell in dict.fromkeys(r["cell"] for r in results):
        row = {"cell": cell, "ratio": f"{last}/{first}"}
        for k in ("us_per_ogm", "us_per_ogm_ticks", "daemon_cores", "rss_mib"):
            a, b = (median([r.get(k) for r in results if r["cell"] == cell and r["code"] == c]) for c in (first, last))
            row[k] = {first: a, last: b, "ratio": round(b / a, 3) if a and b is not None else None}
        out.append(row)
    return out


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics_median(values), 4) if values else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=",".join(DEFAULT_CELLS), help="MxN: M originators behind N neighbours")
    ap.add_argument("--warmup", type=float, default=20.0, help="seconds before measuring")
    ap.add_argument("--measure", type=float, default=20.0, help="seconds measured")
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the whole set (ratios: medians)")
    ap.add_argument("--workers", type=int, default=0, help="batmand --workers")
    ap.add_argument("--code", help="NAME=PATH,NAME=PATH: source trees to compare (daemon PYTHONPATH)")
    ap.add_argument("--profile", metavar="FILE", help="py-spy raw profile of the daemon in the measure window")
    ap.add_argument("--top", type=int, default=15, help="functions listed from the profile")
    ap.add_argument("--slots", type=int, default=25, help="generator send slots per second")
    ap.add_argument("--tvlvs", choices=("tt", "kernel"), default="tt",
                    help="containers per OGM: TT (the issue's load) or MCAST + DAT + TT as a current kernel")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a batmand setting")
    ap.add_argument("--workdir", help="logs and counters (default: a new directory under /tmp)")
    args = ap.parse_args()
    args.cell_list = parse_cells(args.cells)
    args.code_map = parse_code(args.code)
    if os.geteuid() != 0:
        print("control_plane.py needs root (network namespaces)", file=sys.stderr)
        return 2
    if args.profile and not PY_SPY.exists():
        print(f"{PY_SPY} missing: run ./scripts/bench-setup.sh once (bench extras)", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or f"/tmp/{PREFIX}")
    workdir.mkdir(parents=True, exist_ok=True)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    doc = {"benchmark": "control_plane", "issue": 19, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "code": {name: {"path": str(tree), "commit": commit_of(tree)} for name, tree in args.code_map.items()},
           "bench_commit": commit_of(ROOT), "workers": args.workers, "warmup_s": args.warmup,
           "measure_s": args.measure, "reps": args.reps,
           "slots_per_s": args.slots, "tvlvs": args.tvlvs, "settings": args.set,
           "cpus": os.cpu_count(), "load_before": h.loadavg(), "workdir": str(workdir), "cells": []}
    codes = list(args.code_map)
    stale = remove_stale()
    if stale:
        h.log(f"removed namespaces of earlier runs: {' '.join(stale)}")
    try:
        index = 0
        for rep in range(args.reps):
            for i, (m, n) in enumerate(args.cell_list):
                # alternate which tree goes first, so that neither always gets the fresher machine
                order = codes if (i + rep) % 2 == 0 else codes[::-1]
                for code in order:
                    try:
                        result = run_cell(m, n, code, args.code_map[code], args, workdir, index)
                    except RuntimeError as exc:
                        h.log(f"{m}x{n} [{code}] failed: {exc}")
                        result = {"cell": f"{m}x{n}", "code": code, "error": str(exc)}
                    doc["cells"].append(result | {"rep": rep})
                    index += 1
    except KeyboardInterrupt as exc:
        doc["interrupted"] = str(exc) or "Ctrl-C"
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        h.teardown()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    doc["ratios"] = ratios([c for c in doc["cells"] if "error" not in c], codes)
    gen_limited = [c["cell"] for c in doc["cells"] if "refused" in c and "bottleneck" in c["refused"]]
    if gen_limited:
        doc["generator_limited_cells"] = gen_limited
    doc["commands"] = h.COMMANDS
    print(json.dumps(doc, indent=1))
    return 0 if not doc.get("interrupted") else 130


if __name__ == "__main__":
    sys.exit(main())
