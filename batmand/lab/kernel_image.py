"""The guest image of netns-lab's kernel nodes: Debian's own kernel (with its in-tree
batman-adv module) and batctl, in a busybox initramfs that QEMU boots.

    .venv/bin/python -m batmand.lab kernel-image build     # what scripts/kernel-node-setup.sh runs
    .venv/bin/python -m batmand.lab kernel-image show      # the cached image and the accelerator

Everything comes from Debian packages: the kernel package that `linux-image-amd64` depends on,
batctl and iperf3 with the shared libraries they need, fetched with `apt-get download` (never
installed on the host), plus the host's static busybox (busybox-static). The result lives in
the cache directory (default /var/cache/batmand-kernel-node, env BATMAND_KERNEL_NODE_CACHE):

    debs/              the downloaded packages (only the current versions are kept)
    vmlinux            the kernel, uncompressed from the bzImage: QEMU boots it through its PVH
                       entry point, which saves the guest's own decompression (half the boot
                       under TCG); vmlinuz is kept as the fallback when there is no PVH note
    base.cpio.gz       busybox, batctl, iperf3, libraries and loader, kernel modules
    init.cpio.gz       /init (kernel_guest_init.sh) and the image's version file
    initrd.img         both, concatenated (the kernel unpacks one cpio after the other)
    image.json         what was built from what; a build is skipped when nothing changed
    accel.json         the accelerator that works here (KVM is probed once, TCG is the fallback)

The base is rebuilt only when a package version, the host's busybox or this file changes;
the small init archive whenever kernel_guest_init.sh changes. Standard library only (the
archive writer, ELF reading and module dependency resolution are done here), apart from
apt-get/apt-cache/dpkg-deb and qemu for the probe.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import platform
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

CACHE_ENV = "BATMAND_KERNEL_NODE_CACHE"
DEFAULT_CACHE = Path("/var/cache/batmand-kernel-node")
GUEST_INIT = Path(__file__).with_name("kernel_guest_init.sh")
QEMU = os.environ.get("BATMAND_KERNEL_NODE_QEMU", "qemu-system-x86_64")
BUSYBOX = Path("/bin/busybox")

KERNEL_META = "linux-image-amd64"
# programs for the guest: package -> paths inside it (their libraries are resolved from DT_NEEDED)
TOOLS = {"batctl": ["usr/sbin/batctl"], "iperf3": ["usr/bin/iperf3"]}
# loaded by /init in dependency order; batman-adv pulls in bridge, cfg80211, crc16, libcrc32c ...
BOOT_MODULES = ["virtio_pci", "virtio_net", "batman-adv"]
# shipped for `modprobe` in the guest (VLANs, TT clients behind macvlan/veth/dummy)
EXTRA_MODULES = ["8021q", "macvlan", "veth", "dummy"]
ARCH_LIBDIRS = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib", "lib"]
PROBE_MARK = "BM-PROBE-OK"
KVM_PROBE_TIMEOUT = 20.0
TCG_PROBE_TIMEOUT = 120.0


class ImageError(RuntimeError):
    """The image cannot be built or used; the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def log(msg: str) -> None:
    print(f"[kernel-node] {msg}", file=sys.stderr, flush=True)


# --- the built image ------------------------------------------------------------------------


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


def load_accel(cache: Path | None = None) -> dict | None:
    """accel.json: {"accel": "kvm"|"tcg", "kvm": why/seconds, "tcg": seconds, ...} or None."""
    try:
        return json.loads(((cache or cache_dir()) / "accel.json").read_text())
    except (OSError, ValueError):
        return None


# --- small ELF reader (64-bit little endian) --------------------------------------------------


