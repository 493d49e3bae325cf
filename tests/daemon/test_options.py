"""The settings: the TOML file, --set, kernel defaults, and the schema every entry point
checks (ranges, rules between keys, live or restart)."""

import ast
import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import batmand
from batmand.core.config import (HARDIF_SETTINGS, MESH_SETTINGS, Choice, Flag, HardifConfig, Levels, ListOf,
                                 MeshConfig, Range, Text)
from batmand.daemon.install import sample_config
from batmand.daemon.options import DAEMON_SETTINGS, SETTINGS, Options, OptionsError, load
from tests.daemon.control_client import RawClient
from tests.daemon.daemons import start, stop, veth_namespace
from tests.daemon.labs import make_lab, orig_mac, originators, wait_for
from tests.netns import in_netns, ip


def test_defaults_are_the_kernels(tmp_path):
    opts = load(["-i", "eth0", "--config", str(_write(tmp_path, ""))])
    assert opts.meshif == "bat0" and opts.interfaces == ["eth0"]
    assert (opts.mesh.orig_interval_ms, opts.mesh.hop_penalty, opts.mesh.aggregation) == (1000, 30, True)
    assert opts.socket_path == "@batmand/bat0" and opts.state_directory == "/var/lib/batmand"
    # the features to come keep the kernel's defaults (batadv_meshif_init_late) for when they exist
    defaults = {k: MESH_SETTINGS[k].default for k in ("ap_isolation", "bonding", "distributed_arp_table",
                                                      "multicast_mode", "bridge_loop_avoidance", "loglevel")}
    assert defaults == {"ap_isolation": False, "bonding": False, "distributed_arp_table": True,
                        "multicast_mode": True, "bridge_loop_avoidance": True, "loglevel": "none"}


def _write(tmp_path, text):
    path = tmp_path / "bat0.toml"
    path.write_text(text)
    return path


def test_toml_then_command_line(tmp_path):
    path = _write(tmp_path, 'interfaces = ["eth1", "eth2"]\norig_interval_ms = 500\naggregation = false\n'
                            'control_socket = "/tmp/x.sock"\n')
    opts = load(["--config", str(path)])
    assert opts.interfaces == ["eth1", "eth2"] and opts.mesh.orig_interval_ms == 500
    assert opts.mesh.aggregation is False and opts.socket_path == "/tmp/x.sock"
    opts = load(["--config", str(path), "-i", "eth9", "--set", "orig_interval_ms=200", "--set", "aggregation=1"])
    assert opts.interfaces == ["eth9"] and opts.mesh.orig_interval_ms == 200 and opts.mesh.aggregation is True


@pytest.mark.parametrize("text,message", [
    ("nonsense_key = 1\n", "unknown setting 'nonsense_key'"),
    ("hop_penalty = \"lots\"\n", "expected an integer"),
    ("aggregation = \"maybe\"\n", "expected a boolean"),
    ("orig_interval_ms = \n", "bat0.toml"),
])
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    with pytest.raises(OptionsError, match=message):
        load(["--config", str(_write(tmp_path, text))])


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(OptionsError, match="cannot read"):
        load(["--config", str(tmp_path / "nope.toml")])
    with pytest.raises(OptionsError, match="KEY=VALUE"):
        load(["--config", str(_write(tmp_path, "")), "--set", "orig_interval_ms"])


def test_data_plane_settings():
    import os

    from batmand.daemon.options import OptionsError, load

    assert load([]).workers == (os.cpu_count() or 1)  # one worker per CPU by default
    assert load(["--workers", "auto"]).workers == (os.cpu_count() or 1)
    assert load(["--workers", "0"]).workers == 0
    opts = load(["--set", "gro=off", "--set", "tso=no", "--set", "csum_offload=false", "--set", "rx_ring=v3"])
    assert (opts.gro, opts.tso, opts.csum_offload, opts.rx_ring) == (False, False, False, "v3")
    defaults = load([])
    assert (defaults.gro, defaults.tso, defaults.csum_offload, defaults.rx_ring) == (True, True, True, "v2")
    for bad in (["--workers", "-1"], ["--workers", "65"], ["--workers", "many"], ["--set", "rx_ring=v4"],
                ["--set", "gro=maybe"]):
        with pytest.raises(OptionsError):
            load(bad)


