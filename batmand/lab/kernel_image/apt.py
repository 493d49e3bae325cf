"""Debian packages without installing them: candidate versions and dependencies from the
host's apt lists, `apt-get download` into the cache, `dpkg-deb -x` into a build tree."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .image import ImageError, log

KERNEL_META = "linux-image-amd64"


def _apt(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, **kwargs)


def _parse_stanzas(text: str) -> list[dict[str, str]]:
    stanzas, cur, key = [], {}, None
    for line in text.splitlines():
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
        elif line[0] in " \t" and key:
            cur[key] += "\n" + line.strip()
        else:
            key, _, value = line.partition(":")
            cur[key] = value.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


class Apt:
    """Candidate versions and dependencies from the host's apt lists; apt-get update once
    when a package is unknown (fresh machines often have no lists)."""

    def __init__(self) -> None:
        self.updated = False

    def update(self) -> None:
        if not self.updated:
            log("apt-get update")
            proc = _apt(["apt-get", "update", "-qq"])
            if proc.returncode != 0:
                raise ImageError(f"apt-get update failed: {proc.stderr.strip()[-500:]}")
            self.updated = True

    def show(self, packages: list[str]) -> dict[str, dict[str, str]]:
        """The candidate stanza of each package."""
        for attempt in range(2):
            proc = _apt(["apt-cache", "show", "--no-all-versions", *packages])
            found = {s.get("Package"): s for s in _parse_stanzas(proc.stdout)}
            missing = [p for p in packages if p not in found]
            if not missing:
                return found
            if attempt == 0 and not self.updated:
                self.update()
        raise ImageError(f"apt knows no package(s) {', '.join(missing)} (apt-cache show: {proc.stderr.strip()[-300:]})")

    def kernel_package(self) -> str:
        stanza = self.show([KERNEL_META])[KERNEL_META]
        for dep in _depends(stanza):
            if re.match(r"^linux-image-\d", dep):
                return dep
        raise ImageError(f"{KERNEL_META} depends on no linux-image-<version> package: {stanza.get('Depends')}")

    def library_closure(self, roots: list[str]) -> dict[str, dict[str, str]]:
        """roots plus, recursively, the library packages (lib*) they depend on."""
        result: dict[str, dict[str, str]] = {}
        todo = list(roots)
        while todo:
            batch = [p for p in dict.fromkeys(todo) if p not in result]
            todo = []
            if not batch:
                break
            for name, stanza in self.show(batch).items():
                result[name] = stanza
                todo += [d for d in _depends(stanza) if d.startswith("lib") and d not in result]
        return result


def _depends(stanza: dict[str, str]) -> list[str]:
    """Package names of Pre-Depends and Depends (the first of each alternative)."""
    out = []
    for key in ("Pre-Depends", "Depends"):
        for item in stanza.get(key, "").split(","):
            name = item.split("|")[0].strip().split(" ")[0].split(":")[0]
            if name:
                out.append(name)
    return out


def download(debs: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Make sure debs/ holds each package at the given version (apt-get download when not);
    returns package -> .deb file. Other versions are removed once the new one is there."""
    debs.mkdir(parents=True, exist_ok=True)
    files = {}
    for pkg, version in sorted(packages.items()):
        have = [p for p in debs.glob(f"{pkg}_*.deb") if _deb_field(p, "Package") == pkg]
        match = [p for p in have if _deb_field(p, "Version") == version]
        if match:
            files[pkg] = match[0]
        else:
            log(f"apt-get download {pkg}={version}")
            proc = _apt(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", f"{pkg}={version}"], cwd=debs)
            if proc.returncode != 0:
                raise ImageError(f"apt-get download {pkg}={version} failed: {proc.stderr.strip()[-500:]}")
            match = [p for p in debs.glob(f"{pkg}_*.deb") if _deb_field(p, "Version") == version]
            if not match:
                raise ImageError(f"apt-get download {pkg}={version} left no such .deb in {debs}")
            files[pkg] = match[0]
        for old in have:
            if old != files[pkg]:
                old.unlink()
    return files


def _deb_field(deb: Path, name: str) -> str:
    proc = subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True)
    return proc.stdout.strip()


def unpack(debs: dict[str, Path], root: Path) -> None:
    """Extract the packages into root, as dpkg would install them (no maintainer scripts)."""
    for pkg, deb in sorted(debs.items()):
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageError(f"dpkg-deb -x {deb} failed: {proc.stderr.strip()}")
