"""The distributed ARP table (the kernel's distributed-arp-table.c).

Nodes keep IPv4 -> MAC entries on the three DAT-capable originators closest to the
address's key on a ring (dat_hash.py) and in a local cache. A host's ARP request is
answered from the cache, or asked of those candidates (DHT_GET) while the broadcast waits
250 ms and is dropped if the answer came meanwhile; ARP replies and DHCPACKs are stored
at the candidates (DHT_PUT); a candidate answers a GET it has the entry for
(DAT_CACHE_REPLY). The frames are UNICAST_4ADDR with their subtypes.

Where the kernel's 2022.3 and newest releases differ, we do what the newest does (cached
replies are always 4addr, equally close candidates go by the lower address, the cache
keeps VLANs apart, ARP behind a priority tag is left alone); the entries' limit and
eviction are ours (the kernel has none)."""

from __future__ import annotations

import itertools
import struct
from collections import OrderedDict
from dataclasses import dataclass

from batmand.wire import DatTvlv, InnerFrame, Mac, Unicast4Addr, Unicast4AddrSubtype
from batmand.wire.constants import ETH_P_BATMAN, VLAN_HAS_TAG, TvlvType
from batmand.wire.ethernet import Ethernet

from .dat_hash import hash_dat, select_candidates
from .events import Deliver
from .forwarding import FROM_HOST, NO_SLOW_PATH, TO_HOST, SlowPath, SlowRule
from .hooks import DAT, DAT_DHCP

ARP_REQ_DELAY = 0.25  # the host's ARP request waits this long for a DHT answer
PURGE_PERIOD = 10.0  # batadv_dat_purge
CACHE_BUCKETS = 1024  # the kernel's hash table: the order batctl dc lists entries in
ETH_P_ARP, ETH_P_IP, ETH_P_8021Q = 0x0806, 0x0800, 0x8100
ARPOP_REQUEST, ARPOP_REPLY = 1, 2
BOOTP_MIN = 236 + 4  # the BOOTP header and the magic cookie
DHCP_MAGIC = b"\x63\x82\x53\x63"
DHCPACK = 5
GET, PUT, CACHE_REPLY = (Unicast4AddrSubtype.DAT_DHT_GET, Unicast4AddrSubtype.DAT_DHT_PUT,
                         Unicast4AddrSubtype.DAT_CACHE_REPLY)
_COUNTER = {GET: "dat_get_tx", PUT: "dat_put_tx"}
_RX_COUNTER = {GET: "dat_get_rx", PUT: "dat_put_rx"}
# while DAT is on: the host's ARP and DHCP replies both ways go through the core
_DAT_SLOW_PATH = SlowPath(rules=frozenset(
    SlowRule(direction, ethertype, proto, port) for direction in (FROM_HOST, TO_HOST)
    for ethertype, proto, port in ((ETH_P_ARP, None, None), (ETH_P_IP, 17, 68))))


@dataclass(frozen=True, slots=True)
class Arp:
    op: int
    sha: Mac
    spa: bytes
    tha: Mac
    tpa: bytes


def _usable_ip(ip: bytes) -> bool:
    """Not 0/8, loopback, multicast or the limited broadcast (the kernel's checks)."""
    return ip[0] not in (0, 127) and ip[0] & 0xF0 != 0xE0 and ip != b"\xff\xff\xff\xff"


def arp_of(inner: InnerFrame) -> Arp | None | bool:
    """batadv_arp_get_type: the ARP message DAT may use, None when the frame is no ARP,
    False when it is an ARP DAT ignores (malformed, or addresses it cannot store)."""
    if inner.h_proto != ETH_P_ARP or (inner.vlan_tci is not None and not inner.vid):
        return None  # behind a priority tag (VID 0) the kernel's DAT sees no ARP (2022.3 used VID 0x8000)
    p = inner.payload
    if len(p) < 28 or p[0:6] != b"\x00\x01\x08\x00\x06\x04":  # Ethernet, IPv4, 6 and 4 byte addresses
        return False
    op = p[6] << 8 | p[7]
    sha, spa, tha, tpa = Mac(p[8:14]), bytes(p[14:18]), Mac(p[18:24]), bytes(p[24:28])
    if not (_usable_ip(spa) and _usable_ip(tpa)) or sha.is_multicast or not any(sha):
        return False
    if op != ARPOP_REQUEST and (tha.is_multicast or not any(tha)):
        return False
    return Arp(op, sha, spa, tha, tpa)


