"""A bookie that filled its disk starts again by itself and serves every entry it
acknowledged (issue B4), on the simulated disk (a real filesystem: tests/faults/
test_bookie_full_filesystem.py).

The bookie's own dead copies are what a replay needs room for: logs the index does not
name and the tail of the log that was current at the last checkpoint hold only what the
journal holds too. They go before replay, and a reserved file, set aside at every start,
is released first, so that the replay and its checkpoint find room."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from support import run_virtual

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, ReadRequest, Response
from quorumlog.testing.raw_client import make_entry, master_key
from quorumlog.testing.sim.disk import SimDisk
from quorumlog.testing.sim.loop import SimExecutor

KEY = master_key(b"pw")
ENTRY_BYTES = 64 * 1024


class Node:
    """A real Bookie on a SimDisk, its threads as SimExecutor jobs (virtual time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, disk: SimDisk, **config: Any) -> None:
        self.loop = loop
        self.disk = disk
        self.config = BookieConfig(
            data_dir=Path("/b/data"),
            journal_dir=Path("/b/journal"),
            checkpoint_interval_ms=100,
            disk_check_interval_ms=600_000,
            **config,
        )
        self.bookie: Bookie | None = None
        self.executors: list[SimExecutor] = []

    def _worker(self, name: str) -> SimExecutor:
        executor = SimExecutor(self.loop, random.Random(len(self.executors)), (0.1, 1.0), name)
        self.executors.append(executor)
        return executor

    async def start(self) -> Bookie:
        self.executors = []
        self.bookie = Bookie.open(self.config, files=self.disk.files(), workers=self._worker)
        await self.bookie.start(self.loop)
        return self.bookie

    def crash(self) -> None:
        """kill -9: the process and its threads go, the page cache stays."""
        for executor in self.executors:
            executor.kill()
        assert self.bookie is not None
        self.bookie._timers.stop()
        self.disk.crash()
        self.bookie = None

    async def call(self, request: object) -> Response:
        future: asyncio.Future[Response] = self.loop.create_future()
        assert self.bookie is not None
        self.bookie.submit(request, future.set_result)  # type: ignore[arg-type]
        return await asyncio.wait_for(future, 10)


def _entry(entry_id: int) -> bytes:
    return make_entry(1, entry_id, bytes([entry_id % 251]) * ENTRY_BYTES, lac=entry_id - 1)


def test_b4_a_bookie_that_filled_its_disk_starts_again_and_serves_what_it_acknowledged() -> None:
    async def body(loop: asyncio.AbstractEventLoop) -> None:
        disk = SimDisk(random.Random(3))
        disk.capacity_bytes = 40 << 20
        # Usage thresholds of 1.0: nothing stops the adds before the disk is full (as
        # adds faster than the disk checks can be).
        node = Node(
            loop,
            disk,
            disk_usage_threshold=1.0,
            disk_usage_lwm_threshold=1.0,
            entry_log_max_bytes=4 << 20,
            entry_log_write_buffer_bytes=256 * 1024,
        )
        await node.start()
        acknowledged: list[bytes] = []
        for entry_id in range(1000):
            answer = await node.call(AddRequest(0, 1, KEY, [_entry(entry_id)]))
            if answer.status != Status.OK:
                break
            acknowledged.append(_entry(entry_id))
        assert 100 < len(acknowledged) < 1000
        await asyncio.sleep(1.0)  # checkpoints try (and fail) meanwhile
        node.crash()
        bookie = await node.start()  # was: BookieStartError ... failed again: [Errno 28]
        for entry_id, blob in enumerate(acknowledged):
            read = await node.call(ReadRequest(0, 1, entry_id, 1))
            assert read.status == Status.OK and read.entries == [blob], entry_id
        # The replayed entries are in ledger storage and the journal before them is gone:
        # the disk has room again.
        assert bookie.checkpoints_done >= 1
        node.crash()
        await node.start()
        read = await node.call(ReadRequest(0, 1, len(acknowledged) - 1, 1))
        assert read.status == Status.OK

    run_virtual(body)
