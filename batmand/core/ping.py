"""State of our own `ping` and `traceroute` runs (what batctl keeps in its process):
which probes are out, which came back, round-trip times and the summary. Sans-I/O: the
caller sends the probes the session asks for and feeds back IcmpResult records."""

from __future__ import annotations

from dataclasses import dataclass, field

from batmand.wire import IcmpMsgType, Mac

from .config import INT_MAX, Range
from .events import IcmpResult

SEQNOS = 1 << 16  # the ICMP seqno field; batctl's counter wraps the same way (htons(++seq_counter))
# What a session may be asked for: batctl's -c is an int and its -i/-t whole seconds from 1
# (an int); we also take fractions of a second, down to a millisecond. TTL: the u8 field; 1
# is answered by the first hop (traceroute's first probe).
COUNT = Range(1, INT_MAX)
INTERVAL = Range(0.001, INT_MAX, "s", real=True)
TIMEOUT = Range(0.001, INT_MAX, "s", real=True)
TTL_RANGE = Range(1, 255)
SEQNO = Range(0, SEQNOS - 1)


@dataclass
class PingReply:
    seqno: int
    kind: str  # "reply", "unreachable", "ttl_exceeded", "timeout"
    rtt: float | None = None
    orig: Mac | None = None
    ttl: int | None = None
    rr: tuple = ()


_KINDS = {IcmpMsgType.ECHO_REPLY: "reply", IcmpMsgType.DESTINATION_UNREACHABLE: "unreachable",
          IcmpMsgType.TTL_EXCEEDED: "ttl_exceeded"}


@dataclass
class PingSession:
    """`count` probes to `dst`, `interval` apart, each waited for `timeout` seconds. Seqnos
    count from `first_seqno` (batctl's 1) and wrap at 16 bits."""

    dst: Mac
    uid: int
    count: int = 5
    interval: float = 1.0
    timeout: float = 1.0
    first_seqno: int = 1
    sent: dict[int, float] = field(default_factory=dict)  # seqno -> send time, still open
    results: list[PingReply] = field(default_factory=list)
    probes: int = 0  # sent so far
    next_send: float = 0.0

    def due(self, now: float) -> list[int]:
        """Seqnos to send now (at most one per call, paced by `interval`); expires old probes."""
        for seqno, at in list(self.sent.items()):
            if now - at >= self.timeout:
                self._timed_out(seqno)
        if self.probes >= self.count or now < self.next_send:
            return []
        seqno = (self.first_seqno + self.probes) % SEQNOS
        self.probes += 1
        self.next_send = now + self.interval
        if seqno in self.sent:  # 65536 probes later its reply can no longer be told apart
            self._timed_out(seqno)
        self.sent[seqno] = now
        return [seqno]

    def _timed_out(self, seqno: int) -> None:
        del self.sent[seqno]
        self.results.append(PingReply(seqno, "timeout"))

    def on_result(self, result: IcmpResult) -> PingReply | None:
        if result.uid != self.uid or result.seqno not in self.sent:
            return None
        started = self.sent.pop(result.seqno)
        reply = PingReply(result.seqno, _KINDS.get(result.msg_type, "unreachable"), result.now - started,
                          result.orig, result.ttl, result.rr)
        self.results.append(reply)
        return reply

    @property
    def finished(self) -> bool:
        return self.probes >= self.count and not self.sent

    @property
    def log(self) -> list[PingReply]:
        """Every outcome so far, in the order it happened."""
        return self.results

    def next_deadline(self) -> float:
        times = [at + self.timeout for at in self.sent.values()]
        if self.probes < self.count:
            times.append(self.next_send)
        return min(times, default=float("inf"))

    def summary(self) -> dict:
        rtts = [r.rtt * 1000 for r in self.results if r.kind == "reply"]
        transmitted = self.probes
        out = {"transmitted": transmitted, "received": len(rtts),
               "loss_percent": round(100 * (transmitted - len(rtts)) / transmitted) if transmitted else 0}
        if rtts:
            mean = sum(rtts) / len(rtts)
            mdev = (sum((x - mean) ** 2 for x in rtts) / len(rtts)) ** 0.5
            out.update(min=min(rtts), avg=mean, max=max(rtts), mdev=mdev)
        return out


@dataclass
class TracerouteSession:
    """batctl traceroute: 3 probes per TTL, 1..max_ttl, until the destination answers."""

    dst: Mac
    uid: int
    probes_per_hop: int = 3
    max_ttl: int = 50
    timeout: float = 1.0
    ttl: int = 1
    hops: list[list[PingReply]] = field(default_factory=list)
    _open: dict[int, tuple[float, int]] = field(default_factory=dict)  # seqno -> (sent, ttl)
    _next_seqno: int = 1
    done: bool = False
    log: list[PingReply] = field(default_factory=list)  # every outcome, in order

    @property
    def finished(self) -> bool:
        return self.done

    def due(self, now: float) -> list[tuple[int, int]]:
        """(seqno, ttl) probes to send now: the next hop's probes once the last ones ended."""
        for seqno, (at, ttl) in list(self._open.items()):
            if now - at >= self.timeout:
                del self._open[seqno]
                self._record(ttl, PingReply(seqno, "timeout"))
        if self.done or self._open or self.ttl > self.max_ttl:
            return []
        if len(self.hops) >= self.ttl:
            return []
        self.hops.append([])
        probes = []
        for _ in range(self.probes_per_hop):
            self._open[self._next_seqno] = (now, self.ttl)
            probes.append((self._next_seqno, self.ttl))
            self._next_seqno += 1
        return probes

    def _record(self, ttl: int, reply: PingReply) -> None:
        self.hops[ttl - 1].append(reply)
        self.log.append(reply)
        if len(self.hops[ttl - 1]) == self.probes_per_hop:
            if any(r.kind in ("reply", "unreachable") for r in self.hops[ttl - 1]):
                self.done = True
            self.ttl += 1
            if self.ttl > self.max_ttl:
                self.done = True

    def on_result(self, result: IcmpResult) -> PingReply | None:
        if result.uid != self.uid or result.seqno not in self._open:
            return None
        started, ttl = self._open.pop(result.seqno)
        reply = PingReply(result.seqno, _KINDS.get(result.msg_type, "unreachable"), result.now - started,
                          result.orig, result.ttl)
        self._record(ttl, reply)
        return reply

    def next_deadline(self) -> float:
        return min((at + self.timeout for at, _ in self._open.values()), default=float("inf"))