def dhcp_ack_of(inner: InnerFrame) -> tuple[bytes, Mac, bytes] | None:
    """(yiaddr, chaddr, server IP) of a DHCPACK from a server (UDP source port 67), with the
    kernel's checks (batadv_dat_check_dhcp_ack); None for anything else."""
    if inner.h_proto != ETH_P_IP:
        return None
    p = inner.payload
    if len(p) < 20 or p[0] >> 4 != 4 or p[0] & 0x0F < 5 or p[9] != 17:
        return None
    udp = (p[0] & 0x0F) * 4
    bootp = udp + 8
    if len(p) < bootp + BOOTP_MIN or p[udp:udp + 2] != b"\x00\x43":
        return None
    if p[bootp] != 2 or p[bootp + 1] != 1 or p[bootp + 2] != 6 or p[bootp + 236:bootp + 240] != DHCP_MAGIC:
        return None
    off, end = bootp + 240, len(p)
    while off < end:
        code = p[off]
        if code == 0:  # pad
            off += 1
            continue
        if code == 255 or off + 1 >= end:
            return None
        length = p[off + 1]
        if code == 53:
            if length != 1 or off + 2 >= end or p[off + 2] != DHCPACK:
                return None
            return bytes(p[bootp + 16:bootp + 20]), Mac(p[bootp + 28:bootp + 34]), bytes(p[12:16])
        off += length + 2
    return None


def arp_reply(src_mac: Mac, src_ip: bytes, dst_mac: Mac, dst_ip: bytes, vid: int) -> bytes:
    """The ARP reply the kernel builds (batadv_dat_arp_create_reply): 42 bytes, with an
    802.1Q tag (priority 0) when the VLAN is tagged."""
    tag = struct.pack("!HH", ETH_P_8021Q, vid & 0x0FFF) if vid & VLAN_HAS_TAG else b""
    arp = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, ARPOP_REPLY, src_mac, src_ip, dst_mac, dst_ip)
    return bytes(dst_mac) + bytes(src_mac) + tag + struct.pack("!H", ETH_P_ARP) + arp


def _ip_text(ip: bytes) -> str:
    return ".".join(str(b) for b in ip)


@dataclass(eq=False, slots=True)
class CacheEntry:
    mac: Mac
    updated: float
    seq: int  # when it was created: batctl dc lists the newer first within a bucket


