"""The main job of `scripts/run demo`: for now, decode the kernel reference captures with
`batmanctl td` and summarise what each holds. (The live netns demo lab replaces this when
the daemon exists.)"""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

from batmand.capture import read_capture
from batmand.cli import main as batmanctl
from batmand.wire import WireError, decode_frame
from batmand.wire.constants import PACKET_TYPE_NAMES
from batmand.wire.errors import NotBatmanError


def default_pcap_dir() -> Path:
    shared = os.environ.get("BATMAND_SHARED")
    base = Path(shared) if shared else Path(__file__).resolve().parent.parent.parent / "shared"
    return base / "reference" / "pcaps"


def summarise(path: Path) -> str:
    counts: collections.Counter = collections.Counter()
    errors = 0
    for cf in read_capture(str(path)):
        try:
            frame = decode_frame(cf.data)
        except NotBatmanError:
            counts["non-batman"] += 1
            continue
        except WireError:
            errors += 1
            continue
        for packet in frame.packets:
            counts[PACKET_TYPE_NAMES.get(packet.packet_type, hex(packet.packet_type))] += 1
    kinds = ", ".join(f"{n} {k}" for k, n in counts.most_common())
    return f"{path.name}: {kinds}; {errors} malformed"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pcap_dir = Path(argv[0]) if argv else default_pcap_dir()
    paths = sorted(pcap_dir.glob("*.pcap*"))
    paths = [p for p in paths if p.suffix in (".pcap", ".pcapng")]
    if not paths:
        print(f"demo: no captures in {pcap_dir} (set BATMAND_SHARED or pass a directory)", file=sys.stderr)
        return 1
    for path in paths:
        print(f"==> batmanctl td -r {path}")
        sys.stdout.flush()
        status = batmanctl.main(["td", "-r", str(path)])
        if status:
            return status
        print()
    print("==> summary (packets per type)")
    for path in paths:
        print("  " + summarise(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
