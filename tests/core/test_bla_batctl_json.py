"""batctl's BLA JSON dumps as the kernel's batctl prints them (2022.3 with batctl 2023.0,
seen in tests/interop/test_bla.py): the keys in the order of their netlink attributes
(LAST_SEEN_MSECS 23, BLA_OWN 30, BLA_ADDRESS 31, BLA_VID 32, BLA_BACKBONE 33, BLA_CRC 34),
so `bla_vid` comes before `bla_backbone` in a backbone row as in a claim row:

    batctl clj: [{"bla_address":"fa:54:2b:06:3d:fc","bla_vid":-1,"bla_backbone":"02:b1:a0:00:01:01","bla_crc":41692}]
    batctl bbj: [{"last_seen_msecs":2192,"bla_own":true,"bla_vid":-1,"bla_backbone":"02:ba:00:00:02:01","bla_crc":0},
                 {"last_seen_msecs":2200,"bla_vid":-1,"bla_backbone":"02:b1:a0:00:01:01","bla_crc":41692}]
"""

from __future__ import annotations

from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.wire import InnerFrame, Mac

OURS, OTHER, CLIENT = Mac("02:ba:00:00:02:01"), Mac("02:b1:a0:00:01:01"), Mac("fa:54:2b:06:3d:fc")
CLAIM_KEYS = ["bla_address", "bla_vid", "bla_backbone", "bla_crc"]
BACKBONE_KEYS = ["last_seen_msecs", "bla_vid", "bla_backbone", "bla_crc"]


def _gateway() -> Mesh:
    mesh = Mesh(MeshConfig(bridge_loop_avoidance=True), soft_mac=Mac("02:bb:00:00:02:00"))
    mesh.add_interface(0.0, "e0", OURS)
    # another gateway claims a client (its CLAIM frame from the LAN), and we claim one
    claim = (bytes(Mac("ff:ff:ff:ff:ff:ff")) + bytes(CLIENT) + bytes.fromhex("08060001080006040002") + bytes(OTHER)
             + bytes(4) + bytes.fromhex("ff4305009918") + bytes(4))
    mesh.soft_iface_frame(1.0, claim)
    frame = InnerFrame.decode(bytes(Mac("02:11:00:00:00:01")) + bytes(Mac("02:22:00:00:00:01")) + b"\x88\xb5"
                              + bytes(46))
    assert not mesh.bla.host_rx(1.0, frame, 0, "unicast")
    return mesh


def test_claim_rows_keep_batctls_key_order():
    rows = _gateway().bla.claim_rows()
    assert sorted(list(r) for r in rows) == sorted([CLAIM_KEYS, ["bla_own", *CLAIM_KEYS]])


def test_backbone_rows_keep_batctls_key_order():
    rows = _gateway().bla.backbone_rows(2.0)
    own = next(r for r in rows if r.get("bla_own"))
    other = next(r for r in rows if not r.get("bla_own"))
    assert list(own) == ["last_seen_msecs", "bla_own", *BACKBONE_KEYS[1:]]
    assert list(other) == BACKBONE_KEYS
