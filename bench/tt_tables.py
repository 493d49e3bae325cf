"""The translation tables the benchmarks' simulated originators announce: untagged clients
without flags, as a full-table TT response carries them."""

from __future__ import annotations

from batmand.wire import TtChange, TtTvlv, TtVlan, tt_vlan_crc
from batmand.wire.constants import TtDataFlags


def full_table(clients, ttvn: int = 1) -> TtTvlv:
    """The TT container of a full-table response for these client MACs (VLAN 0)."""
    return TtTvlv(flags=TtDataFlags.RESPONSE | TtDataFlags.FULL_TABLE, ttvn=ttvn,
                  vlans=[TtVlan(crc=tt_vlan_crc([(mac, 0) for mac in clients], 0), vid=0)],
                  changes=[TtChange(flags=0, addr=mac, vid=0) for mac in clients])
