"""The image in the cache as image.json describes it, where the cache is, and what every
part of the builder shares: its error and its log line."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "BATMAND_KERNEL_NODE_CACHE"
DEFAULT_CACHE = Path("/var/cache/batmand-kernel-node")


class ImageError(RuntimeError):
    """The image cannot be built or used; the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def log(msg: str) -> None:
    print(f"[kernel-node] {msg}", file=sys.stderr, flush=True)


@dataclass
class Image:
    """A built image as image.json describes it."""
    cache: Path
    kernel: Path  # vmlinux (PVH) or vmlinuz (bzImage)
    pvh: bool
    initrd: Path
    kernel_release: str
    versions: dict = field(default_factory=dict)  # package -> version, plus batman-adv, busybox
    manifest: dict = field(default_factory=dict)

    @property
    def batman_adv_version(self) -> str:
        return self.versions.get("batman-adv", "")


def load_image(cache: Path | None = None) -> Image | None:
    """The image in the cache, or None if there is none (or a file of it is missing)."""
    cache = cache or cache_dir()
    try:
        m = json.loads((cache / "image.json").read_text())
        img = Image(cache, cache / m["kernel"], bool(m["pvh"]), cache / m["initrd"], m["kernel_release"],
                    dict(m["versions"]), m)
    except (OSError, ValueError, KeyError):
        return None
    if not img.kernel.is_file() or not img.initrd.is_file():
        return None
    return img
