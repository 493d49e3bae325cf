"""Gateway mode in a lab of batmand nodes (real namespaces): a client c between two gateways
g1 and g2 that announce different bandwidths over links of different quality,

         g1   10mbit/2mbit announced, the better link (IV: TQ 255; V: 30 Mbit/s)
        /
       c      client: dnsmasq runs on each gateway's bat0, udhcpc on c's bat0
        \\
         g2   100mbit/20mbit announced, the worse link (IV: c's hop penalty 100 on it,
              TQ 155; V: 100 Mbit/s, so that V's min(path, bandwidth) has a say)

and what the kernel does with them (gateway_client.c, mesh-interface.c): the client
selects the gateway its selection class predicts, `batmanctl gw`/`gwl` show it as batctl
does, its DHCP goes as UNICAST_4ADDR to that gateway alone (never as a BCAST) and the lease
comes from there; when the gateway goes away the client selects the other one, says so
(`batmanctl event`, the event hook) and leases from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from batmand.lab import Lab, from_dict
from batmand.wire import PacketType, Unicast4AddrSubtype
from tests.daemon.dhcp import (DhcpTimeout, capture, dhcp_lease, dhcp_server, dhcpv4_discover, dhcpv6_solicit,
                               send_raw)
from tests.daemon.labs import best_routes, prefix, tt_synced, wait_for

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root"),
    pytest.mark.skipif(shutil.which("dnsmasq") is None and not os.path.exists("/usr/sbin/dnsmasq"),
                       reason="dnsmasq is not installed (scripts/setup.sh installs dnsmasq-base)"),
]

INTERVAL_MS = 200
PURGE_MS = 3000  # a gateway that stopped is forgotten (and deselected) after this
RANGES = {"g1": ("10.77.0.150", "10.77.0.159"), "g2": ("10.77.0.160", "10.77.0.169")}
IV_BW = {"g1": "10mbit/2mbit", "g2": "100mbit/20mbit"}
IV_SHOWN = {"g1": "10.0/2.0", "g2": "100.0/20.0"}
HOP_PENALTY_TO_G2 = 100  # c's penalty on its link to g2: TQ 255 * (255 - 100) / 255 = 155
# IV's asymmetry penalty fills with the 64-OGM window: TQ near its end value after ~50 OGMs
TQ_RAMP_S = 64 * INTERVAL_MS / 1000 + 15
V_LINKS = {"g1": "30mbit", "g2": "100mbit"}
ROW_IV = re.compile(r"^([* ]) ([0-9a-f:]{17}) \(\s*(\d+)\) ([0-9a-f:]{17}) \[\s*(\S+)\]: (\d+\.\d)/(\d+\.\d) MBit$")
ROW_V = re.compile(r"^([* ]) ([0-9a-f:]{17}) \(\s*(\d+\.\d)\) ([0-9a-f:]{17}) \[\s*(\S+)\]: (\d+\.\d)/(\d+\.\d) MBit$")
HEADER_IV = "  Router            ( TQ) Next Hop          [outgoingIf]  Bandwidth"
HEADER_V = "  Router            ( throughput) Next Hop          [outgoingIf]  Bandwidth"
HOOK = """#!/bin/sh
# the event hook: one line per call, with what batmand put in the environment
echo "BATTYPE=$BATTYPE BATACTION=$BATACTION BATDATA=${BATDATA-<unset>} INTERFACE=$INTERFACE ACTION=$ACTION" >> %s
"""


def _lab(algo: str = "BATMAN_IV", hook: Path | None = None, **client) -> Lab:
    topo = from_dict({
        "lab": {"mtu": 1560},
        "batmand": {"orig_interval_ms": INTERVAL_MS, "purge_timeout_ms": PURGE_MS, "routing_algo": algo},
        "node": [{"name": "c"}, {"name": "g1"}, {"name": "g2"}],
        "link": [{"a": "c", "b": "g1"}, {"a": "c", "b": "g2"}],
    }, name="gateways")
    c = topo.nodes["c"].batmand
    if algo == "BATMAN_IV":
        c["hardif"] = {"e-g2": {"hop_penalty": HOP_PENALTY_TO_G2}}
    else:  # both ends of a link agree on its throughput
        c["hardif"] = {f"e-{g}": {"throughput_override": rate} for g, rate in V_LINKS.items()}
        for g, rate in V_LINKS.items():
            topo.nodes[g].batmand["hardif"] = {"e-c": {"throughput_override": rate}}
    if hook is not None:
        c["event_hook"] = str(hook)
    c.update(client)
    return Lab(topo, prefix())


def _converged(lab: Lab) -> dict[str, str]:
    """Every node routes to every other and holds every other's bat0 MAC from its TT (so
    that a DHCP server's unicast reply finds its way); the originators."""
    origs = {n: lab.originator(n) for n in lab.nodes}
    wait_for(lambda: all(set(best_routes(lab, n)) >= {origs[m] for m in lab.nodes if m != n} for n in lab.nodes),
             timeout=30, step=0.2)
    wait_for(lambda: all(tt_synced(lab, n, m) for n in lab.nodes for m in lab.nodes if m != n), timeout=30, step=0.2)
    return origs