class Elf:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] != 2 or d[5] != 1:
            raise ImageError(f"{path}: not a 64-bit little-endian ELF file")
        (self.phoff, self.shoff) = struct.unpack_from("<QQ", d, 0x20)
        (self.phentsize, self.phnum, self.shentsize, self.shnum, self.shstrndx) = struct.unpack_from("<HHHHH", d, 0x36)

    def segments(self):
        """(type, offset, vaddr, filesz) per program header."""
        for i in range(self.phnum):
            p_type, _flags, off, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from(
                "<IIQQQQQQ", self.data, self.phoff + i * self.phentsize)
            yield p_type, off, vaddr, filesz

    def sections(self) -> dict[str, tuple[int, int]]:
        """name -> (offset, size)."""
        raw = []
        for i in range(self.shnum):
            name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", self.data, self.shoff + i * self.shentsize)
            raw.append((name, off, size))
        if not raw:
            return {}
        str_off = raw[self.shstrndx][1]
        out = {}
        for name, off, size in raw:
            end = self.data.index(b"\0", str_off + name)
            out[self.data[str_off + name:end].decode()] = (off, size)
        return out

    def interpreter(self) -> str | None:
        for p_type, off, _vaddr, filesz in self.segments():
            if p_type == 3:  # PT_INTERP
                return self.data[off:off + filesz].rstrip(b"\0").decode()
        return None

    def needed(self) -> list[str]:
        """DT_NEEDED entries (shared libraries)."""
        dynamic = [(off, filesz) for p_type, off, _v, filesz in self.segments() if p_type == 2]  # PT_DYNAMIC
        if not dynamic:
            return []
        off, size = dynamic[0]
        entries = [struct.unpack_from("<qQ", self.data, off + i) for i in range(0, size, 16)]
        strtab = next((val for tag, val in entries if tag == 5), None)  # DT_STRTAB (a virtual address)
        if strtab is None:
            return []
        base = self._vaddr_to_offset(strtab)
        names = []
        for tag, val in entries:
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = self.data.index(b"\0", base + val)
                names.append(self.data[base + val:end].decode())
        return names

    def _vaddr_to_offset(self, vaddr: int) -> int:
        for p_type, off, seg_vaddr, filesz in self.segments():
            if p_type == 1 and seg_vaddr <= vaddr < seg_vaddr + filesz:  # PT_LOAD
                return off + vaddr - seg_vaddr
        raise ImageError(f"{self.path}: address {vaddr:#x} is in no loaded segment")

    def has_note(self, owner: bytes, note_type: int) -> bool:
        for p_type, off, _vaddr, filesz in self.segments():
            if p_type != 4:  # PT_NOTE
                continue
            pos, end = off, off + filesz
            while pos + 12 <= end:
                namesz, descsz, ntype = struct.unpack_from("<III", self.data, pos)
                name = self.data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
                if name == owner and ntype == note_type:
                    return True
                pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
        return False

    def modinfo(self) -> dict[str, str]:
        """A kernel module's .modinfo (key=value strings)."""
        sec = self.sections().get(".modinfo")
        if not sec:
            return {}
        off, size = sec
        out = {}
        for item in self.data[off:off + size].split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                out.setdefault(key, value)
        return out


XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point QEMU's -kernel looks for in an ELF kernel


