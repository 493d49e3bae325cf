"""Bridge loop avoidance between batmand and the kernel's batman-adv (2022.3): the lab test
(tests/daemon/test_bla_lab.py) with one of the two backbone gateways a kernel VM.

Topology bla-kernel: g1 (batmand) - n3 (batmand) - k2 (kernel, BLA on, a LAN NIC bridged
with its bat0 in the guest); g1 and k2 are bridged into one LAN namespace with a LAN host
(tests/daemon/bla_lan.py), n3's host is on its bat0. OGMs every 250 ms, IPv6 off
everywhere, so only the tests' frames start the hold and the claims. One VM per routing
algorithm (B.A.T.M.A.N. IV and V), shared by that algorithm's tests. g1's primary MAC is
chosen so that with IV its group id is the higher one (the kernel adopts ours) and with V
the lower one (we adopt the kernel's).

The fixture sends the LAN host's first broadcast (both gateways become backbone gateways
of the LAN and hold multicast back) and waits until each passes the LAN's broadcasts again,
noting when. Then:
- test_hold_group_and_backbones: each gateway held multicast for its three wait periods
  (20-30 s, the kernel and we alike); both print the same group id (the higher CRC16 of
  the two primary MACs) in the `cl` and `bbt` headers; the kernel's `batctl bbt` lists g1,
  our `batmanctl bbt` lists k2, each with the CRC the other announces for its own claims.
- test_counters_count_claim_frames_alike (V only): in a quiet period of one ANNOUNCE
  period both count claim frames as the kernel does (rx and rx_bytes for each one injected,
  tx_dropped for each of the other's consumed, tx for the other's LOOPDETECTs let in).
- test_claims_broadcasts_and_pings: n3's host pings the LAN host until both list one claim
  for it (same client, backbone, VID; own on the claiming one alone) in `batctl clj` and
  `batmanctl cl --json`; a broadcast of n3's host reaches the LAN host once, through the
  claiming gateway only, and does not come back into the mesh; a broadcast of the LAN host
  reaches n3's host once (n3 drops the second copy) and comes back into the LAN through
  neither gateway; ping both ways without DUP!; the claim and the backbone CRCs agree, and
  so do batctl's and our `cl` text rows and the keys of the JSON rows (and their order).
- test_kernel_claim_frames_are_ours: every claim frame the kernel put on the LAN so far
  (at least its ANNOUNCEs, one at once and one per 10 s) is byte for byte the frame
  batmand.core.bla_frames builds from the same type, addresses, group and VID, names k2
  where the kernel puts its address, and both sides' ANNOUNCEs carry the CRCs of the claims
  their CLAIM frames made.
- test_loop_detection_finds_no_loop (V only): each side's first LOOPDETECT (about 60 s
  after its start) is let into the mesh by the other (n3 claims both loop-detect MACs), and
  neither side reports a loop (its kernel log, our log).
- test_takeover (IV only): the kernel claims n3's host (n3 pings k2's own host: that
  unicast through k2 makes it take the claim over), then k2's VM stops; g1 keeps leaving
  n3's host to it until k2's backbone entry times out (60 s without ANNOUNCEs, found at
  the next 10 s period), then claims it, and n3's broadcasts reach the LAN host again, once.
BLA's timers do not depend on the routing algorithm, so what takes long to wait for runs
with one of them only. When a lab goes down: no Traceback or ERROR in batmand's logs, no
loop reported by either side."""

from __future__ import annotations

import contextlib
import json
import re
import time

import pytest

from batmand.core.bla_frames import ANNOUNCE, ANNOUNCE_PREFIX, CLAIM, LOOPDETECT, REQUEST, TYPE_NAMES, UNCLAIM, \
    claim_frame, crc16, parse_claim
from batmand.lab import Lab, load
from batmand.wire import InnerFrame, Mac
from tests.core.test_bla_capture import announced_crc_mismatches
from tests.daemon.labs import prefix, stats, wait_for
from tests.daemon.bla_lan import LAN_HOST_IP, BlaLan, ClaimCapture, token
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge, ok

GATEWAYS = ("g1", "k2")
PERIOD, WAIT_PERIODS, BACKBONE_TIMEOUT = 10.0, 3, 60.0
LOOPDETECT_PERIODS, LOOPDETECT_TIMEOUT = 6, 3.0
# BLA's timers do not depend on the routing algorithm: what takes a while to wait for runs once
ONCE = "runs with one routing algorithm only (the takeover with IV, the quiet period and loop detection with V)"
# g1's primary MAC per algorithm: its CRC16 above the kernel's 0x9918 (02:ba:00:00:02:01) with
# IV, below it with V, so that each side once adopts the other's group
G1_MAC = {"BATMAN_IV": "02:b1:a0:00:01:01", "BATMAN_V": "02:b1:a0:01:01:01"}


