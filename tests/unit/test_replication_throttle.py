"""Re-replication's copy rate (H3): pacing, a bounded burst after idle, no bound at 0."""

from __future__ import annotations

import pytest
from support import run

from quorumlog.replication.throttle import CopyThrottle


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_copies_are_paced_to_the_rate_on_average() -> None:
    time = FakeTime()
    throttle = CopyThrottle(1_000_000, burst_s=0.05, clock=time.clock, sleep=time.sleep)

    async def copy() -> None:
        for _ in range(100):
            await throttle.take(100_000)  # 10 MB in all at 1 MB/s

    run(copy())
    # Each chunk waits for the ones before it: the last starts after 99 chunks' time,
    # less the burst the idle throttle started with.
    assert time.now - 100.0 == pytest.approx(9.9 - 0.05)
    assert throttle.waited_s == pytest.approx(time.now - 100.0)


def test_idle_time_earns_at_most_the_burst() -> None:
    time = FakeTime()
    throttle = CopyThrottle(1_000, burst_s=0.5, clock=time.clock, sleep=time.sleep)

    async def copy() -> None:
        await throttle.take(500)  # the burst: no wait
        assert time.slept == []
        time.now += 3600.0  # an hour idle
        await throttle.take(500)  # half a second of credit, not an hour's: it starts now,
        await throttle.take(500)  # this one once that one's bytes had their time (now),
        assert time.slept == []
        await throttle.take(500)  # and this one half a second later

    run(copy())
    assert time.slept == [pytest.approx(0.5)]


def test_a_chunk_larger_than_the_burst_passes_and_the_next_one_waits_for_it() -> None:
    time = FakeTime()
    throttle = CopyThrottle(1_000, burst_s=0.0, clock=time.clock, sleep=time.sleep)

    async def copy() -> None:
        await throttle.take(5_000)
        await throttle.take(1)

    run(copy())
    assert time.slept == [pytest.approx(5.0)]


def test_a_rate_of_zero_never_waits_and_a_negative_one_is_refused() -> None:
    time = FakeTime()
    throttle = CopyThrottle(0, clock=time.clock, sleep=time.sleep)
    run(throttle.take(1 << 40))
    assert time.slept == []
    with pytest.raises(ValueError, match="-5 bytes/s"):
        CopyThrottle(-5)
