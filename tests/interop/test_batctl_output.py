"""batmanctl's output against batctl's (2023.0, Debian 12) on a kernel node (batman-adv
2022.3), for every table both have, in one mixed lab (B.A.T.M.A.N. IV).

Lab: the bla-kernel topology, g1 (batmand) - n3 (batmand) - k2 (kernel); g1 and k2 are
backbone gateways of one LAN with a LAN host (tests/daemon/bla_lan.py), n3's host is on its
bat0. k2 and n3 announce gateways (50mbit/10mbit, 20mbit/5mbit), g1 is a gateway client;
n3's host pings the LAN host until both gateways agree who claims it, and k2 pings n3's host,
so that every node's o, n, tl, tg, gwl, dc, mf, cl and bbt have rows (n3's bbt aside: it is
on no LAN), and g1 has a VLAN (5, configured) for vlan_json.

Compared, k2's batctl with g1's (and n3's) batmanctl:
- text tables, as printed, with -H and with -n: each row line matches the batctl printf
  format of its table (fixed widths: MACs, "%4i.%03is" last-seen, "(%3i)" TQ, "[%10s]"
  interfaces, "[%c...]" flags, "0x%.8x"/"0x%04x" CRCs, VIDs "%4i"/"%5d", ...) on both
  sides; the header lines are the same once the node's own values (version, interface
  names, MACs, TTVN, group id, mf's flag slots) are masked; -H leaves exactly the rows.
- values that must agree across nodes: gwl bandwidths of the same gateway (and what that
  gateway's `gw` says), tg CRC and last ttvn of the same originator (and its own tl CRC),
  dc entries of the same IP, cl claims of the same client, bbt CRCs (the other's own
  claims' CRC), mf flags of the same originator.
- JSON verbs (oj nj tlj tgj gwj clj bbj dcj mfj hj, mj, hardif_json, vlan_json): the text
  framing is batctl's (one array or object, a newline, no spaces at the top level), each
  key's value has the same type and form (MAC strings, numbers, true/false, the nested
  flag objects with their spacing), keys come in the same relative order on both sides,
  and both have the same keys, save those mj and vj leave out on batmand (LEFT_OUT).
A report of what was compared is printed at the end."""

from __future__ import annotations

import json
import re
import time

import pytest

from batmand.lab import Lab, load
from tests.daemon.bla_lan import LAN_HOST_IP, BlaLan
from tests.daemon.labs import prefix, wait_for
from tests.interop.conftest import require_kernel_nodes
from tests.interop.matrix import converge, ok

KERNEL, OURS = "k2", ("g1", "n3")
G1_MAC = "02:b1:a0:00:01:01"
OUR_VLAN = 5
# ap_isolation, bonding, isolation_mark and network coding are not batmand features: mj
# leaves their attributes out (as a kernel built without a feature does)
MJ_LEFT_OUT = {"ap_isolation_enabled", "isolation_mark", "isolation_mask", "bonding_enabled",
               "network_coding_enabled"}
LEFT_OUT = {"mj": MJ_LEFT_OUT, "vlan_json": {"ap_isolation_enabled"}}

MAC = r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}"
IF10 = r"\[[ \S]{10}\]"  # [%10s] of an interface name of up to ten characters


def n(width: int) -> str:
    """%<width>i / %<width>u of a value that fits: exactly that many spaces, digits, minus."""
    return rf"[ \d-]{{{width}}}"


