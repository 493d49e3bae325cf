"""The multi-process data plane in a lab of real daemons: per-flow order across worker
processes, bulk TCP intact with the offloads on, and a worker killed with SIGKILL and
restarted while traffic flows.

The traffic comes from small Python scripts (below) that the tests write to a temporary
directory and run inside the nodes' namespaces with the project's interpreter."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.daemon.labs import best_routes, make_lab, orig_mac, wait_for

PY = sys.executable  # the venv's interpreter: it runs the helper scripts inside the namespaces
INTERVAL_MS = 200

# --------------------------------------------------------------------------- helper scripts

UDP_RECEIVER = r'''
import json, socket, struct, sys, time
port, expected, idle, first_wait = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE: the receiver must not be the bottleneck
s.bind(("0.0.0.0", port))
print("ready", flush=True)
flows, sports, corrupt, got = {}, {}, 0, 0
s.settimeout(first_wait)  # until the first datagram; then `idle` ends the test
while got < expected:
    try:
        data, (_host, sport) = s.recvfrom(4096)
    except socket.timeout:
        break
    flow, seq, size = struct.unpack_from("!HIH", data)
    if got == 0:
        s.settimeout(idle)
    got += 1
    if len(data) != size or data[8:] != bytes([(flow * 7 + seq) & 0xFF]) * (size - 8):
        corrupt += 1
    flows.setdefault(flow, []).append(seq)
    sports.setdefault(flow, set()).add(sport)
print(json.dumps({"got": got, "corrupt": corrupt, "flows": flows,
                  "sports": {f: sorted(p) for f, p in sports.items()}}), flush=True)
'''

UDP_SENDER = r'''
import json, socket, struct, sys, time
dst, port, base_sport, nflows, per_flow, pause = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                  int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
socks = []
for f in range(nflows):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, 32, 8 << 20)  # SO_SNDBUFFORCE
    s.bind(("0.0.0.0", base_sport + f))
    s.connect((dst, port))
    socks.append(s)
start = time.monotonic()
sent = 0
for seq in range(per_flow):
    for f, s in enumerate(socks):  # one burst: the next datagram of every flow
        size = 200 + (f * 131 + seq * 977) % 1001
        s.send(struct.pack("!HIH", f, seq, size) + bytes([(f * 7 + seq) & 0xFF]) * (size - 8))
        sent += 1
    time.sleep(pause)
print(json.dumps({"sent": sent, "seconds": time.monotonic() - start}), flush=True)
'''

TCP_RECEIVER = r'''
import hashlib, json, socket, sys, threading, time
port, nconns = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(nconns)
print("ready", flush=True)
results = []

def receive(conn):
    start = time.monotonic()
    h, total, buf = hashlib.sha256(), 0, bytearray(1 << 20)
    view = memoryview(buf)
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        h.update(view[:n])
        total += n
    conn.close()
    results.append({"bytes": total, "sha256": h.hexdigest(), "seconds": time.monotonic() - start})

threads = []
for _ in range(nconns):
    conn, _ = srv.accept()
    threads.append(threading.Thread(target=receive, args=(conn,)))
    threads[-1].start()
for t in threads:
    t.join()
print(json.dumps({"conns": results}), flush=True)
'''

# dst port file [connections [bytes/s per connection]]: every connection sends the whole
# file (rate 0: at full speed with sendfile, so the kernel hands bat0 TSO super-frames)
TCP_SENDER = r'''
import json, socket, sys, threading, time
dst, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
nconns = int(sys.argv[4]) if len(sys.argv) > 4 else 1
rate = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
data = open(path, "rb").read()
sent = []

def send():
    s = socket.create_connection((dst, port), timeout=30)
    if rate:
        start, pos, chunk = time.monotonic(), 0, 1 << 16
        while pos < len(data):
            s.sendall(data[pos:pos + chunk])
            pos += chunk
            delay = start + pos / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        n = len(data)
    else:
        with open(path, "rb") as f:
            n = s.sendfile(f)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(60)
    while s.recv(4096):  # until the receiver has read everything and closed
        pass
    sent.append(n)

start = time.monotonic()
threads = [threading.Thread(target=send) for _ in range(nconns)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(sent) == nconns, "a connection failed"
print(json.dumps({"bytes": sum(sent), "seconds": time.monotonic() - start}), flush=True)
'''


@pytest.fixture
def scripts(tmp_path):
    paths = {}
    for name, text in (("udp_receiver", UDP_RECEIVER), ("udp_sender", UDP_SENDER),
                       ("tcp_receiver", TCP_RECEIVER), ("tcp_sender", TCP_SENDER)):
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        paths[name] = str(path)
    return paths


# --------------------------------------------------------------------------- helpers


def counters(status: dict) -> dict:
    """The data plane's counters from `dp --json`, with kernel_forward and kernel_rx: the
    frames the node's kernel forwarded and delivered for it."""
    kernel = status["kernel_forward"] or {}
    return dict(status["counters"], kernel_forward=kernel.get("forward", 0), kernel_rx=kernel.get("rx", 0),
                kernel_tx=kernel.get("tx", 0))


