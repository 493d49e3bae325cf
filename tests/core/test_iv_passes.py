"""B.A.T.M.A.N. IV's passes over one OGM (batadv_iv_ogm_process: the default table's, then
each active interface's). batmand looks the sender's entries up once per OGM instead of
in each pass; what one pass makes must still count in the passes after it, as it does
in the kernel, whose passes each look it up again."""

from __future__ import annotations

import struct

from batmand.core.bat_iv import receive_window
from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.wire import BROADCAST, Mac

US = Mac("02:00:00:00:00:01")
NEIGH = Mac("02:00:00:00:01:01")


def own_ogm(orig: Mac, seqno: int) -> bytes:
    """A neighbour's own OGM (orig = previous sender), no TVLVs, in a frame from it."""
    element = struct.pack("!BBBBI6s6sBBH", 0, 15, 50, 0, seqno, bytes(orig), bytes(orig), 0, 255, 0)
    return bytes(BROADCAST) + bytes(orig) + b"\x43\x05" + element


def test_a_new_neighbours_first_ogm_is_in_the_window_of_the_pass_after_the_one_that_made_it():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:aa"), now=0.0)
    mesh.add_interface(0.0, "eth0", US)
    iface = mesh.iface("eth0")
    mesh.receive(0.1, "eth0", own_ogm(NEIGH, 100))
    orig_node = mesh.originators.get(NEIGH)
    (sender,) = orig_node.neighbours.values()
    # the default table's pass found no neighbour to mark (its link check made the entry);
    # the interface's pass found the entry and marked the seqno
    assert receive_window(orig_node, sender, None) == 0
    assert receive_window(orig_node, sender, iface) == 0b1
    mesh.receive(1.1, "eth0", own_ogm(NEIGH, 101))
    # the default table starts its window over (its last seqno was never set); the other slides
    assert receive_window(orig_node, sender, None) == 0b1
    assert receive_window(orig_node, sender, iface) == 0b11
