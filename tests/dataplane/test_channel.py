"""The channel between the control process and its workers carries a forwarding table
of any size: a mesh of 21,600 clients (12 originators behind a real neighbour, announced
in TT diffs) reaches every worker, a worker restarted after SIGKILL gets it whole and
forwards with it, and a worker that stops reading for a while (SIGSTOP) while the table
changes under it is brought up to date with the whole table (a resync), without holding
the control process up."""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import signal
import subprocess
import sys
import time

import pytest

from batmand.core.events import ClientRoute, ForwardingUpdate, OrigRoute
from batmand.core.forwarding import TO_HOST, ForwardingTable, SlowPath, SlowRule
from batmand.dataplane import messages as m
from batmand.dataplane.channel import (MAX_MESSAGE, PART_ENTRIES, BadMessage, Channel, Outbox, decode, encode, pair,
                                       split_update)
from batmand.dataplane.pool import WorkerPool, worker_command
from batmand.dataplane.worker import Worker
from batmand.wire import Mac
from tests.daemon.labs import best_routes, wait_for
from tests.dataplane.inject import FakeOriginators, Sniffer, dp, mac, pair_lab, send_frames

ORIGINATORS = 12
CLIENTS_EACH = 1800  # under the kernel's per-originator limit (2000): 21,600 in all
FLOWS = 32
FAKE_IP = "10.77.0.200"

SEND_UDP = r'''
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(b"x" * 100, (sys.argv[1], 20000 + i))
'''


def fake_mesh(lab, clients_each: int) -> FakeOriginators:
    """b (two workers) learns `clients_each` clients of each of ORIGINATORS originators
    behind a; returns the generator (it knows who announced what)."""
    wait_for(lambda: lab.originator("a") in best_routes(lab, "b").values(), timeout=30)
    fake = FakeOriginators(mac(lab.originator("a")), ORIGINATORS)
    send_paced(lab, fake.grow(clients_each))
    wait_for(lambda: synced(dp(lab, "b"), ORIGINATORS * clients_each), timeout=60, step=0.5)
    return fake


def send_paced(lab, frames: list[bytes]) -> None:
    """From a to b, in bursts the control socket's buffer takes."""
    for i in range(0, len(frames), 24):
        send_frames(lab.ns("a"), "e-b", frames[i:i + 24])
        time.sleep(0.01)


def synced(status: dict, clients: int | None = None) -> bool:
    """Every worker's table has the control process's sizes (and `clients` clients)."""
    table = status["table"]
    return (clients is None or table["clients"] >= clients) and all(w["table"] == table for w in status["workers"])


def traffic_to(lab, client: bytes, sniffer: Sniffer) -> tuple[list[bytes], list[int]]:
    """FLOWS UDP flows from b's host to `client` (a static neighbour entry): the UNICAST
    frames a receives for it, and how many frames each of b's workers sent meanwhile."""
    lab.exec("b", ["ip", "neigh", "replace", FAKE_IP, "lladdr", client.hex(":"), "dev", "bat0", "nud", "permanent"],
             check=True)
    before = [w["tx_frames"] for w in dp(lab, "b")["workers"]]
    sniffer.take()
    lab.exec("b", [sys.executable, "-c", SEND_UDP, FAKE_IP, str(FLOWS)], check=True)
    time.sleep(1.2)  # the workers report twice a second
    got = sniffer.unicast([client])
    after = [w["tx_frames"] for w in dp(lab, "b")["workers"]]
    return got, [a - b for a, b in zip(after, before)]


