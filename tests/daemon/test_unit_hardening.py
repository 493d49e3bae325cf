"""The systemd unit's hardening: its exposure score, no runtime directory shared between
instances, install-unit for a batmand that runs from a home directory, and the real daemon
between two namespaces under the unit's restrictions, which tests/daemon/unit_sandbox.py
applies without systemd (this machine's PID 1 is not systemd)."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from batmand.daemon.install import unit_text
from tests.daemon.labs import wait_for
from tests.netns import in_netns, ip, namespace

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "batmand@.service"
SANDBOX = str(Path(__file__).with_name("unit_sandbox.py"))
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, for python3-seccomp
BATMAND = [sys.executable, "-m", "batmand.daemon_main"]
BATMANCTL = [sys.executable, "-m", "batmand.cli.main"]
UNIT_CAPS = (1 << 12) | (1 << 13) | (1 << 39)  # CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF
MAX_EXPOSURE = 2.5


def exposure(unit: Path) -> float:
    out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True,
                         text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout)
    assert found, out.stdout + out.stderr
    return float(found.group(1))


def service_values(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def install_unit(tmp_path, env=None) -> tuple[Path, subprocess.CompletedProcess]:
    result = subprocess.run([*BATMAND, "install-unit", "--unit-dir", str(tmp_path / "units"),
                             "--config-dir", str(tmp_path / "etc")], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    return tmp_path / "units" / "batmand@.service", result


def test_exposure_is_at_most_2_5(tmp_path):
    """`systemd-analyze security --offline=true`, for the unit as shipped and as install-unit
    writes it for a batmand in a home directory (ProtectHome=read-only)."""
    for name, text in (("shipped", UNIT.read_text()), ("home", unit_text("/root/src/batmand/.venv/bin/batmand"))):
        unit = tmp_path / name / "batmand@.service"
        unit.parent.mkdir()
        unit.write_text(text)
        score = exposure(unit)
        print(f"{name}: exposure {score}")
        assert score <= MAX_EXPOSURE, name


def test_instances_share_no_runtime_directory():
    """systemd removes a RuntimeDirectory when its instance stops: a shared one took the other
    meshes' control sockets and locks with it."""
    text = UNIT.read_text()
    for directory in service_values(text, "RuntimeDirectory"):
        assert all("%i" in d for d in directory.split()), directory


def test_install_unit_for_a_batmand_in_a_home_directory(tmp_path):
    """A venv in a checkout under /root (what the README's setup makes): ProtectHome=yes would
    hide the program, so the unit gets ProtectHome=read-only and install-unit says so."""
    if not os.path.isdir("/root"):
        pytest.skip("no /root")
    home = Path(tempfile.mkdtemp(prefix="batmand-unit-test-", dir="/root"))
    try:
        (home / "batmand").symlink_to(Path(sys.executable).parent / "batmand")
        env = dict(os.environ, PATH=f"{home}:{os.environ['PATH']}")
        unit, result = install_unit(tmp_path, env)
        text = unit.read_text()
        assert f"ExecStart={home}/batmand -m %i" in text
        assert service_values(text, "ProtectHome") == ["read-only"]
        assert "ProtectHome=read-only" in result.stdout and str(home) in result.stdout
        verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        shutil.rmtree(home)


def test_home_is_hidden_unless_batmand_runs_from_there(tmp_path):
    """The script's #! interpreter counts, symlinks followed (a venv python -> ~/.pyenv)."""
    package = str(Path(__import__("batmand").__file__).resolve().parent)
    if package.startswith(("/root/", "/home/", "/run/user/")):
        pytest.skip(f"this batmand itself lives in a home directory ({package})")
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "batmand"
    script.write_text(f"#!{bin_dir}/python\nimport sys\n")
    (bin_dir / "python").symlink_to("/usr/bin/python3")
    assert service_values(unit_text(str(script)), "ProtectHome") == ["yes"]
    (bin_dir / "python").unlink()
    (bin_dir / "python").symlink_to("/root/.pyenv/versions/3.12.1/bin/python3.12")
    assert service_values(unit_text(str(script)), "ProtectHome") == ["read-only"]


# --- the daemon under the unit's restrictions ----------------------------------------------