# ---------------------------------------------------------------------------------------
# the settings schema: every key has a range, checked in one place for the TOML file,
# --set, the control socket and batmanctl

BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
NOT_SETTINGS = {"mesh", "hardif", "argv", "log_file"}  # Options fields the keys fill in
# out-of-range strings for keys whose range is a pattern (a TOML string and a --set word)
BAD_TEXT = {"meshif": "bat/0", "interfaces": ["an-interface-name-too-long"], "control_socket": "/" + "s" * 120,
            "state_dir": "relative/dir", "event_hook": "relative/hook", "control_group": "no-such-group-here", "mac": "01:00:5e:00:00:01",
            "alfred_socket": "relative/alfred.sock",
            "metrics_listen": "localhost:9140",
            "vlans": [5, 4095]}


def _all_settings():
    return [*SETTINGS.values(), *HARDIF_SETTINGS.values()]


def test_every_key_is_in_the_schema_with_a_range():
    """Adding a field to MeshConfig, HardifConfig or Options without a range fails here."""
    assert [f.name for f in dataclasses.fields(MeshConfig)] == list(MESH_SETTINGS)
    assert [f.name for f in dataclasses.fields(HardifConfig)] == list(HARDIF_SETTINGS)
    assert [f.name for f in dataclasses.fields(Options) if f.name not in NOT_SETTINGS] == list(DAEMON_SETTINGS)
    for s in _all_settings():
        assert isinstance(s.allowed, (Range, Flag, Choice, Levels, Text, ListOf)), s.name
        assert s.allowed.describe(), s.name
        if isinstance(s.default, bool):
            assert isinstance(s.allowed, Flag), s.name
        elif isinstance(s.default, int):
            assert isinstance(s.allowed, Range) and s.allowed.lo <= s.default <= s.allowed.hi, s.name
        assert s.allowed.parse(s.default) == s.default, s.name  # the default is allowed
        if isinstance(s.allowed, (Text, ListOf)):
            assert s.name in BAD_TEXT, f"{s.name}: add an out-of-range example to BAD_TEXT"


@pytest.mark.parametrize("value,message", [
    ("localhost:9140", "'localhost' is not an IP address (host names are not looked up)"),
    ("::1:9140", "write an IPv6 address in brackets"),
    ("[127.0.0.1]:9140", "only an IPv6 address goes in brackets"),
    ("127.0.0.1", "has no port 1..65535"),
    ("127.0.0.1:0", "has no port 1..65535"),
    (":65536", "has no port 1..65535"),
    ("1.2.3.4: 80", "is not allowed"),
])
def test_metrics_listen(tmp_path, value, message):
    assert load([]).metrics_listen == ""  # off by default
    for good in ("127.0.0.1:9140", "[::1]:9140", ":9140", "[fe80::1]:1", ""):
        assert load(["--set", f"metrics_listen={good}"]).metrics_listen == good
    with pytest.raises(OptionsError) as refused:
        load(["--config", str(_write(tmp_path, f"metrics_listen = {json.dumps(value)}\n"))])
    assert str(refused.value).startswith(f"{tmp_path / 'bat0.toml'}: metrics_listen: {value!r}")
    assert message in str(refused.value)


# ---------------------------------------------------------------------------------------
# no setting that does nothing: every key is read by the daemon, or refused until it is

