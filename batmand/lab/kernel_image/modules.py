"""Kernel module dependencies of an extracted kernel: depmod, and the order to load modules in."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

from .image import ImageError


def depmod(root: Path, release: str) -> Path:
    """Write modules.dep and friends for the kernel extracted into root (the package ships
    none: its postinst runs depmod), with kmod's depmod; returns the modules directory."""
    moddir = root / "lib/modules" / release
    proc = subprocess.run(["depmod", "-b", str(root), release], capture_output=True, text=True)
    if proc.returncode != 0 or not (moddir / "modules.dep").is_file():
        raise ImageError(f"depmod -b {root} {release} failed: {proc.stderr.strip()[-500:]}")
    return moddir


class Modules:
    """modules.dep / modules.softdep / modules.alias of an extracted kernel, and a load order."""

    def __init__(self, moddir: Path) -> None:
        self.moddir = moddir
        self.deps: dict[str, list[str]] = {}
        self.by_name: dict[str, str] = {}
        for line in (moddir / "modules.dep").read_text().splitlines():
            path, _, rest = line.partition(":")
            self.deps[path] = rest.split()
            self.by_name[self.name(path)] = path
        self.softdeps: dict[str, list[str]] = {}
        with contextlib.suppress(OSError):
            for line in (moddir / "modules.softdep").read_text().splitlines():
                words = line.split()
                if len(words) > 2 and words[0] == "softdep":
                    pre, collecting = [], False
                    for w in words[2:]:
                        if w.endswith(":"):
                            collecting = w == "pre:"
                        elif collecting:
                            pre.append(w)
                    self.softdeps[self.norm(words[1])] = pre
        self.aliases: dict[str, list[str]] = {}
        with contextlib.suppress(OSError):
            for line in (moddir / "modules.alias").read_text().splitlines():
                words = line.split()
                if len(words) == 3 and words[0] == "alias" and "*" not in words[1]:
                    self.aliases.setdefault(words[1], []).append(self.norm(words[2]))

    @staticmethod
    def norm(name: str) -> str:
        return name.replace("-", "_")

    def name(self, path: str) -> str:
        return self.norm(os.path.basename(path).split(".ko")[0])

    def resolve(self, name: str) -> list[str]:
        """Module paths for a module name or alias (several for an alias like crc32c)."""
        if self.norm(name) in self.by_name:
            return [self.by_name[self.norm(name)]]
        return [self.by_name[m] for m in self.aliases.get(name, []) if m in self.by_name]

    def load_order(self, names: list[str]) -> list[tuple[str, bool]]:
        """[(path, required)] such that every module comes after what it needs; soft
        dependencies (e.g. libcrc32c wants a crc32c implementation) are optional."""
        order: list[tuple[str, bool]] = []
        placed: set[str] = set()

        def place(path: str, required: bool, stack: tuple = ()) -> None:
            if path in placed or path in stack:
                return
            for soft in self.softdeps.get(self.name(path), []):
                candidates = self.resolve(soft)
                # an alias with a portable implementation (crc32c -> crc32c_generic, not
                # crc32c-intel, which wants SSE4.2 that TCG's default CPU lacks): just that
                generic = [c for c in candidates if self.name(c).endswith("_generic")]
                for candidate in generic or candidates:
                    place(candidate, False, stack + (path,))
            for dep in self.deps.get(path, []):
                place(dep, required, stack + (path,))
            placed.add(path)
            order.append((path, required))

        for name in names:
            paths = self.resolve(name)
            if not paths:
                raise ImageError(f"kernel module {name} not found in {self.moddir}")
            for p in paths:
                place(p, True)
        return order
