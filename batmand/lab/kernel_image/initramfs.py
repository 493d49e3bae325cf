"""What the guest's initramfs holds: busybox, the tools with their libraries and loader,
the kernel modules (base.cpio.gz, with vmlinuz and vmlinux beside it), and the small
archive with /init and the image's versions."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

from .apt import unpack
from .cpio import Cpio
from .elf import Elf, extract_vmlinux
from .image import ImageError, log
from .modules import Modules, depmod

# the guest's /init; it stays in batmand/lab (package data, see pyproject.toml)
GUEST_INIT = Path(__file__).parents[1] / "kernel_guest_init.sh"
BUSYBOX = Path("/bin/busybox")
# programs for the guest: package -> paths inside it (their libraries are resolved from DT_NEEDED)
TOOLS = {"batctl": ["usr/sbin/batctl"], "iperf3": ["usr/bin/iperf3"],
         "alfred": ["usr/sbin/alfred", "usr/sbin/batadv-vis"]}  # batadv-vis -s: tests/interop/test_vis.py
# loaded by /init in dependency order; batman-adv pulls in bridge, cfg80211, crc16, libcrc32c ...
BOOT_MODULES = ["virtio_pci", "virtio_net", "batman-adv"]
# shipped for `modprobe` in the guest (VLANs, TT clients behind macvlan/veth/dummy)
EXTRA_MODULES = ["8021q", "macvlan", "veth", "dummy"]
ARCH_LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib", "lib"]


def _in_root(root: Path, path: str) -> Path:
    """A path inside an extracted package tree, following symlinks as if root were /."""
    cur = root
    parts = [p for p in path.strip("/").split("/") if p]
    hops = 0
    while parts:
        nxt = cur / parts.pop(0)
        if nxt.is_symlink():
            hops += 1
            if hops > 40:
                raise ImageError(f"symlink loop at {nxt}")
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur, parts = root, [p for p in target.strip("/").split("/") if p] + parts
            else:
                parts = [p for p in target.split("/") if p] + parts
            continue
        if nxt.name == "..":
            cur = cur.parent if cur != root else root
            continue
        cur = nxt
    return cur


def _find_library(root: Path, soname: str) -> Path | None:
    for d in ARCH_LIBDIRS:
        p = _in_root(root, f"{d}/{soname}")
        if p.is_file():
            return p
    return None


def build_base(debs: dict[str, Path], kernel_pkg: str, workdir: Path, out_dir: Path) -> dict:
    """Extract the packages and write base.cpio.gz, vmlinuz and vmlinux into out_dir.
    Returns the facts for image.json."""
    root = workdir / "root"
    root.mkdir()
    unpack(debs, root)
    releases = sorted(p.name for p in (root / "lib/modules").iterdir())
    if len(releases) != 1:
        raise ImageError(f"expected one kernel in {kernel_pkg}, found {releases}")
    release = releases[0]
    moddir = depmod(root, release)
    bzimage = root / "boot" / f"vmlinuz-{release}"
    if not bzimage.is_file():
        raise ImageError(f"{kernel_pkg} has no /boot/vmlinuz-{release}")
    shutil.copyfile(bzimage, out_dir / "vmlinuz")
    log("uncompressing vmlinux from the bzImage")
    pvh = extract_vmlinux(out_dir / "vmlinuz", out_dir / "vmlinux")
    if not pvh:
        log("the kernel has no PVH entry note: booting the (slower) bzImage instead")
        (out_dir / "vmlinux").unlink()

    archive = Cpio()
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "lib", "lib64", "proc", "sys", "dev", "tmp", "run", "root",
              "etc/bm", "var/run"):
        archive.dir(d)
    archive.chardev("dev/console", 5, 1)
    archive.chardev("dev/null", 1, 3, 0o666)
    archive.chardev("dev/ttyS0", 4, 64)
    archive.chardev("dev/ttyS1", 4, 65)
    archive.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    archive.file("etc/group", b"root:x:0:\n")
    archive.file("etc/hosts", b"127.0.0.1 localhost\n::1 localhost\n")

    # busybox and its applets
    if Elf(BUSYBOX).interpreter() is not None:
        raise ImageError(f"{BUSYBOX} is dynamically linked: install busybox-static")
    archive.file("bin/busybox", BUSYBOX.read_bytes(), 0o755)
    applets = subprocess.run([str(BUSYBOX), "--list-full"], capture_output=True, text=True, check=True).stdout.split()

    libs = _add_tools(archive, root, debs)
    for applet in applets:  # after the tools: a real program wins over an applet of its name
        if applet.strip("/") not in archive.names:
            archive.symlink(applet, "/bin/busybox")
    boot, batman_adv = _add_modules(archive, moddir, release)
    busybox = subprocess.run([str(BUSYBOX)], capture_output=True, text=True).stdout.split("\n")[0].split(" ")[1]
    versions = {"batman-adv": batman_adv, "busybox": busybox}

    data = archive.finish()
    (out_dir / "base.cpio.gz.tmp").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    (out_dir / "base.cpio.gz.tmp").replace(out_dir / "base.cpio.gz")
    return {
        "kernel_release": release, "pvh": pvh, "versions": versions, "base_unpacked_bytes": len(data),
        "modules": boot, "libraries": libs,
    }


def _add_tools(archive: Cpio, root: Path, debs: dict[str, Path]) -> list[str]:
    """The tools, their libraries and the loader, all from the extracted packages; returns
    the libraries' sonames."""
    libs: dict[str, Path] = {}
    interpreters: set[str] = set()
    for pkg, paths in TOOLS.items():
        for rel in paths:
            src = _in_root(root, rel)
            if not src.is_file():
                raise ImageError(f"{pkg} has no /{rel}")
            archive.file(rel, src.read_bytes(), 0o755)
            todo = [src]
            while todo:
                elf = Elf(todo.pop())
                if elf.interpreter():
                    interpreters.add(elf.interpreter())
                for soname in elf.needed():
                    if soname in libs:
                        continue
                    lib = _find_library(root, soname)
                    if lib is None:
                        raise ImageError(f"library {soname} (needed by {elf.path.name}) is in none of the "
                                         f"downloaded packages {', '.join(sorted(debs))}")
                    libs[soname] = lib
                    todo.append(lib)
    for soname, lib in sorted(libs.items()):
        archive.file(f"lib/x86_64-linux-gnu/{soname}", lib.read_bytes(), 0o755)
    for interp in sorted(interpreters):
        src = _in_root(root, interp)
        if not src.is_file():
            raise ImageError(f"loader {interp} not found in the extracted libc")
        archive.file(f"lib/x86_64-linux-gnu/{src.name}", src.read_bytes(), 0o755)
        if interp.strip("/") != f"lib/x86_64-linux-gnu/{src.name}":
            archive.symlink(interp, f"/lib/x86_64-linux-gnu/{src.name}")
    return sorted(libs)