def sandboxed(unit: Path, state_dir: Path, argv: list[str], cgroup: str | None = None) -> list[str]:
    """argv under the unit's restrictions; --kill: a call outside SystemCallFilter kills the
    process instead of failing with EPERM, so that none can go unnoticed."""
    cgroup_args = ["--pids-cgroup", cgroup] if cgroup else []
    return [SYSTEM_PYTHON, SANDBOX, str(unit), "--state-dir", str(state_dir), "--kill", *cgroup_args, "--", *argv]


def exec_start(unit: Path) -> str:
    return service_values(unit.read_text(), "ExecStart")[0].split()[0]


@pytest.fixture
def installed_unit(tmp_path):
    if not os.path.exists(SYSTEM_PYTHON) or subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"]).returncode:
        pytest.skip("needs Debian's python3-seccomp (scripts/setup.sh installs it)")
    unit, _ = install_unit(tmp_path)
    return unit


PROBE = textwrap.dedent("""
    import ctypes, errno, json, mmap, os, socket, sys
    def outcome(fn):
        try:
            fn()
            return "ok"
        except OSError as exc:
            return errno.errorcode[exc.errno]
    def unshare_net():
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000):
            raise OSError(ctypes.get_errno(), "unshare")
    status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
    print(json.dumps({
        "mmap_wx": outcome(lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC)),
        "mmap_rw": outcome(lambda: mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_READ)),
        "inet6": outcome(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
        "packet": outcome(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()),
        "unshare_net": outcome(unshare_net),
        "write_etc": outcome(lambda: open("/etc/batmand-sandbox-probe", "w")),
        "write_state": outcome(lambda: open(os.path.join(sys.argv[1], "probe"), "w").close()),
        "write_sys": outcome(lambda: open("/sys/class/net/lo/mtu", "w").write("1400")),
        "tun": outcome(lambda: os.close(os.open("/dev/net/tun", os.O_RDWR))),
        "dev": sorted(os.listdir("/dev")),
        "umask": oct(os.umask(0o22)),
        "cap_eff": int(status["CapEff"], 16), "no_new_privs": status["NoNewPrivs"], "seccomp": status["Seccomp"],
    }), flush=True)
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {0})  # @resources: outside the unit's SystemCallFilter
    """)


