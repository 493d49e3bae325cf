"""Gateway mode between batmand and the kernel's batman-adv (2022.3), IV and V: one
interop-pair lab per algorithm (b1 = batmand, k2 = a kernel node), shared by the tests of
that algorithm, each of which leaves both sides' gateway mode off again.

- with gateway mode off, DHCP crosses the mesh as broadcasts both ways (the baseline, and
  the guest's udhcpd/udhcpc against our dnsmasq/udhcpc);
- a kernel gateway server (`batctl gw server 20mbit/5mbit`, udhcpd on its bat0) and a
  batmand client get a lease through the kernel's gateway, our DHCP as UNICAST_4ADDR to it;
- a batmand gateway server (`batmanctl gw server 30mbit/6mbit`, dnsmasq) and a kernel
  client (`batctl gw client`, udhcpc in the guest): `batctl gwl` lists our originator with
  30.0/6.0 MBit, the kernel's DHCP reaches us as UNICAST_4ADDR and it gets its lease; the
  kernel's uevent says what ours must say."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

from batmand.lab import Lab, load
from batmand.wire import PacketType, Unicast4AddrSubtype
from tests.daemon.dhcp import capture, dhcp_lease, dhcp_server
from tests.daemon.labs import prefix, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge, kernel_json, ok

INTERVAL_MS = 500
KERNEL_RANGE = ("10.77.0.150", "10.77.0.159")  # udhcpd in k2's guest
OUR_RANGE = ("10.77.0.160", "10.77.0.169")  # dnsmasq on b1's bat0
CLIENT_LINE = {"BATMAN_IV": "client (selection class: 20)", "BATMAN_V": "client (selection class: 5.0 MBit)"}
HEADER = {"BATMAN_IV": "  Router            ( TQ) Next Hop          [outgoingIf]  Bandwidth",
          "BATMAN_V": "  Router            ( throughput) Next Hop          [outgoingIf]  Bandwidth"}
ROW = re.compile(r"^([* ]) ([0-9a-f:]{17}) \(\s*([\d.]+)\) ([0-9a-f:]{17}) \[\s*(\S+)\]: (\d+\.\d)/(\d+\.\d) MBit$")
DATA = Unicast4AddrSubtype.DATA  # BATADV_P_DATA (1): user payload in a UNICAST_4ADDR
SERVER_LINE = re.compile(r"^server \(announced bw: (\d+\.\d)/(\d+\.\d) MBit\)$")
# the guest's uevent listener: the gateway uevents of bat0, with the variables the kernel sets
UEVENT_SCRIPT = """#!/bin/sh
[ "$BATTYPE" = gw ] && echo "BATACTION=$BATACTION BATDATA=${BATDATA-<unset>} INTERFACE=$INTERFACE ACTION=$ACTION" \\
    >> /tmp/gw-uevents.log
exit 0
"""


@pytest.fixture(scope="module", params=["BATMAN_IV", "BATMAN_V"])
def pair(request):
    """interop-pair with the algorithm, converged; one VM boot per algorithm."""
    algo = request.param
    topo = load("interop-pair")
    topo.batmand["orig_interval_ms"] = INTERVAL_MS
    topo.batmand["routing_algo"] = algo
    if algo == "BATMAN_V":  # virtio-net reports no speed: give both sides the same figure
        for name, node in topo.nodes.items():
            ifaces = [l.ifname_a if l.a == name else l.ifname_b for l in topo.links if name in (l.a, l.b)]
            node.batmand["hardif"] = {i: {"throughput_override": "100mbit"} for i in ifaces}
    lab = Lab(topo, prefix())
    require_kernel_nodes(len(lab.kernel_nodes))
    with lab:
        lab.start(timeout=120)
        converge(lab)
        lab.algo = algo
        yield lab


@contextlib.contextmanager
def _gateway_modes_reset(lab: Lab):
    """Both sides' gateway mode off again afterwards, whatever happened (the next test
    starts from the kernel's default)."""
    try:
        yield
    finally:
        lab.exec("k2", ["batctl", "gw", "off"])
        lab.batmanctl("b1", "gw", "off")


def _rows(text: str) -> dict[str, tuple]:
    """gwl rows by gateway originator (batctl's and ours are the same format)."""
    return {m[2]: m.groups() for line in text.splitlines() if (m := ROW.match(line))}


