"""Which QEMU accelerator boots the guest here (KVM is probed once, TCG is the fallback),
kept in accel.json, and the QEMU arguments for it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

from .image import Image, cache_dir, log

QEMU = os.environ.get("BATMAND_KERNEL_NODE_QEMU", "qemu-system-x86_64")
PROBE_MARK = "BM-PROBE-OK"
KVM_PROBE_TIMEOUT = 20.0
TCG_PROBE_TIMEOUT = 120.0


def load_accel(cache: Path | None = None) -> dict | None:
    """accel.json: {"accel": "kvm"|"tcg", "kvm": why/seconds, "tcg": seconds, ...} or None."""
    try:
        return json.loads(((cache or cache_dir()) / "accel.json").read_text())
    except (OSError, ValueError):
        return None


def _qemu_version() -> str:
    try:
        return subprocess.run([QEMU, "--version"], capture_output=True, text=True, timeout=10).stdout.split("\n")[0]
    except (OSError, subprocess.TimeoutExpired):
        return ""


def kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def accel_args(accel: str, tb_size_mb: int = 64) -> list[str]:
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "host"]
    # a bounded translation cache: QEMU's default (1 GiB) lets a VM's RSS grow towards it
    return ["-accel", f"tcg,tb-size={tb_size_mb}"]


def probe_boot(image: Image, accel: str, timeout: float) -> tuple[bool, float, str]:
    """Boot the image with `bm.probe` (its /init prints a marker and powers off at once).
    Returns (ok, seconds, what went wrong)."""
    with tempfile.TemporaryDirectory(prefix="probe-") as tmp:
        console = Path(tmp) / "console"
        argv = [QEMU, "-M", "pc", *accel_args(accel), "-m", "256", "-smp", "1", "-nodefaults", "-no-user-config",
                "-display", "none", "-no-reboot", "-kernel", str(image.kernel), "-initrd", str(image.initrd),
                "-append", "console=ttyS0 quiet panic=-1 bm.probe", "-serial", f"file:{console}"]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            err = proc.stderr.strip()
        except subprocess.TimeoutExpired:
            err = f"no marker within {timeout:g}s"
        except OSError as exc:
            return False, 0.0, str(exc)
        seconds = time.monotonic() - t0
        text = console.read_text(errors="replace") if console.exists() else ""
        if PROBE_MARK in text:
            return True, seconds, ""
        return False, seconds, (err or "the guest printed no marker")[-300:]


def probe_accel(image: Image, *, force: bool = False) -> dict:
    """Which accelerator boots the guest here; probed once and kept in accel.json (again when
    QEMU, the host kernel or /dev/kvm changed). KVM is tried first, TCG is the fallback."""
    cache = image.cache
    key = {"qemu": _qemu_version(), "host_kernel": platform.release(), "kvm_device": kvm_usable(),
           "kernel": f"{image.manifest.get('kernel_package')} {image.versions.get(image.manifest.get('kernel_package'))}"}
    old = load_accel(cache)
    if old and not force and old.get("key") == key and old.get("accel"):
        return old
    result: dict = {"key": key, "probed": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if key["kvm_device"]:
        log(f"probing KVM (up to {KVM_PROBE_TIMEOUT:g}s)")
        ok, secs, why = probe_boot(image, "kvm", KVM_PROBE_TIMEOUT)
        result["kvm"] = f"boots in {secs:.1f}s" if ok else f"fails: {why}"
        if ok:
            result["accel"] = "kvm"
    else:
        result["kvm"] = "no usable /dev/kvm"
    log(f"probing TCG (up to {TCG_PROBE_TIMEOUT:g}s)")
    ok, secs, why = probe_boot(image, "tcg", TCG_PROBE_TIMEOUT)
    result["tcg"] = f"boots in {secs:.1f}s" if ok else f"fails: {why}"
    if ok:
        result.setdefault("accel", "tcg")
    result.setdefault("accel", None)
    (cache / "accel.json").write_text(json.dumps(result, indent=1))
    log(f"accelerator: {result['accel'] or 'NONE'} (kvm: {result['kvm']}; tcg: {result['tcg']})")
    return result