def extract_vmlinux(bzimage: Path, out: Path) -> bool:
    """Uncompress the ELF kernel that a bzImage carries (its header says where the payload
    is). Returns whether it has a PVH entry note (else QEMU cannot boot it directly)."""
    d = bzimage.read_bytes()
    if d[0x202:0x206] != b"HdrS":
        raise ImageError(f"{bzimage}: not a bzImage")
    setup_sects = d[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", d, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = d[start:start + payload_length]
    if payload.startswith(b"\xfd7zXZ\x00"):
        kernel = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(payload)
    elif payload.startswith(b"\x1f\x8b"):
        kernel = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    elif payload.startswith(b"\x5d\x00\x00"):
        kernel = lzma.LZMADecompressor(format=lzma.FORMAT_ALONE).decompress(payload)
    elif payload.startswith(b"\x28\xb5\x2f\xfd") and shutil.which("zstd"):
        kernel = subprocess.run(["zstd", "-dc"], input=payload, capture_output=True, check=True).stdout
    else:
        raise ImageError(f"{bzimage}: unsupported kernel compression (payload starts {payload[:6].hex()})")
    if kernel[:4] != b"\x7fELF":
        raise ImageError(f"{bzimage}: the payload is not an ELF kernel")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(kernel)
    pvh = Elf(tmp).has_note(b"Xen", XEN_ELFNOTE_PHYS32_ENTRY)
    tmp.replace(out)
    return pvh


# --- cpio (newc) writer -------------------------------------------------------------------------


class Cpio:
    """A newc archive in memory: root-owned, mtime 0, so the same input gives the same bytes."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.ino = 0
        self.names: set[str] = set()

    def _add(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        name = name.strip("/")
        if name in self.names:
            return
        parent = os.path.dirname(name)
        if parent and parent not in self.names:
            self.dir(parent)
        self.names.add(name)
        self.ino += 1
        encoded = name.encode() + b"\0"
        fields = (self.ino, mode, 0, 0, 2 if stat.S_ISDIR(mode) else 1, 0, len(data), 0, 0, rdev[0], rdev[1],
                  len(encoded), 0)
        self.out.write(b"070701" + "".join(f"{v:08X}" for v in fields).encode() + encoded)
        self._pad()
        self.out.write(data)
        self._pad()

    def _pad(self) -> None:
        self.out.write(b"\0" * (-self.out.tell() % 4))

    def dir(self, name: str, mode: int = 0o755) -> None:
        self._add(name, stat.S_IFDIR | mode)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._add(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._add(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int, mode: int = 0o600) -> None:
        self._add(name, stat.S_IFCHR | mode, rdev=(major, minor))

    def finish(self) -> bytes:
        self.ino += 1
        encoded = b"TRAILER!!!\0"
        self.out.write(b"070701" + "".join(f"{v:08X}" for v in (0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, len(encoded), 0)).encode()
                       + encoded)
        self._pad()
        return self.out.getvalue()


# --- Debian packages ------------------------------------------------------------------------------


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


# --- kernel modules -------------------------------------------------------------------------------


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


# --- building -------------------------------------------------------------------------------------


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    return _sha256(path.read_bytes())


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
    for pkg, deb in sorted(debs.items()):
        proc = subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageError(f"dpkg-deb -x {deb} failed: {proc.stderr.strip()}")
    releases = sorted(p.name for p in (root / "lib/modules").iterdir())
    if len(releases) != 1:
        raise ImageError(f"expected one kernel in {kernel_pkg}, found {releases}")
    release = releases[0]
    moddir = root / "lib/modules" / release
    # the package ships no modules.dep (its postinst runs depmod): make it, with kmod's depmod
    proc = subprocess.run(["depmod", "-b", str(root), release], capture_output=True, text=True)
    if proc.returncode != 0 or not (moddir / "modules.dep").is_file():
        raise ImageError(f"depmod -b {root} {release} failed: {proc.stderr.strip()[-500:]}")
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

    # the tools, their libraries and the loader, all from the extracted packages
    libs: dict[str, Path] = {}
    interpreters: set[str] = set()
    versions = {}
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
    for applet in applets:
        if applet.strip("/") not in archive.names:
            archive.symlink(applet, "/bin/busybox")

    # kernel modules: the boot set in load order, the extras for modprobe, a filtered modules.dep
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
    versions["batman-adv"] = Elf(moddir / batman_ko).modinfo().get("version", "")
    versions["busybox"] = subprocess.run([str(BUSYBOX)], capture_output=True, text=True).stdout.split("\n")[0].split(" ")[1]

    data = archive.finish()
    (out_dir / "base.cpio.gz.tmp").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    (out_dir / "base.cpio.gz.tmp").replace(out_dir / "base.cpio.gz")
    return {
        "kernel_release": release, "pvh": pvh, "versions": versions, "base_unpacked_bytes": len(data),
        "modules": [p for p, _ in boot], "libraries": sorted(libs),
    }


def build_init(image_facts: dict) -> bytes:
    """The small archive: /init and /etc/bm/image (versions, sourced by /init)."""
    archive = Cpio()
    archive.file("init", GUEST_INIT.read_bytes(), 0o755)
    lines = [f"KERNEL_RELEASE={image_facts['kernel_release']}"]
    for key, value in sorted(image_facts["versions"].items()):
        lines.append(f"VERSION_{re.sub(r'[^A-Za-z0-9]', '_', key).upper()}='{value}'")
    archive.file("etc/bm/image", ("\n".join(lines) + "\n").encode())
    return gzip.compress(archive.finish(), compresslevel=9, mtime=0)


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
    neither apt's package lists nor this builder nor busybox changed since the last build,
    apt is not even asked; otherwise only what changed is downloaded and rebuilt."""
    cache = cache or cache_dir()
    with _locked(cache):
        old = load_image(cache)
        manifest = dict(old.manifest) if old else {}
        builder = _file_sha(Path(__file__))
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
        if not manifest.get("pvh"):
            with contextlib.suppress(FileNotFoundError):
                (cache / "vmlinux").unlink()
        image = load_image(cache)
        if image is None:
            raise ImageError(f"the image in {cache} is incomplete after building")
        return image


# --- accelerator ----------------------------------------------------------------------------------


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


# --- command line ---------------------------------------------------------------------------------


def _cache_size(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m batmand.lab kernel-image", description=__doc__,
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


if __name__ == "__main__":
    sys.exit(main())