def _in(ip: str, span: tuple[str, str]) -> bool:
    low, high = (int(a.rsplit(".", 1)[1]) for a in span)
    return ip.startswith("10.77.0.") and low <= int(ip.rsplit(".", 1)[1]) <= high


def _dhcp_goes_to_the_gateway(lab: Lab, client: str, server: str, span: tuple[str, str], tmp_path, what: str):
    """`client` gets leases from `server` (with and without udhcpc -B) and, as seen on b1's
    link: the requests as UNICAST_4ADDR DATA from the client's originator to the server's,
    never a DHCP broadcast, the replies as UNICAST to the client's originator."""
    ours = client == "b1"  # b1 is the batmand side: its outgoing frames are the client's
    client_orig, server_orig = lab.originator(client), lab.originator(server)
    for broadcast in (False, True):  # with -B the server's gateway unicasts its broadcast reply
        with capture(lab.ns("b1"), ["e-k2"]) as cap:
            lease = dhcp_lease(lab, client, tmp_path, broadcast=broadcast)
        assert lease.server_id == lab.address(server) and _in(lease.ip, span), lease
        print(f"\nGATEWAY {lab.algo} {what}{' -B' if broadcast else ''}: lease {lease.ip} from {lease.server_id}; "
              f"frames:\n{cap.dhcp_summary()}")
        requests = cap.select(outgoing=ours, dhcp=True)
        assert requests, cap.dhcp_summary()
        for f in requests:
            assert f.packet_type == PacketType.UNICAST_4ADDR, cap.dhcp_summary()
            assert (str(f.packet.dest), str(f.packet.src), f.packet.subtype) == (server_orig, client_orig, DATA), \
                cap.dhcp_summary()
        assert not cap.select(packet_type=PacketType.BCAST, dhcp=True), cap.dhcp_summary()
        replies = cap.select(outgoing=not ours, dhcp=True)
        assert replies and all(f.packet_type == PacketType.UNICAST and str(f.packet.dest) == client_orig
                               for f in replies), cap.dhcp_summary()
    return lease


def test_with_gateway_mode_off_dhcp_is_broadcast_both_ways(pair, tmp_path):
    lab = pair
    assert ok(lab.exec("k2", ["batctl", "gw"])).strip() == "off"
    b1, k2 = lab.originator("b1"), lab.originator("k2")
    with dhcp_server(lab, "b1", *OUR_RANGE, tmp_path) as ours, capture(lab.ns("b1"), ["e-k2"]) as cap:
        lease = dhcp_lease(lab, "k2", tmp_path)
        assert lease.server_id == lab.address("b1") and _in(lease.ip, OUR_RANGE), lease
        report = [f"k2 leased {lease.ip} from {lease.server_id}"]
        wait_for(lambda: lab.mesh_mac("k2") in ours.leases(), timeout=5)
    got = [f for f in cap.select(outgoing=False, dhcp=True) if f.dhcp_to_server]
    assert got and all(f.packet_type == PacketType.BCAST and str(f.packet.orig) == k2 for f in got), \
        cap.dhcp_summary()
    with dhcp_server(lab, "k2", *KERNEL_RANGE, tmp_path) as theirs, capture(lab.ns("b1"), ["e-k2"]) as cap:
        lease = dhcp_lease(lab, "b1", tmp_path)
        assert lease.server_id == lab.address("k2") and _in(lease.ip, KERNEL_RANGE), lease
        wait_for(lambda: lab.mesh_mac("b1") in theirs.leases(), timeout=5, step=0.5)
        report.append(f"b1 leased {lease.ip} from {lease.server_id}")
    sent = [f for f in cap.select(outgoing=True, dhcp=True) if f.dhcp_to_server]
    assert sent and all(f.packet_type == PacketType.BCAST and str(f.packet.orig) == b1 for f in sent), \
        cap.dhcp_summary()
    print(f"\nGATEWAY {lab.algo} off: {'; '.join(report)}; DHCP to servers as BCAST both ways")