class Run:
    """One algorithm's lab, LAN, captures and what the fixture measured."""

    def __init__(self, algo: str, lan: BlaLan, sniffer, claims: ClaimCapture) -> None:
        self.algo = algo
        self.lan = lan
        self.lab = lan.lab
        self.sniffer = sniffer
        self.claim_frames = claims
        self.orig = lan.orig
        self.n3_mac = self.lab.mesh_mac("n3")
        self.hold: dict[str, float] = {}
        self.report: dict = {}
        self.kernel_log = ""  # k2's dmesg, read before the VM stops

    def read_kernel_log(self) -> None:
        with contextlib.suppress(Exception):
            self.kernel_log = self.lab.exec("k2", ["dmesg"], timeout=20).stdout

    def other(self, g: str) -> str:
        return next(x for x in GATEWAYS if x != g)

    def entered_from(self, tok: bytes) -> set[str]:
        """The nodes whose BCAST carrying tok reached n3."""
        return self.lan.entered_from(self.sniffer, tok, "n3")

    def claims_of_n3(self, g: str) -> list[dict]:
        return [r for r in self.lan.claims(g) if r["bla_address"] == self.n3_mac]

    def claimed_by(self) -> str | None:
        return self.lan.claimed_by(self.n3_mac)


def _lab(algo: str) -> Lab:
    topo = load("bla-kernel")
    topo.batmand["routing_algo"] = algo
    if algo == "BATMAN_V":  # virtio-net reports no speed: both sides get the same figure
        for name, node in topo.nodes.items():
            node.batmand["hardif"] = {i: {"throughput_override": "100mbit"} for i in topo.hard_interfaces(name)}
    return Lab(topo, prefix())


@pytest.fixture(scope="module", params=["BATMAN_IV", "BATMAN_V"])
def run(request):
    algo = request.param
    lab = _lab(algo)
    require_kernel_nodes(len(lab.kernel_nodes))
    started = time.monotonic()
    with lab:
        lan = BlaLan(lab, list(GATEWAYS), macs={"g1": G1_MAC[algo]})
        lan.build()
        sniffer, claims = lan.sniff(), ClaimCapture(lan.lan, list(GATEWAYS))
        r = Run(algo, lan, sniffer, claims)
        try:
            r.report["booted_s"] = round(time.monotonic() - started, 1)
            r.report["converged_s"] = round(converge(lab, timeout=60), 1)
            entered, r.hold = lan.hold(sniffer, "n3")
            r.report["first_broadcast_entered_from"] = sorted(entered)
            r.report["hold_s"] = {g: round(v, 1) for g, v in r.hold.items()}
            yield r
        finally:
            sniffer.stop()
            claims.stop()
            logs = {n: lab.log_path(n).read_text(errors="replace") for n in lab.daemon_nodes}
            if lab.daemon_running("k2"):
                r.read_kernel_log()
            r.report["total_s"] = round(time.monotonic() - started, 1)
            print(f"\nINTEROP BLA {algo}: {json.dumps(r.report)}")
        for node, text in logs.items():
            assert "Traceback" not in text and "ERROR" not in text, f"{node}'s log:\n{text[-3000:]}"
        assert "Possible loop" not in r.kernel_log, r.kernel_log[-3000:]
        for node, text in logs.items():
            assert "Possible loop" not in text, f"{node}'s log:\n{text[-3000:]}"


def test_hold_group_and_backbones(run):
    lan = run.lan
    for g, held in run.hold.items():
        assert (WAIT_PERIODS - 1) * PERIOD - 2 < held < WAIT_PERIODS * PERIOD + 2, \
            f"{g} passed the LAN's multicast again {held:.1f} s after its first frame: {run.hold}"
    group = max(crc16(Mac(run.orig[g])) for g in GATEWAYS)
    groups = {g: lan.group(g) for g in GATEWAYS}
    assert groups == {"g1": group, "k2": group}, {g: f"{v:#06x}" for g, v in groups.items()}
    run.report["group"] = f"{group:#06x} ({'g1' if group == crc16(Mac(run.orig['g1'])) else 'k2'}'s)"
    # bbt: each lists the other (not itself); the CRC it holds for the other is the one the
    # other holds for its own entry
    for g in GATEWAYS:
        other = run.other(g)
        listed = lan.backbones(g)
        assert list(listed) == [run.orig[other]], f"{g}'s bbt: {listed}"
        own = {row["bla_backbone"]: row for row in lan.backbone_table(other)}[run.orig[other]]
        assert own.get("bla_own") is True and own["bla_vid"] == -1, own
        assert listed[run.orig[other]] == own["bla_crc"], (g, listed, own)
        # the other's ANNOUNCEs (every 10 s) keep its entry fresh
        seen = {row["bla_backbone"]: row for row in lan.backbone_table(g)}[run.orig[other]]
        assert "bla_own" not in seen and seen["last_seen_msecs"] < (PERIOD + 1.5) * 1000, seen


