"""Just enough of eBPF to run a small program of our own in the kernel's receive path:
the bpf(2) commands for maps, program loading and tcx links (through ctypes: nothing to
install), and an assembler for the instructions the program uses, with jump labels.

tcx (Linux 6.6) attaches a program to an interface's ingress through a link that lives as
long as its descriptor: when the daemon exits, however it exits, the program goes with
it, and no qdisc or filter is left behind for anyone to clean up."""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

# bpf(2) commands and constants (linux/bpf.h)
_MAP_CREATE, _MAP_LOOKUP, _MAP_UPDATE, _MAP_DELETE, _PROG_LOAD, _LINK_CREATE = 0, 1, 2, 3, 5, 28
MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY = 1, 2, 6
NO_PREALLOC = 1  # a hash map takes kernel memory per entry, not for max_entries up front
PROG_SCHED_CLS = 3
ATTACH_TCX_INGRESS, ATTACH_TCX_EGRESS = 46, 47
PSEUDO_MAP_FD = 1
HELPER_MAP_LOOKUP, HELPER_KTIME_GET_NS, HELPER_REDIRECT, HELPER_SKB_CHANGE_HEAD, HELPER_SKB_ADJUST_ROOM = 1, 5, 23, 43, 50
REDIRECT_INGRESS = 1  # BPF_F_INGRESS: into the interface's receive path, not out of it
ADJ_ROOM_MAC = 1  # bpf_skb_adjust_room: room behind the Ethernet header
TC_NEXT = -1  # tcx verdict: on to the next program, then the stack
TC_SHOT = 2  # tcx verdict: drop

_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "armv7l": 386, "armv6l": 386, "riscv64": 280,
                "ppc64le": 361, "s390x": 351, "i686": 357, "mips": 4355}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf(2) command failed; for a program the verifier's log follows the message."""

    def __init__(self, err: int, what: str, log: str = "") -> None:
        super().__init__(err, f"{what}: {os.strerror(err)}" + (f"\n{log}" if log else ""))


def _bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    if _SYSCALL_BPF is None:
        raise BpfError(errno.ENOSYS, f"{what}: no bpf(2) number known for {platform.machine()}")
    result = _libc.syscall(_SYSCALL_BPF, cmd, attr, len(attr))
    if result < 0:
        raise BpfError(ctypes.get_errno(), what)
    return result


def _attr(fmt: str, *values) -> ctypes.Array:
    buf = ctypes.create_string_buffer(128)  # the rest of union bpf_attr stays zero
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _addr(buf) -> int:
    return ctypes.addressof(buf)


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key (the kernel's possible CPUs)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            return max(int(part.split("-")[-1]) for part in f.read().strip().split(",")) + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


class Map:
    """A kernel map of fixed-size keys and values, owned by this descriptor."""

    def __init__(self, kind: int, key_size: int, value_size: int, max_entries: int, name: str,
                 flags: int = 0) -> None:
        self.key_size, self.value_size = key_size, value_size
        self.per_cpu = possible_cpus() if kind == MAP_PERCPU_ARRAY else 0
        # map_type, key_size, value_size, max_entries, map_flags, inner_map_fd, numa_node, map_name
        attr = _attr("7I16s", kind, key_size, value_size, max_entries, flags, 0, 0, name.encode()[:15])
        self.fd = _bpf(_MAP_CREATE, attr, f"creating map {name}")

    def update(self, key: bytes, value: bytes) -> None:
        k, v = ctypes.create_string_buffer(key, self.key_size), ctypes.create_string_buffer(value, self.value_size)
        _bpf(_MAP_UPDATE, _attr("IIQQQ", self.fd, 0, _addr(k), _addr(v), 0), "updating a map")

    def delete(self, key: bytes) -> bool:
        k = ctypes.create_string_buffer(key, self.key_size)
        try:
            _bpf(_MAP_DELETE, _attr("IIQQ", self.fd, 0, _addr(k), 0), "deleting from a map")
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return False
            raise
        return True

    def lookup(self, key: bytes) -> bytes | list[bytes] | None:
        """The value (a per-CPU map: one per possible CPU), None when the key is absent."""
        k = ctypes.create_string_buffer(key, self.key_size)
        size = (self.value_size + 7) // 8 * 8 * self.per_cpu if self.per_cpu else self.value_size
        v = ctypes.create_string_buffer(size)
        try:
            _bpf(_MAP_LOOKUP, _attr("IIQQ", self.fd, 0, _addr(k), _addr(v)), "reading a map")
        except BpfError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise
        if not self.per_cpu:
            return v.raw
        step = size // self.per_cpu
        return [v.raw[i * step:i * step + self.value_size] for i in range(self.per_cpu)]

    def close(self) -> None:
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1


def close(fd: int) -> None:
    """Let go of a map, program or link (a link's end detaches its program)."""
    os.close(fd)


def load_program(insns: bytes, name: str) -> int:
    """A SCHED_CLS program's descriptor; the verifier's log comes with a refusal."""
    log = ctypes.create_string_buffer(1 << 16)
    lic = ctypes.create_string_buffer(b"GPL")
    code = ctypes.create_string_buffer(insns, len(insns))  # kept referenced until the call returns
    # prog_type, insn_cnt, insns, license, log_level, log_size, log_buf, kern_version, prog_flags, prog_name
    attr = _attr("IIQQIIQII16s", PROG_SCHED_CLS, len(insns) // 8, _addr(code), _addr(lic), 1, len(log), _addr(log),
                 0, 0, name.encode()[:15])
    try:
        return _bpf(_PROG_LOAD, attr, f"loading program {name}")
    except BpfError as exc:
        raise BpfError(exc.errno, f"loading program {name}", log.value.decode(errors="replace")) from None


def attach_ingress(prog_fd: int, ifindex: int) -> int:
    """A tcx link running the program on the interface's ingress, first of all programs
    there; closing the descriptor detaches it."""
    return _attach(prog_fd, ifindex, ATTACH_TCX_INGRESS, "ingress")


def attach_egress(prog_fd: int, ifindex: int) -> int:
    """The same on the interface's egress (before its qdisc)."""
    return _attach(prog_fd, ifindex, ATTACH_TCX_EGRESS, "egress")


def _attach(prog_fd: int, ifindex: int, kind: int, where: str) -> int:
    # prog_fd, target_ifindex, attach_type, flags
    return _bpf(_LINK_CREATE, _attr("IIII", prog_fd, ifindex, kind, 0), f"attaching to {where} of interface {ifindex}")


# --- an assembler for the instructions we use -------------------------------------------------------

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)
_SIZE = {1: 0x10, 2: 0x08, 4: 0x00, 8: 0x18}  # BPF_B, BPF_H, BPF_W, BPF_DW
_ALU = {"+": 0x00, "-": 0x10, "|": 0x40, "&": 0x50, "<<": 0x60, "s>>": 0xC0, "=": 0xB0}
_JMP = {"==": 0x10, ">": 0x20, "&": 0x40, "!=": 0x50, "s<": 0xC0, "<": 0xA0}