def dp(lab, node) -> dict:
    return json.loads(lab.batmanctl(node, "dp", "--json", check=True).stdout)


def wait_ready(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """Wait for a helper's "ready" line (it has bound its socket)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        raise AssertionError(f"helper not ready within {timeout} s (got {line!r}, exit {proc.poll()})")


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def result(proc: subprocess.Popen, timeout: float) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"helper exited with {proc.returncode}: {out[-2000:]}"
    return json.loads(out.strip().splitlines()[-1])


def mesh_ready(lab, src: str, dst: str, timeout: float = 30.0) -> None:
    """The route src -> dst exists and a ping gets through (ARP resolved, TT entries known)."""
    target = orig_mac(lab, dst)
    wait_for(lambda: target in best_routes(lab, src), timeout=timeout)
    wait_for(lambda: lab.exec(src, ["ping", "-c", "1", "-W", "1", lab.address(dst)]).returncode == 0,
             timeout=timeout, step=0.2)
    lab.exec(src, ["ping", "-c", "3", "-i", "0.2", "-W", "1", lab.address(dst)])


def all_drops(lab) -> dict:
    return {n: dp(lab, n)["drops"] for n in lab.nodes}


def kernel_drops(lab, node: str) -> str:
    """What the kernel dropped in a node (UDP buffers, qdiscs): for failure messages."""
    snmp = lab.exec(node, ["sh", "-c", "grep ^Udp: /proc/net/snmp; tc -s qdisc show dev bat0 | grep -i drop"]).stdout
    return f"{node}: {snmp.strip()}"


def loss_counters(lab, node: str) -> dict:
    """Every place on a node that counts a lost frame, for failure messages: the daemon's
    nonzero error and drop counters (failed ring sends included) and the interfaces'
    kernel drop counters (a veth drops when the peer's backlog is full)."""
    stats = json.loads(lab.batmanctl(node, "s", "--json").stdout or "{}")
    found = {k: v for k, v in stats.items() if isinstance(v, int) and v and any(
        word in k for word in ("error", "drop", "full", "bad", "truncated"))}
    links = json.loads(lab.exec(node, ["ip", "-s", "-j", "link", "show"]).stdout or "[]")
    for link in links:
        st = link.get("stats64", {})
        for way in ("rx", "tx"):
            for k in ("dropped", "errors"):
                if st.get(way, {}).get(k):
                    found[f"{link['ifname']}:{way}_{k}"] = st[way][k]
    return found


def tcp_transfer(lab, scripts, src: str, dst: str, path: str, port: int, timeout: float = 120.0) -> tuple[dict, dict]:
    receiver = lab.spawn(dst, [PY, scripts["tcp_receiver"], str(port)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        wait_ready(receiver)
        sent = lab.exec(src, [PY, scripts["tcp_sender"], lab.address(dst), str(port), path], timeout=timeout)
        assert sent.returncode == 0, f"sender {src} -> {dst} failed: {sent.stdout}{sent.stderr}"
        got = result(receiver, timeout=30)["conns"][0]
        return json.loads(sent.stdout.strip().splitlines()[-1]), got
    finally:
        stop(receiver)


def random_file(directory, megabytes: int) -> tuple[str, str]:
    path = directory / f"random{megabytes}M.bin"
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(megabytes):
            chunk = os.urandom(1 << 20)
            h.update(chunk)
            f.write(chunk)
    return str(path), h.hexdigest()


# --------------------------------------------------------------------------- 1. flow order

FLOWS = 32
PER_FLOW = 2000
UDP_PORT = 9400
BASE_SPORT = 20000
# seconds after each burst of 32 datagrams (one per flow): about 11-13k datagrams/s on a
# 2-core machine. Measured: a 0.5 ms pause (21-27k/s) was still loss-free; without a pause
# (about 35k/s) the inline daemon's receive ring on n2 overflowed (dp drops.socket > 0).
PAUSE = 0.002


@pytest.mark.parametrize("workers", [2, 0])
def test_flow_order_and_no_loss(scripts, workers):
    """line3, n1 -> n3 across n2: 32 UDP flows, 2000 sequence-numbered datagrams each
    (200..1200 bytes), interleaved in bursts of one datagram per flow. Each flow must
    arrive complete and in order. With workers=2 the daemons forward themselves
    (kernel_forward off) and the flows must be spread over both workers of the receiving
    node and of the forwarding middle node; with workers=0 (the other defaults) the
    middle node's kernel forwards them."""
    settings = {"kernel_forward": False} if workers else {}
    with make_lab("line3", orig_interval_ms=INTERVAL_MS, workers=workers, **settings) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n3")
        receiver = lab.spawn("n3", [PY, scripts["udp_receiver"], str(UDP_PORT), str(FLOWS * PER_FLOW), "3", "30"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_ready(receiver)
            before = {n: dp(lab, n) for n in lab.nodes}
            # No warm-up: mesh_ready's pings have resolved ARP and the TT entries, so
            # the very first datagram of each flow must arrive too.
            sender = lab.exec("n1", [PY, scripts["udp_sender"], lab.address("n3"), str(UDP_PORT), str(BASE_SPORT),
                                     str(FLOWS), str(PER_FLOW), str(PAUSE)], timeout=120)
            assert sender.returncode == 0, sender.stdout + sender.stderr
            sent = json.loads(sender.stdout.strip().splitlines()[-1])
            got = result(receiver, timeout=60)
        finally:
            stop(receiver)
        time.sleep(1.2)  # workers report their counters twice a second
        after = {n: dp(lab, n) for n in lab.nodes}
        drops = {n: after[n]["drops"] for n in lab.nodes}
        diag = "; ".join(kernel_drops(lab, n) for n in ("n1", "n3"))
        diag += "; " + "; ".join(f"{n}: {loss_counters(lab, n)}" for n in lab.nodes)

    flows = {int(f): seqs for f, seqs in got["flows"].items()}
    reordered = {f: sum(1 for a, b in zip(seqs, seqs[1:]) if b <= a) for f, seqs in flows.items()}
    lost = {f: PER_FLOW - len(set(flows.get(f, []))) for f in range(FLOWS)}
    total_lost = sum(lost.values())
    rate = sent["sent"] / sent["seconds"]
    print(f"workers={workers}: sent {sent['sent']} datagrams in {sent['seconds']:.1f} s ({rate:.0f}/s), "
          f"received {got['got']}, lost {total_lost}, "
          f"reordered {sum(reordered.values())}, corrupt {got['corrupt']}; drops {drops}")
    print(f"  kernel and daemon loss counters: {diag}")
    if workers:
        for n in lab.nodes:
            print(f"  {n}: " + ", ".join(
                f"worker {w['index']} rx {w['rx_frames'] - b['rx_frames']} tx {w['tx_frames'] - b['tx_frames']} "
                f"fwd {w['forward_frames'] - b['forward_frames']}"
                for w, b in zip(after[n]["workers"], before[n]["workers"])))
    assert sent["sent"] == FLOWS * PER_FLOW
    assert got["corrupt"] == 0
    assert all(len(got["sports"][str(f)]) == 1 for f in flows), "a flow arrived from more than one source port"
    assert not any(reordered.values()), f"reordered datagrams per flow: { {f: r for f, r in reordered.items() if r} }"
    assert all(d == 0 for node in drops.values() for d in node.values()), f"data-plane drops: {drops}"
    assert total_lost == 0, f"lost per flow: { {f: n for f, n in lost.items() if n} } ({diag})"
    if workers:
        assert after["n3"]["mode"] == f"{workers} workers"
        rx = [w["rx_frames"] - b["rx_frames"] for w, b in zip(after["n3"]["workers"], before["n3"]["workers"])]
        fwd = [w["forward_frames"] - b["forward_frames"]
               for w, b in zip(after["n2"]["workers"], before["n2"]["workers"])]
        assert len(rx) == workers and all(r > 0 for r in rx), f"n3 workers' rx_frames during the test: {rx}"
        assert all(f > 0 for f in fwd), f"n2 workers' forward_frames during the test: {fwd}"
        assert sum(rx) >= FLOWS * PER_FLOW
    else:
        assert after["n3"]["mode"] == "inline" and after["n3"]["workers"] == []
        assert after["n2"]["kernel_forward"]["error"] is None, after["n2"]["kernel_forward"]
        kernel = counters(after["n2"])["kernel_forward"] - counters(before["n2"])["kernel_forward"]
        assert kernel >= FLOWS * PER_FLOW, f"n2's kernel forwarded {kernel} frames"


# --------------------------------------------------------------------------- 2. bulk TCP with offloads


@pytest.mark.parametrize("kernel_path", [False, True], ids=["workers", "defaults"])
def test_large_file_intact_with_offloads(scripts, tmp_path, kernel_path):
    """line3 with workers=2 and gro/tso/csum_offload on (the defaults): 64 MB of random
    bytes over TCP from n1 to its neighbour n2, then from n1 to n3 (n2 forwards). The
    receiver's SHA-256 must equal the file's. Without the kernel path the counters must
    show that the offloads were used: TSO super-frames cut by n1's workers, segments
    coalesced by the receiving node's workers (fewer TAP writes than received frames).
    With the defaults the kernels carry it all: n1's sends the segments its passage cut,
    n2's forwards them to n3, the receiver's delivers them."""
    path, digest = random_file(tmp_path, 64)
    settings = {} if kernel_path else {"kernel_forward": False}
    with make_lab("line3", orig_interval_ms=INTERVAL_MS, workers=2, **settings) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n2")
        mesh_ready(lab, "n1", "n3")
        results = {}
        for dst, port in (("n2", 9500), ("n3", 9501)):
            before = {n: counters(dp(lab, n)) for n in lab.nodes}
            sent, got = tcp_transfer(lab, scripts, "n1", dst, path, port)
            time.sleep(1.2)  # workers report their counters twice a second
            after = {n: dp(lab, n) for n in lab.nodes}
            delta = {n: {k: v - before[n].get(k, 0) for k, v in counters(after[n]).items()} for n in lab.nodes}
            results[dst] = (sent, got, delta, {n: after[n]["drops"] for n in lab.nodes})
    for dst, (sent, got, delta, drops) in results.items():
        tx, rx = delta["n1"], delta[dst]
        print(f"n1 -> {dst}: {got['bytes'] >> 20} MiB in {sent['seconds']:.1f} s "
              f"({got['bytes'] / sent['seconds'] / 1e6:.1f} MB/s); n1: tso_frames {tx['tso_frames']} "
              f"tso_segments {tx['tso_segments']} tx {tx['tx']} slow_host {tx['slow_host']}; {dst}: rx {rx['rx']} "
              f"gro_written {rx['gro_written']} gro_merged {rx['gro_merged']}"
              + (f"; n2 forward {delta['n2']['forward']}" if dst == "n3" else "") + f"; drops {drops}")
    segments = (64 << 20) // 1448  # at least one TCP segment per 1448 bytes crossed the mesh
    for dst, (sent, got, delta, drops) in results.items():
        assert got["bytes"] == sent["bytes"] == 64 << 20, f"n1 -> {dst}: {got['bytes']} bytes received"
        assert got["sha256"] == digest, f"n1 -> {dst}: the received stream differs from the file"
        tx, rx = delta["n1"], delta[dst]
        if kernel_path:
            assert tx["kernel_tx"] >= segments and rx["kernel_rx"] >= segments, (tx, rx)
            if dst == "n3":
                assert delta["n2"]["kernel_forward"] >= segments
            continue
        assert tx["tso_frames"] > 0 and tx["tso_segments"] > tx["tso_frames"], \
            f"n1 -> {dst}: no TSO super-frame was segmented by n1's workers: {tx}"
        assert rx["rx"] > 0 and rx["gro_written"] < rx["rx"], \
            f"n1 -> {dst}: no coalescing on {dst} (gro_written {rx['gro_written']}, rx {rx['rx']}): {rx}"
        assert tx["tx"] >= segments
        if dst == "n3":
            assert delta["n2"]["forward"] >= segments and delta["n2"]["kernel_forward"] == 0
    for dst, (sent, got, delta, drops) in results.items():
        if kernel_path:
            continue  # (the passage's GRO merges them: test_kernel_tcp)
        # every frame a worker delivers is either written to the TAP or merged into one
        # that is: the segments merged are rx - gro_written
        rx = delta[dst]
        assert rx["gro_merged"] > 0, (f"n1 -> {dst}: counters.gro_merged is {rx['gro_merged']} although "
                                      f"{rx['rx']} frames were delivered in {rx['gro_written']} TAP writes "
                                      f"(expected about {rx['rx'] - rx['gro_written']} merged)")


def ring_kib(pid: int) -> int:
    """RSS of a process's packet-socket mappings (its rings) in KiB."""
    total, in_socket = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and ":" not in first:  # a mapping's header line
                in_socket = "socket:" in line
            elif in_socket and first == "Rss:":
                total += int(line.split()[1])
    return total


GROW_ATTEMPTS = 4


def test_a_grown_ring_outlives_its_worker(scripts, tmp_path):
    """workers=2, every frame through the workers (kernel_forward off): 64 MB from n1 to
    its neighbour n2 (again, up to GROW_ATTEMPTS times, until it happens) grow the receive
    ring of the n2 worker that carries the flow (rings start at 1024 slots). Both of n2's workers are then killed: each restarted worker maps
    the ring it inherits at the size it has now (with the size the daemon first gave, the
    kernel refuses the mapping and the worker would die again and again). Every worker
    restarts once, its rings as big as its predecessor's, and a fresh 16 MB arrive intact."""
    path, digest = random_file(tmp_path, 64)
    with make_lab("line3", orig_interval_ms=INTERVAL_MS, workers=2, kernel_forward=False) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n2")
        # Whether a transfer outpaces the worker enough to fill half its ring depends on the
        # machine (about one in seven does not here): another 64 MB until one does.
        for attempt in range(GROW_ATTEMPTS):
            sent, got = tcp_transfer(lab, scripts, "n1", "n2", path, 9520 + attempt)
            assert got["bytes"] == sent["bytes"] == 64 << 20 and got["sha256"] == digest
            time.sleep(1.2)  # workers report their counters twice a second
            grown = counters(dp(lab, "n2")).get("rx_ring_grown", 0)
            if grown:
                break
        old = [w["pid"] for w in dp(lab, "n2")["workers"]]
        rings_before = [ring_kib(pid) for pid in old]
        for pid in old:
            os.kill(pid, signal.SIGKILL)

        def restarted():
            workers = dp(lab, "n2")["workers"]
            return workers if all(w["restarts"] >= 1 and w["pid"] not in (None, *old) for w in workers) else None
        wait_for(restarted, timeout=10, step=0.05)
        time.sleep(1.0)  # a worker that cannot map its ring is gone again by now
        workers = dp(lab, "n2")["workers"]
        assert [w["restarts"] for w in workers] == [1, 1], f"a restarted worker died again: {workers}"
        rings_after = [ring_kib(w["pid"]) for w in workers]
        restarted_pids = [w["pid"] for w in workers]
        fresh_path, fresh_digest = random_file(tmp_path, STREAM_MB)
        fresh_sent, fresh_got = tcp_transfer(lab, scripts, "n1", "n2", fresh_path, 9521)
        final = dp(lab, "n2")["workers"]
    print(f"n2: rx_ring_grown {grown} after {attempt + 1} transfer(s); ring KiB per worker {rings_before} -> "
          f"{rings_after}; restarts {[w['restarts'] for w in final]}")
    assert grown >= 1, f"{GROW_ATTEMPTS} x 64 MB through a worker did not grow its ring"
    assert max(rings_before) > min(rings_before) or grown == 2, rings_before  # (grown: bigger than the other)
    assert rings_after == rings_before, "a restarted worker's rings differ from its predecessor's"
    assert [w["restarts"] for w in final] == [1, 1] and [w["pid"] for w in final] == restarted_pids, final
    assert fresh_got["bytes"] == fresh_sent["bytes"] == STREAM_MB << 20 and fresh_got["sha256"] == fresh_digest


# --------------------------------------------------------------------------- 3. worker restart

PING_INTERVAL = 0.05
_REPLY = re.compile(r"^\[(\d+\.\d+)\] .*icmp_seq=(\d+)")
_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def moved(status: dict, index: int) -> int:
    """Frames a worker (all its lives) received or sent, from `dp --json`."""
    w = status["workers"][index]
    return w["rx_frames"] + w["tx_frames"]


def busy_worker(lab, node: str, seconds: float = 1.5) -> int:
    """Index of the worker of `node` that moved the most frames in the next `seconds`."""
    before = dp(lab, node)["workers"]
    time.sleep(seconds)
    after = dp(lab, node)["workers"]
    moved = [(a["rx_frames"] + a["tx_frames"]) - (b["rx_frames"] + b["tx_frames"]) for a, b in zip(after, before)]
    return max(range(len(moved)), key=moved.__getitem__)


STREAM_MB = 16
STREAM_CONNS = 4
STREAM_RATE = 4 << 20  # bytes/s per connection: the stream lasts about 4 s
STREAM_ATTEMPTS = 8


@pytest.mark.parametrize("node", ["n2", "n1"])
def test_worker_restart_after_sigkill(scripts, tmp_path, node):
    """line3 with workers=2: while n1 pings n3 every 50 ms and four paced TCP connections
    carry 16 MB each from n1 to n3, SIGKILL the worker of `node` (n2: the forwarding
    middle; n1: the TAP side) that carries the ping. The daemon restarts it (restarts 1, a
    new pid, a child of the same daemon); the ping gets replies again, the running TCP
    connections complete intact, and so does a fresh 16 MB transfer."""
    path, digest = random_file(tmp_path, STREAM_MB)
    # (the kernel path would carry the ping and the TCP streams past the workers)
    with make_lab("line3", orig_interval_ms=INTERVAL_MS, workers=2, kernel_forward=False) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n3")
        daemon = lab.pids[node]
        pinger = stream_rx = stream_tx = None
        try:
            pinger = lab.spawn("n1", ["ping", "-D", "-i", str(PING_INTERVAL), "-W", "1", lab.address("n3")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            victim = busy_worker(lab, node)  # the worker the ping goes through
            workers = dp(lab, node)["workers"]
            old_pids = [w["pid"] for w in workers]
            assert len(workers) == 2 and all(w["restarts"] == 0 for w in workers), workers
            assert all(ppid(pid) == daemon for pid in old_pids), "the workers are not children of the daemon"
            # The TCP connections run across the kill; at least one must go through the
            # victim. A connection stays on the worker its flow hash picks: if none of the
            # four took the victim (about 1 in 16), start four new ones.
            for attempt in range(STREAM_ATTEMPTS):
                moved_before = moved(dp(lab, node), victim)
                stream_rx = lab.spawn("n3", [PY, scripts["tcp_receiver"], str(9601 + attempt), str(STREAM_CONNS)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                wait_ready(stream_rx)
                stream_tx = lab.spawn("n1", [PY, scripts["tcp_sender"], lab.address("n3"), str(9601 + attempt),
                                             path, str(STREAM_CONNS), str(STREAM_RATE)],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                time.sleep(1.2)  # the stream runs (and the workers have reported at least twice)
                assert stream_tx.poll() is None, "the TCP stream ended before the kill"
                if moved(dp(lab, node), victim) - moved_before > 1000:  # the ping alone moves about 50
                    break
                stop(stream_tx)
                stop(stream_rx)
            else:
                raise AssertionError(f"no TCP connection of {STREAM_ATTEMPTS} x {STREAM_CONNS} went through "
                                     f"worker {victim}")

            killed_at = time.time()
            os.kill(old_pids[victim], signal.SIGKILL)

            def restarted():
                w = dp(lab, node)["workers"][victim]
                return w if w["restarts"] == 1 and w["pid"] not in (None, old_pids[victim]) else None
            row, _ = wait_for(restarted, timeout=5, step=0.02)
            restarted_at = time.time()
            new_pid = row["pid"]
            time.sleep(2.5)
            after = dp(lab, node)
            daemon_alive = lab.daemon_running(node) and lab.pids[node] == daemon
            new_parent = ppid(new_pid)
            stream_sent = result(stream_tx, timeout=60)
            stream_got = result(stream_rx, timeout=30)
        finally:
            stop(stream_tx)
            stop(stream_rx)
            ping_out = ""
            if pinger is not None:
                if pinger.poll() is None:
                    pinger.send_signal(signal.SIGINT)  # ping prints its statistics on SIGINT
                try:
                    ping_out = pinger.communicate(timeout=10)[0]
                except subprocess.TimeoutExpired:
                    stop(pinger)
        fresh_sent, fresh_got = tcp_transfer(lab, scripts, "n1", "n3", path, 9610)
        drops = all_drops(lab)
        log_tail = lab.log_path(node).read_text(errors="replace")[-3000:]

    replies = [(float(m[1]), int(m[2])) for m in map(_REPLY.match, ping_out.splitlines()) if m]
    summary = _SUMMARY.search(ping_out)
    transmitted, received = int(summary[1]), int(summary[2])
    loss = 1 - received / transmitted
    within_2s = sum(1 for t, _ in replies if restarted_at < t <= restarted_at + 2.0)
    gaps = [(b[0] - a[0], a[1], b[1]) for a, b in zip(replies, replies[1:])]
    gap, seq_a, seq_b = max(gaps, default=(float("inf"), -1, -1))
    print(f"{node}: killed worker {victim} (pid {old_pids[victim]}); restarted as pid {new_pid} "
          f"{restarted_at - killed_at:.2f} s later (as seen by dp); ping: {received}/{transmitted} replies "
          f"({loss:.1%} lost), {within_2s} replies in the 2 s after the restart, longest gap {gap:.2f} s "
          f"(icmp_seq {seq_a} -> {seq_b}); stream {stream_sent['bytes'] >> 20} MiB in {stream_sent['seconds']:.1f} s; "
          f"fresh 16 MiB in {fresh_sent['seconds']:.1f} s; frames through the killed worker (both lives) "
          f"{moved(after, victim) - moved_before} (stream attempts {attempt + 1}); drops {drops}")
    assert daemon_alive, f"the daemon of {node} (pid {daemon}) is gone or was replaced"
    assert row["restarts"] == 1 and after["workers"][victim]["pid"] == new_pid
    assert new_parent == daemon, f"the restarted worker {new_pid} is a child of {new_parent}, not of {daemon}"
    other = 1 - victim
    assert after["workers"][other]["restarts"] == 0 and after["workers"][other]["pid"] == old_pids[other]
    assert "restarting" in log_tail
    assert within_2s >= 10, f"{within_2s} ping replies in the 2 s after the restart"
    assert loss <= 0.1, f"ping lost {loss:.1%} ({received}/{transmitted})"
    assert gap < 3.0, f"no ping reply for {gap:.2f} s (icmp_seq {seq_a} -> {seq_b})"
    assert len(stream_got["conns"]) == STREAM_CONNS
    for conn in stream_got["conns"]:
        assert conn["bytes"] == STREAM_MB << 20 and conn["sha256"] == digest, f"stream across the kill: {conn}"
    assert fresh_got["bytes"] == fresh_sent["bytes"] == STREAM_MB << 20
    assert fresh_got["sha256"] == digest


def test_a_stuck_worker_is_killed_and_restarted():
    """A worker that stops reporting (here: SIGSTOP, as a wedged loop would look) is killed
    after SILENCE_LIMIT and restarted on its queue and rings; traffic through it resumes."""
    from batmand.dataplane.pool import SILENCE_LIMIT

    with make_lab("line3", workers=2, orig_interval_ms=200) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n3")
        victim = dp(lab, "n2")["workers"][0]
        assert ppid(victim["pid"]) == lab.pids["n2"]
        os.kill(victim["pid"], signal.SIGSTOP)
        try:
            restarted, waited = wait_for(lambda: (lambda w: w if w["restarts"] == 1 else None)(
                dp(lab, "n2")["workers"][0]), timeout=SILENCE_LIMIT + 5)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim["pid"], signal.SIGCONT)
        assert restarted["pid"] != victim["pid"] and ppid(restarted["pid"]) == lab.pids["n2"]
        assert waited >= SILENCE_LIMIT - 1.5, f"restarted after {waited:.1f} s: it was not silence that did it"
        assert "silent for" in lab.log_path("n2").read_text()
        # every flow, whichever worker it hashes to, gets through again
        for _ in range(8):
            assert lab.exec("n1", ["ping", "-c", "2", "-i", "0.2", "-W", "2", lab.address("n3")]).returncode == 0


# --------------------------------------------------------------------------- 4. isolated start

PLANTED = '''
import os, sys
open(os.environ["PLANTED_MARKER"], "w").write(" ".join(sys.argv))
'''


def test_workers_ignore_modules_planted_in_the_current_directory(tmp_path, monkeypatch):
    """The daemon started (as root) from a directory someone else can write, holding a
    `batmand/dataplane/worker.py` of theirs: the workers must not run it (they start
    isolated from the current directory, PYTHONPATH and the user's site-packages) and must
    still find the batmand the daemon runs, and forward."""
    planted = tmp_path / "cwd"
    (planted / "batmand" / "dataplane").mkdir(parents=True)
    (planted / "batmand" / "__init__.py").write_text("")
    (planted / "batmand" / "dataplane" / "__init__.py").write_text("")
    (planted / "batmand" / "dataplane" / "worker.py").write_text(PLANTED)
    marker = tmp_path / "planted-module-ran"
    monkeypatch.setenv("PLANTED_MARKER", str(marker))
    monkeypatch.chdir(planted)
    # n2's workers forward only while its kernel does not
    with make_lab("line3", orig_interval_ms=INTERVAL_MS, workers=2, kernel_forward=False) as lab:
        lab.start()
        mesh_ready(lab, "n1", "n3")
        time.sleep(1.2)  # the workers report their counters twice a second
        workers = {n: dp(lab, n)["workers"] for n in lab.nodes}
    assert not marker.exists(), f"a worker ran the planted module: {marker.read_text()}"
    for node, rows in workers.items():
        assert len(rows) == 2 and all(w["restarts"] == 0 for w in rows), f"{node}: {rows}"
        assert sum(w["rx_frames"] + w["tx_frames"] for w in rows) > 0, f"{node}: no frame went through the workers"
