"""Creating and destroying a mesh interface (batctl interface create|destroy): where the
kernel makes a batadv link, we bring a batmand for that mesh up or down.

When systemd manages this network namespace and has the batmand@.service unit, the mesh is
the unit instance batmand@MESHIF; otherwise batmanctl starts the daemon itself in the
background (its own session, its log in LOG_DIR) and stops it through the control socket.
The routing algorithm of `batctl ra ALGO` (the kernel's module parameter: the default of the
next mesh interface) is kept in SELECTED_ALGO_FILE, one for the host as the parameter is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

from batmand.core.algorithm import ALGORITHMS

from .client import Client, ControlError, NoDaemon, socket_path

RUN_DIR = "/run/batmand"
LOG_DIR = RUN_DIR
SELECTED_ALGO_FILE = os.path.join(RUN_DIR, "routing_algo")
DEFAULT_ALGO = "BATMAN_IV"
UNIT = "batmand@{}.service"
START_TIMEOUT = 20.0  # seconds for a new daemon's control socket to answer
STOP_TIMEOUT = 20.0


class MeshError(ControlError):
    """interface create/destroy failed; the message is the reason batctl would print."""


def available_algorithms() -> list[str]:
    return sorted(ALGORITHMS)


def selected_algorithm() -> str:
    try:
        with open(SELECTED_ALGO_FILE) as f:
            name = f.read().strip()
    except OSError:
        return DEFAULT_ALGO
    return name if name in ALGORITHMS else DEFAULT_ALGO


def select_algorithm(name: str) -> None:
    if name not in ALGORITHMS:
        raise MeshError(f"unknown routing algorithm: {name} (available: {', '.join(available_algorithms())})")
    os.makedirs(RUN_DIR, mode=0o755, exist_ok=True)
    tmp = SELECTED_ALGO_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write(name + "\n")
    os.replace(tmp, SELECTED_ALGO_FILE)


def _netns_id() -> str:
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return "0"


def log_path(meshif: str) -> str:
    """One log per mesh interface and network namespace (labs run a bat0 in each)."""
    return os.path.join(LOG_DIR, f"{meshif}.{_netns_id()}.log")


def systemd_manages_this_namespace() -> bool:
    """systemd is PID 1, this is its network namespace, and the unit is installed: a unit
    started from a lab's namespace would run in the host's."""
    if not os.path.isdir("/run/systemd/system") or shutil.which("systemctl") is None:
        return False
    try:
        if os.stat("/proc/self/ns/net").st_ino != os.stat("/proc/1/ns/net").st_ino:
            return False
    except OSError:
        return False
    probe = subprocess.run(["systemctl", "cat", UNIT.format("probe")], capture_output=True, text=True)
    return probe.returncode == 0


def is_running(meshif: str, socket: str | None = None) -> bool:
    """Something answers on the mesh's control socket (a reset or a slow answer counts: the
    daemon is there, starting or going)."""
    try:
        Client(socket_path(meshif, socket), meshif, timeout=3.0).request("mesh_info")
    except NoDaemon:
        return False
    except ControlError:
        return True
    return True


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _log_tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read().strip().splitlines()
    except OSError:
        return ""
    return " / ".join(text[-lines:])


def create(meshif: str, algo: str | None, socket: str | None = None) -> None:
    """Bring up a batmand for `meshif` (with `algo`, else the selected algorithm)."""
    algo = algo or selected_algorithm()
    if algo not in ALGORITHMS:
        raise MeshError(f"Invalid argument (unknown routing algorithm {algo}; "
                        f"available: {', '.join(available_algorithms())})")
    if is_running(meshif, socket) or os.path.exists(f"/sys/class/net/{meshif}"):
        raise MeshError("File exists")
    if socket is None and systemd_manages_this_namespace():
        _systemd_start(meshif, algo)
    else:
        _background_start(meshif, algo, socket)


def destroy(meshif: str, socket: str | None = None) -> None:
    if not is_running(meshif, socket):
        raise MeshError("No such device")
    if socket is None and systemd_manages_this_namespace() and _unit_active(meshif):
        subprocess.run(["systemctl", "stop", UNIT.format(meshif)], check=False)
        _drop_in(meshif, None)
    else:
        try:
            Client(socket_path(meshif, socket), meshif).request("shutdown")
        except ControlError:
            pass  # it went down before the answer: the wait below tells

    if not _wait(lambda: not is_running(meshif, socket), STOP_TIMEOUT):
        raise MeshError("Device or resource busy (batmand did not stop)")
    remove_logs(meshif)  # gone with the interface, as nothing of a kernel's batX stays


def remove_logs(meshif: str) -> None:
    """The background daemon's log files of this mesh interface and network namespace."""
    log = log_path(meshif)
    for path in (log, log + ".1", log + ".stderr"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _background_start(meshif: str, algo: str, socket: str | None) -> None:
    os.makedirs(LOG_DIR, mode=0o755, exist_ok=True)
    log = log_path(meshif)
    argv = [sys.executable, "-m", "batmand.daemon_main", "-m", meshif, "--routing-algo", algo, "--log-file", log]
    if socket:
        argv += ["--control-socket", socket]
    # the log rotates (--log-file); stderr only gets what escapes logging, e.g. a crash
    with open(log + ".stderr", "wb") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(argv, stdin=devnull, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)

    def up() -> bool:
        if proc.poll() is not None:
            return True
        return is_running(meshif, socket)

    _wait(up, START_TIMEOUT)
    if proc.poll() is not None:
        why = _log_tail(log + ".stderr") or _log_tail(log)
        raise MeshError(f"batmand exited with status {proc.returncode}: {why} (log: {log})")
    if not is_running(meshif, socket):
        proc.terminate()
        raise MeshError(f"Timer expired (batmand did not answer within {START_TIMEOUT:.0f} s; log: {log})")


def _unit_active(meshif: str) -> bool:
    return subprocess.run(["systemctl", "is-active", "--quiet", UNIT.format(meshif)]).returncode == 0


def _batmand_executable() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "batmand")
    return here if os.access(here, os.X_OK) else (shutil.which("batmand") or "/usr/local/bin/batmand")


def _drop_in(meshif: str, algo: str | None) -> None:
    """The routing algorithm of `interface create ra ALGO` for the unit instance: a runtime
    drop-in (gone at reboot, as the kernel's interface is) with the unit's command line plus
    --routing-algo, which wins over the configuration file; None removes it."""
    path = f"/run/systemd/system/{UNIT.format(meshif)}.d/batctl-create.conf"
    if algo is None:
        if os.path.exists(path):
            os.unlink(path)
            subprocess.run(["systemctl", "daemon-reload"], check=False)
        return
    config = f"/etc/batmand/{meshif}.toml"
    command = [_batmand_executable(), "-m", "%i"] + (["--config", config] if os.path.exists(config) else [])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"[Service]\nExecStart=\nExecStart={' '.join(command)} --routing-algo {algo}\n")
    subprocess.run(["systemctl", "daemon-reload"], check=False)


def _systemd_start(meshif: str, algo: str) -> None:
    _drop_in(meshif, algo)
    result = subprocess.run(["systemctl", "start", UNIT.format(meshif)], capture_output=True, text=True)
    if result.returncode != 0:
        raise MeshError(f"systemctl start {UNIT.format(meshif)} failed: {result.stderr.strip()}")
    if not _wait(lambda: is_running(meshif), START_TIMEOUT):
        raise MeshError(f"Timer expired ({UNIT.format(meshif)} did not answer within {START_TIMEOUT:.0f} s)")
