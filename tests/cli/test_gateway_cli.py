"""batmanctl gw, gwl and event: batctl's grammar (cmd/gw_mode.c, parse_throughput) and
output lines, checked against what the kernel node's batctl printed in the gateway capture
(shared/reference/pcaps/batman_iv-2node-gateway-dhcp.commands.txt) and batctl's notes."""

from __future__ import annotations

import pytest

from batmand.cli import commands, tables
from batmand.cli.commands import UsageError, gw_settings
from tests.conftest import PCAP_DIR, SHARED


def _kernel_lines() -> list[str]:
    return (PCAP_DIR / "batman_iv-2node-gateway-dhcp.commands.txt").read_text().splitlines()


def test_gwl_and_gw_lines_are_the_kernels():
    kernel = _kernel_lines()
    row = {"orig_address": "02:00:00:bb:01:01", "tq": 55, "router": "02:00:00:bb:01:01", "hard_ifname": "eth0",
           "bandwidth_down": 500, "bandwidth_up": 100, "best": True}
    assert tables.gateway_line(row) in kernel
    assert tables.gateways_header("BATMAN_IV") in kernel
    assert tables.gw_mode_line({"gw_mode": "server", "gw_bandwidth_down": 500, "gw_bandwidth_up": 100}) in kernel
    assert tables.gw_mode_line({"gw_mode": "client", "gw_sel_class": 20, "algo": "BATMAN_IV"}) in kernel
    assert tables.gw_mode_line({"gw_mode": "off"}) in kernel
    # B.A.T.M.A.N. V: the throughput column, and the class in Mbit/s (batctl.md's sample)
    notes = (SHARED / "research" / "batctl.md").read_text()
    assert "client (selection class: 5.0 MBit)" in notes
    assert tables.gw_mode_line({"gw_mode": "client", "gw_sel_class": 50, "algo": "BATMAN_V"}) == \
        "client (selection class: 5.0 MBit)"
    v_row = dict(row, tq=None, throughput=1234, best=False)
    assert tables.gateway_line(v_row) == "  02:00:00:bb:01:01 (      123.4) 02:00:00:bb:01:01 [      eth0]: 50.0/10.0 MBit"
    assert tables.gateways_header("BATMAN_V") == \
        "  Router            ( throughput) Next Hop          [outgoingIf]  Bandwidth"


def test_gw_grammar_as_batctl():
    # the capture's command, in the kernel's attribute order; bandwidths in kbit/s
    assert gw_settings(["server", "50mbit/10mbit"], "BATMAN_IV") == [
        ["gw_bandwidth_down", 50_000], ["gw_bandwidth_up", 10_000], ["gw_mode", "server"]]
    # a plain number is kbit/s (batctl's parse_throughput), truncated to 100 kbit/s; no "/UP": up unchanged
    assert gw_settings(["server", "10050"], "BATMAN_IV") == [["gw_bandwidth_down", 10_000], ["gw_mode", "server"]]
    assert gw_settings(["server", "5MBIT/512kbit"], "BATMAN_V") == [
        ["gw_bandwidth_down", 5_000], ["gw_bandwidth_up", 500], ["gw_mode", "server"]]
    assert gw_settings(["server"], "BATMAN_IV") == [["gw_mode", "server"]]
    # client: a TQ class for IV (strtoul: hex and octal too), a throughput for V
    assert gw_settings(["client"], "BATMAN_IV") == [["gw_mode", "client"]]
    assert gw_settings(["client", "0x20"], "BATMAN_IV") == [["gw_mode", "client"], ["gw_sel_class", 32]]
    assert gw_settings(["client", "5mbit"], "BATMAN_V") == [["gw_mode", "client"], ["gw_sel_class", 50]]
    assert gw_settings(["client", "1500"], "BATMAN_V") == [["gw_mode", "client"], ["gw_sel_class", 15]]
    assert gw_settings(["off"], "BATMAN_IV") == [["gw_mode", "off"]]
    for words, message in ((["off", "1"], 'unexpected argument for mode "off": 1'),
                           (["client", "fast"], 'unexpected argument for mode "client": fast'),
                           (["client", "fast"], None),
                           (["server", "10 mbit"], "Invalid throughput speed for download gateway speed"),
                           (["server", "10mbit/x"], "Invalid throughput speed for upload gateway speed: x"),
                           (["server", "1gbit"], "Invalid throughput speed"),  # batctl knows kbit and mbit only
                           (["gateway"], "the supplied argument is invalid: gateway"),
                           (["client", "20", "x"], "incorrect number of arguments")):
        with pytest.raises(UsageError, match=None if message is None else message.replace("(", r"\(")):
            gw_settings(words, "BATMAN_IV")
    with pytest.raises(UsageError, match="too large"):
        gw_settings(["server", f"{2**32}mbit"], "BATMAN_IV")


def test_event_lines():
    add = {"meshif": "bat0", "type": "gw", "action": "add", "data": "02:00:00:bb:01:01", "time": 1.5}
    assert tables.event_line(add) == "bat0: uevent gw add 02:00:00:bb:01:01"
    assert tables.event_line({"meshif": "bat0", "type": "gw", "action": "del", "data": None}, "1.500000: ") == \
        "1.500000: bat0: uevent gw del"


def test_gw_is_a_command_of_its_own_not_a_plain_setting():
    assert "gw_mode" not in [s.name for s in commands.SETTINGS]
