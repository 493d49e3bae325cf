"""Sequence numbers kept across restarts.

Kernel peers drop an originator whose OGM seqno jumps backwards (or far ahead) for up to
30 s after a restart (reset protection), and broadcasts likewise. Continuing from the last
saved seqnos, plus a margin for what was sent after the last save, makes a restarted node
acceptable at once.

The seqnos belong to the node as its peers know it: the file is named by the mesh interface
and the originator address (the primary interface's MAC), and per-interface seqnos are kept
by interface MAC. Two nodes, in two network namespaces say, never share a file, and a node
whose interfaces got new MACs is a new originator to its peers and starts fresh."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

log = logging.getLogger("batmand.state")

SAVE_PERIOD = 10.0  # seconds between saves while running (flash wear on small boards)
MARGIN = 64  # seqnos added on restore beyond what may have been sent since the save
MAX_AGE = 3600.0  # older state is not restored (peers forgot us long ago) and is pruned
SUFFIX = ".state"


def state_path(state_dir: str, meshif: str, originator) -> str:
    return os.path.join(state_dir, f"{meshif}.{bytes(originator).hex()}{SUFFIX}")


META = ("saved_at", "originator", "orig_interval_ms")  # about the file; the rest is the core's


def snapshot(mesh) -> dict:
    return {"saved_at": time.time(), "originator": str(mesh.primary.mac),
            "orig_interval_ms": mesh.config.orig_interval_ms, **mesh.seqno_state()}


def save(path: str, mesh) -> None:
    """Write the state atomically and durably: a power cut leaves the old file or the new
    one, never a torn or empty one. Also removes this mesh interface's files too old to be
    restored (other originators' files, left by earlier MACs)."""
    directory = os.path.dirname(path) or "."
    tmp = path + ".tmp"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(snapshot(mesh), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        log.warning("cannot save seqno state to %s: %s", path, exc.strerror)
        return
    _prune(directory, os.path.basename(path))


def _prune(directory: str, keep: str) -> None:
    meshif = keep.split(".", 1)[0]
    cutoff = time.time() - MAX_AGE
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name != keep and name.startswith(meshif + ".") and name.endswith(SUFFIX):
            try:
                if os.stat(os.path.join(directory, name)).st_mtime < cutoff:
                    os.unlink(os.path.join(directory, name))
            except OSError:
                pass


@dataclass
class Saved:
    """What a state file says, checked value by value: a value that is neither a seqno nor
    a table of them is skipped (with a warning), never the cause of a failed start."""

    ahead: int  # seqnos to skip: the margin plus what may have been sent since the save
    seqnos: dict = field(default_factory=dict)  # as Mesh.seqno_state() wrote it


def _seqno(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


def _checked(name: str, value, path: str):
    if _seqno(value):
        return value
    if isinstance(value, dict) and all(_seqno(v) for v in value.values()):
        return {str(k).lower(): v for k, v in value.items()}
    log.warning("%s: %s is not a seqno or a table of seqnos; ignored", path, name)
    return None


def load(path: str) -> Saved | None:
    """The saved state, or None when there is none, it is unreadable, or too old."""
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot read seqno state %s (%s); starting fresh", path, exc)
        return None
    if not isinstance(state, dict):
        log.warning("%s is not a state file; starting fresh", path)
        return None
    saved_at, interval = state.get("saved_at"), state.get("orig_interval_ms")
    if not isinstance(saved_at, (int, float)) or isinstance(saved_at, bool):
        log.warning("%s: no valid saved_at; starting fresh", path)
        return None
    elapsed = max(0.0, time.time() - saved_at)
    if elapsed > MAX_AGE:
        return None
    if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
        interval = 1000
    ahead = MARGIN + int(min(elapsed, SAVE_PERIOD) / (interval / 1000.0)) + 1
    seqnos = {}
    for name, value in state.items():
        if name not in META:
            checked = _checked(name, value, path)
            if checked is not None:
                seqnos[name] = checked
    return Saved(ahead, seqnos)