def _add_modules(archive: Cpio, moddir: Path, release: str) -> tuple[list[str], str]:
    """The boot set in load order (for /init), the extras for modprobe, a modules.dep of
    just those; returns the boot set and batman-adv's version."""
    mods = Modules(moddir)
    boot = mods.load_order(BOOT_MODULES)
    extra = mods.load_order(EXTRA_MODULES)
    shipped = dict.fromkeys([p for p, _ in boot] + [p for p, _ in extra])
    for path in shipped:
        archive.file(f"lib/modules/{release}/{path}", (moddir / path).read_bytes())
    dep_lines = [f"{p}: {' '.join(d for d in mods.deps[p] if d in shipped)}".rstrip() for p in shipped]
    archive.file(f"lib/modules/{release}/modules.dep", ("\n".join(dep_lines) + "\n").encode())
    archive.file("etc/bm/modules", "".join(f"{'' if req else '?'}{p}\n" for p, req in boot).encode())
    batman_ko = mods.resolve("batman-adv")[0]
    return [p for p, _ in boot], Elf(moddir / batman_ko).modinfo().get("version", "")


def build_init(image_facts: dict) -> bytes:
    """The small archive: /init and /etc/bm/image (versions, sourced by /init)."""
    archive = Cpio()
    archive.file("init", GUEST_INIT.read_bytes(), 0o755)
    lines = [f"KERNEL_RELEASE={image_facts['kernel_release']}"]
    for key, value in sorted(image_facts["versions"].items()):
        lines.append(f"VERSION_{re.sub(r'[^A-Za-z0-9]', '_', key).upper()}='{value}'")
    archive.file("etc/bm/image", ("\n".join(lines) + "\n").encode())
    return gzip.compress(archive.finish(), compresslevel=9, mtime=0)
