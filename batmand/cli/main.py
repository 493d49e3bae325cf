"""batmanctl (and `batctl`, its batctl-named twin): batctl's command line for batmand.

grammar.py decides which command runs for which mesh (batctl's selectors and scopes); each
command is an argparse subcommand that parses its own options."""

from __future__ import annotations

import argparse
import os
import sys

from . import commands, event, grammar, install_batctl, json_verbs, tcpdump, throughputmeter, topology
from .client import Client, ControlError, NoDaemon, socket_path
from .commands import UsageError


class BatctlArgumentParser(argparse.ArgumentParser):
    """A command's option parser that fails as batctl does: "Error - ..." and exit status 1."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"Error - {message}\n")


def build_parser(prog: str = "batmanctl") -> argparse.ArgumentParser:
    parser = BatctlArgumentParser(prog=prog, add_help=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=BatctlArgumentParser)
    commands.add_parsers(subparsers)
    tcpdump.add_parser(subparsers)
    throughputmeter.add_parser(subparsers)
    json_verbs.add_parsers(subparsers)
    topology.add_parser(subparsers)
    install_batctl.add_parser(subparsers)
    event.add_parser(subparsers)
    for command in grammar.COMMANDS:  # a batctl command without an implementation says so
        if command.subcommand not in subparsers.choices:
            p = subparsers.add_parser(command.subcommand)
            p.add_argument("words", nargs="*", help=argparse.SUPPRESS)
            p.set_defaults(func=commands.run_refused, why=f"{command.name}: batmand does not implement it yet")
    return parser


def hardif_mesh(ifname: str, inv: grammar.Invocation) -> str | None:
    """The mesh interface whose batmand has `ifname` (batctl reads the interface's master)."""
    for meshif in grammar.meshes_to_ask(inv.meshif, inv.socket):
        try:
            rows = Client(socket_path(meshif, inv.socket), meshif, timeout=2.0).request("interfaces") or []
        except ControlError:
            continue
        if any(row.get("hard_ifname") == ifname for row in rows):
            return meshif
    return None


def _prog() -> str:
    name = os.path.basename(sys.argv[0] or "")
    return "batctl" if name == "batctl" else "batmanctl"


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or (_prog() if argv is None else "batmanctl")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        inv = grammar.parse(argv, hardif_mesh=hardif_mesh)
    except grammar.GrammarError as exc:
        print(f"Error - {exc}", file=sys.stderr)
        if exc.usage:
            sys.stderr.write(grammar.usage(prog))
        return 1
    for warning in inv.warnings if prog == "batctl" else ():  # batmanctl's own -m is not deprecated
        print(warning, file=sys.stderr)
    if inv.show_help:
        sys.stderr.write(grammar.usage(prog))
        return 0
    if inv.show_version:
        print(grammar.version_line(prog))
        return 0
    parser = build_parser(prog)
    namespace = argparse.Namespace(meshif=inv.meshif, socket=inv.socket, vid=inv.vid, hardif=inv.hardif,
                                   prog=prog, grammar=inv.command)
    try:
        args = parser.parse_args([inv.command.subcommand, *inv.rest], namespace=namespace)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return args.func(args)
    except UsageError as exc:
        sys.stdout.flush()
        print(f"Error - {exc}", file=sys.stderr)
        return 1
    except NoDaemon as exc:
        sys.stdout.flush()
        if prog == "batctl":  # what batctl says when the mesh interface is missing
            print(f"Error - interface {args.meshif} is not present or not a batman-adv interface", file=sys.stderr)
        else:
            print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except ControlError as exc:
        sys.stdout.flush()
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `batmanctl td -r x | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def batctl_main() -> int:
    """The `batctl` name (batmanctl install-batctl)."""
    return main(prog="batctl")


if __name__ == "__main__":
    sys.exit(main())
