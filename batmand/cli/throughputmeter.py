"""batmanctl throughputmeter|tp [-t MS] [-n] DEST: batctl's throughput meter (2023.x
throughputmeter.c), run by the daemon's tp meter toward DEST's originator.

Output and exit status as batctl: the three result lines on stdout and 0 for a complete
test (also one cut short by Ctrl-C, which cancels it and prints what was measured, as
the kernel reports it), the error text on stderr and 1 otherwise. DEST is a bat-hosts
name or a MAC address. -n is batctl's "don't convert addresses to bat-host names": batctl
still looks DEST up in bat-hosts and prints no address, so it changes nothing visible
there either. -t takes a whole number of milliseconds (0: the kernel's 10 s); unlike
batctl 2023's strtoul, anything else is refused (as batctl 2026 does)."""

from __future__ import annotations

import signal
import struct
import sys

from batmand.core.tp_meter import TEST_LENGTH, TpReason

from .client import ControlError
from .commands import client_for, emit
from .hosts import load_bat_hosts, parse_mac

USAGE = ("Usage: batctl tp [parameters] <MAC>", "Parameters:", "\t -t <time> test length in milliseconds",
         "\t -n don't convert addresses to bat-host names")
ERRORS = {  # batctl's texts for the kernel's error reasons (stderr)
    TpReason.DST_UNREACHABLE: "Destination unreachable",
    TpReason.RESEND_LIMIT: "The number of retry for the same window exceeds the limit, test aborted",
    TpReason.ALREADY_ONGOING: "Cannot run two test towards the same node",
    TpReason.MEMORY_ERROR: "Kernel cannot allocate memory, aborted",
    TpReason.TOO_MANY: "Too many ongoing sessions",
}
CANCEL_TEXT = "CANCEL received: test aborted"
_F32 = struct.Struct("f")


def _f32(value: float) -> float:
    """What a C float holds: batctl computes the rates in single precision."""
    return _F32.unpack(_F32.pack(value))[0]


def throughput_text(total_bytes: int, test_time_ms: int) -> str:
    """batctl's `Throughput: ` value: byte rates in binary units (KB = 1024), bit rates in
    decimal ones, "inf" for a test of 0 ms. (The GB/s line keeps batctl 2023's "%2.f".)"""
    if test_time_ms <= 0:
        return "inf"
    thr = total_bytes * 1000 // test_time_ms
    f = _f32(thr)
    if thr > 1 << 30:
        return "%.2f GB/s (%2.f Gbps)" % (_f32(f / (1 << 30)), _f32(_f32(f * 8) / 1e9))
    if thr > 1 << 20:
        return "%.2f MB/s (%.2f Mbps)" % (_f32(f / (1 << 20)), _f32(_f32(f * 8) / 1e6))
    if thr > 1 << 10:
        return "%.2f KB/s (%.2f Kbps)" % (_f32(f / (1 << 10)), _f32(_f32(f * 8) / 1e3))
    return "%d Bytes/s (%d Bps)" % (thr, thr * 8)


def result_lines(result: dict) -> tuple[list[str], list[str], int]:
    """(stdout lines, stderr lines, exit status) for the daemon's result."""
    code = int(result.get("result") or 0)
    if code in ERRORS:
        return [], [ERRORS[code]], 1
    if code not in (TpReason.COMPLETE, TpReason.CANCEL):
        return [f"Unrecognized return value {code}"], [], 1
    out = [CANCEL_TEXT] if code == TpReason.CANCEL else []
    test_time, total = int(result.get("test_time_ms") or 0), int(result.get("total_bytes") or 0)
    out += [f"Test duration {test_time}ms.", f"Sent {total} Bytes.", f"Throughput: {throughput_text(total, test_time)}"]
    return out, [], 0


def event_text(code: int) -> str:
    """What batctl event prints after `tp_meter 0x%08x: ` (event.c)."""
    if code == TpReason.COMPLETE:
        return "complete"
    if code == TpReason.CANCEL:
        return CANCEL_TEXT
    return ERRORS.get(code, "unknown")


def _usage(error: str | None = None) -> int:
    lines = ([error] if error else []) + list(USAGE)
    sys.stderr.write("\n".join(lines) + "\n")
    return 1


def _destination(text: str) -> str | None:
    """batctl: a bat-hosts name first, else ether_aton."""
    for mac, name in load_bat_hosts().items():
        if name == text:
            return mac
    return parse_mac(text)


def run(args) -> int:

    if args.dest is None:
        return _usage()
    length = 0
    if args.test_time is not None:
        try:
            if not args.test_time.strip().isdigit():
                raise ValueError
            length = TEST_LENGTH.parse(args.test_time.strip())
        except ValueError:
            return _usage(f"Error - the supplied test duration is invalid: {args.test_time}")
    mac = _destination(args.dest)
    if mac is None:
        emit([f"Error - the tp meter destination is not a mac address or bat-host name: {args.dest}"])
        return 1
    client = client_for(args)
    stream = client.stream("tp", {"dst": mac, "test_time": length})
    interrupted = []

    def cancel(signum, frame):
        """batctl's tp_sig_handler: the first Ctrl-C (or SIGTERM) cancels the test and the
        result is still waited for; another one stops waiting."""
        if interrupted:
            raise KeyboardInterrupt
        interrupted.append(signum)
        try:
            client.request("tp_cancel", {"dst": mac})
        except ControlError:
            raise KeyboardInterrupt from None

    previous = {sig: signal.signal(sig, cancel) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for _ in stream:  # the start and progress events: batctl prints nothing while it waits
            pass
    except KeyboardInterrupt:
        stream.close()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    result = stream.result if isinstance(stream.result, dict) else {}
    out, err, status = result_lines(result)
    emit(out)
    if err:
        sys.stderr.write("\n".join(err) + "\n")
    return status


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("throughputmeter", aliases=["tp"], help="start a throughput measurement")
    p.add_argument("-t", dest="test_time", metavar="TIME", help="test length in milliseconds")
    p.add_argument("-n", dest="no_names", action="store_true", help="don't convert addresses to bat-host names")
    p.add_argument("dest", nargs="?", metavar="<destination>")
    p.set_defaults(func=run)
