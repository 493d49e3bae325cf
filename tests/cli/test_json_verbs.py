"""batmanctl's JSON verbs against what batctl 2023.0 printed on a kernel node (batman-adv
2022.3) in the lab of tests/interop/test_batctl_output.py: keys in netlink attribute order
whatever the row's dict order, nested flag objects with a space after their colons, flags
present only when set, a dump as one array, a GET as one object; each with its newline."""

from __future__ import annotations

import dataclasses
import json

from batmand.cli import json_verbs, tables
from batmand.core.config import MeshConfig
from batmand.core.mesh import Mesh
from batmand.daemon import tables as daemon_tables
from batmand.wire import Mac

KERNEL_TLJ = ('[{"tt_address":"02:bb:00:00:02:00","tt_crc32":523300334,"tt_vid":-1,"tt_flags":{"del": false,'
              '"roam": false,"wifi": false,"isolated": false,"nopurge": true,"new": false,"pending": false,'
              '"temp": false,"raw": 256}},{"tt_address":"6a:9a:8f:e1:d6:c7","tt_crc32":523300334,"tt_vid":-1,'
              '"tt_flags":{"del": false,"roam": false,"wifi": false,"isolated": false,"nopurge": false,"new": false,'
              '"pending": false,"temp": false,"raw": 0},"last_seen_msecs":1692}]\n')
KERNEL_OJ = ('[{"hard_ifindex":2,"hard_ifname":"eth0","orig_address":"02:b1:a0:00:03:02","best":true,'
             '"last_seen_msecs":40,"neigh_address":"02:b1:a0:00:03:02","tq":255}]\n')
KERNEL_GWJ = ('[{"hard_ifindex":2,"hard_ifname":"eth0","orig_address":"02:b1:a0:00:03:01","tq":255,'
              '"bandwidth_up":50,"bandwidth_down":200,"router":"02:b1:a0:00:03:02"}]\n')
KERNEL_MFJ = ('[{"orig_address":"02:b1:a0:00:03:01","mcast_flags":{"all_unsnoopables": false,"want_all_ipv4": false,'
              '"want_all_ipv6": false,"want_no_rtr_ipv4": true,"want_no_rtr_ipv6": true,"raw": 56}}]\n')
KERNEL_HJ = ('{"mesh_ifindex":4,"mesh_ifname":"bat0","hard_ifindex":2,"hard_ifname":"eth0",'
             '"hard_address":"02:ba:00:00:02:01","active":true,"hop_penalty":0,"elp_interval":500,'
             '"throughput_override":0}\n')
# batctl mj on the kernel node, less the keys batmand leaves out (ap_isolation_enabled,
# isolation_mark, isolation_mask, bonding_enabled, network_coding_enabled)
KERNEL_MJ_KEYS = ["version", "algo_name", "mesh_ifindex", "mesh_ifname", "mesh_address", "hard_ifindex", "hard_ifname",
                  "hard_address", "tt_ttvn", "bla_crc", "mcast_flags", "mcast_flags_priv", "aggregated_ogms_enabled",
                  "bridge_loop_avoidance_enabled", "distributed_arp_table_enabled", "fragmentation_enabled",
                  "gw_bandwidth_down", "gw_bandwidth_up", "gw_mode", "gw_sel_class", "hop_penalty",
                  "multicast_forceflood_enabled", "orig_interval", "multicast_fanout"]


def test_dumps_print_batctls_text_whatever_the_rows_key_order():
    tl = [{"tt_vid": -1, "tt_address": "02:BB:00:00:02:00", "tt_flags": 0x100, "tt_crc32": 523300334},
          {"last_seen_msecs": 1692, "tt_flags": 0, "tt_crc32": 523300334, "tt_vid": -1,
           "tt_address": "6a:9a:8f:e1:d6:c7"}]
    assert json_verbs.json_dump(tl) == KERNEL_TLJ
    o = [{"orig_address": "02:b1:a0:00:03:02", "neigh_address": "02:b1:a0:00:03:02", "hard_ifname": "eth0",
          "last_seen_msecs": 40, "tq": 255, "best": True, "hard_ifindex": 2}]
    assert json_verbs.json_dump(o) == KERNEL_OJ
    gw = [{"orig_address": "02:b1:a0:00:03:01", "tq": 255, "router": "02:b1:a0:00:03:02", "hard_ifname": "eth0",
           "bandwidth_down": 200, "bandwidth_up": 50, "best": False, "hard_ifindex": 2}]
    assert json_verbs.json_dump(gw) == KERNEL_GWJ  # best: a flag, absent when not set
    assert json_verbs.json_dump([{"orig_address": "02:b1:a0:00:03:01", "mcast_flags": 0x38}]) == KERNEL_MFJ
    assert json_verbs.json_dump([]) == "[]\n"


def test_a_get_is_one_object_and_unknown_keys_are_not_printed():
    row = {"hard_ifname": "eth0", "mtu": 1500, "active": True, "mesh_ifindex": 4, "mesh_ifname": "bat0",
           "hard_ifindex": 2, "hard_address": "02:ba:00:00:02:01", "hop_penalty": 0, "elp_interval": 500,
           "throughput_override": 0}
    assert json_verbs.json_get(row) == KERNEL_HJ


