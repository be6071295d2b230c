"""A bookie's storage and request logic, independent of sockets.

The server (``quorumlog.server``) decodes frames and calls :meth:`Bookie.submit`
for each request on its event loop; the bookie answers through the ``respond``
callback, also on that loop, possibly later (an add is answered only once its
journal batch is durable, R2; a long poll when the LAC moves or it times out).

Example::

    bookie = Bookie.open(BookieConfig(data_dir=Path("/var/lib/bookie")))
    await bookie.start(asyncio.get_running_loop())
    bookie.submit(AddRequest(1, ledger_id, key, [blob]), print)  # AddResponse(status=OK) later
    await bookie.close()

:class:`Bookie` builds its parts and runs their start and close in order; each
part has one job:

- :mod:`.opening`: directory locks, ledger storage, journal replay;
- :mod:`.requests`: dispatch, adds (R2, R7, R10, R12), journal completions;
- :mod:`.ledger_changes`: fence (R7), explicit LAC, delete (its tombstone);
- :mod:`.reads`: reads (R4, R9), long polls, read-LAC;
- :mod:`.checkpoints`: ledger storage made durable so journal files can go;
- :mod:`.maintenance`: read-only mode (disk usage, journal failure), garbage collection;
- :mod:`.compaction`: entry logs holding mostly dead data rewritten (minor and major);
- :mod:`.timers`: the timed jobs, stopped first on close;
- :mod:`.invariants`: a broken invariant stops the bookie at once (by default the process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from quorumlog.bookie.checkpoints import Checkpoints
from quorumlog.bookie.compaction import CompactionResult, CompactionSettings, Compactor
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.disk_checker import DiskChecker
from quorumlog.bookie.errors import BookieStartError
from quorumlog.bookie.fileops import REAL_FILES, FileOps
from quorumlog.bookie.invariants import Halt
from quorumlog.bookie.journal.replay import ScanReport
from quorumlog.bookie.journal.writer import Journal
from quorumlog.bookie.ledger_changes import LedgerChanges
from quorumlog.bookie.ledger_state import LedgerState
from quorumlog.bookie.long_poll import LongPolls
from quorumlog.bookie.maintenance import ReadOnlyListener, ReadOnlyMode, drop_dead_ledgers
from quorumlog.bookie.opening import DirectoryLocks, open_storage
from quorumlog.bookie.reads import Reads, Respond
from quorumlog.bookie.requests import Requests
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.bookie.timers import Timers
from quorumlog.proto.codec import Request

__all__ = ["Bookie", "BookieStartError", "Respond"]

log = logging.getLogger(__name__)

Workers = Callable[[str], concurrent.futures.Executor]
"""``workers(name)``: a new single-worker executor ("journal", "checkpoint")."""


class Bookie:
    """Journal + ledger storage + per-ledger state (fence, master key, LACs).

    Use :meth:`open` (it replays the journal), then :meth:`start` on the event
    loop, then :meth:`submit` from that loop only.
    """

    submit: Callable[[Request, Respond], None]
    """``submit(request, respond)``: handle one request; ``respond`` is called exactly
    once, on the loop. It is the request handler's own method, so that a request costs
    no extra call on its way in."""

    storage: LedgerStorage

    def __init__(
        self,
        config: BookieConfig,
        *,
        files: FileOps = REAL_FILES,
        workers: Workers | None = None,
        on_broken_invariant: Callable[[str], None] | None = None,
    ) -> None:
        """Open the directories and replay the journal (what :meth:`open` does)."""
        problems = config.problems()
        if problems:
            raise BookieStartError(f"bookie {config.data_dir}: " + "; ".join(problems))
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.journal_dir = Path(config.journal_path)
        self.replay_report = ScanReport()
        self._locks = DirectoryLocks(files)
        self._closed = False
        self._workers = workers
        self._executor: concurrent.futures.Executor | None = None
        try:
            opened = open_storage(
                config, self.data_dir, self.journal_dir, self._locks, self.replay_report, files
            )
        except BaseException:
            self._locks.release()
            raise
        self.storage = storage = opened.storage
        self._journal: Journal = opened.journal
        self._disk_checker: DiskChecker = opened.disk_checker
        self._timers = timers = Timers()
        self.halt = Halt(self.data_dir, on_broken_invariant)
        self.halt.on_halt(timers.stop)  # no checkpoint may write a state that cannot be
        self._mode = ReadOnlyMode(
            opened.disk_checker, timers, config.disk_check_interval_ms, self.data_dir
        )
        self._polls = LongPolls(config.long_poll_max_per_ledger, config.long_poll_max_total)
        self._reads = Reads(config, storage, self._polls, self.halt)
        changes = LedgerChanges(storage, self._journal, self._reads, self._mode, self.halt)
        self._requests = Requests(
            config,
            storage,
            self._journal,
            self._polls,
            self._reads,
            changes,
            self._mode,
            self.halt,
        )
        self.submit = self._requests.submit
        self._checkpoints = Checkpoints(
            storage,
            self._journal,
            timers,
            config.checkpoint_interval_ms,
            done=1,  # open_storage ends with one
            after=lambda: self._mode.storage_checked(storage),
        )
        # A failed entry-log write refuses adds at once, not at the next checkpoint.
        storage.entry_log.on_write_error = lambda _error: self._mode.storage_checked(storage)
        # Free space is measured at every new entry log too, not only on the timer.
        storage.entry_log.on_rotate = self._mode.check_disks
        self.compactor = Compactor(
            storage,
            CompactionSettings(
                minor_threshold=config.minor_compaction_threshold,
                minor_interval_s=config.minor_compaction_interval_ms / 1000,
                major_threshold=config.major_compaction_threshold,
                major_interval_s=config.major_compaction_interval_ms / 1000,
                rate_bytes_per_s=config.compaction_rate_bytes_per_s,
                rate_entries_per_s=config.compaction_rate_entries_per_s,
            ),
            self._compaction_checkpoint,
            stopped=lambda: timers.stopped,
        )
        self._compaction: asyncio.Task[CompactionResult] | None = None
        self._compaction_suspended = False
        self.gc_round: Callable[[], Awaitable[int]] | None = None
        """Set by the server: one garbage-collection round against the metadata store
        (R15), which :meth:`force_gc` runs before compacting."""

    @classmethod
    def open(
        cls,
        config: BookieConfig,
        *,
        files: FileOps = REAL_FILES,
        workers: Workers | None = None,
        on_broken_invariant: Callable[[str], None] | None = None,
    ) -> Bookie:
        """Check directories, replay the journal into ledger storage, and return the bookie.

        Raises BookieStartError with a clear message on a damaged journal (unless
        ``journal_skip_corruption``) or unusable directories.

        ``files`` makes every system call on the bookie's files (a simulated disk, or
        a test's faults); ``workers(name)`` makes the executors that stand for the
        journal's and the checkpoints' threads (a simulation's deterministic
        scheduler). The defaults are the real ones.

        ``on_broken_invariant(message)`` is what :attr:`halt` does after logging a broken
        invariant; the default ends the process (:mod:`.invariants`).
        """
        return cls(config, files=files, workers=workers, on_broken_invariant=on_broken_invariant)

    # ------------------------------------------------------------ life cycle

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the journal thread, checkpoints and the disk checker on ``loop``."""
        config = self.config
        self._timers.loop = loop
        self._polls.loop = loop
        journal_executor = None
        executor: concurrent.futures.Executor
        if self._workers is None:
            self._executor = executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="bookie-checkpoint"
            )
        else:
            self._executor = executor = self._workers("checkpoint")
            journal_executor = self._workers("journal")
        if not config.journal_sync:
            log.warning(
                "bookie %s: JOURNAL SYNC IS OFF: adds are acknowledged before they are "
                "durable; a crash or power loss can lose acknowledged entries",
                self.data_dir,
            )
        self._journal.start(loop, self._requests.on_journal_batch, journal_executor)

        def write_chunk(fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
            return loop.run_in_executor(executor, fn, *args)

        # Entry-log writes share the checkpoint's thread, so a checkpoint's sync
        # follows every write queued before it.
        self.storage.entry_log.writer = write_chunk
        self._checkpoints.start(loop, executor)
        self._mode.start()
        self.compactor.last_minor = self.compactor.last_major = loop.time()
        self._schedule_compaction()
        if self._mode.read_only:
            log.warning("bookie %s starts read-only (disk usage)", self.data_dir)
        self._requests.serving = True

    async def close(self) -> None:
        """Stop accepting work, answer what is queued, checkpoint, release files."""
        if self._closed or self._timers.stopped:
            return
        self._timers.stop()  # the bookie is closing: no timed job starts from now on
        self._requests.serving = False
        if self._compaction is not None and not self._compaction.done():
            # Safe at any of its waits: copies are ordinary recent adds, and the old
            # logs stay until a checkpoint has moved the index off them.
            self._compaction.cancel()
            await asyncio.wait({self._compaction})
        try:
            self._reads.answer_all()
            # Adds held back by the journal's queue bound are journaled now.
            self._requests.journal_deferred()
            await self._journal.close()
            await self._checkpoints.last()
            if self.storage.failed_checkpoints == 0:
                # Nothing is left to replay: the next start needs no room for it.
                self._release_reserve()
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            try:
                self.storage.close()
            finally:
                self._locks.release()

    # The local tests' crash simulation stops a bookie through these without closing
    # its files (tests/local/conftest.py).

    @property
    def _closing(self) -> bool:
        return self._timers.stopped

    @_closing.setter
    def _closing(self, closing: bool) -> None:
        self._timers.stopped = closing

    @property
    def _checkpoint_running(self) -> asyncio.Future[None] | None:
        return self._checkpoints.running

    def _release_locks(self) -> None:
        self._locks.release()

    def _release_reserve(self) -> None:
        reserve = self._disk_checker.reserve
        if reserve is not None:
            try:
                reserve.release()
            except OSError as exc:
                log.warning("bookie %s: releasing the reserved space: %s", self.data_dir, exc)

    # ------------------------------------------------------------ read-only mode

    @property
    def read_only(self) -> bool:
        """True while adds are refused (disk full, the journal or ledger storage failed)."""
        return self._mode.read_only

    @property
    def read_only_reason(self) -> str | None:
        """Why adds are refused, in words; None while they are not."""
        return self._mode.reason

    def add_read_only_listener(self, listener: ReadOnlyListener) -> None:
        """``listener(read_only)`` is called on the loop whenever :attr:`read_only` changes."""
        self._mode.add_listener(listener)

    def set_read_only(self, read_only: bool) -> None:
        """Refuse adds (True) or take them again (False) at an operator's request; the
        bookie stays read-only while another reason holds (:attr:`read_only_reason`)."""
        self._mode.set_operator(read_only)

    # ------------------------------------------------------------ ledgers, GC

    def ledger_ids(self) -> set[int]:
        """Ledgers this bookie holds data or state for."""
        return self.storage.ledger_ids()

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int:
        """Drop ledgers in ``snapshot`` that are not live; returns how many were dropped.

        Their index entries and state go at the next checkpoint (started now), and
        with them every entry log that holds no other ledger. Tombstones of deleted
        ledgers stay.
        """
        dropped = drop_dead_ledgers(self.storage, self._reads, live_ledger_ids, snapshot)
        if dropped:
            self._timers.call_soon(self._checkpoints.tick)
        return dropped

    # ------------------------------------------------------------ compaction

    def _schedule_compaction(self) -> None:
        c = self.config
        intervals = [
            ms
            for ms, threshold in (
                (c.minor_compaction_interval_ms, c.minor_compaction_threshold),
                (c.major_compaction_interval_ms, c.major_compaction_threshold),
            )
            if ms > 0 and threshold > 0
        ]
        if intervals and not self._timers.stopped:
            self._timers.schedule(min(intervals), self._compaction_tick)

    def _compaction_tick(self) -> None:
        if self._timers.stopped:
            return
        assert self._timers.loop is not None
        major = self.compactor.due(self._timers.loop.time())
        if major is not None and (self._compaction is None or self._compaction.done()):
            room: int | None = None
            if self._disk_checker.full and not self.config.compaction_allowed_when_disk_full:
                # Compaction is what gives a full disk its space back: it goes on, one log
                # at a time, within the room left beyond the reserved space.
                room = self._room_bytes()
                if room <= 0:
                    if not self._compaction_suspended:  # said once per full spell
                        log.warning(
                            "bookie %s: compaction suspended: the disk is full and has no "
                            "room beyond its reserved space",
                            self.data_dir,
                        )
                    self._compaction_suspended = True
                    major = None
            if major is not None:
                self._compaction_suspended = False
                self._compaction = self._timers.loop.create_task(self._compact(major, room))
        self._schedule_compaction()

    def _room_bytes(self) -> int:
        """Free bytes of the fullest disk beyond the reserved space: what compaction may
        write ahead of the space it gives back while the disk is full."""
        free = min((u.free_bytes for u in self._disk_checker.last), default=0)
        return free - max(self.config.reserved_space_bytes, 0)

    async def _compact(self, major: bool, room_bytes: int | None = None) -> CompactionResult:
        try:
            return await self.compactor.run(major, room_bytes)
        except OSError as exc:
            # A file could not be made (a new entry log): nothing was released, so the
            # old logs and the index stand; the next run tries again.
            log.error("bookie %s: compaction stopped: %s", self.data_dir, exc)
            return CompactionResult(skipped=[f"compaction stopped: {exc}"])
        except Exception as exc:
            self.halt("compaction", exc)
            raise

    async def _compaction_checkpoint(self) -> None:
        if self._timers.stopped:
            return  # the close's own checkpoint commits what was copied
        # Shielded: a cancelled compaction must not cancel a checkpoint others wait on.
        await asyncio.shield(self._checkpoints.now())

    async def force_gc(self, major: bool = True) -> CompactionResult:
        """Garbage collection now, then a major (or minor) compaction, and wait for both.

        What ``quorumlog shell gc`` and the admin API's ``/api/v1/bookie/gc`` run. A
        collection round that proves nothing (R15) or cannot reach the store drops no
        ledger; compaction of what is already known dead goes on regardless, and the
        result says why in ``skipped``.
        """
        result_skipped: list[str] = []
        if self.gc_round is not None:
            try:
                await self.gc_round()
            except Exception as exc:
                result_skipped.append(f"garbage collection: {exc}")
        if self._compaction is not None and not self._compaction.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._compaction)
        assert self._timers.loop is not None
        self._compaction = self._timers.loop.create_task(self._compact(major))
        result = await asyncio.shield(self._compaction)
        result.skipped[:0] = result_skipped
        return result

    # ------------------------------------------------------------ checkpoints

    @property
    def checkpoints_done(self) -> int:
        """Checkpoints completed since open (the one at the end of open included)."""
        return self._checkpoints.done

    async def checkpoint(self) -> None:
        """Run a checkpoint now (after any running one) and wait for it."""
        await self._checkpoints.now()

    # ------------------------------------------------------------ introspection

    def stats(self) -> dict[str, int]:
        """Counters for benchmarks and tests."""
        journal = self._journal
        return {
            "journal_syncs": journal.sync_count,
            "journal_batches": journal.batch_count,
            "journal_records": journal.records_written,
            "journal_queued_bytes": journal.queued_bytes,
            "checkpoints": self._checkpoints.done,
            "ledgers": len(self.storage.states),
            "deferred_adds": self._requests.deferred_adds,
            "parked_polls": self._polls.total,
            "read_cache_bytes": self.storage.read_cache.size_bytes,
        }

    def state(self, ledger_id: int) -> LedgerState | None:
        """The in-memory state of a ledger (tests and tools; do not modify)."""
        return self.storage.states.get(ledger_id)

    @property
    def journal(self) -> Journal:
        return self._journal

    def __repr__(self) -> str:
        return f"<Bookie {self.data_dir} read_only={self._mode.read_only}>"
