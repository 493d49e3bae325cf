"""Faults with traffic flowing: a node killed and restarted, a flapping link, an MTU change."""

import os
import signal
import subprocess
import time


from tests.daemon.labs import best_routes, make_lab, orig_mac, originators, stats, wait_for


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1])


def _daemon_pid(lab, node) -> int:
    return lab.pids[node]  # `ip netns exec` execs the daemon in place: this is its PID


def _heard_lately(lab, node, orig) -> bool:
    """`node` accepts new OGMs of `orig` (its entry is fresh, not left over from before)."""
    return any(r["orig_address"] == orig and r["best"] and r["last_seen_msecs"] < 400
               for r in originators(lab, node))


def test_kill_middle_node_reroute_and_rejoin():
    """ring5 (interval 250 ms): kill -9 n2, which carries n1's traffic to n3; n1 reroutes
    the other way round the ring. Then restart n2: it rejoins, at once thanks to the saved
    seqnos (kernel-style reset protection would otherwise hold it off for up to 30 s)."""
    with make_lab("ring5", orig_interval_ms=250, purge_timeout_ms=30_000) as lab:
        lab.start()
        n3, n2 = orig_mac(lab, "n3"), orig_mac(lab, "n2")
        wait_for(lambda: best_routes(lab, "n1").get(n3) == n2, timeout=40)
        time.sleep(1.5)  # the restarted daemon continues the seqnos it saved
        pinger = lab.spawn("n1", ["ping", "-i", "0.1", "-W", "1", lab.address("n3")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(1)
            os.kill(_daemon_pid(lab, "n2"), signal.SIGKILL)
            wait_for(lambda: not lab.daemon_running("n2"), timeout=10)
            t0 = time.monotonic()
            wait_for(lambda: best_routes(lab, "n1").get(n3) not in (None, n2), timeout=60)
            reroute = time.monotonic() - t0
            lab.start_daemons(["n2"])
            t1 = time.monotonic()
            wait_for(lambda: _heard_lately(lab, "n3", n2), timeout=60)
            rejoin = time.monotonic() - t1
        finally:
            pinger.send_signal(signal.SIGINT)  # ping prints its statistics on SIGINT
            out, _ = pinger.communicate(timeout=10)
        # the same without the saved seqnos: our peers (like kernel peers) hold off a
        # restarted originator whose seqno jumped, until 30 s after its previous reset
        os.kill(_daemon_pid(lab, "n2"), signal.SIGKILL)
        wait_for(lambda: not lab.daemon_running("n2"), timeout=10)
        lab.state_path("n2").unlink()
        lab.start_daemons(["n2"])
        t2 = time.monotonic()
        wait_for(lambda: _heard_lately(lab, "n3", n2), timeout=60)
        rejoin_fresh = time.monotonic() - t2
        summary = out.strip().splitlines()[-2] if out else ""
        print(f"ring5: rerouted around the killed node after {reroute:.1f} s; restarted node rejoined after "
              f"{rejoin:.1f} s with saved seqnos, {rejoin_fresh:.1f} s without; ping during the kill: {summary}")
        assert rejoin < 10
        assert lab.exec("n1", ["ping", "-c", "2", "-i", "0.2", "-W", "2", lab.address("n3")]).returncode == 0


def test_flapping_link_and_mtu_change():
    with make_lab("line3", orig_interval_ms=250) as lab:
        lab.start()
        n3 = orig_mac(lab, "n3")
        wait_for(lambda: n3 in best_routes(lab, "n1"), timeout=30)
        pids = {n: _daemon_pid(lab, n) for n in lab.nodes}
        rss_before = {n: _rss_kb(pid) for n, pid in pids.items()}
        for i in range(60):  # a minute of flapping, once a second
            lab.set_loss("n2", "n3", 100 if i % 2 == 0 else 0)
            time.sleep(1)
        lab.set_loss("n2", "n3", 0)
        assert all(lab.daemon_running(n) for n in lab.nodes)
        _, settle = wait_for(lambda: n3 in best_routes(lab, "n1") and
                             lab.exec("n1", ["ping", "-c", "1", "-W", "1", lab.address("n3")]).returncode == 0,
                             timeout=30)
        rss_after = {n: _rss_kb(pid) for n, pid in pids.items()}
        print(f"flapping: settled {settle:.1f} s after; RSS kB before {rss_before} after {rss_after}")
        assert all(rss_after[n] < rss_before[n] * 1.1 + 2048 for n in lab.nodes)
        # a smaller MTU on n1's link: 1500-byte frames are now fragmented by batmand
        lab.exec("n1", ["ip", "link", "set", "e-n2", "mtu", "1400"], check=True)
        lab.exec("n2", ["ip", "link", "set", "e-n1", "mtu", "1400"], check=True)
        time.sleep(2)
        before = stats(lab, "n1")["frag_tx"]
        big = lab.exec("n1", ["ping", "-c", "3", "-i", "0.2", "-s", "1400", "-M", "do", "-W", "2", lab.address("n3")])
        assert big.returncode == 0, big.stdout
        assert stats(lab, "n1")["frag_tx"] >= before + 6  # 3 requests, 2 fragments each
        assert stats(lab, "n2")["frag_rx"] >= 6 or stats(lab, "n2").get("frag_fwd", 0) >= 6
