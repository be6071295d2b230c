"""Checkpoints: ledger storage made durable, so the journal before the mark can go.

Every ``checkpoint_interval_ms``, after garbage collection, on demand and on close.
The loop captures the work (journal mark, index updates, changed states); the
worker thread syncs the entry logs and commits the index with the mark; the loop
then forgets what the index now holds. A failed checkpoint puts its work back and
keeps the journal, so nothing acknowledged depends on it (docs/STORAGE.md).
One runs at a time. A checkpoint that fails, or cannot even start, never stops the
timer: the next one tries again (after a failed sync none will pass, R14).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable

from quorumlog.bookie.journal.writer import Journal
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.bookie.timers import Timers

__all__ = ["Checkpoints"]

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoints of one bookie (event loop only)."""

    def __init__(
        self,
        storage: LedgerStorage,
        journal: Journal,
        timers: Timers,
        interval_ms: float,
        done: int,
        after: Callable[[], None] | None = None,
    ) -> None:
        """``after()`` runs on the loop after each checkpoint, failed or not."""
        self.running: asyncio.Future[None] | None = None
        self.done = done  # checkpoints completed, the one at open included
        self._storage = storage
        self._journal = journal
        self._timers = timers
        self._interval_ms = interval_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.Executor | None = None
        self._after = after
        self._timer_pending = False  # one timer at a time, whoever starts a checkpoint

    def start(self, loop: asyncio.AbstractEventLoop, executor: concurrent.futures.Executor) -> None:
        """Commit on ``executor`` from now on, every ``interval_ms``."""
        self._loop = loop
        self._executor = executor
        self._schedule()

    def _schedule(self) -> None:
        if not self._timer_pending and not self._timers.stopped:
            self._timer_pending = True
            self._timers.schedule(self._interval_ms, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer_pending = False
        self.tick()

    def tick(self) -> None:
        """Start one unless one is running (the timer, or garbage collection)."""
        if self._timers.stopped:
            return
        if self.running is None:
            try:
                self._start()
            except Exception:
                log.exception("bookie %s: a checkpoint could not start", self._storage.data_dir)
                self._schedule()  # the next one tries again

    def _start(self) -> asyncio.Future[None]:
        assert self._loop is not None and self._executor is not None
        assert self.running is None, "one checkpoint at a time"
        storage = self._storage
        work = storage.capture(self._journal.mark, self._journal.directory)
        future = self._loop.run_in_executor(self._executor, storage.commit, work)
        done: asyncio.Future[None] = self._loop.create_future()
        self.running = done

        def finished(f: asyncio.Future[None]) -> None:
            try:
                error = f.exception() if not f.cancelled() else asyncio.CancelledError()
                ok = error is None
                storage.finish(work, ok, error)
                if ok:
                    self.done += 1
                else:
                    log.error("bookie %s: checkpoint failed: %s", self._storage.data_dir, error)
                if self._after is not None:
                    self._after()
            except Exception:
                log.exception("bookie %s: finishing a checkpoint failed", self._storage.data_dir)
            finally:
                self.running = None
                if not done.done():
                    done.set_result(None)
                self._schedule()

        future.add_done_callback(finished)
        return done

    async def now(self) -> None:
        """Run a checkpoint now (after any running one) and wait for it."""
        # Another may start in the turn the running one ends (the timer, garbage
        # collection), before this wakes: wait until none runs.
        while self.running is not None:
            await self.running
        await self._start()

    async def last(self) -> None:
        """The checkpoint of a close: after the running one, with the journal closed."""
        while self.running is not None:
            with contextlib.suppress(Exception):
                await self.running
        storage = self._storage
        work = storage.capture(self._journal.mark, self._journal.directory)
        ok = False
        try:
            if self._loop is not None and self._executor is not None:
                await self._loop.run_in_executor(self._executor, storage.commit, work)
            else:
                storage.commit(work)
            ok = True
            self.done += 1
        except Exception as exc:
            # Nothing is lost: the journal stays and the next start replays it. The
            # close goes on, so that the files and locks are released.
            log.error(
                "bookie %s: the checkpoint of the close failed (%s); the journal is kept "
                "and the next start replays it",
                storage.data_dir,
                exc,
            )
        finally:
            storage.finish(work, ok)
