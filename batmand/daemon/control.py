"""The control socket: one JSON request per line, answered from the running service."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import grp
import logging
import os
import pwd
import socket
import struct

from batmand.core import ping, tp_meter
from batmand.core.config import FLAG, HARDIF_SETTINGS, Range, SettingError, check_rules
from batmand.core.ping import PingSession, TracerouteSession
from batmand.wire import Mac
from batmand.wire.constants import TTL

from . import options, protocol, tables

SHUTDOWN_DELAY = 0.1  # seconds

log = logging.getLogger("batmand.control")
VID = Range(0, 4095)  # batctl vj: a VLAN id
EVENT_POLL = 2.0  # seconds: how soon an event stream notices its client went away
TP_PROGRESS = 0.5  # seconds between a tp stream's progress events (a client that went away cancels its test)


class CommandError(Exception):
    pass


def _mac(value) -> Mac:
    try:
        return Mac(str(value))
    except ValueError:
        raise CommandError(f"not a MAC address: {value}") from None


def _arg(args, name: str, allowed, default):
    """A request argument checked against its range; absent (or null): the default."""
    raw = args.get(name)
    if raw is None:
        return default
    try:
        return allowed.parse(raw)
    except ValueError as exc:
        raise CommandError(f"{name}: {exc}") from None


def _peer_credentials(writer) -> tuple[int, int, int] | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)  # pid, uid, gid


class ControlServer:
    def __init__(self, service, path: str, group: str = "", max_request: int = 65536) -> None:
        self.service = service
        self.path = path
        self.group = group
        self.max_request = max_request
        self.server: asyncio.AbstractServer | None = None
        self._gid: int | None = None
        self._members: set[str] = set()
        self._clients: set[asyncio.StreamWriter] = set()
        self._refusing = False  # at MAX_CLIENTS: logged once until a connection is accepted again

    async def start(self) -> None:
        if self.group:
            try:
                entry = grp.getgrnam(self.group)
            except KeyError:
                raise ValueError(f"control_group {self.group!r} does not exist") from None
            self._gid, self._members = entry.gr_gid, set(entry.gr_mem)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if not protocol.is_abstract(self.path):
                self._bind_file(sock)
            else:  # no file modes: the credential check (_allowed) is the only guard
                sock.bind(protocol.sockaddr(self.path))
            sock.listen(64)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"cannot listen on the control socket {self.path}: {exc.strerror}") from None
        self.server = await asyncio.start_unix_server(self._client, sock=sock, limit=self.max_request)

    def _bind_file(self, sock: socket.socket) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket; a live daemon was ruled out before
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        if self._gid is not None:
            os.chown(self.path, -1, self._gid)
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o600)

    def _allowed(self, writer) -> bool:
        """root, our own user, or (with control_group) a member of that group."""
        creds = _peer_credentials(writer)
        if creds is None:
            return False
        _, uid, gid = creds
        if uid in (0, os.getuid()):
            return True
        if self._gid is None:
            return False
        if gid == self._gid:
            return True
        try:
            return pwd.getpwuid(uid).pw_name in self._members
        except KeyError:
            return False

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        if self.server is not None and not protocol.is_abstract(self.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        logged = [False]  # once per connection: a confused client must not flood the log
        try:
            if not self._allowed(writer):
                log.warning("control socket: refused a client without permission %s", _peer_credentials(writer))
                writer.write(protocol.encode({"ok": False, "error": "permission denied"}))
                await writer.drain()
                return
            if len(self._clients) >= protocol.MAX_CLIENTS:
                if not self._refusing:
                    log.warning("control socket: %d connections open; refusing more until one closes",
                                protocol.MAX_CLIENTS)
                    self._refusing = True
                writer.write(protocol.encode({"ok": False, "error": f"batmand serves at most {protocol.MAX_CLIENTS} "
                                                                    "control connections at once; try again later"}))
                await writer.drain()
                return
            self._refusing = False
            self._clients.add(writer)
            while True:
                try:
                    line = await asyncio.wait_for(reader.readline(), protocol.IDLE_TIMEOUT)
                except asyncio.TimeoutError:
                    writer.write(protocol.encode({"ok": False, "error": f"no request for {protocol.IDLE_TIMEOUT:g} s; "
                                                                        "connection closed"}))
                    await writer.drain()
                    return
                except (asyncio.LimitOverrunError, ValueError):
                    writer.write(protocol.encode({"ok": False, "error": f"request larger than {self.max_request} bytes"}))
                    await writer.drain()
                    log.warning("control socket: request larger than %d bytes; connection closed", self.max_request)
                    return
                if not line:
                    break
                writer.write(protocol.encode(await self._answer(line, writer, logged)))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()

    async def _answer(self, line: bytes, writer, logged: list) -> dict:
        """The reply to one request line; nothing a client sends gets past this as an exception."""
        cmd = None
        try:
            request = protocol.decode(line)
            cmd, args = request.get("cmd"), request.get("args")
            handler = getattr(self, f"cmd_{cmd}", None) if isinstance(cmd, str) else None
            if handler is None:
                raise CommandError(f"unknown command {cmd!r}")
            if args is None:
                args = {}
            if not isinstance(args, dict):
                raise CommandError(f"{cmd}: args must be a JSON object, got {type(args).__name__}")
            return {"ok": True, "result": await handler(args, writer)}
        except CommandError as exc:
            return {"ok": False, "error": str(exc)}
        except (ValueError, TypeError) as exc:
            if not logged[0]:
                log.warning("control socket: malformed request (%s)", exc)
                logged[0] = True
            return {"ok": False, "error": f"bad request: {exc}"}
        except (ConnectionError, asyncio.IncompleteReadError):
            raise
        except Exception:  # a bug: the client gets an answer, the daemon keeps serving
            if not logged[0]:
                log.exception("control socket: %s failed", cmd)
                logged[0] = True
            return {"ok": False, "error": f"{cmd}: internal error (see the daemon's log)"}

    # --- listings -------------------------------------------------------------------------

    async def cmd_mesh_info(self, args, writer):
        return tables.mesh_info(self.service.mesh, self.service.options.meshif)

    async def cmd_interfaces(self, args, writer):
        return tables.interfaces(self.service.mesh, self.service.ifindex)

    async def cmd_mesh(self, args, writer):
        return tables.mesh_attrs(self.service.mesh, self.service.options.meshif, self.service.ifindex)

    async def cmd_hardifs(self, args, writer):
        return tables.hardifs(self.service.mesh, self.service.options.meshif, self.service.ifindex)

    async def cmd_hardif(self, args, writer):
        name = str(args.get("ifname"))
        row = next((r for r in await self.cmd_hardifs(args, writer) if r["hard_ifname"] == name), None)
        if row is None:
            raise CommandError(f"{name} is not a hard interface of {self.service.options.meshif}")
        return row

    async def cmd_vlan(self, args, writer):
        vid = _arg(args, "vid", VID, None)
        row = None if vid is None else tables.vlan_attrs(self.service.mesh, self.service.options.meshif, vid)
        if row is None:
            raise CommandError(f"{self.service.options.meshif} has no VLAN {args.get('vid')}")
        return row

    async def cmd_originators(self, args, writer):
        outif = None
        if args.get("outif") is not None:  # batctl o -i IFACE
            outif = self.service.mesh.iface(str(args["outif"]))
            if outif is None:
                raise CommandError(f"interface {args['outif']} is not part of {self.service.options.meshif}")
        return tables.originators(self.service.mesh, self.service.now(), self.service.ifindex, outif)

    async def cmd_neighbors(self, args, writer):
        return tables.neighbors(self.service.mesh, self.service.now(), self.service.ifindex)

    async def cmd_transtable_local(self, args, writer):
        return tables.transtable_local(self.service.mesh, self.service.now())

    async def cmd_transtable_global(self, args, writer):
        return tables.transtable_global(self.service.mesh)

    async def cmd_statistics(self, args, writer):
        await self.service.dataplane.refresh()
        return tables.statistics_now(self.service)

    async def cmd_dataplane(self, args, writer):
        await self.service.dataplane.refresh()
        return tables.dataplane_now(self.service)

    async def cmd_topology(self, args, writer):
        """The local batadv-vis view: the record we publish into alfred (alfred_vis), with
        each neighbour's TQ or throughput."""
        record = self.service.vis_record()
        return {"algo": self.service.mesh.algo.name, "record": record.to_json() if record else None,
                "alfred_vis": self.service.options.alfred_vis, "pushed": self.service.vis.pushed}

    async def cmd_routing_algos(self, args, writer):
        algo = self.service.mesh.algo.name
        return {"active": {self.service.options.meshif: algo}, "selected": algo,
                "available": ["BATMAN_IV", "BATMAN_V"]}

    def _hardif(self, args):
        iface = self.service.mesh.iface(str(args.get("ifname")))
        if iface is None:
            raise CommandError(f"{args.get('ifname')} is not part of {self.service.options.meshif}")
        setting = HARDIF_SETTINGS.get(args.get("setting"))
        if setting is None:
            raise CommandError(f"unknown hard-interface setting {args.get('setting')!r} "
                               f"(known: {', '.join(HARDIF_SETTINGS)})")
        return iface, setting.name

    async def cmd_hardif_get(self, args, writer):
        iface, setting = self._hardif(args)
        return getattr(iface.settings, setting)  # throughput_override in kbit/s, as batctl shows it

    async def cmd_hardif_set(self, args, writer):
        iface, setting = self._hardif(args)
        try:
            value = HARDIF_SETTINGS[setting].parse(args.get("value"))
            if setting == "elp_interval":
                check_rules(self.service.mesh.config, {setting: value})
        except SettingError as exc:
            raise CommandError(str(exc)) from None
        self.service.mesh.set_hardif(iface.name, dataclasses.replace(iface.settings, **{setting: value}))
        log.info("%s: %s set to %s", iface.name, setting, value)
        self.service.events.notify({"kind": "set_hardif", "hardif": iface.name,
                                    "settings": dataclasses.asdict(self.service.mesh.iface(iface.name).settings)})
        return await self.cmd_hardif_get(args, writer)

    # --- settings ---------------------------------------------------------------------------

    def _setting(self, args):
        setting = options.lookup(args.get("setting"))
        if setting is None:
            raise CommandError(f"unknown setting {args.get('setting')!r}")
        if not setting.implemented:
            # reads too: a kernel built without the feature (CONFIG_BATMAN_ADV_DAT=n, ...) leaves
            # the value out and batctl's read fails; a value printed here would read as a switch
            # that works (and "disabled" would contradict a kernel node's "enabled")
            raise CommandError(setting.not_implemented(args.get("setting")))
        return setting

    async def cmd_get(self, args, writer):
        value = options.value_of(self.service.options, self._setting(args))
        return int(value) if isinstance(value, bool) else value

    def _checked(self, args, config):
        """(setting, value) for a live mesh setting, checked against its range and the rules
        between keys as they would be in `config`."""
        setting = self._setting(args)
        if not setting.live:
            raise CommandError(f"{setting.name} cannot change while batmand runs: set it in the configuration file; "
                               "it takes effect after a restart")
        if setting.scope != "mesh":
            raise CommandError(f"{setting.name}: add and remove interfaces with if_add / if_del")
        elps = {f"{i.name} elp_interval": i.settings.elp_interval for i in self.service.mesh.ifaces}
        try:
            value = setting.parse(args.get("value"))
            check_rules(dataclasses.replace(config, **{setting.name: value}),
                        elps | options.elp_intervals(self.service.options.hardif), changed=setting.name)
            self.service.mesh.check_option(setting.name, value)
        except SettingError as exc:
            raise CommandError(str(exc)) from None
        return setting, value

    def _store(self, setting, value) -> None:
        try:
            self.service.set_option(setting, value)
        except SettingError as exc:
            raise CommandError(str(exc)) from None
        log.info("setting %s changed to %s", setting.name, value)

    def _notify_mesh(self) -> None:
        """As the kernel after every change (batadv_netlink_notify_mesh): all mesh settings
        batmand implements, for `batmanctl event`."""
        values = {s.name: options.value_of(self.service.options, s) for s in options.SETTINGS.values()
                  if s.scope == "mesh" and s.implemented and s.live}
        self.service.events.notify({"kind": "set_mesh", "algo": self.service.mesh.algo.name, "settings": values})

    async def cmd_set(self, args, writer):
        """A live mesh setting, checked against its range and the rules between keys."""
        setting, value = self._checked(args, self.service.options.mesh)
        self._store(setting, value)
        self._notify_mesh()
        return await self.cmd_get({"setting": setting.name}, writer)

    async def cmd_set_many(self, args, writer):
        """Several live settings at once, in the order given (batctl gw server 50mbit/10mbit
        sets three): all are checked before any changes."""
        items = args.get("settings")
        if not isinstance(items, list) or not all(isinstance(i, list) and len(i) == 2 for i in items):
            raise CommandError("set_many: settings must be a list of [name, value] pairs")
        config, checked = self.service.options.mesh, []
        for name, raw in items:
            setting, value = self._checked({"setting": name, "value": raw}, config)
            config = dataclasses.replace(config, **{setting.name: value})
            checked.append((setting, value))
        for setting, value in checked:
            self._store(setting, value)
        self._notify_mesh()
        return {s.name: options.value_of(self.service.options, s) for s, _ in checked}

    # --- gateway mode and events ---------------------------------------------------------------

    async def cmd_gateways(self, args, writer):
        return tables.gateways(self.service.mesh, self.service.ifindex)

    async def cmd_dat_cache(self, args, writer):
        return self.service.mesh.dat.rows(self.service.now())

    async def cmd_bla_claims(self, args, writer):
        return self.service.mesh.bla.claim_rows()

    async def cmd_bla_backbones(self, args, writer):
        return self.service.mesh.bla.backbone_rows(self.service.now())

    async def cmd_mcast_flags(self, args, writer):
        return {"own": self.service.mesh.multicast.state(), "rows": self.service.mesh.multicast.rows()}

    async def cmd_gw(self, args, writer):
        return self.service.mesh.gateway.state()

    async def cmd_events(self, args, writer):
        """Stream the uevents (batmanctl event) until the client goes away."""
        queue = self.service.events.listen()
        try:
            while not writer.is_closing():
                try:
                    record = await asyncio.wait_for(queue.get(), EVENT_POLL)
                except asyncio.TimeoutError:
                    continue  # look whether the client is still there
                writer.write(protocol.encode({"event": record}))
                await writer.drain()
        finally:
            self.service.events.unlisten(queue)

    # --- interfaces ---------------------------------------------------------------------------

    async def cmd_if_add(self, args, writer):
        try:
            self.service.add_interface(str(args.get("ifname")))
            self.service.wanted.add(str(args.get("ifname")))
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        return await self.cmd_interfaces(args, writer)

    async def cmd_shutdown(self, args, writer):
        """batmanctl interface destroy: stop as on SIGTERM (the mesh interface goes with us)."""
        log.info("shutdown requested on the control socket")
        asyncio.get_running_loop().call_later(SHUTDOWN_DELAY, self.service.stop)  # after the answer went out
        return None

    async def cmd_if_del(self, args, writer):
        try:
            self.service.wanted.discard(str(args.get("ifname")))
            self.service.remove_interface(str(args.get("ifname")))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        return await self.cmd_interfaces(args, writer)

    # --- translate, ping, traceroute -----------------------------------------------------------

    async def cmd_translate(self, args, writer):
        target = _mac(args.get("target"))
        orig = self.service.mesh.translate(target)
        if orig is None:
            raise CommandError(f"no originator known for {target}")
        return {"orig_address": str(orig)}

    async def _run_session(self, session, writer, send_probe, event_of) -> None:
        """Send the session's probes when due and stream every outcome as an event."""
        wake = self.service.register_icmp(session.uid, session)
        sent = 0
        try:
            while True:
                now = self.service.now()
                for probe in session.due(now):
                    send_probe(probe)
                for reply in session.log[sent:]:
                    writer.write(protocol.encode({"event": event_of(reply)}))
                sent = len(session.log)
                await writer.drain()
                if session.finished:
                    return
                wake.clear()
                timeout = max(0.0, min(session.next_deadline(), now + 0.25) - self.service.now())
                try:
                    await asyncio.wait_for(wake.wait(), timeout=timeout)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.service.unregister_icmp(session.uid)

    async def cmd_ping(self, args, writer):
        dst = _mac(args.get("dst"))
        count, interval = _arg(args, "count", ping.COUNT, 5), _arg(args, "interval", ping.INTERVAL, 1.0)
        timeout, ttl = _arg(args, "timeout", ping.TIMEOUT, 1.0), _arg(args, "ttl", ping.TTL_RANGE, TTL)
        first_seqno, record_route = _arg(args, "seqno", ping.SEQNO, 1), _arg(args, "record_route", FLAG, False)
        session = PingSession(dst=dst, uid=self.service.new_uid(), count=count, interval=interval, timeout=timeout,
                              first_seqno=first_seqno)

        def probe(seqno):
            self.service.ping(dst, seqno=seqno, uid=session.uid, ttl=ttl, record_route=record_route)

        def event(reply):
            return {"type": reply.kind, "seqno": reply.seqno, "ttl": reply.ttl,
                    "rtt_ms": None if reply.rtt is None else round(reply.rtt * 1000, 3),
                    "from": str(reply.orig) if reply.orig else None, "rr": [str(m) for m in reply.rr]}

        await self._run_session(session, writer, probe, event)
        return session.summary()

    async def cmd_traceroute(self, args, writer):
        dst = _mac(args.get("dst"))
        timeout = _arg(args, "timeout", ping.TIMEOUT, 1.0)
        session = TracerouteSession(dst=dst, uid=self.service.new_uid(), timeout=timeout)
        hop_of = {}

        def probe(item):
            seqno, ttl = item
            hop_of[seqno] = ttl
            self.service.ping(dst, seqno=seqno, uid=session.uid, ttl=ttl, record_route=False)

        def event(reply):
            return {"type": "probe", "hop": hop_of.get(reply.seqno), "kind": reply.kind,
                    "from": str(reply.orig) if reply.orig else None,
                    "rtt_ms": None if reply.rtt is None else round(reply.rtt * 1000, 3)}

        await self._run_session(session, writer, probe, event)
        reached = any(r.kind == "reply" for hop in session.hops for r in hop)
        return {"hops": len(session.hops), "reached": reached}

    # --- throughput meter ------------------------------------------------------------------------

    async def cmd_tp(self, args, writer):
        """batctl tp: a test toward `dst` for `test_time` ms (0: 10 s). Streams a start event
        with the cookie and progress events, then answers the result as the kernel reports
        it (result 3 = complete, with test_time_ms and total_bytes; else an error reason). A
        client that goes away cancels its test."""
        dst = _mac(args.get("dst"))
        length = _arg(args, "test_time", tp_meter.TEST_LENGTH, 0)
        cookie, waiter = self.service.tp_start(dst, length)
        try:
            writer.write(protocol.encode({"event": {"type": "started", "cookie": cookie}}))
            await writer.drain()
            while not waiter.done():
                await asyncio.wait([waiter], timeout=TP_PROGRESS)
                if waiter.done() or writer.is_closing():
                    break
                sender = self.service.mesh.tp.senders.get(dst)
                acked = sender.tot_sent if sender is not None and sender.cookie == cookie else None
                writer.write(protocol.encode({"event": {"type": "progress", "cookie": cookie, "acked_bytes": acked}}))
                await writer.drain()
        finally:
            if not waiter.done():  # the client went away (or the daemon stops): the test is ours to end
                self.service.tp_cancel(dst)
        if not waiter.done():
            raise ConnectionResetError("the tp client went away")
        result = waiter.result()
        return {"cookie": result.cookie, "dst": str(result.dst), "result": result.result,
                "test_time_ms": result.test_time_ms, "total_bytes": result.total_bytes}

    async def cmd_tp_cancel(self, args, writer):
        """batctl's Ctrl-C: end the test toward `dst`; its stream then reports what it measured."""
        dst = _mac(args.get("dst"))
        running = dst in self.service.mesh.tp.senders
        self.service.tp_cancel(dst)
        return {"cancelled": running}
