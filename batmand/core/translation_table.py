"""The translation table (the kernel's translation-table.c): which originator serves which
client MAC (per VLAN).

Local table: clients behind this node (learnt from frames the host sends into the soft
interface) and the soft interface's own MAC; changes are committed once per own OGM and
ride in 4 OGMs. Global table: clients of other originators, from their OGM diffs and from
TT responses; CRCs keep both sides honest, TT requests repair gaps. Roaming moves clients."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

from batmand.wire import Mac, RoamTvlv, TtChange, TtTvlv, TtVlan
from batmand.wire.constants import TT_SYNC_MASK, VLAN_HAS_TAG, TtClientFlags as F, TtDataFlags, TvlvType
from batmand.wire.tt_crc import tt_entry_crc

from .bitarray import seq_before8
from .eviction import EvictionOrder
from .ratelimit import RateLimit

OGM_APPEND_MAX = 3
ROAMING_MAX_TIME = 20.0
ROAMING_MAX_COUNT = 5
TT_CHANGE_LEN = 12
TT_VLAN_LEN = 8
TT_TVLV_FIXED = 4 + 4  # the TVLV header and tt_data (flags, ttvn, num_vlan)
TVLV_OVERHEAD = 20 + 4 + 4  # unicast TVLV header + TVLV header + tt_data


def _tt_len(entries: int) -> int:
    return entries * TT_CHANGE_LEN


@dataclass(eq=False)
class LocalEntry:
    addr: Mac
    vid: int
    flags: int
    last_seen: float
    added_at: float


class OrigEntry(NamedTuple):
    """What one announcer said of a client: immutable and shared (orig_entry), as there
    are at most 256 ttvns times the sync flags' combinations, but one per client and
    announcer in the table."""

    ttvn: int
    flags: int  # the sync flags (WIFI, ISOLA) this originator announced


_ORIG_ENTRIES: dict[int, OrigEntry] = {}


def orig_entry(ttvn: int, flags: int) -> OrigEntry:
    key = flags << 8 | ttvn
    oe = _ORIG_ENTRIES.get(key)
    if oe is None:
        oe = _ORIG_ENTRIES[key] = OrigEntry(ttvn, flags)
    return oe


class Announcers:
    """A global entry's announcers, oldest first: the part of a dict's interface the table
    uses, kept as one flat tuple (orig, entry, orig, entry, ...). Nearly every client has
    one announcer; a dict per client cost about 230 bytes, this about 110."""

    __slots__ = ("_flat",)

    def __init__(self) -> None:
        self._flat: tuple = ()

    def __len__(self) -> int:
        return len(self._flat) >> 1

    def __bool__(self) -> bool:
        return bool(self._flat)

    def __iter__(self):
        return iter(self._flat[::2])

    def __reversed__(self):
        return reversed(self._flat[::2])

    def __contains__(self, orig) -> bool:
        return orig in self._flat[::2]

    def _index(self, orig) -> int:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == orig:
                return i
        return -1

    def get(self, orig, default=None):
        i = self._index(orig)
        return default if i < 0 else self._flat[i + 1]

    def __getitem__(self, orig) -> OrigEntry:
        i = self._index(orig)
        if i < 0:
            raise KeyError(orig)
        return self._flat[i + 1]

    def __setitem__(self, orig, oe: OrigEntry) -> None:
        i, flat = self._index(orig), self._flat
        # a new announcer goes last; a known one keeps its place (a dict's order)
        self._flat = flat + (orig, oe) if i < 0 else flat[:i + 1] + (oe,) + flat[i + 2:]

    def pop(self, orig, *default):
        i = self._index(orig)
        if i < 0:
            if default:
                return default[0]
            raise KeyError(orig)
        oe = self._flat[i + 1]
        self._flat = self._flat[:i] + self._flat[i + 2:]
        return oe

    def items(self):
        flat = self._flat
        return list(zip(flat[::2], flat[1::2]))

    def keys(self) -> list:
        return list(self._flat[::2])

    def clear(self) -> None:
        self._flat = ()

    def __eq__(self, other) -> bool:
        return dict(self.items()) == (dict(other.items()) if isinstance(other, Announcers) else other)

    def __repr__(self) -> str:
        return f"Announcers({dict(self.items())!r})"


_UNCOUNTED = F.ROAM | F.TEMP  # entries with these flags are left out of the CRCs
_BY_ORIG_TUPLE = 8  # up to this many clients of an originator, by_orig holds a tuple


class GlobalEntry:
    """A client of other originators. `flags` holds ROAM / TEMP and the announced flags;
    whoever changes ROAM or TEMP, the table hears of it (`_flags_changed`), so its
    per-originator CRCs and the temporary-entry budget stay current."""

    __slots__ = ("key", "_flags", "added_at", "roam_at", "origs", "table")

    def __init__(self, addr: Mac, vid: int, flags: int, added_at: float, roam_at: float = 0.0) -> None:
        self._flags = flags
        # the one tuple the table's dicts and sets share for this client (and addr and vid
        # read from it: two slots fewer per client)
        self.key = (addr, vid)
        self.added_at, self.roam_at = added_at, roam_at
        self.origs = Announcers()
        self.table: TranslationTable | None = None  # set while the entry is in the global table

    def __repr__(self) -> str:
        return f"GlobalEntry({self.addr}, vid={self.vid}, flags={self._flags:#x}, origs={list(self.origs)})"

    @property
    def addr(self) -> Mac:
        return self.key[0]

    @property
    def vid(self) -> int:
        return self.key[1]

    @property
    def flags(self) -> int:
        return self._flags

    @flags.setter
    def flags(self, value: int) -> None:
        old, self._flags = self._flags, value
        if self.table is not None and (old ^ value) & _UNCOUNTED:
            self.table._flags_changed(self, old)


@dataclass(eq=False, slots=True)
class OrigVlan:
    """One originator's entries on one VLAN: how many (any flags), and the CRC of those
    that count (the kernel's orig_node_vlan with its tt.crc)."""

    vid: int
    entries: int = 0
    crc: int = 0


class TranslationTable:
    def __init__(self, mesh) -> None:
        self.mesh = mesh
        # a repeated container finds its request pending or its table matching
        mesh.tvlv.handle_ogm(TvlvType.TT, TtTvlv.VERSION, self._ogm_container, each_copy=False)
        mesh.tvlv.handle_unicast(TvlvType.TT, TtTvlv.VERSION, self.unicast_tvlv_received)
        mesh.tvlv.handle_unicast(TvlvType.ROAM, RoamTvlv.VERSION, self.roam_received)
        mesh.tvlv.contribute(self.commit, flexible=True)  # it can leave its diff out
        self.ttvn = 0
        self.local: dict[tuple[Mac, int], LocalEntry] = {}
        self.vlans: list[int] = []  # local VLANs announced, newest first (the kernel's list order)
        self.registered: set[int] = set()  # the VLANs of the soft interface: hosts may send on these
        self._refusals = RateLimit(5.0)  # the kernel's net_ratelimit(): 10 messages per 5 s
        self.changes: list[TtChange] = []
        self.ogm_append_cnt = 0
        self.last_changeset: list[TtChange] | None = None
        self.local_crcs: dict[int, int] = {}
        self.tvlv: TtTvlv | None = None  # the TT container of our OGMs
        self.global_: dict[tuple[Mac, int], GlobalEntry] = {}
        # originator -> its clients' keys: a tuple while few (a set is 216 bytes however
        # small, and most originators announce a handful), a set beyond _BY_ORIG_TUPLE
        self.by_orig: dict[Mac, tuple | set] = {}
        # kept as entries change, so that a diff costs its changes, not the table
        # (_vlans_of: the one OrigVlan of an originator with one VLAN, most have one, else a
        # tuple of them; a dict per originator would be 224 bytes)
        self.orig_vlans: dict[Mac, OrigVlan | tuple[OrigVlan, ...]] = {}
        # temporary entries (learnt from broadcasts and 4addr frames), oldest first: they have a
        # budget of their own and never take an announced client's place
        self.temporary: OrderedDict[tuple[Mac, int], None] = OrderedDict()
        self.orig_temporary: dict[Mac, int] = {}  # originator -> its temporary entries
        # originators that announced clients, least recently announcing first: when the table
        # is full, those without evidence (see OriginatorTable) lose theirs to a routed one's
        self.announcers = EvictionOrder()
        self.requests: dict[Mac, float] = {}  # originator -> when our TT request went out
        self.unrouted: dict[Mac, TtTvlv] = {}  # requests that found no route: sent when one appears
        self.roam_counts: dict[Mac, tuple[float, int]] = {}  # client -> (first time, roams left)
        self.dirty_clients: set = set()  # global entries whose route may have changed
        self.dirty_local: set = set()
        self._ignored: list = []  # predicates (orig, vid): announcements not held (ignore_vlans_of)

    @property
    def counters(self):
        return self.mesh.counters

    # --- local table ------------------------------------------------------------------------

    def add_vlan(self, now: float, vid: int) -> bool:
        """batadv_softif_create_vlan: a VLAN of the soft interface. Its own MAC becomes a
        local client there, and the host may send on it. Refused (False) when our OGM could
        not carry one VLAN more: receivers ignore an OGM past 512 bytes."""
        if vid in self.registered:
            return True
        announced = len(self.vlans) + (vid not in self.vlans)
        if TT_TVLV_FIXED + TT_VLAN_LEN * announced > self.mesh.ogm_tvlv_room():
            self.counters.drop("tt_vlan_refused")
            return False
        self.registered.add(vid)
        if vid in self.vlans:
            self.vlans.remove(vid)
        self.vlans.insert(0, vid)
        self.local_add(now, self.mesh.soft_mac, vid)
        return True

    def remove_vlan(self, now: float, vid: int) -> None:
        """batadv_softif_destroy_vlan: only the soft interface's own entry goes; the VLAN is
        announced until its clients time out, and takes no new ones."""
        if vid == 0 or vid not in self.registered:
            return
        self.registered.discard(vid)
        self.local_remove(self.mesh.soft_mac, vid, roaming=False)
        self._forget_empty_vlans()

    def _forget_empty_vlans(self) -> None:
        present = {e.vid for e in self.local.values()}
        self.vlans = [vid for vid in self.vlans if vid in self.registered or vid in present]

    def _local_transmit_size(self) -> int:
        return TVLV_OVERHEAD + 8 * len(self.vlans) + _tt_len(len(self.local))

    def local_add(self, now: float, addr: Mac, vid: int, wifi: bool = False) -> bool:
        """batadv_tt_local_add: the host sent a frame from `addr` into the mesh."""
        key = (addr, vid)
        entry = self.local.get(key)
        glob = self.global_.get(key) if not addr[0] & 1 else None
        roamed_back = False
        if entry is not None:
            entry.last_seen = now
            if entry.flags & (F.PENDING | F.ROAM):
                self.dirty_local.add(key)
            if entry.flags & F.PENDING:
                entry.flags &= ~F.PENDING  # it came back before the commit: announce it again
                self._event(entry, 0)
            elif entry.flags & F.ROAM:
                entry.flags &= ~F.ROAM
                roamed_back = True
        else:
            if vid not in self.registered:
                self.counters.drop("tt_local_unknown_vlan")
                if self._refusals.allow(now, 10):
                    self.mesh.log(f"adding TT local entry {addr} to non-existent VLAN {vid & 0x0FFF}")
                return False
            limit = min(self.mesh.packet_size_max, TVLV_OVERHEAD + 8 * len(self.vlans)
                        + _tt_len(self.mesh.config.max_local_tt_entries))
            if self._local_transmit_size() + TT_CHANGE_LEN > limit:
                self.counters.drop("tt_local_table_full")
                return False
            flags = F.NEW
            if addr == self.mesh.soft_mac or addr[0] & 1:
                flags |= F.NOPURGE
            entry = self.local[key] = LocalEntry(Mac(addr), vid, flags, now, now)
            self.dirty_local.add(key)
            self._event(entry, 0)
        if glob is not None and not glob.flags & F.ROAM:
            # the client moved here: tell the nodes that announced it
            for orig in list(glob.origs):
                self.send_roam_adv(now, addr, vid, orig)
            if roamed_back:
                self._global_free(glob)
            else:
                glob.flags |= F.ROAM
                glob.roam_at = now
                self.dirty_clients.add(key)
        remote = entry.flags & 0xFF
        entry.flags = (entry.flags | F.WIFI) if wifi else (entry.flags & ~F.WIFI)
        if remote ^ (entry.flags & 0xFF):
            self._event(entry, 0)
        return True

    def refresh_local(self, seen: dict) -> None:
        """Clients the data path saw sending ({(mac, vid): last time}), without the slow path."""
        for key, when in seen.items():
            entry = self.local.get(key)
            if entry is not None and when > entry.last_seen:
                entry.last_seen = when

    def _event(self, entry: LocalEntry, event_flags: int) -> None:
        """batadv_tt_local_event: queue a change; ADD+DEL / DEL+ADD cancel each other."""
        flags = (entry.flags | event_flags) & 0xFF
        is_del = bool(flags & F.DEL)
        for i, change in enumerate(self.changes):
            if change.addr != entry.addr or change.vid != entry.vid:
                continue
            if is_del != bool(change.flags & F.DEL):
                del self.changes[i]
            else:  # a second ADD (or DEL) in the same interval: only the flags change
                change.flags = flags
            return
        self.changes.append(TtChange(flags=flags, addr=entry.addr, vid=entry.vid))

    def _local_set_pending(self, entry: LocalEntry, flags: int) -> None:
        self._event(entry, flags)
        entry.flags |= F.PENDING
        self.dirty_local.add((entry.addr, entry.vid))

    def is_my_client(self, addr: Mac, vid: int) -> bool:
        """batadv_is_my_client: a local client not deleted (PENDING) and not roamed away."""
        entry = self.local.get((addr, vid))
        return entry is not None and not entry.flags & (F.PENDING | F.ROAM)

    def local_remove(self, addr: Mac, vid: int, roaming: bool) -> int:
        """batadv_tt_local_remove: another node announced our client; returns its old flags."""
        entry = self.local.get((addr, vid))
        if entry is None:
            return 0
        old = entry.flags
        flags = F.DEL
        if roaming:
            flags |= F.ROAM
            entry.flags |= F.ROAM
            self.dirty_local.add((addr, vid))
        if not entry.flags & F.NEW:
            self._local_set_pending(entry, flags)
            return old
        self._event(entry, F.DEL)
        del self.local[(addr, vid)]
        self.dirty_local.add((addr, vid))
        return old

    def local_crc(self, vid: int) -> int:
        crc = 0
        for entry in self.local.values():
            if entry.vid == vid and not entry.flags & F.NEW:
                crc ^= tt_entry_crc(entry.addr, vid, entry.flags)
        return crc

    def _local_vlan_data(self) -> list[TtVlan]:
        present = {e.vid for e in self.local.values()}
        return [TtVlan(crc=self.local_crcs.get(vid, 0), vid=vid) for vid in self.vlans if vid in present]

    def commit(self, now: float, room: int | None = None) -> TtTvlv:
        """batadv_tt_local_commit_changes, right before each own (primary) OGM is built;
        `room`: the bytes our OGM has left for this container (by default all the room
        the other containers leave)."""
        if room is None:
            room = self.mesh.ogm_tvlv_room()
        if not self.changes:
            if self.tvlv is not None and self.ogm_append_cnt > 0:
                self.ogm_append_cnt -= 1  # keep repeating the last diff
            else:
                self.tvlv = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=self.ttvn, vlans=self._local_vlan_data())
            return self.tvlv
        for key, entry in list(self.local.items()):
            entry.flags &= ~F.NEW
            if entry.flags & F.PENDING:
                del self.local[key]
                self.dirty_local.add(key)
        self._forget_empty_vlans()
        self.local_crcs = {vid: self.local_crc(vid) for vid in self.vlans}
        self.ttvn = (self.ttvn + 1) & 0xFF
        self.ogm_append_cnt = OGM_APPEND_MAX
        changes, self.changes = self.changes, []
        # Too many for an OGM: receivers will ask for the full table. The kernel's limit is
        # the MTU; ours is also what the OGM has room for, as receivers ignore OGMs past 512
        # bytes (kernels before batman-adv 2025.1)
        room -= TT_TVLV_FIXED + TT_VLAN_LEN * len(self._local_vlan_data())
        if _tt_len(len(changes)) > min(self.mesh.config.mtu, room):
            changes = []
        self.last_changeset = changes or None
        self.tvlv = TtTvlv(flags=TtDataFlags.OGM_DIFF, ttvn=self.ttvn, vlans=self._local_vlan_data(),
                           changes=[TtChange(flags=c.flags, addr=c.addr, vid=c.vid) for c in changes])
        return self.tvlv

    def purge(self, now: float) -> None:
        """The TT worker: local timeouts, expired ROAM/TEMP global entries, old requests."""
        cfg = self.mesh.config
        for entry in self.local.values():
            if entry.flags & (F.NOPURGE | F.PENDING):
                continue
            if now - entry.last_seen > cfg.tt_local_timeout_ms / 1000.0:
                self._local_set_pending(entry, F.DEL)
        for entry in list(self.global_.values()):
            if entry.flags & F.ROAM and now - entry.roam_at > cfg.tt_roam_timeout_ms / 1000.0:
                self._global_free(entry)
            elif entry.flags & F.TEMP and now - entry.added_at > cfg.tt_temp_timeout_ms / 1000.0:
                self._global_free(entry)
        timeout = cfg.tt_request_timeout_ms / 1000.0
        self.requests = {o: t for o, t in self.requests.items() if now - t <= timeout}
        self.unrouted = {o: tvlv for o, tvlv in self.unrouted.items() if o in self.mesh.originators.nodes}
        self.roam_counts = {c: v for c, v in self.roam_counts.items() if now - v[0] <= ROAMING_MAX_TIME}

    # --- global table -----------------------------------------------------------------------

    def _vlans_of(self, orig: Mac) -> tuple[OrigVlan, ...]:
        vlans = self.orig_vlans.get(orig, ())
        return (vlans,) if type(vlans) is OrigVlan else vlans

    def _orig_vlan(self, orig: Mac, vid: int) -> OrigVlan | None:
        for vlan in self._vlans_of(orig):
            if vlan.vid == vid:
                return vlan
        return None

    def _orig_entry_added(self, entry: GlobalEntry, orig: Mac, oe: OrigEntry) -> None:
        vlan = self._orig_vlan(orig, entry.vid)
        if vlan is None:
            vlan = OrigVlan(entry.vid)
            self.orig_vlans[orig] = self._vlans_of(orig) + (vlan,) if orig in self.orig_vlans else vlan
        vlan.entries += 1
        if not entry.flags & _UNCOUNTED:
            vlan.crc ^= tt_entry_crc(entry.addr, entry.vid, oe.flags)
        if entry.flags & F.TEMP:
            self.orig_temporary[orig] = self.orig_temporary.get(orig, 0) + 1

    def _orig_entry_removed(self, entry: GlobalEntry, orig: Mac, oe: OrigEntry) -> None:
        vlan = self._orig_vlan(orig, entry.vid)
        if vlan is not None:
            vlan.entries -= 1
            if not entry.flags & _UNCOUNTED:
                vlan.crc ^= tt_entry_crc(entry.addr, entry.vid, oe.flags)
            if not vlan.entries:
                rest = tuple(v for v in self._vlans_of(orig) if v is not vlan)
                if rest:
                    self.orig_vlans[orig] = rest if len(rest) > 1 else rest[0]
                else:
                    del self.orig_vlans[orig]
        if entry.flags & F.TEMP:
            self._count_temporary(orig, -1)

    def _count_temporary(self, orig: Mac, delta: int) -> None:
        count = self.orig_temporary.get(orig, 0) + delta
        if count > 0:
            self.orig_temporary[orig] = count
        else:
            self.orig_temporary.pop(orig, None)

    def _flags_changed(self, entry: GlobalEntry, old: int) -> None:
        """ROAM or TEMP of an entry changed: it joins or leaves its originators' CRCs and the
        temporary budget."""
        new = entry.flags
        if bool(old & _UNCOUNTED) != bool(new & _UNCOUNTED):
            for orig, oe in entry.origs.items():
                self._orig_vlan(orig, entry.vid).crc ^= tt_entry_crc(entry.addr, entry.vid, oe.flags)
        if (old ^ new) & F.TEMP:
            key = entry.key
            if new & F.TEMP:
                self.temporary[key] = None
            else:
                self.temporary.pop(key, None)
            for orig in entry.origs:
                self._count_temporary(orig, 1 if new & F.TEMP else -1)

    def _global_new(self, key: tuple[Mac, int], flags: int, now: float) -> GlobalEntry:
        addr = key[0] if type(key[0]) is Mac else Mac(key[0])
        entry = GlobalEntry(addr, key[1], flags, now, now if flags & F.ROAM else 0.0)
        key = entry.key
        self.global_[key] = entry
        entry.table = self
        if flags & F.TEMP:
            self.temporary[key] = None
        return entry

    def _global_free(self, entry: GlobalEntry) -> None:
        key = entry.key
        for orig, oe in entry.origs.items():
            self._by_orig_discard(orig, key)
            self._orig_entry_removed(entry, orig, oe)
        entry.origs.clear()
        if self.global_.get(key) is entry:
            del self.global_[key]
            self.temporary.pop(key, None)
        entry.table = None
        self.dirty_clients.add(key)

    def _global_del_orig_entry(self, entry: GlobalEntry, orig: Mac) -> None:
        oe = entry.origs.pop(orig, None)
        if oe is not None:
            self._by_orig_discard(orig, entry.key)
            self._orig_entry_removed(entry, orig, oe)
            self.dirty_clients.add(entry.key)

    def _by_orig_add(self, orig: Mac, key: tuple) -> None:
        keys = self.by_orig.get(orig)
        if keys is None:
            self.by_orig[orig] = (key,)
        elif type(keys) is tuple:
            if key not in keys:
                self.by_orig[orig] = keys + (key,) if len(keys) < _BY_ORIG_TUPLE else {*keys, key}
        else:
            keys.add(key)

    def _by_orig_discard(self, orig: Mac, key: tuple) -> None:
        keys = self.by_orig.get(orig)
        if type(keys) is tuple:
            if key in keys:
                self.by_orig[orig] = tuple(k for k in keys if k != key)
        elif keys is not None:
            keys.discard(key)

    def _global_add_orig_entry(self, entry: GlobalEntry, orig: Mac, ttvn: int, flags: int) -> None:
        oe = entry.origs.get(orig)
        flags &= TT_SYNC_MASK
        if oe is None:
            oe = entry.origs[orig] = orig_entry(ttvn, flags)
            self._by_orig_add(orig, entry.key)
            self._orig_entry_added(entry, orig, oe)
        else:
            if oe.flags != flags and not entry.flags & _UNCOUNTED:
                self._orig_vlan(orig, entry.vid).crc ^= (tt_entry_crc(entry.addr, entry.vid, oe.flags)
                                                         ^ tt_entry_crc(entry.addr, entry.vid, flags))
            entry.origs[orig] = orig_entry(ttvn, flags)
        self.dirty_clients.add(entry.key)

    def _announced(self, orig: Mac | None = None) -> int:
        """Entries that are not temporary: all of them, or those of one originator."""
        if orig is None:
            return len(self.global_) - len(self.temporary)
        return len(self.by_orig.get(orig, ())) - self.orig_temporary.get(orig, 0)

    def _room_for_announced(self, orig: Mac, *, new: bool) -> bool:
        cfg = self.mesh.config
        if new and self._announced() >= cfg.max_global_tt_entries and not self._evict_unproven(orig):
            self.counters.drop("tt_global_table_full")
            return False
        if self._announced(orig) >= cfg.max_global_tt_entries_per_originator:
            self.counters.drop("tt_global_originator_full")
            return False
        return True

    def _evict_unproven(self, orig: Mac) -> bool:
        """A full table takes a client of an originator with evidence (a route, echoes) by
        dropping everything one without evidence announced, least recently announcing first;
        spoofed originators' clients thus never keep a real one out."""
        originators = self.mesh.originators
        node = originators.get(orig)
        if node is None or not originators.evidence(node):
            return False

        def unproven(other: Mac) -> bool:
            other_node = originators.get(other)
            return other_node is not None and self._announced(other) > 0 and not originators.evidence(other_node)

        while self._announced() >= self.mesh.config.max_global_tt_entries:
            weakest = self.announcers.pop_weakest(unproven)
            if weakest is None:
                return False
            self.counters.drop("tt_global_evicted")
            self.global_del_orig(originators.get(weakest))
        return True

    def _make_room_for_temporary(self) -> None:
        """The oldest temporary entries make room for a new one."""
        limit = self.mesh.config.max_temporary_tt_entries
        while self.temporary and len(self.temporary) >= limit:
            self.counters.drop("tt_temporary_evicted")
            self._global_free(self.global_[next(iter(self.temporary))])

    def ignore_vlans_of(self, predicate) -> None:
        """For the features: predicate(orig, vid) says an originator's announcements on a
        VLAN are not to be held (BLA: it is a backbone gateway of our LAN there)."""
        self._ignored.append(predicate)

    def _ignored_vlan(self, orig: Mac, vid: int) -> bool:
        return any(predicate(orig, vid) for predicate in self._ignored)

    def forget_vlan(self, orig_node, vid: int) -> None:
        """Drop what an originator announced on one VLAN, and ask for its full table again
        with its next OGM (the kernel clears its TT-initialised capability)."""
        for key in [k for k in self.by_orig.get(orig_node.orig, ()) if k[1] == vid]:
            self._global_del_orig_entry(self.global_[key], orig_node.orig)
            if not self.global_[key].origs:
                self._global_free(self.global_[key])
        orig_node.has_tt = False
        orig_node.tvlvs_seen = None  # the next copy of its OGM asks, not only its next OGM

    def global_add(self, now: float, orig: Mac, addr: Mac, vid: int, flags: int, ttvn: int) -> bool:
        """batadv_tt_global_add; False when the table limits refuse it."""
        if self._ignored_vlan(orig, vid):
            return True
        key = (addr, vid)
        local = self.local.get(key)
        if flags & F.TEMP and local is not None and not local.flags & F.NEW:
            return True  # wait for a roaming advertisement instead
        entry = self.global_.get(key)
        if entry is None:
            if flags & F.TEMP:
                self._make_room_for_temporary()
            elif not self._room_for_announced(orig, new=True):
                return False
            entry = self._global_new(key, flags, now)
        elif flags & F.TEMP:
            if not entry.flags & F.TEMP:
                return True  # temporary information never overrides a known client
            if orig in entry.origs:
                return self._after_global_add(entry, addr, vid, flags)
            for other in list(entry.origs):
                self._global_del_orig_entry(entry, other)
        else:
            # a temporary entry that gets announced needs room like a new one
            temporary = bool(entry.flags & F.TEMP)
            if (temporary or orig not in entry.origs) and not self._room_for_announced(orig, new=temporary):
                return False
            if self.global_.get(key) is not entry:  # it went with what an unproven originator announced
                return self.global_add(now, orig, addr, vid, flags, ttvn)
            if temporary:
                for other in list(entry.origs):
                    self._global_del_orig_entry(entry, other)
                entry.flags &= ~F.TEMP
            entry.flags |= flags & ~TT_SYNC_MASK
            if entry.flags & F.ROAM:
                for other in list(entry.origs):
                    self._global_del_orig_entry(entry, other)
                entry.flags &= ~F.ROAM
                entry.roam_at = 0.0
        self._global_add_orig_entry(entry, orig, ttvn, flags)
        if not entry.flags & F.TEMP:
            self.announcers.add(orig)
        return self._after_global_add(entry, addr, vid, flags)

    def _after_global_add(self, entry: GlobalEntry, addr: Mac, vid: int, flags: int) -> bool:
        if not addr[0] & 1:
            local_flags = self.local_remove(addr, vid, bool(flags & F.ROAM))
            entry.flags |= local_flags & F.WIFI
        if not flags & F.ROAM:
            entry.flags &= ~F.ROAM
        return True

    def global_del(self, now: float, orig: Mac, addr: Mac, vid: int, roaming: bool) -> None:
        entry = self.global_.get((addr, vid))
        if entry is None:
            return
        if not roaming:
            self._global_del_orig_entry(entry, orig)
            if not entry.origs:
                self._global_free(entry)
            return
        if (addr, vid) in self.local:  # the client roamed to us
            self._global_free(entry)
        elif all(o == orig for o in entry.origs):  # wait for the new owner to claim it
            entry.flags |= F.ROAM
            entry.roam_at = now
            self.dirty_clients.add((addr, vid))
        else:
            self._global_del_orig_entry(entry, orig)

    def global_del_orig(self, orig_node) -> None:
        """Forget everything an originator announced (route lost, full table coming)."""
        for key in list(self.by_orig.get(orig_node.orig, ())):
            entry = self.global_.get(key)
            if entry is not None:
                self._global_del_orig_entry(entry, orig_node.orig)
                if not entry.origs:
                    self._global_free(entry)
        self.by_orig.pop(orig_node.orig, None)
        self.announcers.discard(orig_node.orig)
        orig_node.has_tt = False
        orig_node.tt_crcs = {}
        orig_node.tvlvs_seen = None  # the next copy of its OGM asks, not only its next OGM

    def _orig_entries(self, orig: Mac):
        for key in self.by_orig.get(orig, ()):
            entry = self.global_[key]
            yield entry, entry.origs[orig]

    def update_orig_crc(self, orig_node) -> None:
        """batadv_tt_global_update_crc: per VLAN of this originator, ROAM/TEMP excluded. The
        CRCs are kept as entries change; this takes the values that are to be compared with
        the originator's next announcements (O(VLANs), not O(entries))."""
        orig_node.tt_crcs = {vlan.vid: vlan.crc for vlan in self._vlans_of(orig_node.orig)}

    def check_crc(self, orig_node, vlans: list[TtVlan]) -> bool:
        """Every announced VLAN CRC matches ours, and we know no VLAN it did not announce;
        VLANs whose announcements we ignore are not compared."""
        announced = {v.vid: v.crc for v in vlans}
        if announced == orig_node.tt_crcs:
            return True  # equal in full, so equal without the ignored VLANs too (every OGM)
        orig = orig_node.orig
        announced = {v.vid: v.crc for v in vlans if not self._ignored_vlan(orig, v.vid)}
        return announced == {vid: crc for vid, crc in orig_node.tt_crcs.items() if not self._ignored_vlan(orig, vid)}

    def _apply_changes(self, now: float, orig_node, changes: list[TtChange], ttvn: int) -> bool:
        """Apply announced changes; stops (and returns False) when our limits refuse one."""
        for change in changes:
            if change.flags & F.DEL:
                self.global_del(now, orig_node.orig, change.addr, change.vid, bool(change.flags & F.ROAM))
            elif not self.global_add(now, orig_node.orig, change.addr, change.vid, change.flags, ttvn):
                return False  # stop without committing the ttvn (the kernel's rule)
        orig_node.has_tt = True
        return True

    def _update_changes(self, now: float, orig_node, changes: list[TtChange], ttvn: int) -> None:
        # the kernel stores the diff and the ttvn even when applying it stopped early
        self._apply_changes(now, orig_node, changes, ttvn)
        orig_node.tt_buff = list(changes)
        self._set_ttvn(orig_node, ttvn)

    def _set_ttvn(self, orig_node, ttvn: int) -> None:
        """The originator's TT version we know now; the forwarding table publishes it (the
        data plane stamps it on unicast headers and checks it when forwarding)."""
        if orig_node.last_ttvn != ttvn:
            orig_node.last_ttvn = ttvn
            self.mesh.route_changed(orig_node)

    def _ogm_container(self, now: float, orig_node, tt: TtTvlv) -> None:
        self.ogm_received(now, orig_node, tt)

    def ogm_received(self, now: float, orig_node, tt: TtTvlv) -> None:
        """batadv_tt_update_orig: a TT container in an OGM of `orig_node`."""
        ttvn = tt.ttvn
        # plain int arithmetic on purpose: 255 -> 0 is not "+1" for the kernel either
        if (not orig_node.has_tt and ttvn == 1) or ttvn - orig_node.last_ttvn == 1:
            if not tt.changes:
                self.send_request(now, orig_node, ttvn, tt.vlans, full_table=False)
                return
            self._update_changes(now, orig_node, tt.changes, ttvn)
            self.update_orig_crc(orig_node)
            if not self.check_crc(orig_node, tt.vlans):
                self.send_request(now, orig_node, ttvn, tt.vlans, full_table=True)
        elif not orig_node.has_tt or ttvn != orig_node.last_ttvn or not self.check_crc(orig_node, tt.vlans):
            self.send_request(now, orig_node, ttvn, tt.vlans, full_table=True)

    # --- TT requests and responses over UNICAST_TVLV ----------------------------------------

    def send_request(self, now: float, orig_node, ttvn: int, vlans: list[TtVlan], full_table: bool) -> None:
        issued = self.requests.get(orig_node.orig)
        if issued is not None and now - issued <= self.mesh.config.tt_request_timeout_ms / 1000.0:
            return  # one outstanding request per originator
        # pending: sent and unanswered, or waiting for a route; one budget for both
        pending = len(self.requests) + len(self.unrouted)
        if issued is None and orig_node.orig not in self.unrouted \
                and pending >= self.mesh.config.max_pending_tt_requests:
            self.counters.drop("tt_pending_requests_full")
            return
        flags = TtDataFlags.REQUEST | (TtDataFlags.FULL_TABLE if full_table else 0)
        tvlv = TtTvlv(flags=flags, ttvn=ttvn, vlans=[TtVlan(crc=v.crc, vid=v.vid) for v in vlans])
        # Recorded only when it went out. The kernel also records a request it had no route
        # for, and then waits out the 3 s before asking again: a link that comes back up
        # (its routes and the TT learnt over it were dropped while it was down) then
        # carries no unicast for 3 s. Asking again with the next OGM looks the same on
        # the wire, only sooner.
        self._send_request_tvlv(now, orig_node.orig, tvlv)

    def _send_request_tvlv(self, now: float, orig: Mac, tvlv: TtTvlv) -> None:
        if self.mesh.send_unicast_tvlv(now, self.mesh.primary.mac, orig, [tvlv]):
            self.requests[orig] = now
            self.unrouted.pop(orig, None)
            self.counters["tt_request_tx"] += 1
        else:
            self.unrouted[orig] = tvlv  # within the pending budget (send_request checked it)

    def route_appeared(self, now: float, orig_node) -> None:
        """A route to the originator exists again: a request that had none goes out now
        (the OGM that made the route was processed after its TT container asked)."""
        tvlv = self.unrouted.pop(orig_node.orig, None)
        if tvlv is not None and orig_node.orig not in self.requests:
            self._send_request_tvlv(now, orig_node.orig, tvlv)

    def unicast_tvlv_received(self, now: float, src: Mac, dst: Mac, tt: TtTvlv) -> bool:
        """A TT container in a UNICAST_TVLV; returns False when the packet must be routed on."""
        kind = tt.flags & 0x0F
        if kind == TtDataFlags.REQUEST:
            self.counters["tt_request_rx"] += 1
            return self._send_response(now, tt, src, dst)
        if kind == TtDataFlags.RESPONSE:
            self.counters["tt_response_rx"] += 1
            if not self.mesh.is_my_mac(dst):
                return False
            self._handle_response(now, src, tt)
        return True

    def _send_response(self, now: float, req: TtTvlv, req_src: Mac, req_dst: Mac) -> bool:
        if self.mesh.is_my_mac(req_dst):
            return self._send_my_response(now, req, req_src)
        return self._send_other_response(now, req, req_src, req_dst)

    def _local_full_table(self) -> list[TtChange]:
        return [TtChange(flags=e.flags & 0xFF, addr=e.addr, vid=e.vid)
                for e in self.local.values() if not e.flags & F.NEW]

    def _send_my_response(self, now: float, req: TtTvlv, req_src: Mac) -> bool:
        if self.mesh.originators.get(req_src) is None:
            return True
        full = bool(req.flags & TtDataFlags.FULL_TABLE) or req.ttvn != self.ttvn or not self.last_changeset
        if full:
            ttvn, changes = self.ttvn, self._local_full_table()
        else:
            ttvn, changes = req.ttvn, [TtChange(flags=c.flags, addr=c.addr, vid=c.vid) for c in self.last_changeset]
        flags = TtDataFlags.RESPONSE | (TtDataFlags.FULL_TABLE if full else 0)
        tvlv = TtTvlv(flags=flags, ttvn=ttvn, vlans=self._local_vlan_data(), changes=changes)
        if self.mesh.send_unicast_tvlv(now, self.mesh.primary.mac, req_src, [tvlv]):
            self.counters["tt_response_tx"] += 1
        return True

    def _send_other_response(self, now: float, req: TtTvlv, req_src: Mac, req_dst: Mac) -> bool:
        """Answer on behalf of req_dst when we hold exactly the table it asks about."""
        dst_node = self.mesh.originators.get(req_dst)
        if dst_node is None or self.mesh.originators.get(req_src) is None:
            return False
        if dst_node.last_ttvn != req.ttvn or not self.check_crc(dst_node, req.vlans):
            return False
        full = bool(req.flags & TtDataFlags.FULL_TABLE) or not dst_node.tt_buff
        if full:
            changes = [TtChange(flags=oe.flags, addr=e.addr, vid=e.vid)
                       for e, oe in self._orig_entries(req_dst) if not e.flags & (F.ROAM | F.TEMP)]
        else:
            changes = [TtChange(flags=c.flags, addr=c.addr, vid=c.vid) for c in dst_node.tt_buff]
        vlans = [TtVlan(crc=crc, vid=vid) for vid, crc in dst_node.tt_crcs.items()]
        flags = TtDataFlags.RESPONSE | (TtDataFlags.FULL_TABLE if full else 0)
        tvlv = TtTvlv(flags=flags, ttvn=req.ttvn, vlans=vlans, changes=changes)
        if TVLV_OVERHEAD - 4 + len(tvlv.encode_value()) + 4 > self.mesh.packet_size_max:
            return False
        if self.mesh.send_unicast_tvlv(now, req_dst, req_src, [tvlv]):
            self.counters["tt_response_tx"] += 1
        return True

    def _handle_response(self, now: float, src: Mac, tt: TtTvlv) -> None:
        orig_node = self.mesh.originators.get(src)
        if orig_node is None:
            return
        if tt.flags & TtDataFlags.FULL_TABLE:
            self.global_del_orig(orig_node)
            self._apply_changes(now, orig_node, tt.changes, tt.ttvn)
            orig_node.tt_buff = None
            self._set_ttvn(orig_node, tt.ttvn)
        else:
            self._update_changes(now, orig_node, tt.changes, tt.ttvn)
        self.update_orig_crc(orig_node)
        self.requests.pop(src, None)

    # --- roaming ----------------------------------------------------------------------------

    def send_roam_adv(self, now: float, client: Mac, vid: int, orig: Mac) -> None:
        first, left = self.roam_counts.get(client, (now, ROAMING_MAX_COUNT))
        if now - first > ROAMING_MAX_TIME:
            first, left = now, ROAMING_MAX_COUNT
        if left <= 0:
            self.counters.drop("tt_roam_rate_limited")
            return
        self.roam_counts[client] = (first, left - 1)
        self.counters["tt_roam_adv_tx"] += 1
        self.mesh.send_unicast_tvlv(now, self.mesh.primary.mac, orig, [RoamTvlv(client=client, vid=vid)])

    def roam_received(self, now: float, src: Mac, dst: Mac, roam: RoamTvlv) -> bool:
        if not self.mesh.is_my_mac(dst):
            return False
        orig_node = self.mesh.originators.get(src)
        if orig_node is None:
            return True
        self.counters["tt_roam_adv_rx"] += 1
        self.global_add(now, src, roam.client, roam.vid, F.ROAM, (orig_node.last_ttvn + 1) & 0xFF)
        return True

    # --- temporary entries and lookups for the data path -------------------------------------

    def add_temporary(self, now: float, orig_node, addr: Mac, vid: int) -> None:
        """A broadcast or 4addr DATA frame from a client nobody announced yet."""
        self.global_add(now, orig_node.orig, addr, vid, F.TEMP, orig_node.last_ttvn)

    def is_roaming(self, addr: Mac, vid: int) -> bool:
        entry = self.global_.get((addr, vid))
        return bool(entry and entry.flags & F.ROAM)

    def best_orig(self, addr: Mac, vid: int) -> Mac | None:
        """batadv_transtable_best_orig: the announcing originator with the best route."""
        entry = self.global_.get((addr, vid))
        if entry is None:
            return None
        best, best_metric = None, -1
        for orig in entry.origs:
            node = self.mesh.originators.get(orig)
            router = node.router() if node else None
            if router is None:
                continue
            metric = self.mesh.algo.metric(router)
            if metric > best_metric:
                best, best_metric = orig, metric
        return best

    def owner(self, addr: Mac) -> Mac | None:
        """batctl translate: the best originator announcing this client, untagged first."""
        vids = sorted(vid for mac, vid in self.global_ if mac == addr)
        for vid in vids:
            best = self.best_orig(addr, vid)
            if best is not None:
                return best
        return None

    @staticmethod
    def seq_before(x: int, y: int) -> bool:
        return seq_before8(x, y)

    # --- what batmanctl shows (batctl's JSON keys; VIDs as batctl prints them) --------------

    def local_rows(self, now: float) -> list[dict]:
        """batctl tl. As the kernel's dump, a no-purge entry (our own bat0 MAC) has no last-seen."""
        return [{"tt_address": str(e.addr), "tt_vid": _shown_vid(e.vid), "tt_flags": int(e.flags),
                 **({} if e.flags & F.NOPURGE else {"last_seen_msecs": max(0, round((now - e.last_seen) * 1000))}),
                 "tt_crc32": self.local_crcs.get(e.vid, 0)} for e in self.local.values()]

    def global_rows(self) -> list[dict]:
        """batctl tg: one row per client and announcing originator. As in the kernel's
        netlink dump, TT_TTVN is the entry's and TT_LAST_TTVN the originator's current one."""
        rows = []
        for (addr, vid), entry in self.global_.items():
            best = self.best_orig(addr, vid)
            for orig, orig_entry in entry.origs.items():
                orig_node = self.mesh.originators.get(orig)
                flags = (entry.flags & ~0xFF) | (entry.flags & (F.ROAM | F.TEMP)) | orig_entry.flags
                rows.append({"tt_address": str(addr), "tt_vid": _shown_vid(vid), "tt_flags": int(flags),
                             "tt_ttvn": orig_entry.ttvn, "orig_address": str(orig),
                             "tt_last_ttvn": orig_node.last_ttvn if orig_node else 0,
                             "tt_crc32": orig_node.tt_crcs.get(vid, 0) if orig_node else 0, "best": orig == best})
        return rows


def _shown_vid(vid: int) -> int:
    """-1 untagged, else the 12-bit VLAN id (batctl's TT_VID)."""
    return vid & 0x0FFF if vid & VLAN_HAS_TAG else -1
