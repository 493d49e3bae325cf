"""The control socket: one JSON request per line, answered from the running service."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import socket
import struct

from batmand.core.ping import PingSession, TracerouteSession
from batmand.wire import Mac

from . import protocol, tables
from .links import sysfs_int

log = logging.getLogger("batmand.control")

SETTINGS = {
    "orig_interval": ("orig_interval_ms", int),
    "hop_penalty": ("hop_penalty", int),
    "aggregation": ("aggregation", bool),
    "ap_isolation": ("ap_isolation", bool),
    "loglevel": ("loglevel", str),
}
LOGLEVELS = ("none", "all", "batman", "routes", "tt", "bla", "dat", "mcast", "tp")


class CommandError(Exception):
    pass


def _mac(value) -> Mac:
    try:
        return Mac(str(value))
    except ValueError:
        raise CommandError(f"not a MAC address: {value}") from None


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
        logged = False
        try:
            if not self._allowed(writer):
                log.warning("control socket: refused a client without permission %s", _peer_credentials(writer))
                writer.write(protocol.encode({"ok": False, "error": "permission denied"}))
                await writer.drain()
                return
            while True:
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    writer.write(protocol.encode({"ok": False, "error": f"request larger than {self.max_request} bytes"}))
                    await writer.drain()
                    log.warning("control socket: request larger than %d bytes; connection closed", self.max_request)
                    return
                if not line:
                    break
                try:
                    request = protocol.decode(line)
                    cmd, args = request.get("cmd"), request.get("args") or {}
                    handler = getattr(self, f"cmd_{cmd}", None) if isinstance(cmd, str) else None
                    if handler is None:
                        raise CommandError(f"unknown command {cmd!r}")
                    result = await handler(args, writer)
                    reply = {"ok": True, "result": result}
                except CommandError as exc:
                    reply = {"ok": False, "error": str(exc)}
                except (ValueError, TypeError) as exc:
                    reply = {"ok": False, "error": f"bad request: {exc}"}
                    if not logged:  # once per connection: a confused client must not flood the log
                        log.warning("control socket: malformed request (%s)", exc)
                        logged = True
                writer.write(protocol.encode(reply))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    # --- listings -------------------------------------------------------------------------

    async def cmd_mesh_info(self, args, writer):
        return tables.mesh_info(self.service.mesh, self.service.options.meshif)

    async def cmd_interfaces(self, args, writer):
        return tables.interfaces(self.service.mesh, self.service.ifindex)

    async def cmd_originators(self, args, writer):
        return tables.originators(self.service.mesh, self.service.now(), self.service.ifindex)

    async def cmd_neighbors(self, args, writer):
        return tables.neighbors(self.service.mesh, self.service.now(), self.service.ifindex)

    async def cmd_transtable_local(self, args, writer):
        return tables.transtable_local(self.service.mesh, self.service.now())

    async def cmd_transtable_global(self, args, writer):
        return tables.transtable_global(self.service.mesh)

    async def cmd_statistics(self, args, writer):
        dataplane = self.service.dataplane
        await dataplane.refresh()
        stats = tables.statistics(self.service.mesh, dataplane.counters())
        # frames lost at the packet sockets (the control process's and the data plane's rings)
        stats["drop_socket_buffer"] = (sum(s.statistics()[1] for s in self.service.sockets.values())
                                       + dataplane.status()["drops"]["socket"])
        return stats

    async def cmd_dataplane(self, args, writer):
        """Per-worker counters and drops by place (socket rings, TAP queue, daemon)."""
        await self.service.dataplane.refresh()
        status = self.service.dataplane.status()
        status["mode"] = "inline" if not status["workers"] else f"{len(status['workers'])} workers"
        # tap: frames the host could not queue to the TAP (no worker read them in time);
        # tap_write: frames for the host whose TAP write failed (the host's backlog was full)
        status["drops"]["tap"] = sysfs_int(self.service.softif.name, "statistics/tx_dropped") or 0
        status["drops"]["tap_write"] += self.service.softif.write_dropped
        status["counters"] = self.service.dataplane.counters()
        return status

    async def cmd_routing_algos(self, args, writer):
        algo = self.service.mesh.algo.name
        return {"active": {self.service.options.meshif: algo}, "selected": algo,
                "available": ["BATMAN_IV", "BATMAN_V"]}

    def _hardif(self, args):
        iface = self.service.mesh.iface(str(args.get("ifname")))
        if iface is None:
            raise CommandError(f"{args.get('ifname')} is not part of {self.service.options.meshif}")
        setting = args.get("setting")
        if setting not in ("elp_interval", "throughput_override", "hop_penalty"):
            raise CommandError(f"unknown hard-interface setting {setting!r}")
        return iface, setting

    async def cmd_hardif_get(self, args, writer):
        iface, setting = self._hardif(args)
        if setting == "elp_interval":
            return iface.elp_interval_ms
        if setting == "throughput_override":
            return iface.throughput_override * 100  # kbit/s
        return iface.hop_penalty

    async def cmd_hardif_set(self, args, writer):
        iface, setting = self._hardif(args)
        try:
            value = int(args.get("value"))
        except (TypeError, ValueError):
            raise CommandError(f"{setting}: expected a number") from None
        if value < 0 or (setting == "hop_penalty" and value > 255):
            raise CommandError(f"{setting}: out of range")
        if setting == "elp_interval":
            iface.elp_interval_ms = max(value, 1)
        elif setting == "throughput_override":
            iface.throughput_override = value // 100
        else:
            iface.hop_penalty = value
        log.info("%s: %s set to %s", iface.name, setting, value)
        return await self.cmd_hardif_get(args, writer)

    # --- settings ---------------------------------------------------------------------------

    async def cmd_get(self, args, writer):
        name = args.get("setting")
        if name not in SETTINGS:
            raise CommandError(f"unknown setting {name!r}")
        field, kind = SETTINGS[name]
        value = getattr(self.service.mesh.config, field)
        return int(value) if kind is bool else value

    async def cmd_set(self, args, writer):
        name, value = args.get("setting"), args.get("value")
        if name not in SETTINGS:
            raise CommandError(f"unknown setting {name!r}")
        field, kind = SETTINGS[name]
        if kind is bool:
            if str(value).lower() not in ("0", "1", "enable", "disable", "enabled", "disabled", "true", "false"):
                raise CommandError(f"{name}: expected 0 or 1")
            value = str(value).lower() in ("1", "enable", "enabled", "true")
        elif kind is int:
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise CommandError(f"{name}: expected a number") from None
            if name == "hop_penalty" and not 0 <= value <= 255:
                raise CommandError("hop_penalty: 0..255")
            if name == "orig_interval" and not 40 <= value <= 2 ** 31:
                raise CommandError("orig_interval: at least 40 ms")
        else:
            levels = str(value).split()
            if any(level not in LOGLEVELS for level in levels):
                raise CommandError(f"loglevel: choose from {' '.join(LOGLEVELS)}")
            value = " ".join(levels)
        setattr(self.service.mesh.config, field, value)
        log.info("setting %s changed to %s", name, value)
        return await self.cmd_get({"setting": name}, writer)

    # --- interfaces ---------------------------------------------------------------------------

    async def cmd_if_add(self, args, writer):
        try:
            self.service.add_interface(str(args.get("ifname")))
            self.service.wanted.add(str(args.get("ifname")))
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        return await self.cmd_interfaces(args, writer)

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
        mesh = self.service.mesh
        if mesh.is_my_mac(target) or mesh.originators.get(target) is not None:
            return {"orig_address": str(target)}
        for vid in [0] + sorted({k[1] for k in mesh.tt.global_ if k[0] == target}):
            best = mesh.tt.best_orig(target, vid)
            if best is not None:
                return {"orig_address": str(best)}
        if mesh.tt.is_my_client(target, 0) and mesh.primary is not None:
            return {"orig_address": str(mesh.primary.mac)}
        raise CommandError(f"no originator known for {target}")

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
        session = PingSession(dst=dst, uid=self.service.new_uid(), count=int(args.get("count") or 5),
                              interval=float(args.get("interval") or 1.0), timeout=float(args.get("timeout") or 1.0))
        ttl = int(args.get("ttl") or 50)
        record_route = bool(args.get("record_route"))

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
        session = TracerouteSession(dst=dst, uid=self.service.new_uid(), timeout=float(args.get("timeout") or 1.0))
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