# every row line, from batctl 2023's printf formats (originators.c ... backbonetable.c), IV
ROWS = {
    "o": rf" [* ] {MAC} {n(4)}\.\d{{3}}s   \({n(3)}\) {MAC} {IF10}",
    "n": rf"   [ \S]{{10}}\t  {MAC} {n(4)}\.\d{{3}}s",
    "tl": rf"{MAC} {n(4)} \[[.R][.P][.N][.X][.W][.I]\] {n(3)}\.\d{{3}}   \(0x[0-9a-f]{{8}}\)",
    "tg": rf" [* ] {MAC} {n(4)} \[[.R][.W][.I][.T]\] \({n(3)}\) {MAC} \({n(3)}\) \(0x[0-9a-f]{{8}}\)",
    "gwl": rf"[* ] {MAC} \({n(3)}\) {MAC} {IF10}: \d+\.\d/\d+\.\d MBit",
    "dc": rf" \* [ \d.]{{15}} {MAC} {n(4)} {n(6)}:\d\d",
    "mf": rf"{MAC} (\[[.U][.4][.6](R4|\. )(R6|\. )\]|-)",
    "cl": rf"{MAC} on {n(5)} by {MAC} \[[* ]\] \(0x[0-9a-f]{{4}}\)",
    "bbt": rf"{MAC} on {n(5)} {n(4)}\.\d{{3}}s \(0x[0-9a-f]{{4}}\)",
}
INFO = re.compile(rf"\[B\.A\.T\.M\.A\.N\. adv \S+, MainIF/MAC: \S+/{MAC} \(bat0/{MAC} BATMAN_IV\)"
                  rf"(, TTVN: \d+|, group id: 0x[0-9a-f]{{4}})?\]")
MF_OWN = re.compile(r"Multicast flags \(own flags: \[[.U][.4][.6](R4|\. )(R6|\. )\]\)")


def mask(line: str) -> str:
    """A header line without the node's own values."""
    line = re.sub(r"adv \S+, MainIF/MAC: \S+/", "adv V, MainIF/MAC: IF/", line)
    line = re.sub(MAC, "MAC", line)
    line = re.sub(r"TTVN: \d+", "TTVN: N", line)
    line = re.sub(r"group id: 0x[0-9a-f]{4}", "group id: 0xGGGG", line)
    if MF_OWN.fullmatch(line):
        line = "Multicast flags (own flags: [FLAGS])"
    return re.sub(r"(\t+)[.U?4]$|(\t+)[.4?]/[.6?]$", lambda m: (m[1] or m[2]) + "X", line)


class Run:
    def __init__(self, lab: Lab, lan: BlaLan) -> None:
        self.lab, self.lan = lab, lan
        self.orig = lan.orig
        self.report: dict[str, list] = {}

    def out(self, node: str, *args: str) -> str:
        if self.lab.is_kernel(node):
            return ok(self.lab.exec(node, ["batctl", *args]))
        return ok(self.lab.batmanctl(node, *args))

    def note(self, what: str, item: str) -> None:
        self.report.setdefault(what, []).append(item)


@pytest.fixture(scope="module")
def run():
    topo = load("bla-kernel")
    topo.batmand["routing_algo"] = "BATMAN_IV"
    topo.nodes["g1"].batmand["vlans"] = [OUR_VLAN]  # (the host may lack 802.1Q devices: the configured VLAN)
    lab = Lab(topo, prefix())
    require_kernel_nodes(len(lab.kernel_nodes))
    started = time.monotonic()
    with lab:
        lan = BlaLan(lab, ["g1", "k2"], macs={"g1": G1_MAC})
        lan.build()
        r = Run(lab, lan)
        converge(lab, timeout=60)
        ok(lab.exec("k2", ["batctl", "gw", "server", "50mbit/10mbit"]))
        ok(lab.batmanctl("n3", "gw", "server", "20mbit/5mbit"))
        ok(lab.batmanctl("g1", "gw", "client"))
        sniffer = lan.sniff()
        try:
            lan.hold(sniffer, "n3")  # both gateways pass the LAN's broadcasts: BLA is in sync
        finally:
            sniffer.stop()
        lan.claim("n3")
        assert lan.ping("n3", LAN_HOST_IP, 3).returncode == 0
        assert lab.exec("k2", ["ping", "-c", "2", lab.address("n3")]).returncode == 0

        def gateways_listed():  # every gateway's OGMs carried its bandwidth to every node
            return all(ok(lab.batmanctl(node, "gwl", "-H")).count("MBit") == want
                       for node, want in (("k2", 1), ("g1", 2), ("n3", 1)))
        wait_for(gateways_listed, timeout=15, step=0.5)
        print(f"\nbatctl output lab ready after {time.monotonic() - started:.1f} s")
        yield r
        print(f"\nCOMPARED WITH batctl ON {KERNEL} ({time.monotonic() - started:.1f} s):")
        for what, items in r.report.items():
            print(f"  {what}: {', '.join(items)}")


