"""`python -m batmand.lab kernel-image build|show`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from . import __doc__ as OVERVIEW
from .builder import build
from .image import ImageError, cache_dir, load_image, log
from .probe import load_accel, probe_accel


def _cache_size(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m batmand.lab kernel-image", description=OVERVIEW,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="bring the cached image up to date and probe the accelerator once")
    b.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    b.add_argument("--reprobe", action="store_true", help="probe KVM/TCG again")
    sub.add_parser("show", help="the cached image and accelerator, as JSON")
    args = p.parse_args(argv)
    cache = cache_dir()
    if args.command == "show":
        img = load_image(cache)
        print(json.dumps({"cache": str(cache), "image": img.manifest if img else None, "accel": load_accel(cache),
                          "cache_bytes": _cache_size(cache) if cache.exists() else 0}, indent=1))
        return 0 if img else 1
    if os.geteuid() != 0:
        print("kernel-node: building the image needs root (apt-get download into the cache)", file=sys.stderr)
        return 1
    error_file = cache / "build-error.txt"
    try:
        img = build(cache, force=args.force)
        accel = probe_accel(img, force=args.reprobe)
    except (ImageError, OSError, subprocess.SubprocessError) as exc:
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
            error_file.write_text(f"{exc}\n")
        print(f"kernel-node: image build failed: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(FileNotFoundError):
        error_file.unlink()
    log(f"ready: kernel {img.kernel_release} ({'PVH vmlinux' if img.pvh else 'bzImage'}), batman-adv "
        f"{img.batman_adv_version}, batctl {img.versions.get('batctl')}, accel {accel.get('accel')}, "
        f"cache {cache} {_cache_size(cache) >> 20} MiB")
    return 0 if accel.get("accel") else 1