PACKAGE = Path(batmand.__file__).parent
# not readers: what handles every key by name (the schema, the loader, the sample config),
# and what is not the daemon (batmanctl, the lab and the simulator)
NOT_READERS = ("core/config.py", "daemon/options.py", "daemon/install.py", "cli/", "lab/", "sim/")
# what a configuration is called where it is read: a MeshConfig `config` or `cfg` (or
# `options.mesh`), Options `options` or `opts`, an interface's HardifConfig `settings`;
# hard-interface keys also come from a dict by name
MESH_HOLDERS = {"config", "cfg"}
DAEMON_HOLDERS = {"options", "opts"}
HARDIF_HOLDERS = {"settings"}


def _name(node) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _holder(node) -> str | None:
    """The scope ("mesh", "daemon") of the configuration `node` names, if it names one."""
    if _name(node) in MESH_HOLDERS:
        return "mesh"
    if _name(node) in DAEMON_HOLDERS:
        return "daemon"
    if _name(node) in HARDIF_HOLDERS:
        return "hardif"
    if _name(node) == "mesh" and isinstance(node, ast.Attribute) and _name(node.value) in DAEMON_HOLDERS:
        return "mesh"
    return None


def _properties(path: Path, cls: str) -> dict[str, set[str]]:
    """The properties of a schema class -> what they read of `self` (purge_timeout reads
    purge_timeout_ms)."""
    body = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {f.name: {n.attr for n in ast.walk(f) if isinstance(n, ast.Attribute) and _name(n.value) == "self"}
            for f in body if isinstance(f, ast.FunctionDef) and any(_name(d) == "property" for d in f.decorator_list)}


