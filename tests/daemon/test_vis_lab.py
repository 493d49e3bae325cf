"""alfred + batadv-vis over a batmand mesh: Debian's alfred in every node of a line of three
(primary mode, -b none: there is no batman-adv module to ask), our daemons publishing with
alfred_vis = true (B.A.T.M.A.N. IV and V), and the real `batadv-vis` client on one node drawing every node with
its links. Also `batmanctl topology` (DOT, JSON, PNG) and the daemon's log while alfred is
missing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest

from tests.daemon.alfred_lab import Alfreds, wait_drawn
from tests.daemon.labs import make_lab, orig_mac, wait_for

pytestmark = pytest.mark.skipif(not (shutil.which("alfred") and shutil.which("batadv-vis") and shutil.which("dot")),
                                reason="needs Debian's alfred and graphviz (scripts/setup.sh installs them)")

INTERVAL_MS = 250
NODES = ("n1", "n2", "n3")


def _macs(lab, node: str) -> list[str]:
    return [lab.exec(node, ["cat", f"/sys/class/net/{i}/address"], check=True).stdout.strip()
            for i in lab.topology.hard_interfaces(node)]


@pytest.fixture(scope="module", params=["BATMAN_IV", "BATMAN_V"])
def mesh(request):
    lab = make_lab("line3", routing_algo=request.param, orig_interval_ms=INTERVAL_MS, alfred_vis=True,
                   alfred_vis_interval_ms=1000)
    lab.algo = request.param
    alfreds = Alfreds(lab)
    for node in NODES:  # alfred's socket is a file: one per namespace
        lab.topology.nodes[node].batmand["alfred_socket"] = alfreds.socket(node)
    with lab:
        try:
            lab.start()
            time.sleep(1.5)  # the daemons try to publish before there is an alfred (logged once)
            for node in NODES:
                alfreds.start(node)
            lab.alfreds = alfreds
            lab.macs = {n: _macs(lab, n) for n in NODES}
            lab.origs = {n: orig_mac(lab, n) for n in NODES}
            yield lab
        finally:
            alfreds.stop_all()


def batadv_vis(lab, node: str, form: str) -> str:
    return lab.alfreds.vis(node, form)


def expected(lab) -> dict:
    """primary -> (secondaries, {(router, neighbour)}): n2 reaches n1 and n3 on one interface
    each. A neighbour is the MAC of the peer's interface on that link, so n3's is n2's second
    interface. (IV: every interface sends OGMs as an originator of its own, and n3's route to
    n2's primary goes through it, no link of its own, as batadv-vis -s leaves out every
    originator that is not its own next hop. V: the neighbour table.) n1 and n3 hear each
    other only through n2."""
    m = lab.macs
    return {m["n1"][0]: ([], {(m["n1"][0], m["n2"][0])}),
            m["n2"][0]: (m["n2"][1:], {(m["n2"][0], m["n1"][0]), (m["n2"][1], m["n3"][0])}),
            m["n3"][0]: ([], {(m["n3"][0], m["n2"][1])})}


def wait_complete(lab, node: str, want: dict, timeout: float):
    return wait_drawn(lab.alfreds, node, lambda picture: picture == want, timeout)


def test_batadv_vis_lists_every_node_with_its_neighbours(mesh):
    want = expected(mesh)
    assert mesh.macs["n2"][0] == mesh.origs["n2"]  # the primary's MAC is the originator address
    doc, waited = wait_complete(mesh, "n1", want, timeout=40)
    print(f"batadv-vis on n1 drew the whole mesh after {waited:.1f} s more")
    for v in doc["vis"]:
        node = next(n for n in NODES if mesh.origs[n] == v["primary"])
        assert mesh.mesh_mac(node) in v["clients"]  # bat0's MAC, a local TT client
        for n in v["neighbors"]:
            assert 1.0 <= float(n["metric"]) <= 255.0  # 255/TQ (TQ 1..255; still rising at first)
    # the far end sees the same picture through its own alfred
    wait_complete(mesh, "n3", want, timeout=20)


def _json_objects(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_batadv_vis_json_and_dot(mesh):
    want = expected(mesh)
    wait_complete(mesh, "n1", want, timeout=40)
    objs = _json_objects(batadv_vis(mesh, "n1", "json"))
    assert {o["primary"] for o in objs if "primary" in o} == set(want)
    assert {(o["secondary"], o["of"]) for o in objs if "secondary" in o} == {(mesh.macs["n2"][1], mesh.origs["n2"])}
    assert {(o["router"], o["neighbor"]) for o in objs if "neighbor" in o} == set.union(*(v[1] for v in want.values()))
    assert {o["gateway"] for o in objs if "gateway" in o} >= {mesh.mesh_mac(n) for n in NODES}
    source = batadv_vis(mesh, "n1", "dot")
    for primary in want:
        assert f'subgraph "cluster_{primary}"' in source
    for router, neighbour in set.union(*(v[1] for v in want.values())):
        assert re.search(rf'"{router}" -> "{neighbour}" \[label="\d\.\d{{3}}"\]', source)
    svg = subprocess.run(["dot", "-Tsvg"], input=source, capture_output=True, text=True, timeout=60)
    assert svg.returncode == 0 and "<svg" in svg.stdout, svg.stderr


def _unlabelled(text: str) -> list[str]:
    return [re.sub(r'"label" : "[\d.]+"', '"label" : _', line) for line in text.splitlines()]


def test_batmanctl_topology_is_what_batadv_vis_shows_of_the_node(mesh, tmp_path):
    want = expected(mesh)
    wait_complete(mesh, "n1", want, timeout=40)
    ours = mesh.batmanctl("n2", "topology", "--json", check=True).stdout
    # n2's lines of batadv-vis's answer on n1 (records follow each other: primary, secondaries, entries)
    theirs, inside = [], False
    for line in batadv_vis(mesh, "n1", "json").splitlines():
        if '"primary"' in line:
            inside = mesh.origs["n2"] in line
        if inside:
            theirs.append(line)
    # the TQs may have moved by a point since the last push; the rest is the same, line for line
    assert theirs and sorted(_unlabelled(ours)) == sorted(_unlabelled("\n".join(theirs)))
    doc = json.loads(mesh.batmanctl("n2", "topology", "--jsondoc", check=True).stdout)
    (node,) = doc["vis"]
    assert node["primary"] == mesh.origs["n2"] and node["secondary"] == mesh.macs["n2"][1:]
    assert {(n["router"], n["neighbor"]) for n in node["neighbors"]} == want[mesh.origs["n2"]][1]
    if mesh.algo == "BATMAN_IV":
        assert all(1 <= n["tq"] <= 255 and n["metric"] == f"{255 / n['tq']:.3f}" for n in node["neighbors"])
    else:  # no room for a throughput in vis v1: quality 255 on the wire, the throughput here
        assert all(n["throughput"] > 0 and n["metric"] == "1.000" for n in node["neighbors"])
    dot_src = mesh.batmanctl("n2", "topology", "--dot", check=True).stdout
    assert mesh.batmanctl("n2", "topology", check=True).stdout.startswith("digraph {\n")  # DOT is the default
    assert dot_src.startswith("digraph {\n") and f'subgraph "cluster_{mesh.origs["n2"]}"' in dot_src
    png = tmp_path / "n2.png"
    mesh.batmanctl("n2", "topology", "--png", str(png), check=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # without graphviz: a clear error, no file
    nodot = mesh.exec("n2", ["env", "PATH=/nonexistent", *mesh.batmanctl_command("n2", "topology", "--png",
                                                                                 str(tmp_path / "x.png"))])
    assert nodot.returncode == 1 and "graphviz's dot, which is not installed" in nodot.stderr
    assert not (tmp_path / "x.png").exists()


def _log(lab, node: str) -> str:
    return lab.log_path(node).read_text()


def test_a_missing_alfred_is_logged_once_and_its_return_too(mesh):
    for node in NODES:  # before the alfreds were started
        text = _log(mesh, node)
        assert text.count("cannot reach alfred") == 1, text
        assert text.count("publishing to alfred at") == 1, text
    mesh.alfreds.stop("n3")
    time.sleep(3.5)  # three more pushes fail: one more line
    assert _log(mesh, "n3").count("cannot reach alfred") == 2
    assert mesh.daemon_running("n3")
    mesh.alfreds.start("n3")
    wait_for(lambda: _log(mesh, "n3").count("publishing to alfred at") == 2, timeout=10)
    assert _log(mesh, "n3").count("cannot reach alfred") == 2
