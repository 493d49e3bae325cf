"""batctl's grammar in batmanctl (batmand/cli/grammar.py): global options, the selectors and
scopes, batctl's errors and usage; and the pieces around it that need no daemon: the event
lines, td -c, the selected routing algorithm, install-batctl."""

import os

import pytest

from batmand.cli import event, grammar, install_batctl, meshes, tcpdump
from batmand.cli.commands import UsageError
from batmand.cli.main import main


def parse(*argv, meshes_of=None):
    return grammar.parse(list(argv), hardif_mesh=lambda ifname, inv: (meshes_of or {}).get(ifname))


def test_no_selector_finds_global_and_mesh_commands():
    inv = parse("o", "-H")
    assert (inv.command.name, inv.meshif, inv.rest) == ("originators", "bat0", ["-H"])
    assert parse("event").command.scope == grammar.GLOBAL
    assert parse("tp", "02:00:00:00:00:01").command.name == "throughputmeter"


def test_meshif_selector_and_its_vid():
    inv = parse("meshif", "bat1", "orig_interval", "5000")
    assert (inv.meshif, inv.command.name, inv.rest, inv.vid) == ("bat1", "orig_interval", ["5000"], None)
    inv = parse("meshif", "bat1", "vid", "0x10", "ap", "1")
    assert (inv.meshif, inv.vid, inv.command.subcommand, inv.rest) == ("bat1", 16, "vlan:ap_isolation", ["1"])
    assert parse("meshif", "bat0", "vid", "5", "vj").command.name == "vlan_json"


@pytest.mark.parametrize("argv,message", [
    (("meshif", "bat0", "event"), "no valid command or debug table/JSON specified: event"),  # global only
    (("meshif", "bat0", "ra"), "no valid command or debug table/JSON specified: ra"),
    (("meshif", "bat0", "vid", "5", "o"), "no valid command or debug table/JSON specified: o"),
    (("meshif", "bat0", "vid", "4096", "ap"), "too large vid (max 4095)"),
    (("meshif", "bat0", "vid", "x1", "ap"), "unparsable vid"),
    (("frobnicate",), "no valid command or debug table/JSON specified: frobnicate"),
    ((), "no command specified"),
    (("-m", "bat0", "-m", "bat1", "o"), "multiple mesh interfaces specified"),
    (("-q", "o"), "unrecognised option '-q'"),
    (("hardif", "nosuchif0", "hp"), "invalid hardif nosuchif0: No such device"),
    (("hardif", "lo", "hp"), "invalid hardif lo: Link has been severed"),  # exists, in no mesh
    (("vlan", "nosuchif0", "ap"), "invalid vlan device nosuchif0: No such device"),
    (("vlan", "lo", "ap"), "invalid vlan device lo: Invalid argument"),
])
def test_batctls_errors(argv, message):
    with pytest.raises(grammar.GrammarError) as error:
        parse(*argv)
    assert str(error.value) == message


def test_hardif_selector_takes_the_mesh_of_the_interface():
    inv = parse("hardif", "lo", "hp", "15", meshes_of={"lo": "bat7"})
    assert (inv.meshif, inv.hardif, inv.command.subcommand, inv.rest) == ("bat7", "lo", "hardif:hop_penalty", ["15"])
    # the same alias, another scope: hp of the mesh, hj of one interface vs all
    assert parse("hp").command.subcommand == "hop_penalty"
    assert parse("hardif", "lo", "hj", meshes_of={"lo": "bat0"}).command.name == "hardif_json"
    assert parse("hj").command.name == "hardifs_json"
    # a bare interface name in a mesh: hardif scope (batctl eth0 hp)
    inv = parse("lo", "et", meshes_of={"lo": "bat0"})
    assert (inv.hardif, inv.command.name) == ("lo", "elp_interval")
    with pytest.raises(grammar.GrammarError):  # elp_interval is not a mesh setting
        parse("et")


def test_a_command_name_is_never_taken_for_an_interface():
    assert parse("o").command.name == "originators"  # even if a netdev "o" existed


def test_minus_m_is_deprecated_under_batctls_name(capsys):
    assert main(["-m", "bat0", "meshif", "bat0", "nosuch"], prog="batctl") == 1
    err = capsys.readouterr().err
    assert err.startswith("Error - no valid command or debug table/JSON specified: nosuch\nUsage: batctl [options]")
    inv = parse("-m", "bat3", "o")
    assert inv.meshif == "bat3" and inv.warnings == [
        "Warning - option -m was deprecated and will be removed in the future"]


def test_usage_lists_every_visible_command_with_its_prefixes():
    text = grammar.usage("batctl")
    assert text.startswith("Usage: batctl [options] command|debug table|debug json [parameters]\noptions:\n")
    assert " \tmeshif <netdev> aggregation|ag             [0|1]             \tdisplay or modify aggregation setting\n" \
        in text
    assert " \tvlan <vdev> ap_isolation|ap                [0|1]" in text
    assert " \tmeshif <netdev> vid <vid> ap_isolation|ap  [0|1]" in text
    assert " \thardif <netdev> throughput_override|to     [mbit]" in text
    assert " \tevent|e                                    " in text
    assert "multicast_mode" not in text  # hidden, as in batctl
    for command in grammar.COMMANDS:
        if not command.hidden:
            assert f"{command.name}|{command.abbr}" in text or command.name in text


