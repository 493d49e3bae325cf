"""The nl80211 station dump (B.A.T.M.A.N. V's Wi-Fi link estimate) never stalls the event
loop: a driver that takes seconds to answer delays only its own answer, not the OGM and
ELP timers. (This machine has no cfg80211: the slow driver is a stand-in for the dump.)"""

import asyncio
import time

import uvloop

from batmand.daemon import wifi


def test_a_slow_station_dump_does_not_stall_the_event_loop(monkeypatch):
    def slow_dump(ifindex):
        time.sleep(1.0)
        return {"ifindex": ifindex}

    monkeypatch.setattr(wifi, "_stations", slow_dump)

    async def main():
        loop = asyncio.get_running_loop()
        ticks = []

        def tick():  # a 10 ms timer, like the daemon's OGM/ELP deadlines
            ticks.append(time.monotonic())
            handle[0] = loop.call_later(0.01, tick)

        handle = [loop.call_soon(tick)]
        result = await wifi.query_stations(loop, 7)
        handle[0].cancel()
        return result, ticks

    result, ticks = uvloop.run(main())
    assert result == {"ifindex": 7}
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert len(ticks) > 50 and max(gaps) < 0.2, max(gaps)


def test_a_failing_station_dump_is_an_empty_answer(monkeypatch):
    def broken(ifindex):
        raise OSError("no nl80211")

    monkeypatch.setattr(wifi, "_stations", broken)

    async def main():
        return await wifi.query_stations(asyncio.get_running_loop(), 3)

    assert uvloop.run(main()) == {}
