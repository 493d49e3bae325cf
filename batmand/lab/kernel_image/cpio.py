"""A cpio (newc) writer, the format the kernel unpacks an initramfs from."""

from __future__ import annotations

import io
import os
import stat


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
        encoded = b"TRAILER!!!\0"
        self.out.write(b"070701" + "".join(f"{v:08X}" for v in (0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, len(encoded), 0)).encode()
                       + encoded)
        self._pad()
        return self.out.getvalue()