# --- text tables --------------------------------------------------------------------------------


def _split(table: str, text: str) -> tuple[list[str], list[str]]:
    """(header lines, row lines): rows are the lines matching the table's row format from
    the first one on; every line after the header must be one."""
    lines = text.splitlines()
    rows = re.compile(ROWS[table])
    first = next((i for i, line in enumerate(lines) if rows.fullmatch(line)), len(lines))
    return lines[:first], lines[first:]


@pytest.mark.parametrize("table", list(ROWS))
def test_text_tables_have_batctls_layout(run, table):
    headers = {}
    for opts in ((), ("-n",), ("-H",)):
        for node in (KERNEL, *OURS):
            text = run.out(node, table, *opts)
            head, rows = _split(table, text)
            bad = [line for line in rows if not re.fullmatch(ROWS[table], line)]
            assert not bad, f"{node}: {table} {' '.join(opts)}: not batctl's row format:\n" + "\n".join(bad) + \
                f"\n(all of it:\n{text})"
            if node in (KERNEL, "g1"):
                assert rows, f"{node}: {table} {' '.join(opts)} has no rows:\n{text}"
            if "-H" in opts:
                assert not head, f"{node}: {table} -H printed a header: {head}"
                continue
            assert head and INFO.fullmatch(head[0]), f"{node}: {table}'s info line: {head[:1]}"
            headers[(node, opts)] = [mask(line) for line in head]
    want = headers[(KERNEL, ())]
    for (node, opts), got in headers.items():
        assert got == want, f"{node}: {table} {' '.join(opts)} header differs from batctl's:\n{got}\n{want}"
    run.note("text tables (as printed, -n, -H; rows and headers)", table)


def _rows(run: Run, node: str, verb: str) -> list[dict]:
    text = run.out(node, verb)
    value = json.loads(text)
    return value if isinstance(value, list) else [value]


def test_gateway_bandwidths_agree(run):
    """gwl on each node lists a gateway with the bandwidth that gateway announces (its gw)."""
    announced = {}
    for gw in ("k2", "n3"):
        m = re.fullmatch(r"server \(announced bw: (\d+\.\d/\d+\.\d) MBit\)", run.out(gw, "gw").strip())
        assert m, run.out(gw, "gw")
        announced[run.orig[gw]] = m[1]
    seen = 0
    for node in (KERNEL, *OURS):
        for line in run.out(node, "gwl", "-H").splitlines():
            m = re.match(rf"[* ] ({MAC}) .*: (\S+) MBit$", line)
            assert m and announced[m[1]] == m[2], (node, line, announced)
            seen += 1
    assert seen == 4
    k2 = {r["orig_address"]: r for r in _rows(run, KERNEL, "gwj")}
    g1 = {r["orig_address"]: r for r in _rows(run, "g1", "gwj")}
    n3 = run.orig["n3"]
    assert (k2[n3]["bandwidth_down"], k2[n3]["bandwidth_up"]) == (g1[n3]["bandwidth_down"], g1[n3]["bandwidth_up"])
    run.note("values", "gwl/gwj bandwidths")


def test_global_tt_crcs_agree(run):
    """tg: the CRC of an originator's VLAN is the one that originator's tl prints, on every
    node; the same (client, originator) has the same VID, flags and last ttvn everywhere."""
    own_crc = {}
    for node in (KERNEL, *OURS):
        for row in _rows(run, node, "tlj"):
            own_crc[(run.orig[node], row["tt_vid"])] = row["tt_crc32"]
    entries = {}
    for node in (KERNEL, *OURS):
        for row in _rows(run, node, "tgj"):
            key = (row["orig_address"], row["tt_vid"])
            if key in own_crc:  # not a VLAN announced after the tl dump
                assert row["tt_crc32"] == own_crc[key], (node, row, own_crc)
            entries.setdefault((row["tt_address"], row["orig_address"], row["tt_vid"]), {})[node] = \
                (row["tt_flags"]["raw"], row["tt_last_ttvn"])
    shared = [e for e in entries.values() if KERNEL in e and len(e) > 1]
    assert shared, entries
    for e in shared:
        assert len(set(e.values())) == 1, e
    # the text shows the same CRCs as the JSON
    text = run.out(KERNEL, "tg", "-H")
    for row in _rows(run, KERNEL, "tgj"):
        assert "(0x%.8x)" % row["tt_crc32"] in text
    run.note("values", f"tg/tgj CRCs and ttvns ({len(shared)} entries held by both kinds)")


