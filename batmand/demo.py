"""The main job of `scripts/run demo`: a live mesh of five batmand nodes in network
namespaces (a line, so the ends need three relays), `batmanctl o` at one end, a ping and a
few seconds of iperf3 across the mesh, then everything torn down.

`python -m batmand.demo captures [DIR]` decodes the kernel reference captures instead."""

from __future__ import annotations

import collections
import os
import subprocess
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


def captures(argv: list[str]) -> int:
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


def _step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def lab_demo(prefix: str, iperf_seconds: int, interval_ms: int) -> int:
    import json
    import time

    from batmand.lab import Lab, load

    topo = load("line5")
    topo.batmand["orig_interval_ms"] = interval_ms
    with Lab(topo, prefix) as lab:
        _step(f"5 nodes in a line ({' - '.join(lab.nodes)}), batmand in each, OGM interval {interval_ms} ms")
        lab.start()
        first, last = lab.nodes[0], lab.nodes[-1]
        _step(f"waiting until {first} and {last} know every other originator and each other's bat0")
        started = time.monotonic()

        def knows_all(node: str) -> bool:
            rows = json.loads(lab.batmanctl(node, "o", "--json", check=True).stdout or "[]")
            return len({r["orig_address"] for r in rows if r["best"]}) >= len(lab.nodes) - 1

        while not (knows_all(first) and knows_all(last)
                   and lab.exec(first, ["ping", "-c", "1", "-W", "1", lab.address(last)]).returncode == 0):
            if time.monotonic() - started > 60:
                print("the mesh did not converge within 60 s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"converged after {time.monotonic() - started:.1f} s")
        _step(f"batmanctl o on {first}")
        print(lab.batmanctl(first, "o", check=True).stdout, end="")
        _step(f"ping {lab.address(last)} ({last}) from {first} over bat0")
        ping = lab.exec(first, ["ping", "-c", "4", "-i", "0.3", "-W", "2", lab.address(last)])
        print(ping.stdout, end="")
        if ping.returncode:
            return 1
        _step(f"iperf3 {first} -> {last}, {iperf_seconds} s, across 4 hops")
        server = lab.spawn(last, ["iperf3", "-s", "-1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            iperf = lab.exec(first, ["iperf3", "-c", lab.address(last), "-t", str(iperf_seconds)],
                             timeout=iperf_seconds + 30)
            print(iperf.stdout, end="")
        finally:
            server.kill()
            server.wait()
        _step(f"batmanctl s on {lab.nodes[2]} (a relay)")
        print(lab.batmanctl(lab.nodes[2], "s", check=True).stdout, end="")
        _step("tearing the lab down")
    return 0 if iperf.returncode == 0 else 1


def main(argv: list[str] | None = None) -> int:
    import argparse
    import os

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["captures"]:
        return captures(argv[1:])
    parser = argparse.ArgumentParser(prog="batmand.demo", description=__doc__)
    parser.add_argument("--prefix", default=f"demo{os.getpid() % 100000}", help="lab prefix (namespaces)")
    parser.add_argument("--iperf-seconds", type=int, default=5)
    parser.add_argument("--interval", type=int, default=500, help="OGM interval (ms)")
    args = parser.parse_args(argv)
    return lab_demo(args.prefix, args.iperf_seconds, args.interval)


if __name__ == "__main__":
    sys.exit(main())
