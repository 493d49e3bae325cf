"""Plumbing for bench/dataplane.py: commands, namespaces and processes this run owns,
their cleanup, and the counters read around each test (CPU of process trees, machine
CPU, link and UDP statistics, load).

Ownership rules: every namespace this run creates is named <prefix><node> with a prefix
unique to the run (dpb<pid>), and every long-running process it starts is remembered by
its PID. Cleanup signals only those PIDs, the children they spawned (found through
/proc/<pid>/task/*/children) and processes still inside our own namespaces, then deletes
the namespaces. Nothing is created in the root network namespace.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PREFIX = f"dpb{os.getpid()}"
STALE_RE = re.compile(r"^dpb(\d+)[A-Z]$")

COMMANDS: list[str] = []  # every set-up command, for the record (results.json)


def log(msg: str) -> None:
    """Progress goes to stderr: stdout carries only the JSON document."""
    print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def run(argv: list[str], *, check: bool = True, timeout: float = 60, record: bool = True,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    if record:
        COMMANDS.append(shlex.join(argv))
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)}` exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r


def in_ns(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


# ------------------------------------------------------------------ processes we own
class Owned:
    """The processes and namespaces of this run."""

    procs: dict[int, subprocess.Popen] = {}
    namespaces: list[str] = []
    seen_children: dict[int, set[int]] = {}  # root pid -> every descendant pid seen so far


def spawn(argv: list[str], logfile: str, *, record: bool = True) -> subprocess.Popen:
    """Start a long-running process (own session: Ctrl-C in the terminal does not reach it;
    we stop it ourselves) with stdout+stderr appended to logfile."""
    if record:
        COMMANDS.append(shlex.join(argv) + " &")
    with open(logfile, "ab") as f:
        f.write(f"--- dataplane bench: {shlex.join(argv)}\n".encode())
        f.flush()
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
    p.logfile = logfile  # type: ignore[attr-defined]
    Owned.procs[p.pid] = p
    Owned.seen_children[p.pid] = set()
    return p


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


def tree(pid: int) -> list[int]:
    """pid and all its live descendants."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        if p in out:
            continue
        out.append(p)
        stack.extend(children(p))
    if pid in Owned.seen_children:
        Owned.seen_children[pid].update(out[1:])
    return out


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(p: subprocess.Popen, grace: float = 5.0) -> int | None:
    """SIGTERM, then SIGKILL after grace; then any descendants it left behind. Returns the
    exit status when the process had already exited on its own (None otherwise)."""
    rc_before = p.poll()
    kids = set(tree(p.pid)[1:]) | Owned.seen_children.get(p.pid, set())
    if rc_before is None:
        _signal(p.pid, signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            _signal(p.pid, signal.SIGKILL)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
    for k in kids:  # workers that outlived their parent (SIGKILLed parent, crash)
        if _alive(k):
            _signal(k, signal.SIGKILL)
    Owned.procs.pop(p.pid, None)
    Owned.seen_children.pop(p.pid, None)
    return rc_before


# ------------------------------------------------------------------ namespaces
def ns_name(node: str) -> str:
    return PREFIX + node


def add_ns(node: str) -> str:
    ns = ns_name(node)
    run(["ip", "netns", "add", ns])
    Owned.namespaces.append(ns)
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    return ns


def ns_pids(ns: str) -> list[int]:
    r = run(["ip", "netns", "pids", ns], check=False, record=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def del_ns(ns: str) -> None:
    """Processes still inside one of our namespaces are ours: stop them, then delete it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = ns_pids(ns)
        if not pids:
            break
        for pid in pids:
            _signal(pid, sig)
        time.sleep(0.5)
    run(["ip", "netns", "del", ns], check=False, record=False)
    if ns in Owned.namespaces:
        Owned.namespaces.remove(ns)


def teardown() -> None:
    for p in list(Owned.procs.values()):
        try:
            stop(p, grace=3.0)
        except Exception as exc:  # keep cleaning up
            log(f"cleanup: stopping pid {p.pid}: {exc}")
    for ns in list(Owned.namespaces):
        try:
            del_ns(ns)
        except Exception as exc:
            log(f"cleanup: deleting namespace {ns}: {exc}")


def remove_stale() -> list[str]:
    """Namespaces of an earlier run of this bench whose process is gone (a SIGKILLed run)."""
    removed = []
    r = run(["ip", "netns", "list"], check=False, record=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = STALE_RE.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            del_ns(name)
            removed.append(name)
    return removed


def wait_until(pred, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)


def link_exists(ns: str, dev: str) -> bool:
    return run(["ip", "-n", ns, "link", "show", "dev", dev], check=False, record=False).returncode == 0


def mac_of(ns: str, dev: str) -> str:
    return json.loads(run(["ip", "-n", ns, "-j", "link", "show", "dev", dev], record=False).stdout)[0]["address"]


def tail(path: str, n: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line for line in f if not line.startswith("--- dataplane bench:")]
        return "".join(lines[-n:]).strip()
    except OSError:
        return ""


# ------------------------------------------------------------------ counters
def proc_cpu(pid: int) -> tuple[str, float] | None:
    """(comm, seconds) for one process: utime+stime, plus cutime+cstime (children it has
    already reaped, e.g. a worker that exited during the test)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    fields = s[s.rindex(")") + 2:].split()
    return comm, sum(int(x) for x in fields[11:15]) / CLK_TCK


def tree_cpu(pid: int) -> dict[int, tuple[str, float]]:
    out = {}
    for p in tree(pid):
        c = proc_cpu(p)
        if c:
            out[p] = c
    return out


def all_procs() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, comm, utime+stime seconds) of every process on the machine."""
    snap = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2:].split()
        snap[int(d)] = (int(fields[1]), s[s.index("(") + 1:s.rindex(")")], (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return snap


def _descendants(snap: dict, root: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in snap.items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = set(), [root]
    while stack:
        p = stack.pop()
        if p not in out:
            out.add(p)
            stack.extend(kids.get(p, []))
    return out


def neighbour_cpu(s0: dict, s1: dict) -> tuple[float, dict[str, float]]:
    """CPU seconds used between two snapshots by processes that are neither this bench's
    (descendants of this process) nor kernel threads."""
    ours = _descendants(s0, os.getpid()) | _descendants(s1, os.getpid())
    per: dict[str, float] = {}
    for pid, (ppid, comm, cpu) in s1.items():
        if pid in ours or pid == 2 or ppid == 2:
            continue
        d = cpu - s0[pid][2] if pid in s0 else cpu
        if d > 0:
            per[comm] = per.get(comm, 0.0) + d
    return sum(per.values()), per


def quiet_wait(max_s: float, threshold: float = 0.10, window: float = 0.5) -> tuple[float, float]:
    """Wait (at most max_s) until other programs use less than `threshold` cores.
    Returns (seconds waited, their last rate in cores)."""
    t0 = time.monotonic()
    while True:
        s0 = all_procs()
        time.sleep(window)
        rate = neighbour_cpu(s0, all_procs())[0] / window
        waited = time.monotonic() - t0
        if rate < threshold or waited >= max_s:
            return round(waited, 2), round(rate, 3)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, sum(v) / CLK_TCK


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def link_stats(ns: str) -> dict[str, dict[str, int]]:
    """Per device of a namespace: packets, bytes, dropped, both directions (rtnetlink
    stats64, the same counters as /sys/class/net/<dev>/statistics inside the namespace)."""
    r = run(["ip", "-n", ns, "-j", "-s", "link", "show"], check=False, record=False)
    out = {}
    try:
        links = json.loads(r.stdout or "[]")
    except json.JSONDecodeError:
        return out
    for link in links:
        s = link.get("stats64") or {}
        rx, tx = s.get("rx", {}), s.get("tx", {})
        out[link["ifname"]] = {"rx_packets": rx.get("packets", 0), "rx_bytes": rx.get("bytes", 0),
                               "rx_dropped": rx.get("dropped", 0), "tx_packets": tx.get("packets", 0),
                               "tx_bytes": tx.get("bytes", 0), "tx_dropped": tx.get("dropped", 0)}
    return out


def udp_counters(ns: str) -> dict[str, int]:
    r = run(in_ns(ns, ["cat", "/proc/net/snmp"]), check=False, record=False)
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("Udp:")]
    if len(rows) < 2:
        return {}
    d = dict(zip(rows[0][1:], (int(x) for x in rows[1][1:])))
    return {k: d.get(k, 0) for k in ("InDatagrams", "RcvbufErrors", "InErrors", "SndbufErrors")}


def delta(after: dict, before: dict) -> dict:
    """after - before for nested dicts of numbers (keys missing before count from 0)."""
    out = {}
    for k, v in after.items():
        b = before.get(k) if isinstance(before, dict) else None
        if isinstance(v, dict):
            out[k] = delta(v, b or {})
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v - (b if isinstance(b, (int, float)) else 0)
    return out


def ethtool_features(ns: str, dev: str, keys=("generic-receive-offload", "tcp-segmentation-offload",
                                             "tx-checksumming", "rx-checksumming", "scatter-gather",
                                             "generic-segmentation-offload")) -> dict[str, str] | None:
    r = run(in_ns(ns, ["ethtool", "-k", dev]), check=False, record=False)
    if r.returncode != 0:
        return None
    feats = {}
    for line in r.stdout.splitlines()[1:]:
        k, sep, v = line.partition(":")
        if sep and k.strip() in keys:
            feats[k.strip()] = v.strip()
    return feats