def test_every_batctl_command_has_an_implementation_or_a_reason(capsys):
    """No batctl command falls through to argparse: each runs, or is refused saying why."""
    from batmand.cli.main import build_parser

    parser = build_parser()
    choices = parser._subparsers._group_actions[0].choices
    for command in grammar.COMMANDS:
        assert command.subcommand in choices, command


def test_version(capsys):
    assert main(["-v"], prog="batctl") == 0
    assert capsys.readouterr().out.startswith(f"batctl {grammar.BATCTL_VERSION} [batman-adv: batmand ")
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("batmanctl ")


@pytest.mark.parametrize("argv,why", [
    (("nc",), "network_coding: batman-adv removed network coding"),
    (("mark", "0x10/0xff"), "isolation_mark: batmand cannot see packet marks"),
    (("bisect_iv", "a.log"), "bisect_iv: it reads the kernel's batman IV debug log"),
])
def test_commands_that_mean_nothing_here_say_why(capsys, argv, why):
    assert main(list(argv)) == 1
    assert capsys.readouterr().err.startswith(f"Error - {why}")


def test_set_mesh_event_as_batctl_prints_it():
    record = {"kind": "set_mesh", "meshif": "bat0", "algo": "BATMAN_IV", "settings": {
        "aggregation": True, "bridge_loop_avoidance": False, "distributed_arp_table": True, "fragmentation": True,
        "gw_bandwidth_down": 50_000, "gw_bandwidth_up": 2_000, "gw_mode": "server", "gw_sel_class": 20,
        "hop_penalty": 15, "multicast_fanout": 16, "multicast_mode": True, "orig_interval_ms": 5000}}
    assert event.event_lines(record) == [
        "bat0: set mesh:", "* aggregated_ogms enabled", "* bridge_loop_avoidance disabled",
        "* distributed_arp_table enabled", "* fragmentation enabled", "* gw_bandwidth_down 50.0 MBit/s",
        "* gw_bandwidth_up 2.0 MBit/s", "* gw_mode server", "* gw_sel_class 20", "* hop_penalty 15",
        "* multicast_fanout 16", "* multicast_forceflood disabled", "* orig_interval 5000 ms"]
    record["algo"], record["settings"] = "BATMAN_V", {"gw_sel_class": 50}
    assert event.event_lines(record)[1:] == ["* gw_sel_class 5.0 MBit/s"]
    hardif = {"kind": "set_hardif", "meshif": "bat0", "hardif": "eth0",
              "settings": {"hop_penalty": 0, "elp_interval": 500, "throughput_override": 100_000}}
    assert event.event_lines(hardif) == ["bat0 (eth0): set hardif:", "* hop_penalty 0", "* elp_interval 500 ms",
                                         "* throughput_override 100.0 MBit/s"]
    uevent = {"meshif": "bat0", "type": "gw", "action": "add", "data": "02:00:00:00:00:01"}
    assert event.event_lines(uevent) == ["bat0: uevent gw add 02:00:00:00:00:01"]


def test_td_compat_filter():
    eth = bytes(6) + bytes(6)
    assert tcpdump.other_compat_version(eth + b"\x43\x05\x00\x0e" + bytes(20))
    assert not tcpdump.other_compat_version(eth + b"\x43\x05\x00\x0f" + bytes(20))
    assert tcpdump.other_compat_version(eth + b"\x81\x00\x00\x05" + b"\x43\x05\x00\x0e" + bytes(20))
    assert not tcpdump.other_compat_version(eth + b"\x08\x00\x45\x00" + bytes(20))  # not batman-adv


def test_selected_routing_algorithm(tmp_path, monkeypatch):
    monkeypatch.setattr(meshes, "RUN_DIR", str(tmp_path))
    monkeypatch.setattr(meshes, "SELECTED_ALGO_FILE", str(tmp_path / "routing_algo"))
    assert meshes.selected_algorithm() == "BATMAN_IV"
    meshes.select_algorithm("BATMAN_V")
    assert meshes.selected_algorithm() == "BATMAN_V"
    with pytest.raises(meshes.MeshError, match="unknown routing algorithm: BATMAN_X"):
        meshes.select_algorithm("BATMAN_X")
    assert meshes.selected_algorithm() == "BATMAN_V"  # unchanged


def test_install_batctl_leaves_a_real_batctl_alone(tmp_path, monkeypatch):
    real = tmp_path / "bin" / "batctl"
    real.parent.mkdir()
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    monkeypatch.setenv("PATH", f"{real.parent}:{os.environ['PATH']}")
    with pytest.raises(UsageError, match="a batctl is installed at"):
        install_batctl.install(str(tmp_path / "sbin"))
    assert not (tmp_path / "sbin").exists()
    monkeypatch.setenv("PATH", "/nonexistent")
    target = install_batctl.install(str(tmp_path / "sbin"))
    assert os.path.realpath(target) == os.path.realpath(install_batctl._ours())
    assert install_batctl.install(str(tmp_path / "sbin")) == target  # again: ours is replaced
