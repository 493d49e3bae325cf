"""The kernel's claim frames as two kernels (batman-adv 2022.3, BLA on) put them on their
LAN: tests/data/bla-kernel-2022.3.pcap, recorded by tests/interop/record_bla_capture.py
(see tests/data/README.md). k1 (02:ba:00:00:01:01, group 0x6918) and k2
(02:ba:00:00:02:01, group 0x9918) are the backbone gateways, n3's host the mesh client
they claim, a second client behind n3 roams into the LAN.

Every frame parses with batmand.core.bla_frames and is rebuilt byte for byte by its
builder; the group ids are our CRC16 of the primary MACs, and the lower one gives way; the
ANNOUNCEs carry the CRCs of the claims the CLAIM and UNCLAIM frames made; and batmand's BLA,
in the state a kernel was in, answers the frames the kernel got with the bytes the kernel
sent (the first own entry's ANNOUNCE, taking the other's group, the periodic ANNOUNCE, a
REQUEST on a CRC it does not have, and the answer to a REQUEST)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from batmand.capture import read_capture
from batmand.core.bla_frames import (ANNOUNCE, ANNOUNCE_PREFIX, BROADCAST, CLAIM, LOOPDETECT, LOOPDETECT_PREFIX,
                                     REQUEST, UNCLAIM, ClaimFrame, claim_frame, crc16, parse_claim)
from batmand.core.config import MeshConfig
from batmand.core.events import Deliver
from batmand.core.mesh import Mesh
from batmand.wire import InnerFrame, Mac

PCAP = Path(__file__).resolve().parents[1] / "data" / "bla-kernel-2022.3.pcap"
K1, K2 = Mac("02:ba:00:00:01:01"), Mac("02:ba:00:00:02:01")
LAN_HOST = Mac("02:11:00:00:00:01")  # any LAN host: its first broadcast starts it all
SETTLED = 1.0  # seconds after the last CLAIM or UNCLAIM: both gateways agree again


@dataclass(frozen=True)
class Seen:
    t: float  # seconds since the first frame
    raw: bytes
    f: ClaimFrame

    @property
    def backbone(self) -> Mac:
        """The gateway that sent it (where batadv_bla_send_claim puts its primary MAC)."""
        return self.f.sender_hw if self.f.kind in (CLAIM, LOOPDETECT) else self.f.eth_src

    @property
    def crc(self) -> int:
        return int.from_bytes(bytes(self.f.sender_hw)[4:6], "big")


@functools.cache
def frames() -> tuple[Seen, ...]:
    captured = list(read_capture(str(PCAP)))
    t0 = captured[0].timestamp
    out = []
    for cf in captured:
        f = parse_claim(InnerFrame.decode(cf.data))
        assert f is not None, f"frame {cf.number} is no claim frame: {cf.data.hex()}"
        out.append(Seen(cf.timestamp - t0, cf.data, f))
    return tuple(out)


def test_the_capture_is_small_and_holds_every_kind():
    kinds = [s.f.kind for s in frames()]
    assert 20 <= len(kinds) <= 60
    assert {CLAIM, UNCLAIM, ANNOUNCE, REQUEST, LOOPDETECT} <= set(kinds)
    assert {s.backbone for s in frames()} == {K1, K2}


def test_every_frame_is_what_our_builder_makes():
    for s in frames():
        f = s.f
        assert f.depth == 0 and len(s.raw) == 42  # untagged, unpadded
        assert claim_frame(f.kind, eth_dst=f.eth_dst, eth_src=f.eth_src, sender_hw=f.sender_hw, group=f.group,
                           vid=0) == s.raw, s.raw.hex()


def test_addresses_are_where_the_kernel_puts_them():
    for s in frames():
        f, other = s.f, (K2 if s.backbone == K1 else K1)
        if f.kind == REQUEST:
            assert f.eth_dst == f.sender_hw == other
        else:
            assert f.eth_dst == BROADCAST
        if f.kind == ANNOUNCE:
            assert bytes(f.sender_hw)[:4] == ANNOUNCE_PREFIX
        elif f.kind == LOOPDETECT:
            assert bytes(f.eth_src)[:2] == LOOPDETECT_PREFIX
        elif f.kind == UNCLAIM:
            assert f.sender_hw not in (K1, K2)
        elif f.kind == CLAIM:
            assert f.eth_src not in (K1, K2)


def test_group_ids_are_our_crc16_and_the_higher_wins():
    assert (crc16(K1), crc16(K2)) == (0x6918, 0x9918)
    for gw in (K1, K2):
        sent = [s.f.group for s in frames() if s.backbone == gw]
        assert sent[0] == crc16(gw), f"{gw} began with group {sent[0]:#06x}"
        assert set(sent[1:]) == {max(crc16(K1), crc16(K2))}, [f"{g:#06x}" for g in sent]


def announced_crc_mismatches(frames: list[tuple[float, ClaimFrame]]) -> tuple[int, list[str]]:
    """Follow the CLAIMs and UNCLAIMs of a LAN's gateways (the latest CLAIM of a client
    wins): each ANNOUNCE sent when nothing had been claimed for SETTLED seconds must carry
    the XOR of crc16(client) over its sender's claims. (times, frames) in order; returns
    how many ANNOUNCEs were checked, and the ones that were wrong."""
    owner: dict[Mac, Mac] = {}
    changed = float("-inf")
    checked, wrong = 0, []
    for t, f in frames:
        if f.kind == CLAIM:
            owner[f.eth_src], changed = f.sender_hw, t
        elif f.kind == UNCLAIM:
            owner.pop(f.sender_hw, None)
            changed = t
        elif f.kind == ANNOUNCE and t - changed > SETTLED:
            expected = 0
            for client, gw in owner.items():
                if gw == f.eth_src:
                    expected ^= crc16(client)
            crc = int.from_bytes(bytes(f.sender_hw)[4:6], "big")
            checked += 1
            if crc != expected:
                wrong.append(f"{f.eth_src} at {t:.3f} s announced {crc:#06x}, its claims make {expected:#06x} "
                             f"({owner})")
    return checked, wrong


def test_announced_crcs_are_the_claims():
    checked, wrong = announced_crc_mismatches([(s.t, s.f) for s in frames()])
    assert not wrong and checked >= 10
    assert any(s.crc for s in frames() if s.f.kind == ANNOUNCE)


# --- batmand in the kernel's place ------------------------------------------------------------


def _gateway(primary: Mac, *known: Mac) -> Mesh:
    """batmand with BLA on, its primary interface `primary`, the other gateways known as
    originators (a claim frame of another group counts only from one)."""
    mesh = Mesh(MeshConfig(bridge_loop_avoidance=True), soft_mac=Mac("02:bb:00:00:00:01"))
    mesh.add_interface(0.0, "e0", primary)
    for orig in known:
        mesh.originators.get_or_create(orig, 0.0)
    return mesh


def _delivered(actions) -> list[bytes]:
    return [a.frame for a in actions if isinstance(a, Deliver)]


def _lan_frame(src: Mac, dst: Mac = BROADCAST) -> bytes:
    return bytes(dst) + bytes(src) + b"\x88\xb5" + b"first".ljust(46, b"\0")


def test_a_fresh_gateway_announces_takes_the_higher_group_and_announces_again_like_k1():
    sent = [s for s in frames() if s.backbone == K1]
    heard = [s for s in frames() if s.backbone == K2]
    mesh = _gateway(K1, K2)
    # the LAN's first frame: a new own entry, announced at once with CRC 0 and k1's own group
    assert _delivered(mesh.soft_iface_frame(1.0, _lan_frame(LAN_HOST))) == [sent[0].raw]
    # k2's first ANNOUNCE (its higher group, CRC 0): taken over silently, no REQUEST
    assert _delivered(mesh.soft_iface_frame(1.001, heard[0].raw)) == []
    assert mesh.bla.group == crc16(K2)
    # the next period's ANNOUNCE: CRC 0, k2's group
    actions = []
    for step in range(1, 12):
        actions += mesh.tick(1.0 + step)
    assert _delivered(actions) == [sent[1].raw]


def _request_exchange() -> tuple[Seen, Seen, Seen, list[Seen]]:
    """(k2's ANNOUNCE that k1 did not expect, k1's ANNOUNCE, k1's REQUEST, k2's answer)."""
    seen = list(frames())
    i = next(i for i, s in enumerate(seen) if s.f.kind == REQUEST)
    request = seen[i]
    trigger = next(s for s in reversed(seen[:i]) if s.backbone == request.f.eth_dst and s.f.kind == ANNOUNCE)
    announce = next(s for s in reversed(seen[:i]) if s.backbone == request.backbone)
    answer = [s for s in seen[i + 1:] if s.backbone == request.f.eth_dst and s.t - request.t < 0.1]
    assert request.backbone == K1 and trigger.crc and request.t - trigger.t < 0.1 and request.t - announce.t < 0.1
    return trigger, announce, request, answer


def test_a_gateway_that_forgot_everything_requests_like_k1():
    """k1 had BLA switched off and on: no tables, its own group again. k2's next ANNOUNCE
    carries the CRC of k2's claim: k1 becomes a backbone gateway (ANNOUNCE, CRC 0, in
    k2's group) and sends k2 a REQUEST. batmand does the same, byte for byte."""
    trigger, announce, request, _ = _request_exchange()
    mesh = _gateway(K1, K2)
    assert _delivered(mesh.soft_iface_frame(1.0, trigger.raw)) == [announce.raw, request.raw]


def test_a_gateway_answers_a_request_like_k2():
    """k2, claiming n3's host, answers k1's REQUEST with that CLAIM and its ANNOUNCE."""
    _, _, request, answer = _request_exchange()
    claims = [s.f.eth_src for s in answer if s.f.kind == CLAIM]
    assert [s.f.kind for s in answer] == [CLAIM] * len(claims) + [ANNOUNCE] and claims
    mesh = _gateway(K2, K1)
    for client in claims:  # a frame of each client from the mesh: k2 claims it (a CLAIM, as k2's)
        inner = InnerFrame.decode(_lan_frame(client, LAN_HOST))
        assert not mesh.bla.host_rx(1.0, inner, 0, "unicast")
    assert _delivered(mesh.tick(1.5)) == [s.raw for s in answer[:-1]]
    assert _delivered(mesh.soft_iface_frame(2.0, request.raw)) == [s.raw for s in answer]