COUNTERS = ("tx", "tx_bytes", "tx_dropped", "rx", "rx_bytes")


def _counters(run: Run, g: str) -> dict[str, int]:
    """The soft interface's counters: the kernel's `batctl s`, our `batmanctl s --json`."""
    if run.lab.is_kernel(g):
        values = dict(re.findall(r"(\w+): (\d+)", ok(run.lab.exec(g, ["batctl", "s"]))))
    else:
        values = stats(run.lab, g)
    return {k: int(values.get(k, 0)) for k in COUNTERS}


def _quiet_window(run: Run, seconds: float) -> tuple[dict, dict, list]:
    """Both gateways' counters before and after `seconds` in which the test sends nothing,
    and the claim frames the LAN carried in between; again (three tries) when a claim
    frame crossed the LAN while the counters were being read."""
    margin = 0.3
    for _ in range(3):
        a0 = time.time()
        before = {g: _counters(run, g) for g in GATEWAYS}
        a1 = time.time()
        time.sleep(seconds)
        b0 = time.time()
        after = {g: _counters(run, g) for g in GATEWAYS}
        b1 = time.time()
        frames = [(t, g, raw) for t, g, raw in list(run.claim_frames.frames) if a0 - margin <= t <= b1 + margin]
        if all(a1 + margin < t < b0 - margin for t, _, _ in frames):
            return before, after, frames
    pytest.fail("claim frames crossed the LAN whenever the counters were read")


def test_counters_count_claim_frames_alike(run):
    """In a quiet period (one ANNOUNCE period and a bit), each side counts the claim frames
    as the kernel does: each one it injects (rx, 42 bytes), each of the other's it consumes
    (tx_dropped), each LOOPDETECT of the other's it lets into the mesh (tx)."""
    if run.algo != "BATMAN_V":
        pytest.skip(ONCE)
    before, after, frames = _quiet_window(run, PERIOD + 0.5)
    kinds = {g: [parse_claim(InnerFrame.decode(raw)).kind for _, x, raw in frames if x == g] for g in GATEWAYS}
    assert all(ANNOUNCE in kinds[g] for g in GATEWAYS), kinds  # the window covers a period of each
    for g in GATEWAYS:
        other = kinds[run.other(g)]
        loopdetects = other.count(LOOPDETECT)
        expected = {"tx": loopdetects, "tx_bytes": 42 * loopdetects, "tx_dropped": len(other) - loopdetects,
                    "rx": len(kinds[g]), "rx_bytes": 42 * len(kinds[g])}
        got = {k: after[g][k] - before[g][k] for k in COUNTERS}
        assert got == expected, (g, {x: [TYPE_NAMES[k] for k in v] for x, v in kinds.items()}, before, after)
    run.report["quiet_window_counters"] = {g: {k: after[g][k] - before[g][k] for k in COUNTERS} for g in GATEWAYS}