def test_dat_caches_agree(run):
    caches = {node: {r["dat_cache_ip4address"]: (r["dat_cache_hwaddress"], r["dat_cache_vid"])
                     for r in _rows(run, node, "dcj")} for node in (KERNEL, *OURS)}
    shared = set(caches[KERNEL]) & set(caches["g1"])
    assert shared, caches
    for ip in shared:
        assert len({c[ip] for c in caches.values() if ip in c}) == 1, (ip, caches)
    run.note("values", f"dc/dcj entries of {len(shared)} IPs")


def test_claims_and_backbones_agree(run):
    claims = {node: {r["bla_address"]: r for r in _rows(run, node, "clj")} for node in (KERNEL, "g1")}
    shared = set(claims[KERNEL]) & set(claims["g1"])
    assert shared, claims
    for client in shared:
        k, g = claims[KERNEL][client], claims["g1"][client]
        assert (k["bla_backbone"], k["bla_vid"], k["bla_crc"]) == (g["bla_backbone"], g["bla_vid"], g["bla_crc"])
        assert bool(k.get("bla_own")) != bool(g.get("bla_own")), (k, g)
    own = {node: next(r for r in _rows(run, node, "bbj") if r.get("bla_own")) for node in (KERNEL, "g1")}
    for node, other in ((KERNEL, "g1"), ("g1", KERNEL)):
        line = next(x for x in run.out(node, "bbt", "-H").splitlines() if x.startswith(run.orig[other]))
        assert line.endswith("(0x%04x)" % own[other]["bla_crc"]), (node, line, own[other])
    run.note("values", "cl/clj claims, bbt CRCs")


def test_multicast_flags_agree(run):
    views = {node: dict(line.split(" ", 1) for line in run.out(node, "mf", "-H").splitlines())
             for node in (KERNEL, *OURS)}
    raws = {node: {r["orig_address"]: r.get("mcast_flags", {}).get("raw") for r in _rows(run, node, "mfj")}
            for node in (KERNEL, *OURS)}
    compared = 0
    for orig in {o for v in views.values() for o in v}:
        seen = {node: v[orig] for node, v in views.items() if orig in v}
        if len(seen) > 1:
            assert len(set(seen.values())) == 1, (orig, seen)
            assert len({raws[node][orig] for node in seen}) == 1, (orig, raws)
            compared += 1
    assert compared >= 2, views
    run.note("values", f"mf/mfj flags of {compared} originators")


# --- JSON verbs -----------------------------------------------------------------------------------


def _members(obj: str) -> list[tuple[str, str]]:
    """The top-level `"key":value` members of one object's text, in order."""
    assert obj[0] == "{" and obj[-1] == "}", obj
    parts, depth, quoted, start = [], 0, False, 1
    for i, ch in enumerate(obj[1:-1], 1):
        if quoted:
            quoted = ch != '"' or obj[i - 1] == "\\"
        elif ch == '"':
            quoted = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(obj[start:i])
            start = i + 1
    if obj != "{}":
        parts.append(obj[start:-1])
    out = []
    for part in parts:
        m = re.fullmatch(r'"(\w+)":(.*)', part, re.S)
        assert m, f"not batctl's member form: {part!r}"
        out.append((m[1], m[2]))
    assert obj == "{" + ",".join(f'"{k}":{v}' for k, v in out) + "}"
    return out


