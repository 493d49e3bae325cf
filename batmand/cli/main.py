"""batmanctl: the batctl-style command line for batmand."""

from __future__ import annotations

import argparse
import os
import sys

from . import tcpdump


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batmanctl", description="batctl-style control of batmand")
    parser.add_argument("-m", "--meshif", default="bat0", help="mesh interface (default: bat0)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    tcpdump.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `batmanctl td -r x | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
