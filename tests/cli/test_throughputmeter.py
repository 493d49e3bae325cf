"""batmanctl tp's output: batctl 2023's result lines, error texts and the event line."""

from batmand.cli import main as cli_main
from batmand.cli.tables import event_line
from batmand.cli.throughputmeter import result_lines, throughput_text


def test_throughput_lines_as_batctl_prints_them():
    # batctl's man page example numbers: 61488160 bytes in 10010 ms
    assert result_lines({"result": 3, "test_time_ms": 10010, "total_bytes": 61488160}) == (
        ["Test duration 10010ms.", "Sent 61488160 Bytes.", "Throughput: 5.86 MB/s (49.14 Mbps)"], [], 0)
    assert throughput_text(0, 0) == "inf"
    assert throughput_text(1000, 1000) == "1000 Bytes/s (8000 Bps)"
    assert throughput_text(10 * 1024 + 512, 1000) == "10.50 KB/s (86.02 Kbps)"
    assert throughput_text(3 << 30, 1000) == "3.00 GB/s (26 Gbps)"  # batctl 2023's "%2.f"


def test_errors_and_cancel():
    assert result_lines({"result": 128}) == ([], ["Destination unreachable"], 1)
    assert result_lines({"result": 130}) == ([], ["Cannot run two test towards the same node"], 1)
    assert result_lines({"result": 133}) == ([], ["Too many ongoing sessions"], 1)
    assert result_lines({"result": 132}) == (["Unrecognized return value 132"], [], 1)
    out, err, status = result_lines({"result": 4, "test_time_ms": 0, "total_bytes": 0})
    assert out[0] == "CANCEL received: test aborted" and out[-1] == "Throughput: inf" and status == 0


def test_event_line():
    assert event_line({"type": "tp_meter", "cookie": 0x12ABCD, "result": 3}) == "tp_meter 0x0012abcd: complete"
    assert event_line({"type": "tp_meter", "cookie": 1, "result": 133}, "1.5: ") == \
        "1.5: tp_meter 0x00000001: Too many ongoing sessions"
    assert event_line({"type": "tp_meter", "cookie": 1, "result": 99}).endswith(": unknown")


def test_usage_and_bad_arguments(capsys):
    assert cli_main.main(["tp"]) == 1
    assert capsys.readouterr().err.startswith("Usage: batctl tp [parameters] <MAC>\nParameters:\n")
    assert cli_main.main(["throughputmeter", "-t", "abc", "02:00:00:00:00:01"]) == 1
    assert capsys.readouterr().err.startswith("Error - the supplied test duration is invalid: abc\nUsage:")
    assert cli_main.main(["tp", "-t", "4294967296", "02:00:00:00:00:01"]) == 1
    assert cli_main.main(["tp", "-n", "not-a-host"]) == 1
    assert capsys.readouterr().out == \
        "Error - the tp meter destination is not a mac address or bat-host name: not-a-host\n"


def test_destination_by_bat_hosts_name_or_mac(tmp_path, monkeypatch):
    from batmand.cli.throughputmeter import _destination

    (tmp_path / "bat-hosts").write_text("02:00:00:00:00:2a node42\n")
    monkeypatch.chdir(tmp_path)  # batctl also reads ./bat-hosts
    assert _destination("node42") == "02:00:00:00:00:2a"
    assert _destination("2:0:0:0:0:1") == "02:00:00:00:00:01"  # ether_aton's short groups
    assert _destination("node43") is None
