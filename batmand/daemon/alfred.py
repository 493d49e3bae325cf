"""Publishing our batadv-vis record into a running alfred (alfred_vis = true), as
`batadv-vis -s` does for a kernel node: every alfred_vis_interval_ms, one ALFRED_PUSH_DATA
on a fresh connection to alfred's unix socket (alfred reads it, stores it under its own
source address and closes; there is no answer). alfred spreads it to the other alfreds of
the mesh and batadv-vis on any node draws it. Without alfred nothing breaks: the daemon
logs once that the socket cannot be reached, and once when it can again."""

from __future__ import annotations

import asyncio
import logging
import struct

from . import vis

log = logging.getLogger("batmand.alfred")

ALFRED_PUSH_DATA = 0  # enum alfred_packet_type
ALFRED_REQUEST = 2
ALFRED_VERSION = 0
CONNECT_TIMEOUT = 2.0  # seconds: alfred answers at once or is stuck

_TLV = struct.Struct("!BBH")  # struct alfred_tlv: type, version, length (of what follows)
_TX = struct.Struct("!HH")  # struct alfred_transaction_mgmt: id, seqno
_DATA = struct.Struct("!6sBBH")  # struct alfred_data: source, then its tlv


def push_data(data_type: int, version: int, payload: bytes, tx_id: int, source: bytes = bytes(6)) -> bytes:
    """struct alfred_push_data_v0 with one alfred_data. A zero source lets alfred fill in
    its own interface's MAC (the one a secondary may only use)."""
    body = _TX.pack(tx_id & 0xFFFF, 0) + _DATA.pack(source, data_type, version, len(payload)) + payload
    return _TLV.pack(ALFRED_PUSH_DATA, ALFRED_VERSION, len(body)) + body


def request(data_type: int, tx_id: int) -> bytes:
    """struct alfred_request_v0 (what batadv-vis sends to read the records)."""
    return _TLV.pack(ALFRED_REQUEST, ALFRED_VERSION, 3) + struct.pack("!BH", data_type, tx_id & 0xFFFF)


def parse_pushes(stream: bytes) -> list[tuple[bytes, int, int, bytes]]:
    """(source, type, version, payload) of each alfred_data in a run of ALFRED_PUSH_DATA
    packets, as alfred answers a request; anything after a malformed packet is ignored."""
    out, pos = [], 0
    while pos + _TLV.size <= len(stream):
        kind, _, length = _TLV.unpack_from(stream, pos)
        body = stream[pos + _TLV.size:pos + _TLV.size + length]
        pos += _TLV.size + length
        if kind != ALFRED_PUSH_DATA or len(body) != length:
            break
        at = _TX.size
        while at + _DATA.size <= len(body):
            source, dtype, version, dlen = _DATA.unpack_from(body, at)
            payload = body[at + _DATA.size:at + _DATA.size + dlen]
            if len(payload) != dlen:
                break
            out.append((source, dtype, version, payload))
            at += _DATA.size + dlen
    return out


class VisPublisher:
    """The periodic push. It reads the options every round, so that SIGHUP can turn it on or
    off and move the socket; `record` builds the record when one is due (None: nothing yet)."""

    def __init__(self, options, record) -> None:
        self.options = options
        self.record = record
        self.tx_id = 0
        self.pushed = 0  # records alfred took
        self._unreachable: str | None = None  # what failed, logged once until a push works

    async def run(self) -> None:
        while True:
            if self.options.alfred_vis:
                await self.push_once()
            await asyncio.sleep(self.options.alfred_vis_interval_ms / 1000)

    async def push_once(self) -> bool:
        opts = self.options
        record = self.record()
        if record is None:
            return False
        self.tx_id = (self.tx_id + 1) & 0xFFFF  # batadv-vis counts its pushes in tx.id
        frame = push_data(vis.VIS_TYPE, vis.VIS_VERSION, vis.encode(record), self.tx_id)
        path = opts.alfred_socket
        try:
            _, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            self._failed(path, exc)
            return False
        try:
            writer.write(frame)
            await asyncio.wait_for(writer.drain(), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            self._failed(path, exc)
            return False
        finally:
            writer.close()
        if self._unreachable is not None:
            log.info("alfred_vis: publishing to alfred at %s again", path)
            self._unreachable = None
        self.pushed += 1
        return True

    def _failed(self, path: str, exc: BaseException) -> None:
        reason = getattr(exc, "strerror", None) or ("no answer" if isinstance(exc, asyncio.TimeoutError) else str(exc))
        what = f"{path}: {reason}"
        if what != self._unreachable:
            log.warning("alfred_vis: cannot reach alfred at %s (%s); trying again every %g s", path, reason,
                        self.options.alfred_vis_interval_ms / 1000)
            self._unreachable = what