def test_restarted_worker_gets_a_table_of_21600_clients():
    with pair_lab(workers_a=0, workers_b=2, kernel_forward=False) as lab:  # (the workers' own sending)
        lab.start()
        fake = fake_mesh(lab, CLIENTS_EACH)
        sniffer = Sniffer(lab.ns("a"), "e-b")
        try:
            status = dp(lab, "b")
            victim = status["workers"][0]["pid"]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: dp(lab, "b")["workers"][0]["restarts"] == 1, timeout=10)
            restarted, waited = wait_for(lambda: synced(dp(lab, "b")), timeout=20, step=0.2)
            time.sleep(3.0)  # a worker that cannot take the table would be restarting again by now
            after = dp(lab, "b")
            got, sent = traffic_to(lab, fake.clients[5][7], sniffer)
        finally:
            sniffer.close()
    print(f"table {after['table']}; restarted worker synced {waited:.1f} s after the restart; "
          f"workers {[(w['pid'], w['restarts'], w['table']) for w in after['workers']]}; "
          f"{len(got)} frames of {FLOWS} flows reached a, sent by the workers {sent}")
    assert after["table"]["clients"] >= ORIGINATORS * CLIENTS_EACH
    assert [w["restarts"] for w in after["workers"]] == [1, 0]
    assert after["workers"][0]["pid"] != victim and synced(after)
    assert len(got) == FLOWS, f"{len(got)} of {FLOWS} flows reached the client's originator"
    assert all(n > 0 for n in sent) and sum(sent) >= FLOWS, f"frames sent by each worker: {sent}"


CHURN_ROUNDS = 120  # 1440 OGMs, each replacing 18 clients: well over the 256 KiB a worker may lag behind, also when
# the daemon publishes a batch of frames as one update (pickle then shares the repeated objects)


def test_stopped_worker_is_resynced():
    """Worker 0 of b stops (SIGSTOP) while more table changes arrive than its channel
    holds (CHURN_ROUNDS rounds of OGMs that replace clients). The control process stays
    responsive; once the worker reads again it gets the whole table (resyncs >= 1) and ends
    with the control process's table: it forwards to clients added while it was stopped
    and not to the ones removed."""
    with pair_lab(workers_a=0, workers_b=2, kernel_forward=False) as lab:  # (the workers' own sending)
        lab.start()
        fake = fake_mesh(lab, 108)  # small: how fast b takes the changes is not the subject
        sniffer = Sniffer(lab.ns("a"), "e-b")
        try:
            victim = dp(lab, "b")["workers"][0]
            frames, removed, added = fake.churn(CHURN_ROUNDS)
            os.kill(victim["pid"], signal.SIGSTOP)
            try:
                stopped_at = time.monotonic()
                send_paced(lab, frames)
                slowest = 0.0

                def resync_queued():
                    nonlocal slowest
                    start = time.monotonic()
                    row = dp(lab, "b")["workers"][0]
                    slowest = max(slowest, time.monotonic() - start)
                    return row if row["resyncs"] >= 1 else None
                queued, _ = wait_for(resync_queued, timeout=max(0.5, 4.0 - (time.monotonic() - stopped_at)),
                                     step=0.1)
            finally:
                os.kill(victim["pid"], signal.SIGCONT)
            stopped_for = time.monotonic() - stopped_at
            status, waited = wait_for(lambda: (lambda s: s if synced(s) else None)(dp(lab, "b")), timeout=20)
            got_new, sent_new = traffic_to(lab, added[-1], sniffer)
            got_old, sent_old = traffic_to(lab, removed[0], sniffer)
        finally:
            sniffer.close()
    row = status["workers"][0]
    print(f"worker 0 stopped for {stopped_for:.1f} s; backlog when the resync was queued "
          f"{queued['channel_backlog']} bytes; slowest dp answer meanwhile {slowest:.2f} s; synced {waited:.1f} s "
          f"after SIGCONT: {row}; control table {status['table']}; to a new client: {len(got_new)} frames "
          f"(workers sent {sent_new}); to a removed one: {len(got_old)} UNICAST frames (workers sent {sent_old})")
    assert row["pid"] == victim["pid"] and row["restarts"] == 0 and row["resyncs"] >= 1
    assert slowest < 2.0, f"the control process took {slowest:.2f} s to answer while a worker was stopped"
    assert len(got_new) == FLOWS and all(n > 0 for n in sent_new), (len(got_new), sent_new)
    assert got_old == [] and sent_old == [0, 0], (len(got_old), sent_old)


# --------------------------------------------------------------------------- the mechanisms alone


ARP_TO_HOST = SlowPath(rules=frozenset({SlowRule(TO_HOST, 0x0806)}))


