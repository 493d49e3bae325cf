"""`python -m batmand.lab`: build, inspect and remove labs from the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys

from . import net
from .lab import Lab, LabError, down, format_status, list_labs
from .topology import TopologyError, shipped_names

DEFAULT_PREFIX = "lab"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m batmand.lab",
                                description="meshes of batmand nodes (and kernel batman-adv VMs) in network namespaces")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--prefix", default=DEFAULT_PREFIX, help=f"lab prefix: namespaces are PREFIX-NODE (default {DEFAULT_PREFIX})")
        return sp

    sp = cmd("up", "build a lab from a topology, start batmand in every node (boot the kernel nodes' VMs), "
                   "address the bat0s")
    sp.add_argument("topology", help=f"a TOML file, or a shipped topology: {', '.join(shipped_names())}")
    sp.add_argument("--no-daemons", action="store_true", help="only namespaces, links and clients")
    sp.add_argument("--replace", action="store_true", help="remove a lab with the same prefix first")
    sp.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each daemon (default 10)")
    sp.add_argument("--daemon", help="daemon program instead of this venv's batmand (split on spaces)")

    sp = cmd("down", "stop everything of a lab and remove it (also leftovers after a crash)")
    sp.add_argument("--keep-logs", action="store_true", help="keep the daemon logs")

    sp = cmd("exec", "run a command in a node's (or client's) namespace; on a kernel node: in its VM")
    sp.add_argument("node")
    sp.add_argument("--netns", action="store_true", help="kernel node: run on the host in its namespace, not in the VM")
    sp.add_argument("--timeout", type=float, default=None, help="kernel node: time limit in the VM (default 120 s)")
    sp.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    sp = cmd("show", "nodes, interfaces, links with loss and rate, and `batmanctl o` per running daemon")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--no-originators", action="store_true", help="skip batmanctl o")

    sp = cmd("start", "start batmand (kernel nodes: boot the VM) in the nodes (all by default), address the bat0s")
    sp.add_argument("nodes", nargs="*")
    sp.add_argument("--timeout", type=float, default=10.0)

    sp = cmd("stop", "stop batmand (kernel nodes: the VM) in the nodes (all by default)")
    sp.add_argument("nodes", nargs="*")

    sp = cmd("loss", "set the loss of link A-B")
    sp.add_argument("a")
    sp.add_argument("b")
    sp.add_argument("percent", type=float)
    sp.add_argument("--direction", choices=["both", "ab", "ba"], default="both", help="ab: frames from A to B")

    sp = cmd("rate", "set the rate of link A-B (e.g. 10mbit; 0 removes it)")
    sp.add_argument("a")
    sp.add_argument("b")
    sp.add_argument("rate")
    sp.add_argument("--direction", choices=["both", "ab", "ba"], default="both")

    sp = cmd("link", "take link A-B down or bring it up (both veth ends)")
    sp.add_argument("a")
    sp.add_argument("b")
    sp.add_argument("state", choices=["up", "down"])

    sub.add_parser("list", help="labs with namespaces or files left")
    sp = sub.add_parser("kernel-image", help="build / show the kernel nodes' VM image (kernel-image -h)",
                        add_help=False)
    sp.add_argument("rest", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kernel-image"]:  # its own parser (build / show)
        from . import kernel_image
        return kernel_image.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (LabError, TopologyError, net.NetError, NotImplementedError) as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1


def _run(args) -> int:
    if args.command == "list":
        for prefix, namespaces in sorted(list_labs().items()):
            print(f"{prefix}: {', '.join(namespaces) if namespaces else '(files only)'}")
        return 0
    if args.command == "down":
        removed = down(args.prefix, keep_logs=args.keep_logs)
        print(f"lab {args.prefix}: removed {len(removed)} namespace(s)")
        return 0
    if args.command == "up":
        if args.replace:
            down(args.prefix)
        lab = Lab(args.topology, args.prefix, daemon=args.daemon.split() if args.daemon else None)
        lab.up()
        if not args.no_daemons:
            try:
                lab.start(timeout=args.timeout)
            except BaseException:
                lab.down(keep_logs=True)
                print(f"lab {args.prefix}: removed again; logs kept in {lab.lab_dir} "
                      f"(`down --prefix {args.prefix}` removes them)", file=sys.stderr)
                raise
        print(lab.show(originators=False))
        for node, secs in lab.boot_times().items():
            if secs is not None:
                print(f"kernel node {node}: VM ready {secs:g}s after QEMU started")
        return 0
    if args.command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            raise LabError("exec needs a command: exec --prefix P NODE -- COMMAND ...")
        ns = f"{args.prefix}-{args.node}"
        if not net.namespace_exists(ns):
            raise LabError(f"no namespace {ns} (is lab {args.prefix} up?)")
        lab = None
        with contextlib.suppress(LabError, TopologyError):
            lab = Lab.attach(args.prefix)
        if lab is not None and args.node in lab.topology.nodes and lab.is_kernel(args.node) and not args.netns:
            try:
                return lab.exec(args.node, argv, timeout=args.timeout, capture=False).returncode
            except subprocess.TimeoutExpired as exc:
                sys.stdout.write(exc.output or "")
                sys.stderr.write((exc.stderr or "") + f"lab: timed out after {exc.timeout:g}s in {args.node}'s VM\n")
                return 124
        return subprocess.run(net.in_namespace(ns, argv)).returncode
    lab = Lab.attach(args.prefix)
    if args.command == "show":
        st = lab.status(originators=not args.no_originators)
        print(json.dumps(st, indent=1) if args.json else format_status(st))
    elif args.command == "start":
        lab.start_daemons(args.nodes or None, timeout=args.timeout)
        lab.configure_mesh_addresses(args.nodes or None, timeout=args.timeout)
    elif args.command == "stop":
        lab.stop_daemons(args.nodes or None)
    elif args.command == "loss":
        lab.set_loss(args.a, args.b, args.percent, args.direction)
    elif args.command == "rate":
        lab.set_rate(args.a, args.b, None if args.rate in ("0", "none") else args.rate, args.direction)
    elif args.command == "link":
        lab.set_link(args.a, args.b, args.state == "up")
    return 0
