"""Reading and writing capture files (pcap and pcapng) through scapy's raw readers/writers.

Only raw bytes cross this module: scapy never dissects anything here."""

from __future__ import annotations

import struct

from collections.abc import Iterator
from dataclasses import dataclass

LINKTYPE_ETHERNET = 1


class CaptureFileError(ValueError):
    """The file is not a readable pcap/pcapng capture."""


@dataclass(slots=True)
class CapturedFrame:
    number: int  # 1-based, as tshark counts
    timestamp: float  # seconds since the epoch
    data: bytes
    ifname: str | None = None
    linktype: int = LINKTYPE_ETHERNET


def read_capture(path: str) -> Iterator[CapturedFrame]:
    """Yield every frame of a pcap or pcapng file (the format is detected from its magic)."""
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapReader  # imported lazily: scapy is slow to import

    try:
        reader = RawPcapReader(path)
    except (Scapy_Exception, EOFError, struct.error) as exc:
        raise CaptureFileError(f"{path}: {exc}") from None
    with reader:
        for number, (data, meta) in enumerate(_records(reader, path), start=1):
            if hasattr(meta, "tsresol"):  # pcapng
                ts = ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
                ifname = meta.ifname.decode(errors="replace") if meta.ifname else None
                linktype = meta.linktype
            else:
                ts = meta.sec + meta.usec / 1e6
                ifname = None
                linktype = getattr(reader, "linktype", LINKTYPE_ETHERNET)
            yield CapturedFrame(number, ts, bytes(data), ifname, linktype)


def _records(reader, path):
    """The reader's records; a damaged tail of the file becomes a CaptureFileError."""
    from scapy.error import Scapy_Exception

    iterator = iter(reader)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except (Scapy_Exception, EOFError, struct.error) as exc:
            raise CaptureFileError(f"{path}: damaged capture file: {exc}") from None


def write_pcap(path: str, frames: list[bytes], timestamps: list[float] | None = None) -> None:
    """Write Ethernet frames to a classic pcap file (stamped with `timestamps`, seconds since
    the epoch, one per frame; without them, the time of writing)."""
    from scapy.utils import RawPcapWriter

    with RawPcapWriter(path, linktype=LINKTYPE_ETHERNET, sync=True) as writer:
        if timestamps is None:
            for data in frames:
                writer.write(data)
            return
        if len(timestamps) != len(frames):
            raise ValueError(f"{len(frames)} frames but {len(timestamps)} timestamps")
        writer.write_header(None)
        for data, ts in zip(frames, timestamps):
            usec = round(ts * 1e6)
            writer.write_packet(data, sec=usec // 1_000_000, usec=usec % 1_000_000)