class Program:
    """Instructions appended in order; jumps name labels, resolved by assemble()."""

    def __init__(self) -> None:
        self._insns: list = []  # (code, dst, src, off, imm) or a label's jump as (code, dst, src, label, imm)
        self._labels: dict[str, int] = {}

    def _emit(self, code: int, dst: int = 0, src: int = 0, off=0, imm: int = 0) -> None:
        self._insns.append((code, dst, src, off, imm))

    def label(self, name: str) -> None:
        self._labels[name] = len(self._insns)

    def load(self, dst: int, src: int, off: int, size: int) -> None:
        self._emit(0x61 | _SIZE[size], dst, src, off)  # BPF_LDX | BPF_MEM

    def store(self, dst: int, off: int, src: int, size: int) -> None:
        self._emit(0x63 | _SIZE[size], dst, src, off)  # BPF_STX | BPF_MEM

    def store_imm(self, dst: int, off: int, imm: int, size: int) -> None:
        self._emit(0x62 | _SIZE[size], dst, 0, off, imm)  # BPF_ST | BPF_MEM

    def alu(self, dst: int, op: str, imm: int) -> None:
        self._emit(0x07 | _ALU[op], dst, 0, 0, imm)  # BPF_ALU64 | BPF_K

    def alu_reg(self, dst: int, op: str, src: int) -> None:
        self._emit(0x0F | _ALU[op], dst, src)  # BPF_ALU64 | BPF_X

    def byte_swap16(self, dst: int) -> None:
        """A 16-bit field loaded from the packet (network order) to its value (nothing to
        do on a big-endian machine)."""
        self._emit(0xDC, dst, 0, 0, 16)  # BPF_ALU | BPF_END | BPF_TO_BE

    def load_imm64(self, dst: int, value: int, map_fd: bool = False) -> None:
        self._emit(0x18, dst, PSEUDO_MAP_FD if map_fd else 0, 0, value & 0xFFFFFFFF)
        self._emit(0, 0, 0, 0, (value >> 32) & 0xFFFFFFFF)

    def jump(self, target: str) -> None:
        self._emit(0x05, 0, 0, target)  # BPF_JMP | BPF_JA

    def jump_if(self, dst: int, op: str, imm: int, target: str) -> None:
        self._emit(0x05 | _JMP[op], dst, 0, target, imm)  # BPF_JMP | BPF_K

    def jump_if_reg(self, dst: int, op: str, src: int, target: str) -> None:
        self._emit(0x0D | _JMP[op], dst, src, target)  # BPF_JMP | BPF_X

    def call(self, helper: int) -> None:
        self._emit(0x85, 0, 0, 0, helper)

    def exit(self) -> None:
        self._emit(0x95)

    def assemble(self) -> bytes:
        """struct bpf_insn in this machine's order (its register nibbles too: the
        bitfields' order follows the byte order)."""
        out = bytearray()
        for index, (code, dst, src, off, imm) in enumerate(self._insns):
            if isinstance(off, str):
                off = self._labels[off] - index - 1
            regs = dst | src << 4 if sys.byteorder == "little" else dst << 4 | src
            out += struct.pack("=BBhi", code, regs, off, imm if imm < 1 << 31 else imm - (1 << 32))
        return bytes(out)
