"""Autorecovery's loops stop when cancelled (a daemon whose session is lost cancels its
worker and auditor and waits for them, and so does its stop()).

A defect the simulator found (a run with autorecovery never ended): both loops
waited for their wake event with ``asyncio.wait_for``, which on Python 3.11 returns
normally when the event is set in the same loop turn as the task is cancelled,
dropping the cancellation; the loop then went round again, for ever. They wait with
``quorumlog.replication.waiting.wait_event`` now.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.replication.auditor import Auditor, AuditorConfig
from quorumlog.replication.worker import ReplicationWorker, WorkerConfig
from quorumlog.testing.memory_store import MemoryStore, MemoryTree


async def _stops_when_cancelled_as_woken(
    run: Callable[[], Awaitable[None]], wake: asyncio.Event
) -> bool:
    task = asyncio.ensure_future(run())
    await asyncio.sleep(0.02)  # it waits for its wake event now
    wake.set()  # an event arrives ...
    task.cancel()  # ... in the turn the daemon stops it
    done, _ = await asyncio.wait({task}, timeout=1.0)
    for _ in range(10):  # let the test end either way
        if task.done():
            break
        task.cancel()
        await asyncio.wait({task}, timeout=0.2)
    return bool(done)


def test_a_replication_worker_stops_when_cancelled_as_its_wake_event_is_set() -> None:
    async def main() -> bool:
        bk = BookKeeper(MemoryStore(MemoryTree()))
        worker = ReplicationWorker(bk, "worker", WorkerConfig(poll_interval_s=0.05))
        return await _stops_when_cancelled_as_woken(worker.run, worker._wake)

    assert asyncio.run(main())


def test_an_auditor_stops_when_cancelled_as_its_wake_event_is_set() -> None:
    async def main() -> bool:
        bk = BookKeeper(MemoryStore(MemoryTree()))
        auditor = Auditor(bk, "auditor", AuditorConfig(bookie_check_interval_s=0.05))
        return await _stops_when_cancelled_as_woken(auditor.run, auditor._wake)

    assert asyncio.run(main())