def test_strings_are_escaped_as_batctl_does():
    assert json_verbs.json_get({"hard_ifname": 'a"b\\c\x01'}) == '{"hard_ifname":"a\\"b\\\\c\\x01"}\n'


def test_mesh_json_has_the_kernels_keys_in_its_order_and_units():
    mesh = Mesh(MeshConfig(orig_interval_ms=250, gw_bandwidth_down=50000, gw_bandwidth_up=10000),
                soft_mac=Mac("02:bb:00:00:02:00"))
    mesh.add_interface(0.0, "e0", Mac("02:ba:00:00:02:01"))
    text = json_verbs.json_get(daemon_tables.mesh_attrs(mesh, "bat0", {"e0": 7}))
    attrs = json.loads(text)
    assert list(attrs) == KERNEL_MJ_KEYS
    assert attrs["gw_bandwidth_down"] == 500 and attrs["gw_bandwidth_up"] == 100  # 100 kbit/s, as the kernel's
    assert attrs["orig_interval"] == 250 and attrs["hard_ifindex"] == 7 and attrs["hard_ifname"] == "e0"
    assert '"mcast_flags_priv":{"bridged": false,' in text and attrs["gw_mode"] == "off"


def test_translocal_rows_have_no_last_seen_for_no_purge_entries():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:bb:00:00:02:00"))
    mesh.add_interface(0.0, "e0", Mac("02:ba:00:00:02:01"))
    rows = mesh.tt.local_rows(5.0)
    own = next(r for r in rows if r["tt_address"] == "02:bb:00:00:02:00")
    assert "last_seen_msecs" not in own  # the kernel puts no LAST_SEEN_MSECS for them
    assert tables.translocal_line(own) == "02:bb:00:00:02:00   -1 [.P....]   0.000   (0x%.8x)" % own["tt_crc32"]


def test_mcast_flags_have_batctl_2023s_five_slots():
    assert tables.mcast_flags_text(0x38) == "[.... . ]"  # the P bit (0x20) is not shown by batctl 2023
    assert tables.mcast_flags_text(0x07) == "[U46R4R6]"
    assert tables.mcast_flags_line({"orig_address": "02:b1:a0:00:03:01", "mcast_flags": 0x3f}) == \
        "02:b1:a0:00:03:01 [U46. . ]"


def test_originators_v_line_with_bat_hosts_lookups_has_batctls_extra_space():
    row = {"orig_address": "02:00:00:00:00:02", "neigh_address": "02:00:00:00:00:03", "hard_ifname": "eth0",
           "last_seen_msecs": 560, "throughput": 9000, "best": True}
    plain = " * 02:00:00:00:00:02    0.560s (        9.0) 02:00:00:00:00:03 [      eth0]"
    assert tables.originator_line(row, None) == plain  # -n
    assert tables.originator_line(row, {}) == plain.replace(") 02:00:00:00:00:03", ")  02:00:00:00:00:03")
    assert tables.originator_line(row, {"02:00:00:00:00:03": "relay"}) == \
        " * 02:00:00:00:00:02    0.560s (        9.0)  *             relay [      eth0]"


def test_verbs_are_reached_through_their_abbreviations_and_scopes():
    from batmand.cli import grammar
    from batmand.cli.main import build_parser

    parser = build_parser()
    meshes_of = {"eth0": "bat0"}.get
    for argv, verb in ((["mj"], "mesh_json"), (["tgj"], "transtable_global_json"), (["hj"], "hardifs_json"),
                       (["hardif", "eth0", "hj"], "hardif_json"), (["meshif", "bat0", "vid", "0x10", "vj"], "vlan_json")):
        inv = grammar.parse(argv, hardif_mesh=lambda name, inv: meshes_of(name))
        args = parser.parse_args([inv.command.subcommand, *inv.rest])
        assert args.json_verb.name == verb == inv.command.name
    assert grammar.parse(["meshif", "bat0", "vid", "0x10", "vj"]).vid == 16
    assert {v.scope for v in json_verbs.JSON_VERBS} == {"mesh", "hardif", "vlan"}
    assert len(json_verbs.JSON_VERBS) == 13
    assert {(v.name, v.abbr, v.scope) for v in json_verbs.JSON_VERBS} == \
        {(c.name, c.abbr, c.scope) for c in grammar.COMMANDS if c.section == "JSON queries"}


def test_hardifs_rows_carry_the_kernels_units():
    mesh = Mesh(MeshConfig(), soft_mac=Mac("02:bb:00:00:02:00"))
    mesh.add_interface(0.0, "e0", Mac("02:ba:00:00:02:01"))
    iface = mesh.iface("e0")
    mesh.set_hardif("e0", dataclasses.replace(iface.settings, throughput_override=100_000, hop_penalty=15))
    (row,) = daemon_tables.hardifs(mesh, "nosuchmesh0", {"e0": 3})  # no such device here: ifindex 0
    assert row["throughput_override"] == 1000  # 100 Mbit/s in the kernel's 100 kbit/s units
    assert json_verbs.json_dump([row]) == (
        '[{"mesh_ifindex":0,"mesh_ifname":"nosuchmesh0","hard_ifindex":3,"hard_ifname":"e0","hard_address":"02:ba:00:00:02:01",'
        '"active":true,"hop_penalty":15,"elp_interval":500,"throughput_override":1000}]\n')
