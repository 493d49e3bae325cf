"""The mesh interface's uevents (the kernel's batadv_throw_uevent) and the results of our
throughput-meter tests (the kernel's `tpmeter` netlink notifications): each goes to the
`batmanctl event` streams listening on the control socket and, when `event_hook` is set,
to that command, run with the environment a hotplug script gets from the kernel's uevent
(BATTYPE, BATACTION, BATDATA unless the action is del, plus INTERFACE and ACTION=change);
tp results are no uevents and run no hook.

Hooks run one at a time, in order; a slow or hanging hook is killed after HOOK_TIMEOUT
and never holds up the daemon. Events wait in bounded queues: a listener or a hook that
falls behind loses the oldest ones (counted and logged), never the daemon's memory."""

from __future__ import annotations

import asyncio
import logging
import os
import time

from batmand.core.events import TpResult, Uevent

log = logging.getLogger("batmand")

QUEUE_LIMIT = 64
HOOK_TIMEOUT = 30.0


def _put(queue: asyncio.Queue, item) -> bool:
    """Queue `item`, dropping the oldest when full; False when one was dropped."""
    dropped = False
    if queue.full():
        queue.get_nowait()
        dropped = True
    queue.put_nowait(item)
    return not dropped


class Events:
    def __init__(self, meshif: str, hook: str | None) -> None:
        self.meshif = meshif
        self.hook = hook
        self.listeners: set[asyncio.Queue] = set()
        self._hook_queue: asyncio.Queue = asyncio.Queue(QUEUE_LIMIT)
        self._hook_task: asyncio.Task | None = None
        self.lost = 0

    def record(self, event: Uevent) -> dict:
        return {"meshif": self.meshif, "type": event.type, "action": event.action, "data": event.data,
                "time": time.time()}

    def publish(self, event: Uevent) -> None:
        log.info("%s: uevent %s %s%s", self.meshif, event.type, event.action, f" {event.data}" if event.data else "")
        record = self.record(event)
        for queue in self.listeners:
            if not _put(queue, record):
                self.lost += 1
        if self.hook:
            if not _put(self._hook_queue, event):
                self.lost += 1
                log.warning("event_hook falls behind; the oldest waiting event was dropped")
            if self._hook_task is None or self._hook_task.done():
                self._hook_task = asyncio.get_running_loop().create_task(self._run_hooks())

    def notify(self, record: dict) -> None:
        """A netlink-style notification (settings changed, a throughput meter's result) for
        the `batmanctl event` streams only: the kernel sends these over generic netlink, not
        as uevents, so hooks do not see them."""
        record = {"meshif": self.meshif, "time": time.time(), **record}
        for queue in self.listeners:
            if not _put(queue, record):
                self.lost += 1

    def publish_tp(self, result: TpResult) -> None:
        """A test of ours ended: to the listeners (batctl event prints tp_meter COOKIE: ...)."""
        log.info("%s: tp_meter 0x%08x to %s: result %d, %d ms, %d bytes", self.meshif, result.cookie, result.dst,
                 result.result, result.test_time_ms, result.total_bytes)
        self.notify({"type": "tp_meter", "cookie": result.cookie, "result": result.result,
                     "test_time_ms": result.test_time_ms, "total_bytes": result.total_bytes, "dst": str(result.dst)})

    def listen(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(QUEUE_LIMIT)
        self.listeners.add(queue)
        return queue

    def unlisten(self, queue: asyncio.Queue) -> None:
        self.listeners.discard(queue)

    def environment(self, event: Uevent) -> dict:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "ACTION": "change",
               "INTERFACE": self.meshif, "BATTYPE": event.type, "BATACTION": event.action}
        if event.action != "del" and event.data is not None:  # the kernel leaves BATDATA out for del
            env["BATDATA"] = event.data
        return env

    async def _run_hooks(self) -> None:
        while not self._hook_queue.empty():
            event = self._hook_queue.get_nowait()
            try:
                proc = await asyncio.create_subprocess_exec(self.hook, env=self.environment(event),
                                                            stdin=asyncio.subprocess.DEVNULL,
                                                            stdout=asyncio.subprocess.DEVNULL)  # stderr: the journal
            except OSError as exc:
                log.warning("event_hook %s cannot run: %s", self.hook, exc.strerror or exc)
                continue
            try:
                await asyncio.wait_for(proc.wait(), HOOK_TIMEOUT)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
                log.warning("event_hook %s ran longer than %g s; killed", self.hook, HOOK_TIMEOUT)
                continue
            if proc.returncode:
                log.warning("event_hook %s exited with status %s", self.hook, proc.returncode)

    async def close(self) -> None:
        if self._hook_task is not None and not self._hook_task.done():
            self._hook_task.cancel()
