"""batmanctl topology: this node's batadv-vis view (its interfaces, one-hop neighbours with
TQ or throughput, local clients) as batadv-vis draws it: DOT (the default), batadv-vis's
JSON lines (--json) or its JSON document (--jsondoc), or a PNG through graphviz's dot.
The whole mesh is batadv-vis's job, on a node where alfred runs (alfred_vis = true)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from batmand import __version__
from batmand.daemon import vis

from .client import Client, ControlError, socket_path

DOT_TIMEOUT = 60.0  # seconds graphviz may take for a picture of one node


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("topology", help="this node's batadv-vis view: DOT, JSON or a PNG")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--dot", action="store_const", dest="form", const="dot", help="graphviz DOT (the default)")
    form.add_argument("--json", action="store_const", dest="form", const="json",
                      help="batadv-vis -f json: one JSON object per line")
    form.add_argument("--jsondoc", action="store_const", dest="form", const="jsondoc",
                      help="batadv-vis -f jsondoc, with each neighbour's tq or throughput")
    form.add_argument("--png", metavar="FILE", help="draw it with graphviz's dot into FILE")
    p.set_defaults(func=run_topology, form="dot")


def render(result: dict, form: str) -> str:
    record = vis.Record.from_json(result["record"]) if result.get("record") else None
    records = [record] if record else []
    if form == "json":
        return vis.json_lines(records)
    if form == "jsondoc":
        return json.dumps(vis.jsondoc(records, f"batmand-{__version__}"), indent=2) + "\n"
    return vis.dot(records)


def run_topology(args) -> int:
    client = Client(socket_path(args.meshif, getattr(args, "socket", None)), args.meshif)
    result = client.request("topology") or {}
    if args.png:
        return _png(render(result, "dot"), args.png)
    sys.stdout.write(render(result, args.form))
    return 0


def _png(source: str, path: str) -> int:
    dot = shutil.which("dot")
    if dot is None:
        raise ControlError("--png needs graphviz's dot, which is not installed (apt install graphviz); "
                           "--dot prints the graph for another machine")
    try:
        proc = subprocess.run([dot, "-Tpng", "-o", path], input=source, capture_output=True, text=True,
                              timeout=DOT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ControlError(f"dot did not finish within {DOT_TIMEOUT:g} s") from None
    if proc.returncode != 0:
        raise ControlError(f"dot failed (exit status {proc.returncode}): {proc.stderr.strip()}")
    return 0
