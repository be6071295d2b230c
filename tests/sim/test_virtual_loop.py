"""The simulator's clock: timers run at their own time, never before it."""

from __future__ import annotations

import asyncio

from quorumlog.testing.sim import VirtualTimeLoop


def test_a_waiter_whose_deadline_is_one_float_step_ahead_reaches_it() -> None:
    # Found by seed 278: a log reader's deadline lay one float step past the clock, its
    # wait for the difference ran within the clock's resolution without moving the
    # clock, and read_next turned a million times (a minute of CPU) at one instant.
    now_s = 0.05825509827951521
    deadline_s = 0.058255098279515215
    assert now_s < deadline_s
    loop = VirtualTimeLoop()
    loop.advance(now_s)

    async def wait_until_deadline() -> int:
        # Another task always ready (as the cluster's many are): the loop never sleeps,
        # so only a timer's own time can move the clock.
        busy = asyncio.ensure_future(yield_many_times())
        turns = 0
        while loop.time() < deadline_s:
            turns += 1
            if turns > 10:
                break
            await asyncio.sleep(deadline_s - loop.time())
        busy.cancel()
        return turns

    async def yield_many_times() -> None:
        for _ in range(1000):
            await asyncio.sleep(0)

    try:
        turns = loop.run_until_complete(wait_until_deadline())
    finally:
        loop.close()
    assert loop.time() >= deadline_s, f"the clock stayed at {loop.time()!r} after {turns} waits"
    assert turns == 1


def test_timers_within_the_clock_resolution_still_run_in_their_order() -> None:
    loop = VirtualTimeLoop()
    order: list[str] = []
    loop.call_at(1.0 + 3e-10, order.append, "third")
    loop.call_at(1.0, order.append, "first")
    loop.call_at(1.0 + 1e-10, order.append, "second")
    loop.call_at(2.0, loop.stop)
    try:
        loop.run_forever()
    finally:
        loop.close()
    assert order == ["first", "second", "third"]
    assert loop.time() == 2.0