def test_claims_broadcasts_and_pings(run):
    lan, sniffer = run.lan, run.sniffer
    owner = lan.claim("n3")
    other = run.other(owner)
    run.report["claimed_by"] = owner

    # n3's host -> LAN: once, through the claiming gateway only, not back into the mesh
    tok = token("from-n3")
    lan.broadcast("n3", tok)
    time.sleep(1.5)
    where = sniffer.summary(tok)
    assert len(sniffer.copies(tok, "h:eth0")) == 1, f"the LAN host got n3's broadcast not once:\n{where}"
    assert len(sniffer.copies(tok, f"lan:p-{owner}")) == 1, where
    assert not sniffer.copies(tok, f"lan:p-{other}"), f"{other} put n3's broadcast on the LAN too:\n{where}"
    assert run.entered_from(tok) <= {"n3"}, f"n3's broadcast came back into the mesh:\n{where}"
    assert len(sniffer.copies(tok, "n3:bat0", outgoing=True)) == 1 and not sniffer.copies(tok, "n3:bat0"), where

    # LAN -> n3's host: through both gateways, once at n3's host, nothing back into the LAN
    dup_before = stats(run.lab, "n3").get("drop_bcast_duplicate_frame", 0)
    tok = token("from-lan")
    lan.broadcast("h", tok)
    time.sleep(1.5)
    where = sniffer.summary(tok)
    assert run.entered_from(tok) == set(GATEWAYS), where
    assert len(sniffer.copies(tok, "n3:bat0")) == 1, f"n3's host got the LAN's broadcast not once:\n{where}"
    assert stats(run.lab, "n3").get("drop_bcast_duplicate_frame", 0) > dup_before
    assert not sniffer.copies(tok, "g1:bat0"), f"g1 delivered k2's copy:\n{where}"
    for g in GATEWAYS:
        assert not sniffer.copies(tok, f"lan:p-{g}"), f"the LAN's broadcast came back through {g}:\n{where}"
    assert not sniffer.copies(tok, "h:eth0"), where

    # unicast both ways, each reply once
    for src, dst in (("n3", LAN_HOST_IP), ("h", run.lab.address("n3"))):
        res = lan.ping(src, dst, count=5)
        assert res.returncode == 0 and " 5 received" in res.stdout, f"ping {src} -> {dst}:\n{res.stdout}{res.stderr}"
        assert "DUP!" not in res.stdout, f"ping {src} -> {dst} got duplicates:\n{res.stdout}"

    # the tables: one claim, the same on both sides (n3's unicast may have moved it to the
    # other gateway meanwhile: a unicast through a gateway takes the claim over, both ways)
    was, (owner, _) = owner, wait_for(run.claimed_by, timeout=5, step=0.2)
    if owner != was:
        run.report["claimed_by"] += f", then {owner}"
    other = run.other(owner)
    for g in GATEWAYS:
        assert run.claims_of_n3(g) == [{**({"bla_own": True} if g == owner else {}), "bla_address": run.n3_mac,
                                        "bla_vid": -1, "bla_backbone": run.orig[owner],
                                        "bla_crc": crc16(Mac(run.n3_mac))}], (g, lan.claims(g))
    crcs = {g: {row["bla_backbone"]: row["bla_crc"] for row in lan.backbone_table(g)} for g in GATEWAYS}
    assert crcs["g1"] == crcs["k2"] == {run.orig[owner]: crc16(Mac(run.n3_mac)), run.orig[other]: 0}, crcs
    assert lan.backbones(owner) == {run.orig[other]: 0}
    assert lan.backbones(other) == {run.orig[owner]: crc16(Mac(run.n3_mac))}
    assert lan.group("g1") == lan.group("k2")
    # batctl's clj/bbj and our --json: the same keys in the same order (bla_own, when there, at
    # the same place)
    for dump in (lan.claims, lan.backbone_table):
        shapes = {g: {tuple(row) for row in dump(g)} for g in GATEWAYS}
        plain = {tuple(k for k in keys if k != "bla_own") for rows in shapes.values() for keys in rows}
        own_at = {keys.index("bla_own") for rows in shapes.values() for keys in rows if "bla_own" in keys}
        assert len(plain) == 1 and len(own_at) == 1, shapes
    # batctl's and our text rows say the same (the own mark [*] on the owner's only)
    rows = {g: [line for line in ok(run.lab.batmanctl(g, "cl", "-H")).splitlines() if run.n3_mac in line]
            for g in GATEWAYS}
    mark = {g: "[*]" if g == owner else "[ ]" for g in GATEWAYS}
    assert rows["k2"] == [rows["g1"][0].replace(mark["g1"], mark["k2"])] and len(rows["g1"]) == 1, rows


def _expected(kind: int, primary: str, frame) -> bool:
    """Who the kernel's frame of this kind says it is from: its primary MAC in the field the
    kernel puts it in (batadv_bla_send_claim)."""
    if kind in (CLAIM, LOOPDETECT):
        return str(frame.sender_hw) == primary
    return str(frame.eth_src) == primary


