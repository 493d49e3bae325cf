"""Classic BPF filters that split a hard interface's batman-adv traffic in the kernel:
UNICAST data frames go to the workers' fanout group, everything else to the control
process's own socket. Both filters also drop frames the socket would see only because
the interface is promiscuous (PACKET_OTHERHOST) and our own outgoing frames, as the
kernel's batman-adv receive handler ignores them."""

from __future__ import annotations

import ctypes
import socket
import struct

from batmand.wire.constants import ETH_P_BATMAN, PacketType

SO_ATTACH_FILTER = 26
SKF_AD_PKTTYPE = -0x1000 + 4  # SKF_AD_OFF + SKF_AD_PKTTYPE, as an unsigned k below
PACKET_OTHERHOST = 3
PACKET_OUTGOING = 4

# opcodes (linux/filter.h)
_LD_W_ABS = 0x20
_LD_H_ABS = 0x28
_LD_B_ABS = 0x30
_JEQ_K = 0x15
_RET_K = 0x06
ACCEPT = 0x40000  # snap length: the whole frame


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _program(unicast: bool) -> bytes:
    """unicast=True: accept only UNICAST; False: accept everything else."""
    jt, jf = (0, 1) if unicast else (1, 0)  # on "type == UNICAST": accept / drop
    return b"".join([
        _insn(_LD_W_ABS, 0, 0, SKF_AD_PKTTYPE),
        _insn(_JEQ_K, 6, 0, PACKET_OTHERHOST),  # -> drop
        _insn(_JEQ_K, 5, 0, PACKET_OUTGOING),  # -> drop
        _insn(_LD_H_ABS, 0, 0, 12),
        _insn(_JEQ_K, 0, 3, ETH_P_BATMAN),  # not batman-adv -> drop
        _insn(_LD_B_ABS, 0, 0, 14),
        _insn(_JEQ_K, jt, jf, PacketType.UNICAST),
        _insn(_RET_K, 0, 0, ACCEPT),
        _insn(_RET_K, 0, 0, 0),
    ])


UNICAST_ONLY = _program(True)
ALL_BUT_UNICAST = _program(False)


def attach(sock: socket.socket, program: bytes) -> None:
    """SO_ATTACH_FILTER: the kernel copies the program, so the buffer may go afterwards."""
    buf = ctypes.create_string_buffer(program)
    fprog = struct.pack("HL", len(program) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
