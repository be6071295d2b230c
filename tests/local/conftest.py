"""Helpers for the bookie tests on real files: a bookie driven through ``submit`` on an
asyncio loop, with real files under ``tmp_path`` and no sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.config import BookieConfig
from quorumlog.proto.codec import Request, Response


class Driver:
    """A bookie on the running loop, and ways to talk to it."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.bookie: Bookie | None = None
        # Broken invariants the bookie reported: it stops serving instead of ending the
        # test process.
        self.broken: list[str] = []

    async def start(self) -> Bookie:
        self.bookie = Bookie.open(self.config, on_broken_invariant=self.broken.append)
        await self.bookie.start(asyncio.get_running_loop())
        return self.bookie

    def send(self, request: Request) -> asyncio.Future[Response]:
        """Submit; the future completes with the answer (a second answer fails the test)."""
        assert self.bookie is not None
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        def respond(response: Response) -> None:
            assert not future.done(), f"answered twice: {future.result()} then {response}"
            future.set_result(response)

        self.bookie.submit(request, respond)
        return future

    async def call(self, request: Request, timeout_s: float = 5) -> Any:
        return await asyncio.wait_for(self.send(request), timeout_s)

    async def close(self) -> None:
        if self.bookie is not None and self.broken:
            await self.crash()  # a halted bookie writes nothing more, not even a checkpoint
        if self.bookie is not None:
            await self.bookie.close()
            self.bookie = None

    async def restart(self) -> Bookie:
        await self.close()
        return await self.start()

    async def crash(self) -> None:
        """Leave the files as a kill -9 would: the journal as synced, entry logs as far as
        written (the write buffer is lost), the index as of the last checkpoint."""
        bookie = self.bookie
        assert bookie is not None
        bookie._closing = True
        for timer in bookie._timers:
            timer.cancel()
        await bookie._journal.close()  # everything acknowledged was synced anyway
        if bookie._checkpoint_running is not None:
            with contextlib.suppress(Exception):
                await bookie._checkpoint_running
        if bookie._executor is not None:
            bookie._executor.shutdown(wait=True)  # entry-log writes already handed over
        storage = bookie.storage
        logs = storage.entry_log
        for fds in (logs._fds, logs._direct_fds, logs._read_fds):
            for fd in fds.values():
                os.close(fd)  # no flush: buffered entry-log bytes vanish
            fds.clear()
        storage.index.close()
        bookie._release_locks()
        bookie._closed = True
        self.bookie = None


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., BookieConfig]:
    """``make_config(**overrides)``: a config under tmp_path; checkpoints only when asked."""

    def make(**overrides: Any) -> BookieConfig:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "checkpoint_interval_ms": 600_000,
            "disk_check_interval_ms": 600_000,
        }
        values.update(overrides)
        return BookieConfig(**values)

    return make


@pytest.fixture
def driver(make_config: Callable[..., BookieConfig]) -> Driver:
    """A driver for a bookie with the default test config (not started)."""
    return Driver(make_config())


@pytest.fixture
def make_driver(make_config: Callable[..., BookieConfig]) -> Callable[..., Driver]:
    """``make_driver(**config_overrides)``."""
    return lambda **overrides: Driver(make_config(**overrides))
