"""VLANs between batmand and the kernel's batman-adv (2022.3): a VLAN device on the kernel
node's bat0 and a configured VLAN on ours; each side announces its bat0 MAC and clients on
VID 5 in the TT, as the other decodes and shows them, and a host frame on a VLAN batmand
does not have announces nothing."""

import json
import re
import socket
import time

from batmand.lab import Lab, load
from tests.daemon.labs import prefix, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import bat0_mac, converge
from tests.netns import entered


def _kernel_tg(lab, node: str) -> dict[str, set[int]]:
    """batctl tg in the kernel node: client MAC -> VIDs it is announced on."""
    out = lab.exec(node, ["batctl", "tg", "-H"]).stdout
    seen: dict[str, set[int]] = {}
    for m in re.finditer(r"^\s*[*+]?\s*([0-9a-f:]{17})\s+(-?\d+)\s", out, re.M):
        seen.setdefault(m[1], set()).add(int(m[2]))
    return seen


def _our_tg(lab, node: str) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = {}
    for r in json.loads(lab.batmanctl(node, "tg", "--json", check=True).stdout):
        seen.setdefault(r["tt_address"], set()).add(r["tt_vid"])
    return seen


def _host_sends_tagged(lab, node: str, src: str, vid: int) -> None:
    frame = b"\xff" * 6 + bytes.fromhex(src.replace(":", "")) + b"\x81\x00" + vid.to_bytes(2, "big") \
        + b"\x08\x06" + bytes(28)
    with entered(lab.ns(node)):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    with sock:
        sock.bind(("bat0", 0))
        sock.send(frame)


def test_vlans_with_a_kernel_node():
    topo = load("interop-pair")
    topo.batmand["orig_interval_ms"] = 500
    topo.nodes["b1"].batmand["vlans"] = [5]
    lab = Lab(topo, prefix())
    require_kernel_nodes(len(lab.kernel_nodes))
    with lab:
        lab.start(timeout=120)
        converge(lab)
        lab.exec("k2", ["sh", "-c", "modprobe 8021q; ip link add link bat0 name bat0.5 type vlan id 5 && "
                                    "ip link set bat0.5 up"], check=True)
        client, stranger = "02:cc:00:00:05:01", "02:cc:00:00:07:01"
        _host_sends_tagged(lab, "b1", client, 5)
        _host_sends_tagged(lab, "b1", stranger, 7)  # b1 has no VLAN 7: refused
        ours, theirs = bat0_mac(lab, "b1"), bat0_mac(lab, "k2")
        # the kernel node shows our bat0 MAC and our client on VID 5
        wait_for(lambda: 5 in _kernel_tg(lab, "k2").get(ours, set()) and 5 in _kernel_tg(lab, "k2").get(client, set()),
                 timeout=30, step=1.0)
        # we show the kernel's bat0 MAC on VID 5 (its VLAN device)
        wait_for(lambda: 5 in _our_tg(lab, "b1").get(theirs, set()), timeout=30, step=1.0)
        assert stranger not in _kernel_tg(lab, "k2")
        assert json.loads(lab.batmanctl("b1", "s", "--json", check=True).stdout)["drop_tt_local_unknown_vlan"] >= 1
        # both sides agree on every VLAN's CRC: no TT request for 10 OGM intervals
        before = json.loads(lab.batmanctl("b1", "s", "--json", check=True).stdout)["tt_request_tx"]
        kernel_before = re.search(r"tt_request_tx: (\d+)", lab.exec("k2", ["batctl", "s"]).stdout)[1]
        time.sleep(5)
        assert json.loads(lab.batmanctl("b1", "s", "--json", check=True).stdout)["tt_request_tx"] == before
        assert re.search(r"tt_request_tx: (\d+)", lab.exec("k2", ["batctl", "s"]).stdout)[1] == kernel_before
