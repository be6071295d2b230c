"""Checkpoints run one at a time (docs/STORAGE.md): the scheduler alone, with a storage
double that records overlapping commits."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

from quorumlog.bookie.checkpoints import Checkpoints
from quorumlog.bookie.timers import Timers


class OverlapRecordingStorage:
    data_dir = "/nowhere"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.commits = 0

    def capture(self, mark: object, directory: object) -> object:
        return object()

    def commit(self, work: object) -> None:
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(0.02)
        with self.lock:
            self.running -= 1
            self.commits += 1

    def finish(self, work: object, ok: bool) -> None:
        assert ok


class Journal:
    mark = (0, 0)
    directory = "/nowhere"


def test_b6_a_checkpoint_on_demand_never_overlaps_one_started_meanwhile():
    async def main() -> OverlapRecordingStorage:
        storage = OverlapRecordingStorage()
        timers = Timers()
        timers.loop = asyncio.get_running_loop()
        checkpoints = Checkpoints(storage, Journal(), timers, 3_600_000, 0)  # type: ignore[arg-type]
        with concurrent.futures.ThreadPoolExecutor(4) as executor:
            checkpoints.start(asyncio.get_running_loop(), executor)
            checkpoints.tick()  # the timer's checkpoint is running
            first = checkpoints.running
            assert first is not None
            # Garbage collection starts the next one in the turn the first one ends,
            # while now() is still waiting to wake up.
            first.add_done_callback(lambda _: checkpoints.tick())
            await checkpoints.now()
            while checkpoints.running is not None:
                await checkpoints.running
            timers.stop()
        return storage

    storage = asyncio.run(main())
    assert storage.commits == 3
    assert storage.most_at_once == 1
