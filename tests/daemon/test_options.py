import pytest

from batmand.daemon.options import OptionsError, load


def test_defaults_are_the_kernels(tmp_path):
    opts = load(["-i", "eth0", "--config", str(_write(tmp_path, ""))])
    assert opts.meshif == "bat0" and opts.interfaces == ["eth0"]
    assert (opts.mesh.orig_interval_ms, opts.mesh.hop_penalty, opts.mesh.aggregation) == (1000, 30, True)
    assert opts.socket_path == "@batmand/bat0" and opts.state_directory == "/var/lib/batmand"


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
