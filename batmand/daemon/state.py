"""Sequence numbers kept across restarts.

Kernel peers drop an originator whose OGM seqno jumps backwards (or far ahead) for up to
30 s after a restart (reset protection), and broadcasts likewise. Continuing from the last
saved seqnos, plus a margin for what was sent after the last save, makes a restarted node
acceptable at once."""

from __future__ import annotations

import json
import logging
import os
import time

log = logging.getLogger("batmand.state")

SAVE_PERIOD = 10.0  # seconds between saves while running
MARGIN = 64  # seqnos added on restore beyond what may have been sent since the save


def state_path(state_dir: str, meshif: str) -> str:
    return os.path.join(state_dir, f"{meshif}.state")


def snapshot(mesh) -> dict:
    algo = mesh.algo
    return {
        "saved_at": time.time(),
        "orig_interval_ms": mesh.config.orig_interval_ms,
        "ogm_seqno": {i.name: i.ogm_seqno for i in mesh.ifaces},
        "elp_seqno": {i.name: i.elp_seqno for i in mesh.ifaces},
        "ogm2_seqno": getattr(algo, "ogm_seqno", None),
        "bcast_seqno": mesh.broadcast.seqno,
        "frag_seqno": mesh.frag_seqno,
    }


def save(path: str, mesh) -> None:
    tmp = path + ".tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(snapshot(mesh), f)
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot save seqno state to %s: %s", path, exc.strerror)


def restore(path: str, mesh) -> bool:
    """Continue the saved seqnos (if any) on the interfaces that exist now."""
    try:
        with open(path) as f:
            state = json.load(f)
        elapsed = max(0.0, time.time() - float(state["saved_at"]))
        interval = max(int(state.get("orig_interval_ms") or 1000), 1) / 1000.0
    except (OSError, ValueError, KeyError, TypeError):
        return False
    ahead = MARGIN + int(min(elapsed, SAVE_PERIOD) / interval) + 1
    if elapsed > 3600:
        return False  # peers forgot us long ago; a fresh random start is as good

    def bump(value, step=ahead):
        return None if not isinstance(value, int) else (value + step) & 0xFFFFFFFF

    for iface in mesh.ifaces:
        seqno = bump(state.get("ogm_seqno", {}).get(iface.name))
        if seqno is not None:
            iface.ogm_seqno = seqno
        seqno = bump(state.get("elp_seqno", {}).get(iface.name), ahead * 2)
        if seqno is not None:
            iface.elp_seqno = seqno
    if hasattr(mesh.algo, "ogm_seqno") and isinstance(state.get("ogm2_seqno"), int):
        mesh.algo.ogm_seqno = bump(state["ogm2_seqno"])
    if isinstance(state.get("bcast_seqno"), int):
        mesh.broadcast.seqno = bump(state["bcast_seqno"], MARGIN + 1000)
    if isinstance(state.get("frag_seqno"), int):
        mesh.frag_seqno = (state["frag_seqno"] + 100) & 0xFFFF
    return True
