"""The running daemon: the protocol core driven by asyncio (uvloop) I/O.

Sockets and the TAP are read in reader callbacks, drained in bounded batches; every frame
first meets the inline data path, and what it does not take goes to the core. The core's
actions come back here: transmit, deliver to the TAP, forwarding-table updates (to the
data path), ICMP results (to the control socket's ping sessions)."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import math
import os
import random
import signal
import socket
import time
from typing import TYPE_CHECKING

from batmand.core.config import HardifConfig
from batmand.core.events import Deliver, ForwardingUpdate, IcmpResult, TpResult, Transmit, Uevent
from batmand.core.mesh import Mesh
from batmand.wire import Mac

from batmand.dataplane.pool import InlineDataPlane, WorkerPool
from batmand.dataplane.kernel_forward import KernelForward

from .alfred import VisPublisher
from .control import ControlServer
from .events import Events
from .mcast_groups import HostGroupsReader

if TYPE_CHECKING:
    from .metrics import MetricsServer
from . import protocol, state, vis
from .links import link_speed
from .netlink import Link, LinkMonitor
from .notify import Notifier
from .options import Options
from .packet_socket import PacketSocket
from .softif import SoftInterface
from .wifi import is_wireless, query_stations

log = logging.getLogger("batmand")

BATCH = 64  # frames per reader wake-up before yielding to the loop
TIMER_TICK = 0.004  # a jiffy at HZ=250
INF = float("inf")
TIMER_EARLY = 0.002  # how much earlier than its deadline uvloop may run a timer
MCAST_WORK_PERIOD = 0.5  # seconds between two looks at bat0's multicast groups
# how often the fast path's sightings of clients reach the core (workers report at the
# same pace): they refresh timeouts of minutes, and a look at every timer is a scan of
# the data plane's caches up to a hundred times a second in a large mesh
SEEN_PERIOD = 0.5
KERNEL_SEEN_PERIOD = 5.0  # the kernel fast path's marks: far inside BLA's claim and TT's local timeouts
# how often the daemon looks for packet sockets on bat0 (tcpdump): the kernel fast path then
# leaves the host's frames to the TAP, where the sockets see them
TAP_CHECK_PERIOD = 1.0
MAX_HEADER = 32  # the largest batman-adv header we put in front of a 1500-byte frame


class AlreadyRunning(RuntimeError):
    pass


class Service:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.loop: asyncio.AbstractEventLoop | None = None
        self.mesh: Mesh | None = None
        self.softif: SoftInterface | None = None
        self.sockets: dict[str, PacketSocket] = {}
        self.ifindex: dict[str, int] = {}
        self.dataplane: InlineDataPlane | WorkerPool | None = None
        self.kernel_forward: KernelForward | None = None  # None: --set kernel_forward=off
        self.control = ControlServer(self, options.socket_path, options.control_group, options.control_max_request)
        self.events = Events(options.meshif, options.event_hook)
        self.vis = VisPublisher(options, self.vis_record)
        self.metrics: MetricsServer | None = None  # metrics_listen
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._clock_floor = 0.0  # the last timer deadline the core ran at
        self._icmp: dict[int, tuple[object, asyncio.Event]] = {}
        self._tp: dict[int, list[asyncio.Future]] = {}  # cookie -> who waits for that test's TpResult
        self._uid = random.randrange(256)
        self._stopped: asyncio.Event | None = None
        self._locks: list = []  # held for the daemon's life: the abstract name, a file lock
        self._next_speed_check = 0.0
        self._next_seen = 0.0
        self._next_tap_check = 0.0
        self._next_kernel_seen = 0.0
        self._station_queries: dict[str, asyncio.Future] = {}  # nl80211 station dumps under way
        self.notifier = Notifier()
        self.wanted: set[str] = set()  # hard interfaces to keep attached (configured or added)
        self.links: LinkMonitor | None = None  # every interface of the namespace, kept current
        self.ports: set[str] = set()  # hard interfaces with data-plane rings
        self._port_failed: set[str] = set()  # rings that could not be opened: retried
        self._vlans_refused: set[int] = set()  # VLANs of bat0 the OGM had no room for (logged once)
        self._state_loaded = False  # the seqno state file was read

    def now(self) -> float:
        # time.monotonic, not loop.time(): uvloop's clock has millisecond steps (ping RTTs);
        # never behind a deadline the core was already run at (_on_timer)
        return max(time.monotonic(), self._clock_floor)

    # --- life cycle -------------------------------------------------------------------------------

    def _take_lock(self) -> None:
        """One daemon per mesh interface per network namespace, as the kernel has one bat0
        per namespace: an abstract name (scoped to the namespace, freed when we exit). A
        control socket at a file path also gets an flock beside it, so that two daemons in
        different namespaces cannot take over each other's socket file."""
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            lock.bind(protocol.sockaddr(protocol.lock_name(self.options.meshif)))
        except OSError as exc:
            lock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            raise AlreadyRunning(f"another batmand already runs {self.options.meshif} in this network namespace "
                                 f"(it holds {protocol.lock_name(self.options.meshif)})") from None
        self._locks.append(lock)
        path = self.options.socket_path
        if protocol.is_abstract(path):
            return
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunning(f"another batmand already uses the control socket {path} "
                                 f"({path}.lock is locked)") from None
        self._locks.append(fd)

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._take_lock()
        opts = self.options
        mac = Mac(opts.mac) if opts.mac else None
        self.softif = SoftInterface(opts.meshif, mac, opts.mesh.mtu, queues=max(1, opts.workers))
        self.mesh = Mesh(opts.mesh, soft_mac=Mac(self.softif.mac), now=self.now())
        self.mesh.log = lambda message: log.warning("%s", message)
        self.mesh.debug = lambda message: log.debug("%s", message)
        housekeeping = None
        try:
            self.links = LinkMonitor()
            self.links.load()
            self._start_dataplane()
            for ifname in opts.interfaces:
                self.wanted.add(ifname)
                self.add_interface(ifname)
            self.links.start(self.loop, self._on_link)
            self._update_vlans()
            self.softif.up()
            await self.control.start()
            if opts.metrics_listen:
                from . import metrics  # prometheus_client (about 5 MB) only for a daemon that serves metrics

                registry = metrics.registry_for(lambda: metrics.read(self))
                self.metrics = metrics.MetricsServer(opts.metrics_listen, registry)
                await self.metrics.start()
                log.info("metrics at http://%s%s", opts.metrics_listen, metrics.PATH)
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, self._stopped.set)
            self.loop.add_signal_handler(signal.SIGHUP, self.reload)
            log.info("%s up: MAC %s, interfaces %s, control socket %s", opts.meshif, self.mesh.soft_mac,
                     ", ".join(opts.interfaces) or "none", opts.socket_path)
            self._reschedule()
            self.notifier.send(READY=1, STATUS=self._status())
            housekeeping = asyncio.create_task(self._housekeeping())
            listeners = asyncio.create_task(self._multicast_listeners())
            publisher = asyncio.create_task(self.vis.run())
            await self._stopped.wait()
            self.notifier.send(STOPPING=1)
        finally:
            if housekeeping is not None:
                housekeeping.cancel()
                listeners.cancel()
                publisher.cancel()
            await self.shutdown()

    def vis_record(self) -> vis.Record | None:
        """Our batadv-vis record; None while no interface is active (batadv-vis would skip
        a record without interfaces)."""
        if self.mesh is None or not self.mesh.active_ifaces():
            return None
        return vis.build(self.mesh, self.now())

    def _status(self) -> str:
        status = self.mesh.status()
        return (f"{status['algo']}, {status['interfaces']} interfaces, {status['originators']} originators, "
                f"{status['global_clients']} global clients")

    async def _housekeeping(self) -> None:
        """Once a second: watchdog and status, the data plane's health, rings to retry, and
        every SAVE_PERIOD the seqno state. An error in one round is logged, never the end
        of the task (the watchdog would then kill a daemon that still routes)."""
        next_save = self.now() + 1.0  # soon after start, then every SAVE_PERIOD
        interval = min(1.0, self.notifier.watchdog_interval or 1.0)
        failing = None
        while True:
            await asyncio.sleep(interval)
            try:
                self.notifier.send(WATCHDOG=1, STATUS=self._status())
                self.dataplane.check()
                for ifname in sorted(self._port_failed):
                    self._ensure_port(ifname)
                if self.now() >= next_save:
                    next_save = self.now() + state.SAVE_PERIOD
                    self._save_state()
                failing = None
            except Exception as exc:  # noqa: BLE001 - logged once per kind, the loop goes on
                if type(exc) is not failing:
                    log.exception("housekeeping failed; it goes on")
                    failing = type(exc)

    async def _multicast_listeners(self) -> None:
        """Every 500 ms (BATADV_MCAST_WORK_PERIOD): the groups bat0's hosts listen to. Read in
        a thread: when bat0 is bridged that asks rtnetlink, which waits while another holds
        the rtnl lock, and the OGM timers must not wait with it."""
        reader = HostGroupsReader(self.softif.name)
        while True:
            try:
                groups = await asyncio.to_thread(reader.read, self.now())
                self._apply(self.mesh.set_host_groups(self.now(), groups))
            except Exception:  # noqa: BLE001 - logged, the next round tries again
                log.exception("reading bat0's multicast groups failed")
            await asyncio.sleep(MCAST_WORK_PERIOD)

    # --- seqnos across restarts ---------------------------------------------------------------

    def _state_path(self, originator=None) -> str:
        """Where this node's seqnos are kept: by mesh interface and originator (the primary's
        MAC); "" when disabled or before there is an originator."""
        directory = self.options.state_directory
        if originator is None and self.mesh is not None and self.mesh.primary is not None:
            originator = self.mesh.primary.mac
        if not directory or originator is None:
            return ""
        return state.state_path(directory, self.options.meshif, originator)

    def _save_state(self) -> None:
        path = self._state_path()
        if path:
            state.save(path, self.mesh)

    def _restore_seqnos(self, mac: bytes) -> None:
        """Before the first interface is attached: the seqnos saved for the originator it
        makes us (the core applies each interface's own when that MAC attaches)."""
        if self._state_loaded or self.mesh.primary is not None:
            return
        path = self._state_path(Mac(mac))
        if not path:
            return
        self._state_loaded = True
        saved = state.load(path)
        if saved is not None:
            self.mesh.restore_seqnos(saved.seqnos, saved.ahead)
            log.info("continuing the sequence numbers saved in %s", path)

    def reload(self) -> None:
        """SIGHUP: read the configuration again; apply what can change while running."""
        from .options import SETTINGS, OptionsError, load, value_of

        self.notifier.send(RELOADING=1)
        try:
            new = load(self.options.argv)
        except OptionsError as exc:
            log.error("reload failed, keeping the running configuration: %s", exc)
            self.notifier.send(READY=1)
            return
        for setting in SETTINGS.values():  # self.options.mesh is the running mesh.config
            if setting.name == "interfaces":
                continue  # attached and removed below
            running, wanted = value_of(self.options, setting), value_of(new, setting)
            if wanted == running:
                continue
            if setting.live:
                self.set_option(setting, wanted)
                log.info("%s changed to %s", setting.name, wanted)
            else:
                log.warning("%s changed in the configuration; it takes effect after a restart", setting.name)
        self.options.hardif = new.hardif
        for ifname in set(new.interfaces) - self.wanted:
            self.wanted.add(ifname)
        for ifname in self.wanted - set(new.interfaces):
            self.wanted.discard(ifname)
            if ifname in self.sockets:
                self.remove_interface(ifname)
        for iface in self.mesh.ifaces:
            self.mesh.set_hardif(iface.name, self._hardif_settings(iface.name))
        for ifname in sorted(self.wanted - set(self.sockets)):
            try:
                self.add_interface(ifname)
            except (OSError, ValueError) as exc:
                log.warning("cannot attach %s: %s; it is attached when it appears", ifname, exc)
        self.options.interfaces = sorted(self.wanted)
        self._update_vlans()
        log.info("configuration reloaded")
        self.notifier.send(READY=1, STATUS=self._status())

    def set_option(self, setting, value) -> None:
        """A live setting, already checked: the mesh's go through the core (its features
        react to them, as the kernel's netlink set does)."""
        if setting.scope == "mesh":
            self._apply(self.mesh.set_option(self.now(), setting.name, value))
        else:
            setattr(self.options, setting.name, value)

    def stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    async def shutdown(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.metrics is not None:
            await self.metrics.close()
            self.metrics = None
        if self.mesh is not None:
            self._save_state()
        for name in list(self.sockets):
            self._close_socket(name)
        if self.kernel_forward is not None:
            self.kernel_forward.close()
            self.kernel_forward = None
        if self.dataplane is not None:
            self.dataplane.close()
            self.dataplane = None
        if self.softif is not None:
            self.softif.close()
            self.softif = None
        if self.links is not None:
            self.links.close()
            self.links = None
        await self.control.close()
        await self.events.close()
        for lock in self._locks:
            if isinstance(lock, socket.socket):
                lock.close()
            else:
                os.close(lock)
        self._locks.clear()
        log.info("%s down", self.options.meshif)

    # --- hard interfaces ----------------------------------------------------------------------------

    def add_interface(self, ifname: str) -> None:
        """Attach a hard interface (batctl if add). One that is down is set up first, as
        the daemon always did (set down later, it stays attached but inactive)."""
        if ifname in self.sockets:
            raise ValueError(f"{ifname} is already part of {self.options.meshif}")
        link = self.links.by_name(ifname)
        if link is None:
            raise ValueError(f"no such interface: {ifname}")
        if ifname == self.softif.name:
            raise ValueError(f"{ifname} is the mesh interface itself")
        self._warn_small_mtu(ifname, link.mtu)
        if not link.up:
            self.links.set_up(link.index)
        sock = PacketSocket(ifname)
        self.sockets[ifname] = sock
        self.ifindex[ifname] = link.index
        self.loop.add_reader(sock.fileno(), self._on_hardif, ifname)
        self._restore_seqnos(link.mac)
        self._apply(self.mesh.add_interface(self.now(), ifname, Mac(link.mac), link.mtu, wifi=is_wireless(ifname),
                                            settings=self._hardif_settings(ifname)))
        self._refresh_speed(self.mesh.iface(ifname))
        self._ensure_port(ifname)
        self._update_datapath_ifaces()
        log.info("interface %s added (MAC %s, MTU %d)%s", ifname, Mac(link.mac), link.mtu,
                 " as primary" if self.mesh.primary and self.mesh.primary.name == ifname else "")

    def _warn_small_mtu(self, ifname: str, mtu: int) -> None:
        required = self.options.mesh.mtu + MAX_HEADER
        if mtu >= required:
            return
        if self.options.mesh.fragmentation:
            log.warning("The MTU of interface %s is too small (%d) to handle the transport of batman-adv "
                        "packets. Packets going over this interface will be fragmented on layer2 which could "
                        "impact the performance. Setting the MTU to %d would solve the problem.",
                        ifname, mtu, required)
        else:
            log.warning("The MTU of interface %s is too small (%d) to handle the transport of batman-adv "
                        "packets. If you experience problems getting traffic through try increasing the MTU "
                        "to %d.", ifname, mtu, required)

    def _ensure_port(self, ifname: str) -> None:
        """The data plane's rings on an attached interface that is up (a fanout group cannot
        be joined while the interface is down). A failure is retried by the housekeeping."""
        iface = self.mesh.iface(ifname)
        if ifname in self.ports or iface is None or not iface.active:
            return
        try:
            self.dataplane.add_port(ifname, bytes(iface.mac), iface.mtu)
        except OSError as exc:
            if ifname not in self._port_failed:
                log.warning("interface %s: cannot open the data-plane rings (%s); retrying", ifname, exc)
            self._port_failed.add(ifname)
            return
        if ifname in self._port_failed:
            log.info("interface %s: data-plane rings open", ifname)
            self._port_failed.discard(ifname)
        self.ports.add(ifname)

    def _watch_socket(self, ifname: str) -> None:
        """Read the control socket of an interface that came back up afresh: the ENETDOWN
        the kernel reported when it went down made the event loop stop watching it."""
        sock = self.sockets[ifname]
        sock.clear_error()
        self.loop.remove_reader(sock.fileno())
        self.loop.add_reader(sock.fileno(), self._on_hardif, ifname)

    def _on_link(self, old: Link | None, new: Link | None) -> None:
        """A change rtnetlink reported (old None: appeared, new None: gone): a hard interface
        set down or up, a new MTU or MAC, one that vanished or came back; VLANs of bat0."""
        link = new or old
        if link.kind == "vlan" or link.name == self.softif.name:
            self._update_vlans()
        if link.name == self.softif.name and self.kernel_forward is not None:
            self.kernel_forward.set_soft(new is not None and new.up, link.mtu)
        name = link.name
        if name not in self.wanted:
            return
        try:
            if new is None:
                if name in self.sockets:
                    log.warning("interface %s disappeared; it is re-attached when it comes back", name)
                    self.remove_interface(name)
            elif name not in self.sockets:
                self.add_interface(name)
                log.info("interface %s is back", name)
            elif old is None or new.index != self.ifindex.get(name):  # a new device of that name
                log.info("interface %s was replaced; attaching it again", name)
                self.remove_interface(name)
                self.add_interface(name)
            else:
                self._link_changed(old, new)
        except (OSError, ValueError) as exc:
            log.warning("interface %s: %s", name, exc)

    def _link_changed(self, old: Link, new: Link) -> None:
        name, iface = new.name, self.mesh.iface(new.name)
        if new.mac != old.mac:  # a new address: a new originator to the peers
            log.info("interface %s: MAC %s -> %s; attaching it again", name, Mac(old.mac), Mac(new.mac))
            self.remove_interface(name)
            self.add_interface(name)
            return
        if new.mtu != iface.mtu:  # fragment to the new size; rings sized for it
            log.info("interface %s: MTU %d -> %d", name, iface.mtu, new.mtu)
            self._warn_small_mtu(name, new.mtu)
            self.mesh.set_mtu(name, new.mtu)
            self._close_port(name)
        if new.up and not iface.active:
            log.info("Interface activated: %s", name)  # the kernel's words
            self._watch_socket(name)
            self._apply(self.mesh.activate_interface(self.now(), name))
        elif not new.up and iface.active:
            log.info("Interface deactivated: %s", name)
            self._apply(self.mesh.deactivate_interface(self.now(), name))
            self._close_port(name)  # opened afresh when it is up again: no stale socket error
        self._ensure_port(name)
        self._update_datapath_ifaces()

    def _close_port(self, ifname: str) -> None:
        if ifname in self.ports:
            self.ports.discard(ifname)
            self.dataplane.remove_port(ifname)

    def _update_vlans(self) -> None:
        """The VLANs of bat0 (the kernel's ndo_vlan_rx_add_vid / kill_vid): the VLAN devices
        on it, and the configured ones. The host's frames on any other VLAN are refused."""
        softif = self.links.by_name(self.softif.name)
        wanted = (self.links.vlans_on(softif.index) if softif else set()) | set(self.mesh.config.vlans)
        self._apply(self.mesh.set_vlans(self.now(), wanted))
        refused = wanted - self.mesh.vlans()
        for vid in sorted(refused - self._vlans_refused):
            log.error("VLAN %d of %s refused: our OGM has no room for another VLAN (receivers ignore OGMs "
                      "longer than 512 bytes)", vid, self.softif.name)
        self._vlans_refused = refused

    def _hardif_settings(self, ifname: str) -> HardifConfig:
        """The configured settings of an interface, the kernel's defaults for the rest."""
        return HardifConfig(**self.options.hardif.get(ifname, {}))

    def _refresh_speed(self, iface) -> None:
        """What an algorithm that estimates links needs when there is no override: the link
        speed (ethtool's view) and, on Wi-Fi, the stations (asked in the background; one
        question at a time)."""
        if not self.mesh.algo.estimates_links:
            return
        speed, full_duplex = link_speed(iface.name)
        self.mesh.set_link_facts(iface.name, speed_mbit=speed, full_duplex=full_duplex)
        if iface.wifi and iface.name not in self._station_queries:
            query = query_stations(self.loop, self.ifindex.get(iface.name, 0))
            self._station_queries[iface.name] = query
            query.add_done_callback(lambda done, name=iface.name: self._stations_known(name, done))

    def _stations_known(self, ifname: str, query: asyncio.Future) -> None:
        self._station_queries.pop(ifname, None)
        if self.mesh is not None and self.mesh.iface(ifname) is not None and not query.cancelled() \
                and query.exception() is None:
            self.mesh.set_stations(ifname, query.result())

    def remove_interface(self, ifname: str) -> None:
        if ifname not in self.sockets:
            raise ValueError(f"{ifname} is not part of {self.options.meshif}")
        was_primary = self.mesh.primary is not None and self.mesh.primary.name == ifname
        self._apply(self.mesh.remove_interface(self.now(), ifname))
        self._close_socket(ifname)
        self._update_datapath_ifaces()
        log.info("interface %s removed%s", ifname,
                 f"; primary is now {self.mesh.primary.name}" if was_primary and self.mesh.primary else "")

    def _close_socket(self, ifname: str) -> None:
        sock = self.sockets.pop(ifname, None)
        if sock is not None:
            self.loop.remove_reader(sock.fileno())
            sock.close()
        if self.dataplane is not None:
            self._close_port(ifname)
        self._port_failed.discard(ifname)
        self.ifindex.pop(ifname, None)

    def _update_datapath_ifaces(self) -> None:
        ifaces = {i.name: (bytes(i.mac), i.mtu) for i in self.mesh.active_ifaces()}
        primary = bytes(self.mesh.primary.mac) if self.mesh.primary else None
        wifi = any(i.wifi for i in self.mesh.active_ifaces())
        self.dataplane.set_ports(ifaces, primary, wifi)
        if self.kernel_forward is not None:
            self.kernel_forward.set_ports(ifaces, primary, wifi)

    # --- frames in ------------------------------------------------------------------------------------

    def _start_dataplane(self) -> None:
        opts = self.options
        settings = {"gro": opts.gro, "tso": opts.tso, "csum_offload": opts.csum_offload,
                    "rx_ring": 2 if opts.rx_ring == "v3" else 1}
        self.softif.set_offload(opts.csum_offload, opts.tso)
        if opts.workers == 0:
            self.dataplane = InlineDataPlane(self.loop, self.softif.fd, self._slow_host, self._slow_mesh, settings)
        else:
            self.dataplane = WorkerPool(self.loop, self.softif.fds, self._slow_host, self._slow_mesh, settings)
            log.info("%d data-plane workers: pids %s", opts.workers, ", ".join(map(str, self.dataplane.pids())))
        if opts.kernel_forward:
            self.kernel_forward = KernelForward(self.softif.name, gro=opts.gro)

    def _slow_host(self, frame: bytes) -> None:
        """A frame from the host that the data plane left to the protocol core."""
        self._apply(self.mesh.soft_iface_frame(self.now(), frame))

    def _slow_mesh(self, ifname: str, frame: bytes) -> None:
        if ifname in self.sockets:
            self._apply(self.mesh.receive(self.now(), ifname, frame))

    def _on_hardif(self, ifname: str) -> None:
        """Everything but UNICAST from a hard interface (the data plane takes UNICAST)."""
        sock = self.sockets.get(ifname)
        if sock is None:
            return
        frames = []
        for _ in range(BATCH):
            frame = sock.recv()
            if frame is None:
                break
            frames.append(frame)
        if frames:  # one publish and one timer check for the batch (an OGM storm is many frames)
            self._apply(self.mesh.receive_many(self.now(), ifname, frames))

    # --- actions out -----------------------------------------------------------------------------------

    def _send(self, ifname: str, frame) -> bool:
        sock = self.sockets.get(ifname)
        return sock.send(frame) if sock is not None else False

    def _deliver(self, frame) -> str | None:
        """Why the frame was dropped (None: written to the TAP)."""
        return self.softif.write(frame) if self.softif is not None else None

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Transmit):
                if not self._send(action.iface, action.frame):
                    self.mesh.counters.drop("send_failed")
            elif isinstance(action, Deliver):
                dropped = self._deliver(action.frame)
                if dropped:
                    self.mesh.counters.drop(dropped)
            elif isinstance(action, ForwardingUpdate):
                self.dataplane.apply(action)
                if self.kernel_forward is not None:
                    self.kernel_forward.apply(action)
            elif isinstance(action, Uevent):
                self.events.publish(action)
            elif isinstance(action, TpResult):
                self.events.publish_tp(action)
                for waiter in self._tp.pop(action.cookie, ()):
                    if not waiter.done():
                        waiter.set_result(action)
            elif isinstance(action, IcmpResult):
                entry = self._icmp.get(action.uid)
                if entry is not None:
                    session, wake = entry
                    if session.on_result(action) is not None:
                        wake.set()
        self._reschedule()

    # --- timers -------------------------------------------------------------------------------------------

    def _reschedule(self) -> None:
        deadline = self.mesh.next_deadline()
        if deadline < INF:  # the kernel's timers fire on jiffies: what falls due in one, goes in one
            deadline = math.ceil(deadline / TIMER_TICK) * TIMER_TICK
        if deadline >= self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_later(max(0.0, deadline - self.now()), self._on_timer)

    def _on_timer(self) -> None:
        deadline, self._timer, self._timer_at = self._timer_at, None, float("inf")
        now = self.now()
        if deadline - TIMER_EARLY <= now < deadline:
            # uvloop fires timers on its millisecond clock, a hair before time.monotonic
            # gets there: this is the deadline's turn (not a wake-up for nothing, and then
            # another one for the rest of that millisecond)
            self._clock_floor = now = deadline
        if now >= self._next_seen:
            self._next_seen = now + SEEN_PERIOD
            seen = self.dataplane.take_seen()
            if self.kernel_forward is not None and now >= self._next_kernel_seen:
                # (a syscall per watched entry; the kernel keeps each one's exact last time)
                self._next_kernel_seen = now + KERNEL_SEEN_PERIOD
                for source, when in self.kernel_forward.take_seen().items():
                    seen[source] = max(when, seen.get(source, 0.0))
            if seen:
                self.mesh.local_clients_seen(seen)
        if now >= self._next_tap_check and self.kernel_forward is not None:
            self._next_tap_check = now + TAP_CHECK_PERIOD
            self.kernel_forward.watch_taps()
        if now >= self._next_speed_check:  # link speeds can change (the kernel asks on every ELP)
            self._next_speed_check = now + 10.0
            for iface in self.mesh.active_ifaces():
                self._refresh_speed(iface)
        self._apply(self.mesh.tick(now))

    # --- ping / traceroute support for the control socket ------------------------------------------------

    def new_uid(self) -> int:
        for _ in range(256):
            self._uid = (self._uid + 1) % 256
            if self._uid not in self._icmp:
                return self._uid
        raise ValueError("too many ping sessions")

    def register_icmp(self, uid: int, session) -> asyncio.Event:
        wake = asyncio.Event()
        self._icmp[uid] = (session, wake)
        return wake

    def unregister_icmp(self, uid: int) -> None:
        self._icmp.pop(uid, None)

    def ping(self, dst: Mac, *, seqno: int, uid: int, ttl: int, record_route: bool) -> None:
        self._apply(self.mesh.ping(self.now(), dst, seqno=seqno, uid=uid, ttl=ttl, record_route=record_route))

    # --- throughput meter (batctl tp) ----------------------------------------------------------------

    def tp_start(self, dst: Mac, test_length_ms: int) -> tuple[int, asyncio.Future]:
        """A test toward `dst`: its cookie and a future for its TpResult (waited for before
        the start's actions run: an error is reported at once). The core sends the MSGs as
        ACKs open the window and at its timer ticks, all on this loop."""
        cookie, actions = self.mesh.tp_start(self.now(), dst, test_length_ms)
        waiter = self.loop.create_future()
        self._tp.setdefault(cookie, []).append(waiter)
        self._apply(actions)
        return cookie, waiter

    def tp_cancel(self, dst: Mac) -> None:
        self._apply(self.mesh.tp_cancel(self.now(), dst))