def test_kernel_claim_frames_are_ours(run):
    frames = run.claim_frames.sent_by("k2")
    ours = run.claim_frames.sent_by("g1")
    k2, group = run.orig["k2"], run.lan.group("k2")
    kinds: dict[str, int] = {}
    for raw in frames:
        f = parse_claim(InnerFrame.decode(raw))
        assert f is not None and f.depth == 0, raw.hex()
        name = TYPE_NAMES.get(f.kind, str(f.kind))
        kinds[name] = kinds.get(name, 0) + 1
        rebuilt = claim_frame(f.kind, eth_dst=f.eth_dst, eth_src=f.eth_src, sender_hw=f.sender_hw,
                              group=f.group, vid=0)
        assert raw == rebuilt, f"the kernel's {name}:\n {raw.hex()}\nours:\n {rebuilt.hex()}"
        assert _expected(f.kind, k2, f), f"the kernel's {name} does not name it: {raw.hex()}"
        assert f.group in (crc16(Mac(k2)), group), f"{name} in group {f.group:#06x}"
        if f.kind == ANNOUNCE:
            assert bytes(f.sender_hw)[:4] == ANNOUNCE_PREFIX and f.eth_dst.is_broadcast
        elif f.kind == CLAIM:
            assert str(f.eth_src) == run.n3_mac, f"the kernel claimed {f.eth_src}"
        elif f.kind == REQUEST:
            assert str(f.eth_dst) == str(f.sender_hw) == run.orig["g1"]
        else:
            assert f.kind in (UNCLAIM, LOOPDETECT), raw.hex()
    run.report["kernel_claim_frames"] = kinds
    run.report["our_claim_frames"] = len(ours)
    assert kinds.get("ANNOUNCE", 0) >= 2, kinds  # one at once, one per period
    assert ours, "g1 put no claim frame on the LAN"
    # both sides' ANNOUNCEs carry the CRCs of the claims their CLAIM frames made
    checked, wrong = announced_crc_mismatches([(t, parse_claim(InnerFrame.decode(raw)))
                                               for t, _, raw in list(run.claim_frames.frames)])
    assert not wrong and checked >= 4, (checked, wrong)


def test_loop_detection_finds_no_loop(run):
    """Each gateway's first LOOPDETECT (the sixth BLA period after its start) goes onto the
    LAN; the other one lets it into the mesh as a broadcast (it is no claim frame to it),
    so n3 (BLA on, no LAN) hears it and claims the loop-detect MAC, as any mesh source; its
    sender gets that broadcast from a backbone gateway and does not take it in: no loop is
    reported (checked on both sides when the lab goes down)."""
    if run.algo != "BATMAN_V":
        pytest.skip(ONCE)

    def loopdetects() -> dict[str, bytes] | None:
        found = {g: raw for t, g, raw in list(run.claim_frames.frames)
                 if parse_claim(InnerFrame.decode(raw)).kind == LOOPDETECT}
        return found if set(found) == set(GATEWAYS) else None

    found, _ = wait_for(loopdetects, timeout=LOOPDETECT_PERIODS * PERIOD + 10, step=0.5)
    time.sleep(LOOPDETECT_TIMEOUT + 0.5)
    macs = {g: str(parse_claim(InnerFrame.decode(raw)).eth_src) for g, raw in found.items()}
    f = parse_claim(InnerFrame.decode(found["k2"]))
    assert claim_frame(LOOPDETECT, eth_dst=f.eth_dst, eth_src=f.eth_src, sender_hw=f.sender_hw, group=f.group,
                       vid=0) == found["k2"] and str(f.sender_hw) == run.orig["k2"], found["k2"].hex()
    n3 = {r["bla_address"]: r for r in run.lan.claims("n3")}
    assert all(n3.get(mac, {}).get("bla_own") for mac in macs.values()), (macs, n3)
    run.report["loopdetect"] = macs


def test_takeover(run):
    if run.algo != "BATMAN_IV":
        pytest.skip(ONCE)
    lab, lan, sniffer = run.lab, run.lan, run.sniffer
    # the kernel claims n3's host: n3's unicast to k2's own host goes through k2, which takes
    # the claim over; so it is batmand that has to notice the kernel gateway is gone
    def k2_claims() -> bool:
        lan.ping("n3", lab.address("k2"))
        return run.claimed_by() == "k2"

    wait_for(k2_claims, timeout=20, step=0.5)
    owner, other = "k2", "g1"
    run.read_kernel_log()
    took = lan.takeover(sniffer, owner, "n3", timeout=BACKBONE_TIMEOUT + PERIOD + 15)
    run.report["takeover"] = f"{owner} stopped, {other} passes n3's broadcasts after {took:.1f} s"
    assert BACKBONE_TIMEOUT - PERIOD - 2 < took < BACKBONE_TIMEOUT + PERIOD + 4, took
    assert run.claims_of_n3(other) == [{"bla_own": True, "bla_address": run.n3_mac, "bla_vid": -1,
                                        "bla_backbone": run.orig[other], "bla_crc": crc16(Mac(run.n3_mac))}]
    assert lan.backbones(other) == {}
    tok = token("after")
    lan.broadcast("n3", tok)
    time.sleep(1)
    where = sniffer.summary(tok)
    assert len(sniffer.copies(tok, "h:eth0")) == 1 and len(sniffer.copies(tok, f"lan:p-{other}")) == 1, where
