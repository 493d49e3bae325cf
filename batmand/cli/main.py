"""batmanctl: the batctl-style command line for batmand."""

from __future__ import annotations

import argparse
import os
import sys

from . import commands, tcpdump, throughputmeter
from .client import ControlError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batmanctl", description="batctl-style control of batmand",
        epilog="The control socket is --socket PATH, else $BATMAND_SOCKET, else /run/batmand/<meshif>.sock. "
               "batctl's `meshif bat0 COMMAND` form works too.")
    parser.add_argument("-m", "--meshif", default="bat0", help="mesh interface (default: bat0)")
    parser.add_argument("--socket", metavar="PATH", help="control socket of batmand")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parsers(subparsers)
    tcpdump.add_parser(subparsers)
    throughputmeter.add_parser(subparsers)
    return parser


def _meshif_prefix(argv: list[str]) -> list[str]:
    """batctl's `batctl meshif bat0 COMMAND ...` as `-m bat0 COMMAND ...`."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-m", "--meshif", "--socket"):
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        if arg == "meshif" and i + 1 < len(argv):
            return argv[:i] + ["-m", argv[i + 1]] + argv[i + 2:]
        return argv
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_meshif_prefix(argv))
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except ControlError as exc:
        sys.stdout.flush()
        print(f"batmanctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `batmanctl td -r x | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
