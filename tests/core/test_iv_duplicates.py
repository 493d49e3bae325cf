"""B.A.T.M.A.N. IV's duplicate check and receive windows (batadv_iv_ogm_update_seqnos)
against the kernel's plain walk over every neighbour: batmand answers a copy of a seqno the
window holds from a union of the neighbours' windows instead, and must come to the same
status and the same windows, also when neighbours come and go."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from batmand.core.bat_iv import NEIGH_DUP, NO_DUP, ORIG_DUP, PROTECTED, IvOrigIfInfo, receive_window
from batmand.core.bitarray import bit_get_packet, seq_diff32
from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.wire import Mac
from batmand.wire.ogm_walk import IvOgmFields

US = Mac("02:00:00:00:00:01")
ORIG = Mac("02:00:00:00:00:99")
NEIGHS = [Mac(f"02:00:00:00:01:{i:02x}") for i in range(6)]


def kernel_walk(windows: dict, last_seqno: int, seqno: int, sender) -> tuple[int, dict]:
    """The kernel's loop: every neighbour's window tested and slid, the sender's marked."""
    diff = seq_diff32(seqno, last_seqno)
    age = -diff
    status = NO_DUP
    out = {}
    for key, bits in windows.items():
        is_dup = 0 <= age < 64 and bool(bits >> age & 1)
        if key == sender:
            status = NEIGH_DUP if is_dup else status
        elif is_dup and status != NEIGH_DUP:
            status = ORIG_DUP
        out[key], _ = bit_get_packet(bits, diff, key == sender)
    return status, out


ops = st.lists(st.one_of(
    # sender, seqno step: mostly near the window's end (copies of the last seqnos, the
    # next ones: where the union of the windows decides), also far back, far ahead and
    # jumps that look like restarts
    st.tuples(st.just("ogm"), st.integers(0, 3), st.integers(-3, 3)),
    st.tuples(st.just("ogm"), st.integers(0, 3), st.integers(-3, 3)),
    st.tuples(st.just("ogm"), st.integers(0, 5),
              st.one_of(st.integers(-70, 70), st.sampled_from([-65536, 65536, 1 << 31]))),
    st.tuples(st.just("add"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("drop"), st.integers(0, 5), st.just(0)),
), max_size=120)


@settings(max_examples=500, deadline=None)
@given(ops)
# a seqno only a second neighbour sent, then a copy of it from a third
@example([("add", 0, 0), ("add", 1, 0), ("add", 2, 0), ("ogm", 0, 0), ("ogm", 0, 2), ("ogm", 1, -1), ("ogm", 2, 0)])
# a seqno the first neighbour sent, asked for after the window slid
@example([("add", 0, 0), ("add", 1, 0), ("add", 2, 0), ("ogm", 0, 0), ("ogm", 1, 2), ("ogm", 2, -2)])
# the union made anew (a neighbour came) from windows that slid since they were written
@example([("add", 0, 0), ("add", 1, 0), ("ogm", 0, 0), ("ogm", 1, 5), ("add", 2, 0), ("ogm", 2, -5)])
def test_duplicate_status_and_windows_are_the_kernels(operations):
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:00:00:00:00:02"))
    mesh.add_interface(0.0, "eth0", US)
    iface = mesh.ifaces[0]
    algo = mesh.algo
    orig_node = mesh.originators.get_or_create(ORIG, 0.0)
    seqno = 1000
    for op, index, step in operations:
        key = (NEIGHS[index], iface)
        if op == "add" and key not in orig_node.neighbours:
            via = mesh.originators.get_or_create(NEIGHS[index], 0.0)
            mesh.originators.neigh_get_or_create(orig_node, iface, NEIGHS[index], via, 0.0)
        elif op == "drop" and key in orig_node.neighbours:
            orig_node.drop_neighbours([key])
        elif op == "ogm":
            seqno = (seqno + step) & 0xFFFFFFFF
            for outif in (None, iface):
                info = orig_node.ifinfo_new(outif, IvOrigIfInfo)
                before = {k: receive_window(orig_node, n, outif) for k, n in orig_node.neighbours.items()}
                status, windows = kernel_walk(before, info.last_real_seqno, seqno, key)
                ogm = IvOgmFields(50, 0, seqno, bytes(ORIG), bytes(NEIGHS[index]), 200, (), b"")
                got = algo._update_seqnos(0.0, ogm, orig_node, orig_node.neighbours.get(key), outif)
                if got == PROTECTED:
                    continue  # a jump inside the reset protection: nothing was changed
                assert got == status
                after = {k: receive_window(orig_node, n, outif) for k, n in orig_node.neighbours.items()}
                assert after == windows