def test_sandbox_applies_the_unit(installed_unit, tmp_path):
    """The tool the next test relies on does restrict: each kind of restriction seen to bite."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    state = tmp_path / "state"
    with namespace() as ns:
        run = subprocess.run(in_netns(ns, sandboxed(installed_unit, state, [sys.executable, str(probe), str(state)])),
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        seen = json.loads(run.stdout)
        killed = subprocess.run(in_netns(ns, sandboxed(installed_unit, state,
                                                       [sys.executable, str(probe), str(state), "refused-call"])),
                                capture_output=True, text=True, timeout=60)
    assert seen == {"mmap_wx": "EPERM", "mmap_rw": "ok", "inet6": "EAFNOSUPPORT", "packet": "ok",
                    "unshare_net": "EPERM", "write_etc": "EROFS", "write_state": "ok", "write_sys": "EROFS",
                    "tun": "ok", "umask": "0o77", "cap_eff": UNIT_CAPS, "no_new_privs": "1", "seccomp": "2",
                    "dev": ["fd", "full", "net", "null", "random", "shm", "stderr", "stdin", "stdout", "tty",
                            "urandom", "zero"]}
    assert killed.returncode == -signal.SIGSYS, killed.stdout + killed.stderr


def _pids_cgroup(name: str):
    """A v1 pids cgroup for TasksMax, or None where there is no such hierarchy."""
    top = Path("/sys/fs/cgroup/pids")
    if not (top / "cgroup.procs").exists():
        return None
    path = top / name
    path.mkdir()
    return path


def _tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(p) for p in children.read_text().split()] if children.exists() else []
    return [pid] + [p for kid in kids for p in _tree(kid)]


def _status(pid: int) -> dict:
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)


def test_daemon_runs_under_the_units_restrictions(installed_unit, tmp_path):
    """Two namespaces, one veth: both daemons (one worker in a, two in b) come up as the unit
    runs them (READY=1 to a notify socket that lies on a read-only file system for them), make
    bat0, exchange OGMs, carry pings both ways, reload and stop cleanly."""
    executable = exec_start(installed_unit)
    procs, logs, cgroups = {}, {}, {}
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(20)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="10000000")
    try:
        with namespace() as a, namespace() as b:
            ip("link", "add", "vA", "mtu", "1560", "type", "veth", "peer", "name", "vB", "mtu", "1560", netns=a)
            ip("link", "set", "vB", "netns", b, netns=a)
            for ns, ifname, workers in ((a, "vA", 1), (b, "vB", 2)):
                ip("link", "set", ifname, "up", netns=ns)
                state = tmp_path / f"state-{ifname}"
                argv = [executable, "-m", "bat0", "-i", ifname, "--state-dir", str(state), "--workers", str(workers),
                        "--set", "orig_interval_ms=200", "--set", "bridge_loop_avoidance=false"]
                logs[ns] = open(tmp_path / f"{ifname}.log", "w+")
                cgroups[ns] = _pids_cgroup(f"batmand-test-{os.getpid()}-{ifname}")  # TasksMax per instance
                procs[ns] = subprocess.Popen(in_netns(ns, sandboxed(installed_unit, state, argv,
                                                                     cgroups[ns] and cgroups[ns].name)),
                                             stdout=logs[ns], stderr=subprocess.STDOUT, text=True,
                                             env=env if ns == a else None)

            def ctl(ns, *args):
                return subprocess.run(in_netns(ns, [*BATMANCTL, *args]), capture_output=True, text=True, timeout=30)

            def running(ns):
                logs[ns].flush()
                assert procs[ns].poll() is None, Path(logs[ns].name).read_text()
                return True

            while "READY=1" not in notify.recv(4096).decode().split("\n"):  # a timeout raises
                pass
            for n, ns in enumerate((a, b), start=1):
                wait_for(lambda: running(ns) and ctl(ns, "if").returncode == 0, timeout=20)
                ip("addr", "add", f"10.99.0.{n}/24", "dev", "bat0", netns=ns)
                ip("link", "set", "bat0", "up", netns=ns)
            for ns, other in ((a, "10.99.0.2"), (b, "10.99.0.1")):
                wait_for(lambda: subprocess.run(in_netns(ns, ["ping", "-c", "1", "-W", "1", other]),
                                                capture_output=True).returncode == 0, timeout=20)
            for ns in (a, b):
                originators = json.loads(ctl(ns, "o", "--json").stdout)
                assert len(originators) == 1 and originators[0]["best"]
                # the kernel path (the default) works under the unit too: programs, maps and
                # the passage (rtnetlink, ethtool ioctls), and it carried the pings
                kernel = json.loads(ctl(ns, "dp", "--json").stdout)["kernel_forward"]
                assert kernel["error"] is None and kernel["deliver"] == "on" and kernel["send"] == "on", kernel
                assert kernel["rx"] > 0 and kernel["tx"] > 0, kernel
            for ns, workers in ((a, 1), (b, 2)):
                daemon = procs[ns].pid  # ip netns exec and the sandbox exec in place
                tree = _tree(daemon)
                assert len(tree) == 1 + workers, tree  # the workers started under the restrictions
                for pid in tree:
                    status = _status(pid)
                    assert int(status["CapEff"], 16) == UNIT_CAPS and status["Seccomp"] == "2", pid
                tasks = sum(len(os.listdir(f"/proc/{pid}/task")) for pid in tree)
                pss = sum(int(re.search(r"^Pss:\s+(\d+)", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.M).group(1))
                          for pid in tree)
                cgroup = cgroups[ns]
                print(f"{workers} workers: {tasks} tasks, {pss // 1024} MiB PSS" + (
                    f", pids.current {(cgroup / 'pids.current').read_text().strip()} of pids.max "
                    f"{(cgroup / 'pids.max').read_text().strip()}" if cgroup else ""))
            procs[a].send_signal(signal.SIGHUP)
            wait_for(lambda: "configuration reloaded" in (tmp_path / "vA.log").read_text(), timeout=10)
            assert ctl(a, "if").stdout.split() == ["vA:", "active"]
            for ns in (a, b):
                procs[ns].send_signal(signal.SIGTERM)
                assert procs[ns].wait(timeout=15) == 0, (tmp_path / "vA.log").read_text()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs.values():
            log.close()
        notify.close()
        for cgroup in cgroups.values():
            if cgroup:
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
    for ifname in ("vA", "vB"):
        log = (tmp_path / f"{ifname}.log").read_text()
        assert "bat0 down" in log and "Traceback" not in log and "ERROR" not in log, log
        assert list((tmp_path / f"state-{ifname}").iterdir()), "no state saved"