def _update(first: int, n: int, removed: range = range(0), orig: bytes = b"\x02\x5e\x00\x00\x00\x01",
            slow_path: SlowPath | None = None) -> ForwardingUpdate:
    """Clients first .. first + n - 1 added, the clients numbered in `removed` removed."""
    clients = {(Mac((first + k).to_bytes(6, "big")), 0): ClientRoute(Mac(orig)) for k in range(n)}
    clients.update({(Mac(k.to_bytes(6, "big")), 0): None for k in removed})
    return ForwardingUpdate(origs={Mac(orig): OrigRoute(Mac(orig), "e0", first & 0xFF)}, clients=clients,
                            local_clients={(Mac(b"\x02" * 6), 0): True}, own_ttvn=first & 0xFF, slow_path=slow_path)


def _tables_equal(a: ForwardingTable, b: ForwardingTable) -> bool:
    return (a.origs, a.clients, a.local_clients, a.own_ttvn, a.slow_path) == \
        (b.origs, b.clients, b.local_clients, b.own_ttvn, b.slow_path)


def test_split_update_parts_make_the_same_table():
    whole, parted = ForwardingTable(), ForwardingTable()
    for update in (_update(1000, 5000, slow_path=ARP_TO_HOST), _update(9000, 300, removed=range(1000, 1200)),
                   _update(20000, 10)):
        whole.apply(update)
        parts = list(split_update(update))
        assert all(len(p.origs) + len(p.clients) + len(p.local_clients) <= PART_ENTRIES for p in parts)
        assert all(len(encode(m.TableUpdate(p))) < MAX_MESSAGE // 4 for p in parts)
        for part in parts:
            parted.apply(part)
    assert _tables_equal(whole, parted) and len(whole.clients) == 5000 - 200 + 300 + 10
    assert parted.slow_path == ARP_TO_HOST
    snapshot = ForwardingTable()
    snapshot.apply(whole.snapshot())
    assert _tables_equal(snapshot, whole)


def test_every_message_kind_has_a_handler_on_its_side():
    """One typed message set: the worker handles every kind the control process sends,
    the control process every kind a worker sends; each survives the wire unchanged."""
    assert set(Worker.HANDLERS) == set(m.TO_WORKER)
    assert set(WorkerPool.HANDLERS) == set(m.FROM_WORKER)
    samples = [m.Configure(True, False), m.AddPort("e0", b"\x02" * 6, 1500, {"mtu": 1560}), m.RemovePort("e0"),
               m.SetPorts({"e0": (b"\x02" * 6, 1500)}, None, False), m.TableUpdate(_update(1, 3)), m.TableBegin(),
               m.TablePart(_update(1, 3)), m.TableEnd(), m.Report(), m.Stop(), m.SlowHost(b"x" * 60),
               m.SlowMesh("e0", b"y" * 60), m.Seen({(b"\x02" * 6, 0): 1.0}), m.Stats({"tx": 1}, {"e0": 0}, {}),
               m.Resync()]
    assert {type(s) for s in samples} == set(m.KINDS)
    for sample in samples:
        assert decode(encode(sample)) == sample and type(decode(encode(sample))) is type(sample)
    with pytest.raises(BadMessage):
        decode(encode(m.Stop()), m.FROM_WORKER)  # not a message for the control process
    with pytest.raises(BadMessage):
        decode(pickle.dumps((len(m.KINDS), b"")))  # no such kind
    with pytest.raises(BadMessage):
        decode(pickle.dumps((m.KINDS.index(m.SlowMesh), "e0")))  # a field missing


def test_a_message_cut_short_is_reported_and_the_channel_goes_on():
    ours, theirs = pair()
    reader = Channel(theirs, m.TO_WORKER)
    try:
        ours.sock.send(encode(m.TableUpdate(_update(1, 6500))))  # over MAX_MESSAGE: the receive cuts it
        ours.send_data(encode(m.Report()))
        with pytest.raises(BadMessage):
            reader.recv()
        assert reader.recv() == (m.Report(), [])
    finally:
        ours.close()
        reader.close()


def test_outbox_never_waits_for_a_worker_that_does_not_read():
    """Table updates for a worker that does not read: each put returns at once; once more
    is waiting than TABLE_BACKLOG, the updates are given up and the whole table queued as
    a stream; when the worker reads again, it ends with the sender's table."""

    async def scenario():
        loop = asyncio.get_running_loop()
        ours, theirs = pair()
        reader = Channel(theirs, m.TO_WORKER)
        table = ForwardingTable()
        stale = []

        def stream():
            yield encode(m.TableBegin())
            for part in split_update(table.snapshot()):
                yield encode(m.TablePart(part))
            yield encode(m.TableEnd())

        def on_stale():
            stale.append(outbox.backlog())
            outbox.drop_tables()
            outbox.put_stream(stream())

        outbox = Outbox(loop, ours, on_stale)
        slowest = 0.0
        for i in range(200):  # about 2.4 MB of updates, none read yet
            first = 100_000 + i * 500
            update = _update(first, 300, removed=range(first - 500, first - 450))
            table.apply(update)
            for data in [encode(m.TableUpdate(part)) for part in split_update(update)]:
                start = time.monotonic()
                outbox.put(data, table=True)
                slowest = max(slowest, time.monotonic() - start)
        assert stale, "the updates beyond the backlog were kept"
        mirror, new = ForwardingTable(), None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the worker reads again
            got = reader.recv()
            if got is None:
                if not outbox.items and _tables_equal(mirror, table):
                    break
                await asyncio.sleep(0.001)
                continue
            message = got[0]
            if type(message) is m.TableUpdate:
                mirror.apply(message.update)
            elif type(message) is m.TableBegin:
                new = ForwardingTable()
            elif type(message) is m.TablePart:
                new.apply(message.update)
            elif type(message) is m.TableEnd:
                mirror, new = new, None
        outbox.close()
        ours.close()
        reader.close()
        return slowest, stale, mirror

    slowest, stale, mirror = asyncio.run(scenario())
    print(f"slowest put {slowest * 1000:.1f} ms; resyncs {len(stale)}")
    assert slowest < 0.01, f"a put took {slowest * 1000:.0f} ms"
    assert len(mirror.clients) == 200 * 300 - 199 * 50 and mirror.own_ttvn == (100_000 + 199 * 500) & 0xFF


def test_worker_asks_for_the_whole_table_after_an_undecodable_message():
    """A real worker process that receives a message cut short (longer than a receive
    takes) stays up, counts it and asks for the whole table; given it, its table is the
    sender's."""
    ours, theirs = pair()
    proc = subprocess.Popen(worker_command(theirs.fileno()), pass_fds=[theirs.fileno()], stderr=subprocess.PIPE)
    theirs.close()
    tap_stand_in, w = os.pipe()  # never readable: the worker's TAP queue stays quiet
    try:
        ours.send_data(encode(m.Configure(gro=True, csum_offload=True)), [tap_stand_in])
        ours.sock.send(encode(m.TableUpdate(_update(1, 6500))))  # over MAX_MESSAGE
        assert _next_message(ours) == m.Resync()
        table = ForwardingTable()
        table.apply(_update(1, 6500))
        ours.sock.setblocking(True)
        ours.send_data(encode(m.TableBegin()))
        for part in split_update(table.snapshot()):
            ours.send_data(encode(m.TablePart(part)))
        ours.send_data(encode(m.TableEnd()))
        ours.send_data(encode(m.Report()))
        stats = _next_message(ours, m.Stats)
        ours.send_data(encode(m.Stop()))
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ours.close()
        for fd in (tap_stand_in, w):
            os.close(fd)
    assert code == 0, proc.stderr.read().decode(errors="replace")
    assert stats.counters["channel_bad_messages"] == 1
    assert stats.table == {"origs": 1, "clients": 6500, "local_clients": 1}


def _next_message(channel: Channel, kind: type | None = None, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([channel.fileno()], [], [], 0.1)
        got = channel.recv()
        if got is not None and (kind is None or type(got[0]) is kind):
            return got[0]
    raise AssertionError(f"no {kind.__name__ if kind else 'message'} from the worker within {timeout} s")