class Dat:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        self.cache: OrderedDict[tuple[bytes, int], CacheEntry] = OrderedDict()  # least recently updated first
        self.capable: set[Mac] = set()  # originators whose OGMs carry the DAT container (BATADV_ORIG_CAPA_HAS_DAT)
        self._seq = itertools.count()
        self._next_purge = 0.0
        mesh.tvlv.handle_ogm(TvlvType.DAT, DatTvlv.VERSION, self._ogm_container, when_absent=True,
                             each_copy=False)
        mesh.tvlv.contribute(self._container, reserve=4)
        mesh.hooks.on_host_tx(DAT_DHCP, self._host_tx_dhcp)
        mesh.hooks.on_host_tx(DAT, self._host_tx_arp)
        mesh.hooks.on_host_rx(DAT, self._host_rx)
        mesh.on_originator_removed(lambda orig_node: self.capable.discard(orig_node.orig))
        mesh.on_purge(self._purge)
        mesh.publisher.need_slow_path(self._slow_path)

    @property
    def enabled(self) -> bool:
        return self.mesh.config.distributed_arp_table

    # --- capability ---------------------------------------------------------------------------

    def _container(self, now: float, room: int) -> DatTvlv | None:
        return DatTvlv() if self.enabled else None

    def _ogm_container(self, now: float, orig_node, tvlv) -> None:
        """batadv_dat_tvlv_ogm_handler_v1: an OGM with the container makes its originator
        a candidate, one without it (CIFNOTFND) makes it none."""
        if tvlv is None:
            self.capable.discard(orig_node.orig)
        else:
            self.capable.add(orig_node.orig)

    def _slow_path(self) -> SlowPath:
        """While DAT is on, the core must see the host's ARP and DHCP replies both ways (the
        data plane would move unicast ones past the snooping)."""
        return _DAT_SLOW_PATH if self.enabled else NO_SLOW_PATH

    # --- the local cache ---------------------------------------------------------------------

    def cache_add(self, now: float, ip: bytes, mac: Mac, vid: int) -> None:
        """batadv_dat_entry_add: new, or the MAC and time refreshed; a full cache makes room
        by dropping the entry updated longest ago."""
        key = (ip, vid)
        entry = self.cache.get(key)
        if entry is not None:
            entry.mac, entry.updated = Mac(mac), now
            self.cache.move_to_end(key)
            return
        if len(self.cache) >= self.mesh.config.max_dat_entries:
            self.cache.popitem(last=False)
            self.mesh.counters.drop("dat_cache_full")
        self.cache[key] = CacheEntry(Mac(mac), now, next(self._seq))

    def lookup(self, ip: bytes, vid: int) -> Mac | None:
        entry = self.cache.get((ip, vid))
        return entry.mac if entry is not None else None

    def _purge(self, now: float) -> None:
        """batadv_dat_purge, every 10 s (or the timeout, when that is shorter)."""
        if now < self._next_purge:
            return
        timeout = self.mesh.config.dat_timeout_ms / 1000.0
        self._next_purge = now + min(PURGE_PERIOD, timeout)
        while self.cache:
            key, entry = next(iter(self.cache.items()))
            if now - entry.updated <= timeout:
                break
            del self.cache[key]

    # --- the DHT -------------------------------------------------------------------------------

    def candidates(self, ip: bytes, vid: int) -> list:
        """The originators that store (ip, vid): up to three DAT-capable ones, closest first."""
        origs = self.mesh.originators
        capable = [mac for mac in self.capable if origs.get(mac) is not None]
        return [origs.get(mac) for mac in select_candidates(hash_dat(ip, vid), capable)]

    def _forward(self, now: float, data: bytes, ip: bytes, vid: int, subtype: int) -> bool:
        """batadv_dat_forward_data: the host's frame as it is, in a UNICAST_4ADDR of
        `subtype`, to each candidate we have a route to; True if one went out."""
        mesh, sent = self.mesh, False
        if mesh.primary is None:
            return False
        inner = InnerFrame.decode(data)
        for orig_node in self.candidates(ip, vid):
            router = orig_node.router()
            if router is None:
                continue  # skipped, not replaced, as the kernel does
            packet = Unicast4Addr(ttvn=orig_node.last_ttvn, dest=orig_node.orig, src=mesh.primary.mac,
                                  subtype=subtype, inner=inner)
            out = router.if_incoming
            mesh.transmit(out, Ethernet(router.addr, out.mac, ETH_P_BATMAN).encode() + packet.encode())
            mesh.counters[_COUNTER[subtype]] += 1
            sent = True
        return sent

    # --- frames from the host (batadv_interface_tx) ----------------------------------------------

    def _host_tx_dhcp(self, now: float, inner: InnerFrame, vid: int) -> bool:
        """batadv_dat_snoop_outgoing_dhcp_ack: a DHCPACK our host's server sends stores the
        client's new address and the server's own at their candidates (as an ARP reply
        from the client to the server) before the ACK itself goes out."""
        ack = dhcp_ack_of(inner) if self.enabled else None
        if ack is None:
            return False
        yiaddr, chaddr, server_ip = ack
        self.cache_add(now, yiaddr, chaddr, vid)
        self.cache_add(now, server_ip, inner.h_source, vid)
        reply = arp_reply(chaddr, yiaddr, inner.h_source, server_ip, vid)
        self._forward(now, reply, yiaddr, vid, PUT)
        self._forward(now, reply, server_ip, vid, PUT)
        return False

    def _host_tx_arp(self, now: float, inner: InnerFrame, vid: int) -> bool:
        if not self.enabled:
            return False
        arp = arp_of(inner)
        if arp is False:
            self.mesh.counters["dat_arp_unusable"] += 1  # counted; it still goes its way, as in the kernel
            return False
        if arp is None:
            return False
        data = inner.encode()
        if arp.op == ARPOP_REQUEST:
            answered = self._outgoing_request(now, inner, arp, vid)
            if inner.h_dest.is_multicast:
                if not answered:
                    return False  # flooded at once, as any broadcast
                # held back: dropped if the answer is in the cache by then (the kernel's fallback)
                self.mesh.broadcast.send_own(now, data, delay=ARP_REQ_DELAY,
                                             keep=lambda later: not (self.enabled and self.lookup(arp.tpa, vid)))
                self.mesh.counters.add("tx", len(data))
                return True
            if answered:
                self.mesh.counters["tx_dropped"] += 1  # a unicast request DAT took care of is not sent
                return True
            return False
        if arp.op == ARPOP_REPLY and not inner.h_dest.is_multicast:
            # batadv_dat_snoop_outgoing_arp_reply (unicast replies only): stored at both
            # addresses' candidates, then sent on as usual
            self.cache_add(now, arp.spa, arp.sha, vid)
            self.cache_add(now, arp.tpa, arp.tha, vid)
            self._forward(now, data, arp.spa, vid, PUT)
            self._forward(now, data, arp.tpa, vid, PUT)
        return False

    def _outgoing_request(self, now: float, inner: InnerFrame, arp: Arp, vid: int) -> bool:
        """batadv_dat_snoop_outgoing_arp_request: answer from the cache (not for a client
        of ours: it answers itself), else ask the candidates; True: taken care of."""
        self.cache_add(now, arp.spa, arp.sha, vid)
        cached = self.lookup(arp.tpa, vid)
        if cached is not None:
            if self.mesh.tt.is_my_client(cached, vid):
                return True
            if self.mesh.bla.claimed_by_other(cached, vid):
                self.mesh.debug(f"Device {cached} claimed by another backbone gw. Don't send ARP reply!")
                return True
            reply = arp_reply(cached, arp.tpa, arp.sha, arp.spa, vid)
            self.mesh.emit(Deliver(reply))
            # the kernel counts the request's length plus an Ethernet header (and its tag)
            self.mesh.counters["rx"] += 1
            self.mesh.counters["rx_bytes"] += len(inner.encode()) + 14 + (4 if vid & VLAN_HAS_TAG else 0)
            return True
        return self._forward(now, inner.encode(), arp.tpa, vid, GET)

    # --- frames from the mesh for the host ---------------------------------------------------------

    def _host_rx(self, now: float, inner: InnerFrame, vid: int, packet) -> bool:
        """The snooping of batadv_recv_unicast_packet and batadv_recv_bcast_packet, for the
        frames addressed to us and the broadcasts, before they reach the host."""
        subtype = packet.subtype if isinstance(packet, Unicast4Addr) else None
        if subtype in _RX_COUNTER:
            self.mesh.counters[_RX_COUNTER[subtype]] += 1  # counted even while DAT is off here
        if not self.enabled:
            return False
        arp = arp_of(inner)
        if arp is False:
            self.mesh.counters["dat_arp_unusable"] += 1
        elif arp is not None and arp.op == ARPOP_REQUEST:
            return self._incoming_request(now, arp, vid)
        elif arp is not None and arp.op == ARPOP_REPLY:
            return self._incoming_reply(now, arp, vid)
        if inner.vlan_tci is None:  # the kernel's receive side does not look behind a tag here
            ack = dhcp_ack_of(inner)
            if ack is not None:
                yiaddr, chaddr, server_ip = ack
                self.cache_add(now, yiaddr, chaddr, vid)
                self.cache_add(now, server_ip, inner.h_source, vid)
        return False

    def _incoming_request(self, now: float, arp: Arp, vid: int) -> bool:
        """batadv_dat_snoop_incoming_arp_request: learn the sender; with the answer in the
        cache, send it to the requester (DAT_CACHE_REPLY) and keep the request from our host."""
        self.cache_add(now, arp.spa, arp.sha, vid)
        cached = self.lookup(arp.tpa, vid)
        if cached is None:
            return False
        mesh = self.mesh
        reply = InnerFrame.decode(arp_reply(cached, arp.tpa, arp.sha, arp.spa, vid))
        orig = mesh.tt.best_orig(arp.sha, vid)
        orig_node = mesh.originators.get(orig) if orig is not None else None
        if not mesh.routing.send_unicast(now, reply, orig_node, CACHE_REPLY):
            return False
        mesh.counters["dat_cached_reply_tx"] += 1
        return True

    def _incoming_reply(self, now: float, arp: Arp, vid: int) -> bool:
        """batadv_dat_snoop_incoming_arp_reply: learn both; a reply we knew already, or one
        not for a client of ours, goes no further."""
        duplicate = self.lookup(arp.spa, vid) == arp.sha
        self.cache_add(now, arp.spa, arp.sha, vid)
        self.cache_add(now, arp.tpa, arp.tha, vid)
        if duplicate:
            return True
        if self.mesh.bla.claimed_by_other(arp.sha, vid):
            self.mesh.debug(f"Device {arp.sha} claimed by another backbone gw. Drop ARP reply.")
            return True  # that gateway puts it on our LAN
        tt = self.mesh.tt
        return not tt.is_my_client(arp.tha, vid) or tt.is_my_client(arp.sha, vid)

    # --- batmanctl dc ------------------------------------------------------------------------------

    def rows(self, now: float) -> list[dict]:
        """batctl dc in the kernel's order (its hash buckets, the newer first in each), with
        batctl's JSON keys."""
        entries = sorted(self.cache.items(), key=lambda item: (hash_dat(*item[0], CACHE_BUCKETS), -item[1].seq))
        return [{"last_seen_msecs": max(0, int((now - e.updated) * 1000)), "dat_cache_ip4address": _ip_text(ip),
                 "dat_cache_hwaddress": str(e.mac), "dat_cache_vid": vid & 0x0FFF if vid & VLAN_HAS_TAG else -1}
                for (ip, vid), e in entries]