def test_kernel_gateway_server_and_a_batmand_client(pair, tmp_path):
    lab = pair
    k2 = lab.originator("k2")
    with _gateway_modes_reset(lab):
        ok(lab.exec("k2", ["batctl", "gw", "server", "20mbit/5mbit"]))
        announced = SERVER_LINE.match(ok(lab.exec("k2", ["batctl", "gw"])).strip())
        assert announced and announced.groups() == ("20.0", "5.0"), announced
        ok(lab.batmanctl("b1", "gw", "client"))
        assert ok(lab.batmanctl("b1", "gw")).strip() == CLIENT_LINE[lab.algo]

        # we list and select the kernel's gateway with what it announces (batctl gw / batmanctl gwl agree)
        wait_for(lambda: _rows(ok(lab.batmanctl("b1", "gwl", "-H"))).get(k2, ("",))[0] == "*", timeout=15, step=0.5)
        text = ok(lab.batmanctl("b1", "gwl"))
        assert text.splitlines()[1] == HEADER[lab.algo], text
        best, _, metric, router, ifname, down, up = _rows(text)[k2]
        assert (router, ifname, (down, up)) == (k2, "e-k2", announced.groups()), text
        assert float(metric) > 0, text
        row = {r["orig_address"]: r for r in json.loads(ok(lab.batmanctl("b1", "gwl", "--json")))}[k2]
        assert (row["bandwidth_down"], row["bandwidth_up"], row["router"], row["best"]) == (200, 50, k2, True), row
        assert ("tq" if lab.algo == "BATMAN_IV" else "throughput") in row, row

        with dhcp_server(lab, "k2", *KERNEL_RANGE, tmp_path) as theirs:
            _dhcp_goes_to_the_gateway(lab, "b1", "k2", KERNEL_RANGE, tmp_path, f"kernel server, b1 client; gwl {_rows(text)[k2]}")
            wait_for(lambda: lab.mesh_mac("b1") in theirs.leases(), timeout=5, step=0.5)


def test_batmand_gateway_server_and_a_kernel_client(pair, tmp_path):
    lab = pair
    b1 = lab.originator("b1")
    with _gateway_modes_reset(lab):
        ok(lab.batmanctl("b1", "gw", "server", "30mbit/6mbit"))
        assert ok(lab.batmanctl("b1", "gw")).strip() == "server (announced bw: 30.0/6.0 MBit)"
        # the kernel's uevents, to hold ours against
        lab.shell("k2", f"cat > /tmp/gw-uevent.sh <<'EOF'\n{UEVENT_SCRIPT}EOF\nchmod 755 /tmp/gw-uevent.sh; "
                        "rm -f /tmp/gw-uevents.log", check=True)
        listener = lab.spawn("k2", ["uevent", "/tmp/gw-uevent.sh"])
        try:
            ok(lab.exec("k2", ["batctl", "gw", "client"]))
            assert ok(lab.exec("k2", ["batctl", "gw"])).strip() == CLIENT_LINE[lab.algo]

            # the kernel lists and selects our gateway with what we announce
            wait_for(lambda: _rows(ok(lab.exec("k2", ["batctl", "gwl", "-H"]))).get(b1, ("",))[0] == "*",
                     timeout=15, step=0.5)
            text = ok(lab.exec("k2", ["batctl", "gwl"]))
            assert HEADER[lab.algo] in text.splitlines(), text
            best, _, metric, router, ifname, down, up = _rows(text)[b1]
            assert (router, f"{down}/{up}") == (b1, "30.0/6.0") and float(metric) > 0, text
            row = next(r for r in kernel_json(lab, "k2", "gwj") if r["orig_address"] == b1)
            assert (row["bandwidth_down"], row["bandwidth_up"], row["router"], row.get("best")) == (300, 60, b1, True)
            wait_for(lambda: "BATACTION=add" in lab.exec("k2", ["cat", "/tmp/gw-uevents.log"]).stdout, timeout=10,
                     step=0.5)
            uevents = lab.exec("k2", ["cat", "/tmp/gw-uevents.log"]).stdout.splitlines()
            assert uevents == [f"BATACTION=add BATDATA={b1} INTERFACE=bat0 ACTION=change"], uevents
        finally:
            listener.kill()

        with dhcp_server(lab, "b1", *OUR_RANGE, tmp_path) as ours:
            lease = _dhcp_goes_to_the_gateway(lab, "k2", "b1", OUR_RANGE, tmp_path,
                                              f"b1 server, kernel client; batctl gwl {_rows(text)[b1]}; uevents {uevents}")
            wait_for(lambda: ours.leases().get(lab.mesh_mac("k2")) == lease.ip, timeout=5)
        # k2 is a client, no server: b1 lists no gateway
        assert _rows(ok(lab.batmanctl("b1", "gwl", "-H"))) == {}
