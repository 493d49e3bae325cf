"""A small ELF reader (64-bit little endian: program interpreter, DT_NEEDED, notes, a
module's .modinfo) and the ELF kernel inside a bzImage."""

from __future__ import annotations

import lzma
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

from .image import ImageError


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