def setting_readers() -> dict[tuple[str, str], list[str]]:
    """(scope, key) -> the places ("path:line") in batmand that read it."""
    properties = {"mesh": _properties(PACKAGE / "core" / "config.py", "MeshConfig"),
                  "daemon": _properties(PACKAGE / "daemon" / "options.py", "Options"), "hardif": {}}
    found = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith(NOT_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(getattr(node, "ctx", None), ast.Load):
                continue
            where = f"{module}:{node.lineno}"
            if isinstance(node, ast.Attribute) and (scope := _holder(node.value)):
                for key in {node.attr, *properties[scope].get(node.attr, ())}:
                    found[scope, key].append(where)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                found["hardif", node.slice.value].append(where)
    return found


def test_every_key_is_read_or_refused(tmp_path):
    """A key that nobody reads changes nothing, and users believe it: each key is either read
    in batmand (a static check: `config.<key>`, `cfg.<key>`, `options.mesh.<key>`,
    `options.<key>`, `opts.<key>`, directly or through a property of its class; a
    hard-interface key as `settings.<key>` or `...["<key>"]`; outside NOT_READERS) or refused by the loader
    because its feature does not exist yet, and a key that is read is not marked so.
    What it cannot see: whether the value read makes a difference (a read whose result is
    ignored passes), a read through getattr with a computed name or by a holder of another
    name (which fails here: call it config/cfg/options/opts), and dead code."""
    readers = setting_readers()
    keys = [*SETTINGS.values(), *HARDIF_SETTINGS.values()]
    accepted_unread = []
    for s in keys:
        if readers[s.scope, s.name]:
            continue
        key = f"hardif.eth0.{s.name}" if s.scope == "hardif" else s.name
        value = ",".join(map(str, s.default)) if isinstance(s.default, list) else s.default
        try:
            load(["--config", str(_write(tmp_path, "")), "--set", f"{key}={value}"])
        except OptionsError as exc:
            assert "batmand does not implement" in str(exc), exc
        else:
            accepted_unread.append(key)
    assert not accepted_unread, f"accepted, and read nowhere (a setting that changes nothing): {accepted_unread}"
    stale = {s.name: readers[s.scope, s.name] for s in keys if not s.implemented and readers[s.scope, s.name]}
    assert not stale, f"read, but refused as not implemented (remove feature= from the schema): {stale}"


def test_the_reader_check_sees_reads():
    """setting_readers finds the kinds of reads batmand has (so that the test above can fail)."""
    readers = setting_readers()
    for scope, key in (("mesh", "max_originators"), ("mesh", "fragmentation"), ("mesh", "purge_timeout_ms"),
                       ("daemon", "workers"), ("daemon", "state_dir"), ("hardif", "elp_interval")):
        assert readers[scope, key], (scope, key)
    assert not readers["daemon", "max_originators"] and not readers["mesh", "workers"]


@pytest.mark.parametrize("key", [s.name for s in SETTINGS.values() if not s.implemented])
def test_a_key_not_implemented_is_refused_whatever_its_value(tmp_path, key):
    s = SETTINGS[key]
    message = s.not_implemented()
    default = ("enabled" if s.default else "disabled") if isinstance(s.default, bool) else s.default
    assert message == f"{key}: batmand does not implement {s.spec.feature} yet (the kernel's default is {default})"
    values = [True, False] if isinstance(s.default, bool) else [s.default, "all"]
    for value in values:
        path = _write(tmp_path, f"{key} = {json.dumps(value)}\n")
        with pytest.raises(OptionsError) as refused:
            load(["--config", str(path)])
        assert str(refused.value) == f"{path}: {message}"
        with pytest.raises(OptionsError) as refused:
            load(["--config", str(_write(tmp_path, "")), "--set", f"{key}={value}"])
        assert str(refused.value) == f"command line: {message}"
    # the sample config names it apart, not as a key to uncomment
    sample = sample_config()
    assert f"# {key} =" not in sample
    assert f"#   {key}: {s.spec.help}" in sample.split("# Not implemented yet")[1].split("# per hard interface")[0]


def _bad_values(s) -> list:
    """Values just outside what a key allows."""
    a = s.allowed
    if isinstance(a, Range):
        return [a.lo - 1, a.hi + 1]
    if isinstance(a, Flag):
        return ["maybe"]
    if isinstance(a, (Choice, Levels)):
        return ["nonsense"]
    return [BAD_TEXT[s.name]]


def _expected(s, bad, label=None) -> str:
    label = label or s.name
    if not s.implemented:
        return s.not_implemented(label)
    return f"{label}: {bad} is out of range ({s.allowed.describe()})" if isinstance(s.allowed, Range) else f"{label}: "


@pytest.mark.parametrize("key", [s.name for s in SETTINGS.values()])
def test_every_range_is_enforced_in_the_file_and_on_the_command_line(tmp_path, key):
    s = SETTINGS[key]
    for bad in _bad_values(s):
        with pytest.raises(OptionsError) as refused:
            load(["--config", str(_write(tmp_path, f"{key} = {json.dumps(bad)}\n"))])
        assert str(refused.value).startswith(f"{tmp_path / 'bat0.toml'}: {_expected(s, bad)}"), refused.value
        if isinstance(bad, list):
            bad = ",".join(map(str, bad))
        with pytest.raises(OptionsError) as refused:
            load(["--config", str(_write(tmp_path, "")), "--set", f"{key}={bad}"])
        assert str(refused.value).startswith(f"command line: {_expected(s, bad)}"), refused.value
        if isinstance(s.allowed, Range):
            assert s.allowed.describe() in str(refused.value)


@pytest.mark.parametrize("key", list(HARDIF_SETTINGS))
def test_every_hard_interface_range_is_enforced(tmp_path, key):
    s = HARDIF_SETTINGS[key]
    for bad in (s.allowed.lo - 1, s.allowed.hi + 1, "lots"):
        label = f"hardif.eth0.{key}"
        with pytest.raises(OptionsError, match=f"bat0.toml: {label}: ") as refused:
            load(["--config", str(_write(tmp_path, f"[hardif.eth0]\n{key} = {json.dumps(bad)}\n"))])
        if bad != "lots":
            assert _expected(s, bad, label) in str(refused.value)
        with pytest.raises(OptionsError, match=f"command line: {label}: "):
            load(["--config", str(_write(tmp_path, "")), "--set", f"{label}={bad}"])


def test_rules_between_keys(tmp_path):
    # the jitter the issue found crashing the start, and the intervals it must fit into
    with pytest.raises(OptionsError, match=r"jitter_ms: 0 is out of range \(2\.\.250 ms\)"):
        load(["--set", "jitter_ms=0"])
    with pytest.raises(OptionsError, match=r"jitter_ms: 1 is out of range"):
        load(["--set", "jitter_ms=1"])
    with pytest.raises(OptionsError, match=r"orig_interval_ms: 50 is out of range \(60\.\.2147483647 ms: at least "
                                           r"twice jitter_ms = 30\)"):
        load(["--set", "jitter_ms=30", "--set", "orig_interval_ms=50"])
    with pytest.raises(OptionsError, match=r"hardif\.e0\.elp_interval: 50 is out of range \(60\.\."):
        load(["--set", "jitter_ms=30", "--set", "hardif.e0.elp_interval=50"])
    ok = load(["--set", "jitter_ms=30", "--set", "orig_interval_ms=60", "--set", "hardif.e0.elp_interval=60",
               "--set", "hardif.e0.throughput_override=100mbit"])
    assert (ok.mesh.jitter_ms, ok.mesh.orig_interval_ms, ok.hardif) == (
        30, 60, {"e0": {"elp_interval": 60, "throughput_override": 100_000}})


@pytest.fixture
def veth_ns():
    with veth_namespace() as ns:
        yield ns


@pytest.mark.parametrize("setting,message", [
    ("jitter_ms=0", "jitter_ms: 0 is out of range (2..250 ms)"),
    ("jitter_ms=1", "jitter_ms: 1 is out of range (2..250 ms)"),
    ("hop_penalty=300", "hop_penalty: 300 is out of range (0..255)"),
    ("orig_interval_ms=0", "orig_interval_ms: 0 is out of range (40..2147483647 ms)"),
])
def test_a_bad_value_is_refused_before_anything_is_created(veth_ns, tmp_path, setting, message):
    sock = tmp_path / "bat0.sock"
    proc = subprocess.Popen(in_netns(veth_ns, [*BATMAND, "-i", "e0", "--workers", "0", "--control-socket", str(sock),
                                               "--set", setting]), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        output = proc.communicate(timeout=15)[0]
    finally:
        if proc.poll() is None:  # it started (the bug): stop it
            proc.kill()
            proc.communicate()
    assert proc.returncode == 2, output
    assert message in output
    assert "bat0" not in ip("-j", "link", "show", netns=veth_ns)
    assert not sock.exists() and not list(tmp_path.iterdir())  # no socket, no lock, no state


@pytest.fixture
def daemon(veth_ns, tmp_path):
    """batmand on e0 with a control socket at a file path; yields (namespace, socket path, log path)."""
    sock, log_path = str(tmp_path / "bat0.sock"), tmp_path / "batmand.log"
    proc = start(veth_ns, ["-i", "e0", "--workers", "0", "--control-socket", sock, "--set", "orig_interval_ms=200"],
                 log_path)
    try:
        wait_for(lambda: os.path.exists(sock) and proc.poll() is None, timeout=15)
        yield veth_ns, sock, log_path
        assert proc.poll() is None, log_path.read_text()
    finally:
        stop(proc)


def test_every_range_is_enforced_over_the_control_socket(daemon):
    ns, sock, log_path = daemon
    with RawClient(sock) as ctl:
        def refused(cmd, **args) -> str:
            _, reply = ctl.request(cmd, **args)
            assert reply["ok"] is False, (cmd, args, reply)
            return reply["error"]

        for s in SETTINGS.values():
            if not s.implemented:  # neither read nor set: no value that pretends
                assert refused("get", setting=s.name) == s.not_implemented()
                assert refused("set", setting=s.name, value=s.default) == s.not_implemented()
                if s.spec.batctl:
                    assert refused("get", setting=s.spec.batctl[0]) == s.not_implemented(s.spec.batctl[0])
                continue
            _, got = ctl.request("get", setting=s.name)
            current = got["result"]
            if not s.live:
                assert "takes effect after a restart" in refused("set", setting=s.name, value=current), s.name
                continue
            if s.scope != "mesh":  # interfaces: if_add / if_del
                assert "if_add" in refused("set", setting=s.name, value=current)
                continue
            for bad in _bad_values(s):
                assert refused("set", setting=s.name, value=bad).startswith(_expected(s, bad)), (s.name, bad)
            _, reply = ctl.request("set", setting=s.name, value=current)  # a good value is taken
            assert reply == {"ok": True, "result": current}, (s.name, reply)
        # batctl's name for a key, and the rules between keys
        assert refused("set", setting="orig_interval", value=39) == "orig_interval_ms: 39 is out of range " \
                                                                    "(40..2147483647 ms)"
        assert ctl.request("set", setting="orig_interval", value=50)[1] == {"ok": True, "result": 50}
        assert refused("set", setting="jitter_ms", value=30).startswith(
            "jitter_ms: 30 is out of range (2..25 ms: orig_interval_ms is 50")
        assert ctl.request("set", setting="orig_interval_ms", value=200)[1]["ok"]
        # per hard interface
        for s in HARDIF_SETTINGS.values():
            for bad in (s.allowed.lo - 1, s.allowed.hi + 1):
                error = refused("hardif_set", ifname="e0", setting=s.name, value=bad)
                assert error == _expected(s, bad), error
            assert "expected" in refused("hardif_set", ifname="e0", setting=s.name, value="lots")
        assert ctl.request("hardif_set", ifname="e0", setting="hop_penalty", value=255)[1] == {"ok": True,
                                                                                               "result": 255}
        assert ctl.request("set", setting="jitter_ms", value=100)[1]["ok"]
        assert refused("hardif_set", ifname="e0", setting="elp_interval", value=150).startswith(
            "elp_interval: 150 is out of range (200..2147483647 ms: at least twice jitter_ms = 100)")
    assert "hop_penalty: 300" not in log_path.read_text()  # refused values are not logged as set


def test_sighup_applies_every_key_or_says_it_needs_a_restart(tmp_path):
    """n1 keeps one originator (max_originators = 1) of the two it hears; SIGHUP with a
    larger limit lets the other in. A changed restart-only key is logged as such."""
    with make_lab("line3", orig_interval_ms=200, workers=0) as lab:
        lab.topology.nodes["n1"].batmand["max_originators"] = 1
        lab.config_path("n1").write_text(_daemon_config(lab, "n1"))
        lab.start()
        far = {orig_mac(lab, "n2"), orig_mac(lab, "n3")}
        known = lambda: {r["orig_address"] for r in originators(lab, "n1")}  # noqa: E731
        wait_for(lambda: len(known()) == 1, timeout=20)
        time.sleep(1.0)  # five OGM intervals: the other one stays out
        assert len(known()) == 1
        lab.topology.nodes["n1"].batmand.update(max_originators=5, rx_ring="v3", control_max_request=4096)
        lab.config_path("n1").write_text(_daemon_config(lab, "n1"))
        os.kill(lab.pids["n1"], signal.SIGHUP)
        wait_for(lambda: known() == far, timeout=20)
        log = lab.log_path("n1").read_text()
        for key in ("rx_ring", "control_max_request"):
            assert f"{key} changed in the configuration; it takes effect after a restart" in log
        assert "max_originators changed to 5" in log
        with RawClient(lab.control_socket("n1"), netns=lab.ns("n1")) as ctl:
            assert ctl.request("get", setting="max_originators")[1] == {"ok": True, "result": 5}
            assert ctl.request("get", setting="rx_ring")[1] == {"ok": True, "result": "v2"}  # still the running one


def _daemon_config(lab, node) -> str:
    from batmand.lab.topology import dumps_toml

    return dumps_toml(lab.topology.daemon_config(node))
