"""The gateway tests' DHCP helpers (tests/daemon/dhcp.py) on their own, without batman-adv:
dnsmasq and udhcpc across a veth between two namespaces, a client without a server, and the
capture's reading of batman-adv frames sent by hand."""

import os
import shutil

import pytest

from batmand.wire import (BROADCAST, Bcast, InnerFrame, Mac, PacketType, Unicast, Unicast4Addr, Unicast4AddrSubtype,
                          build_frame)
from tests.daemon.daemons import link_mac, linked_namespaces
from tests.daemon.dhcp import (DhcpTimeout, capture, dhcpv4_discover, dhcpv6_solicit, dnsmasq, inner_udp, send_raw,
                               udhcpc)
from tests.daemon.labs import wait_for
from tests.netns import ip

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root"),
    pytest.mark.skipif(shutil.which("dnsmasq") is None and not os.path.exists("/usr/sbin/dnsmasq"),
                       reason="dnsmasq is not installed (scripts/setup.sh installs dnsmasq-base)"),
]


def test_dnsmasq_hands_udhcpc_a_lease_across_a_veth(tmp_path):
    with linked_namespaces() as (server, client):
        ip("addr", "add", "10.99.0.1/24", "dev", "eth0", netns=server)
        with dnsmasq(server, "eth0", "10.99.0.50", "10.99.0.59", tmp_path) as srv:
            lease = udhcpc(client, "eth0", tmp_path)
            assert lease.server_id == "10.99.0.1"
            assert lease.subnet == "255.255.255.0"
            assert 50 <= int(lease.ip.rsplit(".", 1)[1]) <= 59, lease
            mac = link_mac(client, "eth0")
            assert srv.leases() == {mac: lease.ip}
            wait_for(lambda: srv.messages("ACK"), timeout=5)  # its log is written a little later
            assert any(mac in line for line in srv.messages("DISCOVER")), srv.messages()
            # with the broadcast flag (the server answers to ff:ff:ff:ff:ff:ff): the same lease
            assert udhcpc(client, "eth0", tmp_path, broadcast=True).ip == lease.ip
            pid = srv.proc.pid
        assert srv.proc is None and _zombie_or_gone(pid)  # stopped by its PID on leaving the block


def _zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_udhcpc_without_a_server_raises_with_what_it_said(tmp_path):
    with linked_namespaces() as (_, client):
        with pytest.raises(DhcpTimeout, match="no DHCP lease") as err:
            udhcpc(client, "eth0", tmp_path, tries=2)
        assert "udhcpc" in str(err.value)


def test_capture_counts_batman_frames_by_type_and_finds_the_dhcp_in_them():
    with linked_namespaces() as (a, b):
        src, dst = Mac(link_mac(a, "eth0")), Mac(link_mac(b, "eth0"))
        host = "02:cc:00:00:00:01"
        discover = InnerFrame.decode(dhcpv4_discover(host))
        solicit = InnerFrame.decode(dhcpv6_solicit(host))
        assert inner_udp(discover.h_proto, discover.payload) == (68, 67)
        assert inner_udp(solicit.h_proto, solicit.payload) == (546, 547)
        data = Unicast4AddrSubtype.DATA
        frames = [
            build_frame(BROADCAST, src, Bcast(seqno=1, orig=src, inner=discover)),
            build_frame(dst, src, Unicast4Addr(ttvn=1, dest=dst, src=src, subtype=data, inner=discover)),
            build_frame(dst, src, Unicast4Addr(ttvn=1, dest=dst, src=src, subtype=data, inner=solicit)),
            build_frame(dst, src, Unicast(ttvn=1, dest=dst, inner=InnerFrame.decode(bytes(14) + b"\x45" + bytes(40)))),
        ]
        with capture(a, ["eth0"]) as sent, capture(b, ["eth0"]) as received:
            for frame in frames:
                send_raw(a, "eth0", frame)
            send_raw(a, "eth0", b"\xff" * 12 + b"\x08\x06" + bytes(28))  # ARP: not batman-adv, not counted
            wait_for(lambda: len(received.select()) == 4 and len(sent.select()) == 4, timeout=5, step=0.05)
        want = {PacketType.BCAST: 1, PacketType.UNICAST_4ADDR: 2, PacketType.UNICAST: 1}
        assert sent.counts(outgoing=True) == want and not sent.counts(outgoing=False)
        assert received.counts(outgoing=False) == want and not received.counts(outgoing=True)
        assert received.counts(dhcp=True) == {PacketType.BCAST: 1, PacketType.UNICAST_4ADDR: 2}
        fouraddr = received.select(packet_type=PacketType.UNICAST_4ADDR)
        assert all(f.dhcp_to_server and not f.dhcp_to_client for f in fouraddr)
        assert {f.udp for f in fouraddr} == {(68, 67), (546, 547)}
        assert all(f.packet.dest == dst and f.packet.subtype == Unicast4AddrSubtype.DATA for f in fouraddr)
        assert "eth0 in BCAST udp (68, 67)" in received.dhcp_summary()