def _objects(text: str, dump: bool) -> list[str]:
    """The objects of a dump (`[...]` and a newline) or of a GET (one object, a newline)."""
    assert text.endswith("\n") and text.count("\n") == 1, repr(text[-80:])
    body = text[:-1]
    if not dump:
        return [body]
    assert body[0] == "[" and body[-1] == "]", body[:80]
    objs, depth, start = [], 0, None
    for i, ch in enumerate(body[1:-1], 1):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                objs.append(body[start:i + 1])
    assert body == "[" + ",".join(objs) + "]", body[:200]
    return objs


def _form(value: str) -> str:
    """A value's type and form: strings as "S" (MAC strings as "MAC"), numbers as 0."""
    value = re.sub(rf'"{MAC}"', '"MAC"', value)
    value = re.sub(r'"(?:[^"\\]|\\.)*"(?=[,}]|$)', lambda m: m[0] if m[0] == '"MAC"' else '"S"', value)
    value = re.sub(r"(?<=[:\s])-?\d+|^-?\d+$", "0", value)
    return re.sub(r"\b(true|false)\b", "B", value)


JSON_VERBS = {  # verb -> (batctl's arguments, batmanctl's arguments, a dump?)
    "oj": (["oj"], ["oj"], True), "nj": (["nj"], ["nj"], True), "tlj": (["tlj"], ["tlj"], True),
    "tgj": (["tgj"], ["tgj"], True), "gwj": (["gwj"], ["gwj"], True), "clj": (["clj"], ["clj"], True),
    "bbj": (["bbj"], ["bbj"], True), "dcj": (["dcj"], ["dcj"], True), "mfj": (["mfj"], ["mfj"], True),
    "hj": (["hj"], ["hj"], True), "mj": (["mj"], ["mj"], False),
    "hardif_json": (["hardif", "eth0", "hj"], ["hardif", "e-n3", "hj"], False),
    "vlan_json": (["meshif", "bat0", "vid", "1", "vj"], ["meshif", "bat0", "vid", str(OUR_VLAN), "vj"], False),
}


def _json_members(run: Run, verb: str) -> dict[str, list[list[tuple[str, str]]]]:
    kargs, oargs, dump = JSON_VERBS[verb]
    out = {KERNEL: [_members(o) for o in _objects(run.out(KERNEL, *kargs), dump)]}
    out["g1"] = [_members(o) for o in _objects(run.out("g1", *oargs), dump)]
    return out


def test_json_verbs_have_batctls_keys_order_and_forms(run):
    order: set[tuple[str, str]] = set()  # (a, b): batctl prints key a before key b
    rows = {verb: _json_members(run, verb) for verb in JSON_VERBS}
    for verb, sides in rows.items():
        for obj in sides[KERNEL]:
            keys = [k for k, _ in obj]
            order |= {(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]}
    for verb, sides in rows.items():
        assert sides[KERNEL] and sides["g1"], (verb, sides)
        kernel_keys = {k for obj in sides[KERNEL] for k, _ in obj}
        our_keys = {k for obj in sides["g1"] for k, _ in obj}
        left_out = LEFT_OUT.get(verb, set())
        # flags the kernel puts only when set may be on one side alone (gwj "best": g1 is a client)
        optional = {"best", "bla_own", "active"}
        assert our_keys - optional == kernel_keys - left_out - optional, \
            f"{verb}: keys only batctl prints {sorted(kernel_keys - left_out - our_keys)}, " \
            f"only batmanctl {sorted(our_keys - kernel_keys)}"
        forms = {k: _form(v) for obj in sides[KERNEL] for k, v in obj}
        for obj in sides["g1"]:
            keys = [k for k, _ in obj]
            for i, a in enumerate(keys):
                for b in keys[i + 1:]:
                    assert (b, a) not in order, f"{verb}: batctl prints {b} before {a}; batmanctl: {keys}"
            for k, v in obj:
                if k in forms:
                    assert _form(v) == forms[k], f"{verb}: {k} is {v} here, batctl prints the form {forms[k]}"
        run.note("JSON verbs (keys, order, value forms, framing)", verb)