def _ctl(lab: Lab, node: str, *args: str) -> str:
    out = lab.batmanctl(node, *args)
    assert out.returncode == 0, f"{node}: batmanctl {' '.join(args)}: {out.returncode}\n{out.stdout}{out.stderr}"
    return out.stdout


def gateways(lab: Lab, node: str) -> dict[str, dict]:
    """`batmanctl gwl --json` of a node: gateway originator -> row."""
    out = lab.batmanctl(node, "gwl", "--json")
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    return {r["orig_address"]: r for r in json.loads(out.stdout)}


def selected(lab: Lab, node: str) -> str | None:
    best = [o for o, r in gateways(lab, node).items() if r.get("best")]
    assert len(best) <= 1, f"more than one selected gateway: {gateways(lab, node)}"
    return best[0] if best else None


def _gwl_rows(text: str, algo: str) -> list[tuple]:
    row = ROW_IV if algo == "BATMAN_IV" else ROW_V
    return [m.groups() for line in text.splitlines() if (m := row.match(line))]


class EventWatch:
    """`batmanctl event ARGS` running in a node while the block runs; its lines as they come."""

    def __init__(self, lab: Lab, node: str, *args: str) -> None:
        # unbuffered: read line by line as it prints them (batctl event does not flush a pipe either)
        self.proc = lab.spawn(node, lab.batmanctl_command(node, "event", *args), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # Ctrl-C ends it
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        self.stderr = self.proc.stderr.read()

    def __enter__(self) -> "EventWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _text_events(lines: list[str]) -> list[tuple[str, str | None]]:
    """("add", MAC) / ("change", MAC) / ("del", None) from `bat0: uevent gw ACTION [MAC]` lines;
    the settings' notifications (batctl's `bat0: set mesh:` and its `* key value` lines, sent
    when the test changes gw_mode) are skipped."""
    out = []
    for line in lines:
        if re.fullmatch(r"bat0(?: \(\S+\))?: set (?:mesh|hardif|vlan):|\* \S+ .*", line):
            continue
        m = re.fullmatch(r"bat0: uevent gw (add|change|del)(?: ([0-9a-f:]{17}))?", line)
        assert m, f"unexpected event line {line!r}"
        out.append((m[1], m[2]))
    return out


def _json_events(lines: list[str]) -> list[tuple[str, str | None]]:
    out = []
    for line in lines:
        event = json.loads(line)
        if event.get("kind") in ("set_mesh", "set_hardif"):  # the settings' notifications
            continue
        assert (event["meshif"], event["type"]) == ("bat0", "gw"), event
        out.append((event["action"], event.get("data") or None))
    return out


def _hook_events(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        env = dict(word.split("=", 1) for word in line.split())
        assert (env["BATTYPE"], env["INTERFACE"], env["ACTION"]) == ("gw", "bat0", "change"), line
        data = None if env["BATDATA"] == "<unset>" else env["BATDATA"]
        if env["BATACTION"] == "del":
            assert data is None, f"BATDATA is set for a del: {line}"
        out.append((env["BATACTION"], data))
    return out


def _failover_events(events, first: str, second: str) -> bool:
    """add first, then the switch as the kernel reports it: change, or del and add."""
    return events in ([("add", first), ("change", second)], [("add", first), ("del", None), ("add", second)])


def _in_range(ip: str, gateway: str) -> bool:
    first, last = (int(a.rsplit(".", 1)[1]) for a in RANGES[gateway])
    return ip.startswith("10.77.0.") and first <= int(ip.rsplit(".", 1)[1]) <= last


def _assert_dhcp_went_to(cap, lab: Lab, origs: dict, gateway: str) -> None:
    """What c sent: DHCP to servers as UNICAST_4ADDR (subtype P_DATA, 1) from c to `gateway`'s
    originator on the link to it only, and never a BCAST with DHCP in it, either way."""
    sent = cap.select(outgoing=True, dhcp=True)
    summary = cap.dhcp_summary()
    assert sent, f"c sent no DHCP into the mesh:\n{summary}"
    for f in sent:
        assert f.dhcp_to_server, f"c sent a DHCP reply:\n{summary}"
        assert f.packet_type == PacketType.UNICAST_4ADDR, f"DHCP left c as {f.packet_type:#x}, not 0x42:\n{summary}"
        assert f.ifname == f"e-{gateway}" and str(f.packet.dest) == origs[gateway], summary
        assert str(f.packet.src) == origs["c"] and f.packet.subtype == Unicast4AddrSubtype.DATA, summary
    assert not cap.select(packet_type=PacketType.BCAST, dhcp=True), f"a BCAST carried DHCP:\n{summary}"


# --- the main story (IV) -------------------------------------------------------------------------


def test_client_selects_by_tq_leases_there_and_fails_over(tmp_path):
    events_log = tmp_path / "events.log"
    hook = tmp_path / "hook.sh"
    hook.write_text(HOOK % events_log)
    hook.chmod(0o755)
    lab = _lab(hook=hook)
    with lab:
        lab.start()
        origs = _converged(lab)
        c_ns = lab.ns("c")

        # servers announce their bandwidth (batctl's grammar), as `batmanctl gw` shows
        for g in ("g1", "g2"):
            _ctl(lab, g, "gw", "server", IV_BW[g])
            assert _ctl(lab, g, "gw").strip() == f"server (announced bw: {IV_SHOWN[g]} MBit)"
        assert _ctl(lab, "c", "gw").strip() == "off"

        # c lists both (a node lists the gateways it hears whatever its mode) and selects none
        def listed():
            rows = gateways(lab, "c")
            return (set(rows) == {origs["g1"], origs["g2"]} and rows[origs["g1"]]["tq"] >= 250
                    and rows[origs["g2"]]["tq"] >= 140 and rows)
        rows, _ = wait_for(listed, timeout=TQ_RAMP_S, step=0.2)
        assert not any(r["best"] for r in rows.values())
        for g, (down, up) in {"g1": (100, 20), "g2": (1000, 200)}.items():
            assert (rows[origs[g]]["bandwidth_down"], rows[origs[g]]["bandwidth_up"]) == (down, up), rows
        # the premise of the prediction: g1 is the better path by far
        assert rows[origs["g1"]]["tq"] - rows[origs["g2"]]["tq"] >= 60, rows

        # with gateway mode off, c's DHCP is broadcast like anything else (the capture sees it)
        with capture(c_ns, ["e-g1", "e-g2"]) as cap:
            send_raw(c_ns, "bat0", dhcpv4_discover(lab.mesh_mac("c")))
            wait_for(lambda: {f.ifname for f in cap.select(outgoing=True, packet_type=PacketType.BCAST, dhcp=True)}
                     == {"e-g1", "e-g2"}, timeout=5, step=0.05)

        with dhcp_server(lab, "g1", *RANGES["g1"], tmp_path) as s1, \
                dhcp_server(lab, "g2", *RANGES["g2"], tmp_path) as s2, \
                EventWatch(lab, "c") as text_events, EventWatch(lab, "c", "--json") as json_events:
            time.sleep(1.5)  # both watchers connected before anything happens
            _ctl(lab, "c", "gw", "client")
            assert _ctl(lab, "c", "gw").strip() == "client (selection class: 20)"
            # class 20 (the default): the best TQ, g1
            wait_for(lambda: selected(lab, "c") == origs["g1"], timeout=10, step=0.2)

            # batmanctl gwl as batctl prints it
            text = _ctl(lab, "c", "gwl")
            lines = text.splitlines()
            assert lines[0].startswith("[B.A.T.M.A.N. adv") and lines[1] == HEADER_IV, text
            parsed = {r[1]: r for r in _gwl_rows(text, "BATMAN_IV")}
            assert len(lines) == 4 and set(parsed) == {origs["g1"], origs["g2"]}, text
            for g in ("g1", "g2"):
                best, _, tq, router, ifname, down, up = parsed[origs[g]]
                assert (best, router, ifname, f"{down}/{up}") == ("*" if g == "g1" else " ", origs[g], f"e-{g}",
                                                                  IV_SHOWN[g]), text
            assert int(parsed[origs["g1"]][2]) > int(parsed[origs["g2"]][2])
            headless = _ctl(lab, "c", "gwl", "-H").splitlines()
            assert len(headless) == 2 and all(ROW_IV.match(line) for line in headless), headless
            assert {r[1] for r in _gwl_rows(_ctl(lab, "c", "gateways"), "BATMAN_IV")} == set(parsed)
            rows = gateways(lab, "c")
            for g in ("g1", "g2"):
                r = rows[origs[g]]
                assert set(r) >= {"orig_address", "router", "hard_ifname", "hard_ifindex", "bandwidth_down",
                                  "bandwidth_up", "tq", "best"}, r
                assert "throughput" not in r and r["router"] == origs[g] and r["hard_ifname"] == f"e-{g}", r
                ifindex = json.loads(lab.exec("c", ["ip", "-j", "link", "show", f"e-{g}"], check=True).stdout)[0]
                assert r["hard_ifindex"] == ifindex["ifindex"], r
                assert r["best"] is (g == "g1"), r

            # the lease: from g1 only, its DHCP as UNICAST_4ADDR to g1; with the broadcast flag
            # g1's reply is a broadcast, which its server mode sends as UNICAST to c
            with capture(c_ns, ["e-g1", "e-g2"]) as cap:
                lease = dhcp_lease(lab, "c", tmp_path, broadcast=True)
            assert lease.server_id == lab.address("g1") and _in_range(lease.ip, "g1"), lease
            assert not s2.messages("DISCOVER"), f"g2 heard c's DHCP: {s2.messages()}"
            _assert_dhcp_went_to(cap, lab, origs, "g1")
            replies = cap.select(outgoing=False, dhcp=True)
            assert replies, cap.dhcp_summary()
            for f in replies:
                assert f.packet_type == PacketType.UNICAST and str(f.packet.dest) == origs["c"], cap.dhcp_summary()
                assert f.ifname == "e-g1", cap.dhcp_summary()
            wait_for(lambda: s1.leases() == {lab.mesh_mac("c"): lease.ip}, timeout=5)

            # DHCPv6 to servers (UDP 547) goes the same way
            with capture(c_ns, ["e-g1", "e-g2"]) as cap:
                send_raw(c_ns, "bat0", dhcpv6_solicit(lab.mesh_mac("c")))
                wait_for(lambda: cap.select(outgoing=True, dhcp=True), timeout=5, step=0.05)
                time.sleep(0.3)
            _assert_dhcp_went_to(cap, lab, origs, "g1")
            assert {f.udp for f in cap.select(outgoing=True, dhcp=True)} == {(546, 547)}

            # g1 goes away: c forgets it (purge timeout) and selects g2
            lab.stop_daemons(["g1"])
            wait_for(lambda: set(gateways(lab, "c")) == {origs["g2"]}, timeout=PURGE_MS / 1000 + 15, step=0.2)
            wait_for(lambda: selected(lab, "c") == origs["g2"], timeout=10, step=0.2)
            assert _ctl(lab, "c", "gwl", "-H").startswith("* " + origs["g2"])

            # and says so: the event stream, its JSON form and the hook agree with the kernel's uevents
            wait_for(lambda: _failover_events(_text_events(text_events.lines), origs["g1"], origs["g2"]),
                     timeout=5, step=0.1)
            wait_for(lambda: _failover_events(_json_events(json_events.lines), origs["g1"], origs["g2"]),
                     timeout=5, step=0.1)
            wait_for(lambda: _failover_events(_hook_events(events_log), origs["g1"], origs["g2"]),
                     timeout=5, step=0.1)
            assert _text_events(text_events.lines) == _json_events(json_events.lines) == _hook_events(events_log)

            # a new lease, from g2
            with capture(c_ns, ["e-g1", "e-g2"]) as cap:
                lease2 = dhcp_lease(lab, "c", tmp_path)
            assert lease2.server_id == lab.address("g2") and _in_range(lease2.ip, "g2"), lease2
            _assert_dhcp_went_to(cap, lab, origs, "g2")
            wait_for(lambda: s2.leases() == {lab.mesh_mac("c"): lease2.ip}, timeout=5)
        assert "Traceback" not in text_events.stderr + json_events.stderr, text_events.stderr + json_events.stderr


# --- the selection classes ------------------------------------------------------------------------


def test_iv_selection_class_1_weighs_bandwidth_and_a_new_class_reselects(tmp_path):
    """Class 1 takes tq² · bandwidth: g2 (155² · 1000 > 255² · 100) despite its TQ; a class
    set later (batctl gw client 20) makes the client choose again: g1, the best TQ."""
    with _lab() as lab:
        lab.start()
        origs = _converged(lab)
        for g in ("g1", "g2"):
            _ctl(lab, g, "gw", "server", IV_BW[g])
        wait_for(lambda: (rows := gateways(lab, "c")) and set(rows) == {origs["g1"], origs["g2"]}
                 and rows[origs["g1"]]["tq"] >= 250 and rows[origs["g2"]]["tq"] >= 140, timeout=TQ_RAMP_S, step=0.2)
        _ctl(lab, "c", "gw", "client", "1")
        assert _ctl(lab, "c", "gw").strip() == "client (selection class: 1)"
        wait_for(lambda: selected(lab, "c") == origs["g2"], timeout=10, step=0.2)
        time.sleep(2)  # class 1 does not switch by itself (the kernel re-elects only on fast or late switch)
        assert selected(lab, "c") == origs["g2"]
        with dhcp_server(lab, "g1", *RANGES["g1"], tmp_path), dhcp_server(lab, "g2", *RANGES["g2"], tmp_path):
            assert dhcp_lease(lab, "c", tmp_path).server_id == lab.address("g2")
            _ctl(lab, "c", "gw", "client", "20")
            assert _ctl(lab, "c", "gw").strip() == "client (selection class: 20)"
            wait_for(lambda: selected(lab, "c") == origs["g1"], timeout=10, step=0.2)
            assert dhcp_lease(lab, "c", tmp_path).server_id == lab.address("g1")
        _ctl(lab, "c", "gw", "off")
        assert _ctl(lab, "c", "gw").strip() == "off"
        wait_for(lambda: selected(lab, "c") is None and len(gateways(lab, "c")) == 2, timeout=5, step=0.2)


def test_v_selects_by_the_smaller_of_path_throughput_and_announced_bandwidth(tmp_path):
    """V: min(path throughput, announced down). g1: min(30, 100) = 30, g2: min(100, 20) = 20:
    g1 (a path-only choice would take g2); then g2 announces 50: min(100, 50) = 50 beats 30 by
    more than the 5 Mbit/s class, so the client switches (a bandwidth-only choice would not)."""
    with _lab("BATMAN_V") as lab:
        lab.start()
        origs = _converged(lab)
        _ctl(lab, "g1", "gw", "server", "100mbit/20mbit")
        _ctl(lab, "g2", "gw", "server", "20mbit/4mbit")
        wait_for(lambda: (rows := gateways(lab, "c")) and set(rows) == {origs["g1"], origs["g2"]}
                 and rows[origs["g1"]]["throughput"] == 300 and rows[origs["g2"]]["throughput"] == 1000,
                 timeout=15, step=0.2)
        _ctl(lab, "c", "gw", "client")
        assert _ctl(lab, "c", "gw").strip() == "client (selection class: 5.0 MBit)"
        wait_for(lambda: selected(lab, "c") == origs["g1"], timeout=10, step=0.2)
        text = _ctl(lab, "c", "gwl")
        assert text.splitlines()[1] == HEADER_V, text
        parsed = {r[1]: r for r in _gwl_rows(text, "BATMAN_V")}
        assert parsed[origs["g1"]][:3] == ("*", origs["g1"], "30.0") and parsed[origs["g1"]][5:] == ("100.0", "20.0")
        assert parsed[origs["g2"]][:3] == (" ", origs["g2"], "100.0") and parsed[origs["g2"]][5:] == ("20.0", "4.0")
        assert "tq" not in gateways(lab, "c")[origs["g1"]]
        with dhcp_server(lab, "g1", *RANGES["g1"], tmp_path), dhcp_server(lab, "g2", *RANGES["g2"], tmp_path):
            with capture(lab.ns("c"), ["e-g1", "e-g2"]) as cap:
                lease = dhcp_lease(lab, "c", tmp_path)
            assert lease.server_id == lab.address("g1") and _in_range(lease.ip, "g1"), lease
            _assert_dhcp_went_to(cap, lab, origs, "g1")
            _ctl(lab, "g2", "gw", "server", "50mbit")  # DOWN alone: UP stays 4mbit
            assert _ctl(lab, "g2", "gw").strip() == "server (announced bw: 50.0/4.0 MBit)"
            wait_for(lambda: selected(lab, "c") == origs["g2"], timeout=10, step=0.2)
            lease = dhcp_lease(lab, "c", tmp_path)
            assert lease.server_id == lab.address("g2") and _in_range(lease.ip, "g2"), lease


# --- without a gateway, and on a gateway ----------------------------------------------------------


def test_a_client_without_a_gateway_sends_no_dhcp(tmp_path):
    """Client mode with no gateway selected drops the host's DHCP (gateway_client.c: no
    gateway, no destination); a server that appears is selected and leases."""
    with _lab(gw_mode="client") as lab:
        lab.start()
        origs = _converged(lab)
        assert _ctl(lab, "c", "gw").strip() == "client (selection class: 20)"
        assert gateways(lab, "c") == {}
        with dhcp_server(lab, "g1", *RANGES["g1"], tmp_path) as s1:
            with capture(lab.ns("c"), ["e-g1", "e-g2"]) as cap:
                with pytest.raises(DhcpTimeout):
                    dhcp_lease(lab, "c", tmp_path, tries=2)
                send_raw(lab.ns("c"), "bat0", dhcpv6_solicit(lab.mesh_mac("c")))
                time.sleep(0.5)
            assert not cap.select(outgoing=True, dhcp=True), cap.dhcp_summary()
            assert not s1.messages("DISCOVER")
            _ctl(lab, "g1", "gw", "server")  # the default bandwidth: 10.0/2.0
            wait_for(lambda: selected(lab, "c") == origs["g1"], timeout=10, step=0.2)
            assert gateways(lab, "c")[origs["g1"]]["bandwidth_down"] == 100
            assert dhcp_lease(lab, "c", tmp_path).server_id == lab.address("g1")


def test_a_gateway_keeps_its_own_hosts_dhcp_out_of_the_mesh(tmp_path):
    """In server mode, the host's broadcast DHCP aimed at servers is dropped (mesh-interface.c:
    a gateway does not forward DHCP to servers); a node with gateway mode off still
    broadcasts it and leases from c's server."""
    with _lab() as lab:
        lab.start()
        _converged(lab)
        _ctl(lab, "g1", "gw", "server")
        with dhcp_server(lab, "c", "10.77.0.170", "10.77.0.179", tmp_path) as sc:
            with capture(lab.ns("g1"), ["e-c"]) as cap:
                with pytest.raises(DhcpTimeout):
                    dhcp_lease(lab, "g1", tmp_path, tries=2)
            assert not cap.select(outgoing=True, dhcp=True), cap.dhcp_summary()
            assert not [m for m in sc.messages("DISCOVER") if lab.mesh_mac("g1") in m], sc.messages()
            with capture(lab.ns("g2"), ["e-c"]) as cap:
                lease = dhcp_lease(lab, "g2", tmp_path)
            assert lease.server_id == lab.address("c"), lease
            assert cap.select(outgoing=True, packet_type=PacketType.BCAST, dhcp=True), cap.dhcp_summary()
