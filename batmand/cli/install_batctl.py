"""batmanctl install-batctl: batctl's command line under the name `batctl`, for scripts
that call batctl, on machines without the real one (a symlink to batmanctl, which speaks
batctl's grammar and prints as batctl when called by that name)."""

from __future__ import annotations

import os
import shutil
import sys

from .commands import UsageError

DEFAULT_DIR = "/usr/local/sbin"


def _ours() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "batmanctl")
    return here if os.access(here, os.X_OK) else os.path.realpath(sys.argv[0])


def _is_ours(path: str) -> bool:
    return os.path.realpath(path) == os.path.realpath(_ours())


def install(directory: str, force: bool = False) -> str:
    existing = shutil.which("batctl")
    if existing and not _is_ours(existing) and not force:
        raise UsageError(f"a batctl is installed at {existing}: it drives the kernel module and is left alone "
                         "(use batmanctl, or --force to install ours in front of it)")
    target = os.path.join(directory, "batctl")
    if os.path.lexists(target):
        if not _is_ours(target) and not force:
            raise UsageError(f"{target} exists and is not batmanctl (--force replaces it)")
        os.unlink(target)
    os.makedirs(directory, exist_ok=True)
    os.symlink(_ours(), target)
    return target


def run(args) -> int:
    target = install(args.dir, args.force)
    print(f"{target} -> {_ours()}")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("install-batctl", help="install batctl's name for batmanctl (where no batctl is)")
    p.add_argument("--dir", default=DEFAULT_DIR, help=f"where the batctl link goes (default {DEFAULT_DIR})")
    p.add_argument("--force", action="store_true", help="also where a batctl is already installed")
    p.set_defaults(func=run)
