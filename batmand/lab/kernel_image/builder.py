"""Bringing the cached image up to date: which packages, and what changed since the last
build (the keys in image.json), under a lock so two builds do not interleave."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import tempfile
import time
from pathlib import Path

from .apt import Apt, download
from .image import Image, ImageError, cache_dir, load_image, log
from .initramfs import BOOT_MODULES, BUSYBOX, EXTRA_MODULES, GUEST_INIT, TOOLS, build_base, build_init

# a change to the builder's code rebuilds the base archive; these modules do not decide what
# is built (a new module counts as builder code until it is listed here)
NOT_BUILDER = {"__init__.py", "__main__.py", "cli.py", "image.py", "probe.py"}
BUILDER_SOURCES = sorted(p for p in Path(__file__).parent.glob("*.py") if p.name not in NOT_BUILDER)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    return _sha256(path.read_bytes())


def _builder_sha() -> str:
    return _sha256(" ".join(f"{path.name}:{_file_sha(path)}" for path in BUILDER_SOURCES).encode())


@contextlib.contextmanager
def _locked(cache: Path):
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _apt_lists_stamp() -> str:
    """Changes whenever apt's package lists do (apt-get update)."""
    lists = Path("/var/lib/apt/lists")
    with contextlib.suppress(OSError):
        return str(max((p.stat().st_mtime_ns for p in lists.iterdir() if "_Packages" in p.name), default=0))
    return ""


def _resolve_and_download(cache: Path) -> tuple[str, dict[str, str], dict[str, Path]]:
    """(kernel package, {package: version}, {package: .deb}) for the current candidates."""
    apt = Apt()
    kernel_pkg = apt.kernel_package()
    stanzas = apt.library_closure([kernel_pkg, *TOOLS])
    # the kernel package depends on no library we want; keep the tools and their libraries
    wanted = {kernel_pkg: stanzas[kernel_pkg]["Version"]}
    for name, stanza in stanzas.items():
        if name in TOOLS or name.startswith("lib"):
            wanted[name] = stanza["Version"]
    debs = download(cache / "debs", wanted)
    for stale in (cache / "debs").glob("*.deb"):
        if stale not in debs.values():
            stale.unlink()
    return kernel_pkg, wanted, debs


def build(cache: Path | None = None, *, force: bool = False, offline_ok: bool = True) -> Image:
    """Bring the cached image up to date (download, extract, archive). Idempotent: when
    neither apt's package lists nor the builder's code nor busybox changed since the last build,
    apt is not even asked; otherwise only what changed is downloaded and rebuilt."""
    cache = cache or cache_dir()
    with _locked(cache):
        old = load_image(cache)
        manifest = dict(old.manifest) if old else {}
        builder = _builder_sha()
        quick_key = _sha256(f"{_apt_lists_stamp()} {builder} {_file_sha(BUSYBOX)}".encode())
        if not force and manifest.get("quick_key") == quick_key and (cache / "base.cpio.gz").is_file():
            kernel_pkg, wanted, debs = manifest["kernel_package"], manifest["packages"], None
        else:
            try:
                kernel_pkg, wanted, debs = _resolve_and_download(cache)
            except ImageError as exc:
                if old is not None and offline_ok and not force:
                    log(f"cannot check for new package versions ({exc}); keeping the existing image")
                    return old
                raise

        base_key = _sha256(json.dumps({
            "builder": builder, "packages": wanted, "busybox": _file_sha(BUSYBOX),
            "tools": TOOLS, "boot": BOOT_MODULES, "extra": EXTRA_MODULES,
        }, sort_keys=True).encode())
        if force or manifest.get("base_key") != base_key or not (cache / "base.cpio.gz").is_file():
            if debs is None:
                kernel_pkg, wanted, debs = _resolve_and_download(cache)
            log(f"building the base archive: {kernel_pkg} {wanted[kernel_pkg]}, "
                f"batctl {wanted['batctl']}, iperf3 {wanted['iperf3']}")
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="build-", dir=cache) as tmp:
                facts = build_base(debs, kernel_pkg, Path(tmp), cache)
            facts["versions"] = {**wanted, **facts["versions"]}
            manifest = {"base_key": base_key, **facts, "kernel_package": kernel_pkg, "packages": wanted,
                        "kernel": "vmlinux" if facts["pvh"] else "vmlinuz"}
            log(f"base archive built in {time.monotonic() - t0:.1f}s "
                f"({(cache / 'base.cpio.gz').stat().st_size >> 10} KiB, {facts['base_unpacked_bytes'] >> 10} KiB unpacked)")
        init_key = _sha256(base_key.encode() + GUEST_INIT.read_bytes())
        if force or manifest.get("init_key") != init_key or manifest.get("quick_key") != quick_key \
                or not (cache / "initrd.img").is_file():
            manifest["quick_key"] = quick_key
            init = build_init(manifest)
            (cache / "init.cpio.gz").write_bytes(init)
            tmp = cache / "initrd.img.tmp"
            tmp.write_bytes((cache / "base.cpio.gz").read_bytes() + init)
            tmp.replace(cache / "initrd.img")
            manifest["init_key"] = init_key
            manifest["initrd"] = "initrd.img"
            manifest["initrd_bytes"] = (cache / "initrd.img").stat().st_size
            manifest["built"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            (cache / "image.json.tmp").write_text(json.dumps(manifest, indent=1, sort_keys=True))
            (cache / "image.json.tmp").replace(cache / "image.json")
            log(f"initrd.img written ({manifest['initrd_bytes'] >> 10} KiB)")
        image = load_image(cache)
        if image is None:
            raise ImageError(f"the image in {cache} is incomplete after building")
        return image
