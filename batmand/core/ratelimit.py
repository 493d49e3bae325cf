"""A fixed-window rate limit for what a peer or a host can make us do (replies, log lines)."""

from __future__ import annotations


class RateLimit:
    """At most `burst` events per window of `period` seconds (a window starts with the
    first event after the previous one ended). The burst is given at each call, so that a
    limit read from the live configuration applies at once."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.window_start, self.count = float("-inf"), 0

    def allow(self, now: float, burst: int) -> bool:
        if now - self.window_start >= self.period:
            self.window_start, self.count = now, 0
        if self.count >= burst:
            return False
        self.count += 1
        return True
