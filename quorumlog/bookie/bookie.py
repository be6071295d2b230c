"""A bookie's storage and request logic, independent of sockets.

The server (``quorumlog.server``) decodes frames and calls :meth:`Bookie.submit`
for each request on its event loop; the bookie answers through the ``respond``
callback, also on that loop, possibly later (an add is answered only once its
journal batch is durable, R2; a long poll when the LAC moves or it times out).
No task is created per request: the hot path is plain calls and one
thread-safe wake-up per journal batch.

Example::

    bookie = Bookie.open(BookieConfig(data_dir=Path("/var/lib/bookie")))
    await bookie.start(asyncio.get_running_loop())
    bookie.submit(AddRequest(1, ledger_id, key, [blob]), print)  # AddResponse(status=OK) later
    await bookie.close()

Rules enforced here: R2 (answer adds once durable), R7 (a fenced ledger refuses
normal adds; the fence is journaled and survives restarts), R9 (a damaged
record is an I/O error, never "no such entry"), R10 (a different master key is
refused and changes nothing), R12 (bad input changes nothing), and the
tombstone of a deleted ledger (an add after delete fails, BookKeeper #4462).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from quorumlog.bookie import journal as journal_mod
from quorumlog.bookie.config import BookieConfig
from quorumlog.bookie.cookie import check_directories
from quorumlog.bookie.disk_checker import DiskChecker, disk_usage
from quorumlog.bookie.errors import BookieStartError
from quorumlog.bookie.journal import (
    Journal,
    JournalCorruptionError,
    ScanReport,
    add_record,
    delete_record,
    fence_record,
    lac_record,
    list_journal_ids,
    master_key_record,
)
from quorumlog.bookie.ledger_state import LedgerState
from quorumlog.bookie.long_poll import LongPolls, Poll
from quorumlog.bookie.storage import LedgerStorage
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    DeleteLedgerRequest,
    FenceRequest,
    FenceResponse,
    Op,
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    StatusResponse,
    WriteLacRequest,
    error_response,
)
from quorumlog.proto.entry import ENTRY_HEADER_SIZE

__all__ = ["Bookie", "BookieStartError", "Respond"]

log = logging.getLogger(__name__)

Respond = Callable[[Response], None]
ReadOnlyListener = Callable[[bool], None]

_HEADER3 = struct.Struct(">qqq")  # ledger id, entry id, LAC: what a bookie reads of a blob
_OK = Status.OK
_LOCK_FILE_NAME = "LOCK"


class Bookie:
    """Journal + ledger storage + per-ledger state (fence, master key, LACs).

    Use :meth:`open` (it replays the journal), then :meth:`start` on the event
    loop, then :meth:`submit` from that loop only.
    """

    def __init__(self, config: BookieConfig) -> None:
        """Open the directories and replay the journal (what :meth:`open` does)."""
        problems = config.problems()
        if problems:
            raise BookieStartError(f"bookie {config.data_dir}: " + "; ".join(problems))
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.journal_dir = Path(config.journal_path)
        self._lock_fds: list[int] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polls = LongPolls(config.long_poll_max_per_ledger, config.long_poll_max_total)
        self._deferred: collections.deque[tuple[AddRequest, Respond]] = collections.deque()
        self._listeners: list[ReadOnlyListener] = []
        self._timers: list[asyncio.TimerHandle] = []
        self._checkpoint_running: asyncio.Future[None] | None = None
        self._closing = False
        self._closed = False
        self._serving = False  # between start() and close()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.checkpoints_done = 0
        self.replay_report = ScanReport()
        try:
            self._open()
        except BaseException:
            self._release_locks()
            raise

    @classmethod
    def open(cls, config: BookieConfig) -> Bookie:
        """Check directories, replay the journal into ledger storage, and return the bookie.

        Raises BookieStartError with a clear message on a damaged journal (unless
        ``journal_skip_corruption``) or unusable directories.
        """
        return cls(config)

    # ------------------------------------------------------------ opening

    def _open(self) -> None:
        config = self.config
        locked: set[Path] = set()
        for name, directory in (("data", self.data_dir), ("journal", self.journal_dir)):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BookieStartError(f"{name} directory {directory}: {exc}") from None
            if directory.resolve() not in locked:  # the journal may share the data directory
                self._lock(directory)
                locked.add(directory.resolve())
        problem = check_directories(self.data_dir, self.journal_dir)
        if problem:
            raise BookieStartError(f"bookie {self.data_dir}: {problem}")
        try:
            self.storage = LedgerStorage(
                self.data_dir,
                entry_log_max_bytes=config.entry_log_max_bytes,
                entry_log_write_buffer_bytes=config.entry_log_write_buffer_bytes,
                read_cache_max_bytes=config.read_cache_max_bytes,
                index_map_size_bytes=config.index_map_size_bytes,
            )
        except (BKError, OSError) as exc:
            raise BookieStartError(f"ledger storage in {self.data_dir}: {exc}") from None
        self._states = self.storage.states
        journal: Journal | None = None
        try:
            self._replay()
            existing = list_journal_ids(self.journal_dir)
            last = max([*existing, self.storage.mark[0] if self.storage.mark else 0])
            journal = Journal(
                self.journal_dir,
                last + 1,
                sync=config.journal_sync,
                max_group_wait_ms=config.journal_max_group_wait_ms,
                max_batch_bytes=config.journal_max_batch_bytes,
                max_batch_records=config.journal_max_batch_records,
                file_max_bytes=config.journal_file_max_bytes,
            )
            # Everything replayed goes to ledger storage now, and the old journal files go.
            work = self.storage.capture(journal.mark, self.journal_dir)
            self.storage.commit(work)
            self.storage.finish(work, True)
            self.checkpoints_done += 1
            self._disk_checker = DiskChecker(
                [self.data_dir, self.journal_dir],
                config.disk_usage_threshold,
                config.disk_usage_lwm_threshold,
            )
            self._disk_checker.check()
        except BaseException as exc:
            if journal is not None:
                journal.abandon()
            self.storage.close()
            if isinstance(exc, JournalCorruptionError):
                raise BookieStartError(exc.message) from None
            if isinstance(exc, BKError | OSError):
                raise BookieStartError(f"bookie {self.data_dir}: opening failed: {exc}") from None
            raise
        self._journal = journal
        for st in self._states.values():
            st.fence_durable = st.fenced
        self._journal_failed = False
        self._read_only = self._disk_checker.full

    def _lock(self, directory: Path) -> None:
        path = directory / _LOCK_FILE_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise BookieStartError(
                f"directory {directory} is in use by another bookie process (lock {path})"
            ) from None
        except OSError:
            os.close(fd)
            raise
        self._lock_fds.append(fd)

    def _release_locks(self) -> None:
        for fd in self._lock_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._lock_fds.clear()

    def _replay(self) -> None:
        storage = self.storage
        states = self._states
        report = self.replay_report
        records = journal_mod.scan(
            self.journal_dir, storage.mark, self.config.journal_skip_corruption, report
        )
        for kind, payload in records:
            ledger_id = journal_mod.decode_ledger(payload)
            st = states.get(ledger_id)
            if kind == journal_mod.RECORD_DELETE:
                storage.drop_ledger(ledger_id, tombstone=True)
                continue
            if st is None:
                st = storage.create_state(ledger_id)
            elif st.deleted:
                continue  # nothing may follow a delete; ignore rather than revive
            if kind == journal_mod.RECORD_ADD:
                where = f"journal add record of ledger {ledger_id}"
                lac = storage.replay_add(st, payload[8:], where)
                if lac > st.lac:
                    st.lac = lac
            elif kind == journal_mod.RECORD_MASTER_KEY:
                st.master_key = bytes(payload[8:])
                storage.mark_dirty(st)
            elif kind == journal_mod.RECORD_FENCE:
                st.fenced = True
                storage.mark_dirty(st)
            elif kind == journal_mod.RECORD_LAC:
                _, lac = journal_mod.decode_ledger_lac(payload)
                self._set_explicit_lac(st, lac)
        if report.records or report.truncated or report.skipped:
            log.info(
                "bookie %s: replayed %d journal records from %s (torn tails cut: %s, "
                "damaged ranges skipped: %s)",
                self.data_dir,
                report.records,
                storage.mark,
                report.truncated or "none",
                report.skipped or "none",
            )

    # ------------------------------------------------------------ life cycle

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the journal thread, checkpoints and the disk checker on ``loop``."""
        self._loop = loop
        config = self.config
        self._polls.loop = loop
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="bookie-checkpoint"
        )
        if not config.journal_sync:
            log.warning(
                "bookie %s: JOURNAL SYNC IS OFF: adds are acknowledged before they are "
                "durable; a crash or power loss can lose acknowledged entries",
                self.data_dir,
            )
        self._journal.start(loop, self._on_journal_batch)
        executor = self._executor

        def write_chunk(fn: Callable[..., None], *args: Any) -> asyncio.Future[None]:
            return loop.run_in_executor(executor, fn, *args)

        self.storage.entry_log.writer = write_chunk
        self._schedule(config.checkpoint_interval_ms, self._checkpoint_tick)
        self._schedule(config.disk_check_interval_ms, self._disk_tick)
        if self._read_only:
            log.warning("bookie %s starts read-only (disk usage)", self.data_dir)
        self._serving = True

    def _schedule(self, delay_ms: float, callback: Callable[[], None]) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._timers = [t for t in self._timers if not t.cancelled() and t.when() > now]
        self._timers.append(self._loop.call_later(delay_ms / 1000, callback))

    async def close(self) -> None:
        """Stop accepting work, answer what is queued, checkpoint, release files."""
        if self._closed or self._closing:
            return
        self._closing = True
        self._serving = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        try:
            for poll in self._polls.take_all():
                self._answer_poll_now(poll, with_entries=False)
            # Adds held back by the journal's queue bound are journaled now.
            while self._deferred:
                request, respond = self._deferred.popleft()
                self._run_guarded(Bookie._add, request, respond)
            await self._journal.close()
            if self._checkpoint_running is not None:
                with contextlib.suppress(Exception):
                    await self._checkpoint_running
            work = self.storage.capture(self._journal.mark, self.journal_dir)
            ok = False
            try:
                if self._loop is not None and self._executor is not None:
                    await self._loop.run_in_executor(self._executor, self.storage.commit, work)
                else:
                    self.storage.commit(work)
                ok = True
                self.checkpoints_done += 1
            finally:
                self.storage.finish(work, ok)
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            try:
                self.storage.close()
            finally:
                self._release_locks()

    # ------------------------------------------------------------ read-only mode

    @property
    def read_only(self) -> bool:
        """True while adds are refused (disk full, or the journal failed)."""
        return self._read_only

    def add_read_only_listener(self, listener: ReadOnlyListener) -> None:
        """``listener(read_only)`` is called on the loop whenever :attr:`read_only` changes."""
        self._listeners.append(listener)

    def _update_read_only(self) -> None:
        read_only = self._disk_checker.full or self._journal_failed
        if read_only == self._read_only:
            return
        self._read_only = read_only
        for listener in list(self._listeners):
            try:
                listener(read_only)
            except Exception:
                log.exception("read-only listener failed")

    def _disk_tick(self) -> None:
        if self._closing:
            return
        try:
            if self._disk_checker.check():
                self._update_read_only()
        except OSError as exc:
            log.warning("bookie %s: disk check failed: %s", self.data_dir, exc)
        self._schedule(self.config.disk_check_interval_ms, self._disk_tick)

    # ------------------------------------------------------------ requests

    def submit(self, request: Request, respond: Respond) -> None:
        """Handle one request; ``respond`` is called exactly once, on the loop."""
        if not self._serving:
            respond(error_response(request, Status.SHUTTING_DOWN))
            return
        handler = self._handlers.get(request.__class__)
        if handler is None:
            respond(error_response(request, Status.BAD_REQUEST))
            return
        self._run_guarded(handler, request, respond)

    def _run_guarded(
        self, handler: Callable[[Bookie, Any, Respond], None], request: Any, respond: Respond
    ) -> None:
        # Handlers check everything before they change anything, and hand ``respond``
        # on (or call it) as their last step, so an exception means it was not called.
        try:
            handler(self, request, respond)
        except BKError as exc:
            log.warning("bookie %s: %s failed: %s", self.data_dir, type(request).__name__, exc)
            respond(error_response(request, exc.status))
        except (struct.error, ValueError, OverflowError) as exc:
            respond(error_response(request, Status.BAD_REQUEST))
            log.warning("bookie %s: bad %s: %s", self.data_dir, type(request).__name__, exc)
        except Exception:
            log.exception("bookie %s: %r failed", self.data_dir, request)
            respond(error_response(request, Status.IO_ERROR))

    def _refuse(self, request: Request, respond: Respond, status: Status) -> None:
        respond(error_response(request, status))

    # -------------------------------------------------------------- add

    def _on_add(self, request: AddRequest, respond: Respond) -> None:
        if self._read_only:
            status = Status.IO_ERROR if self._journal_failed else Status.READ_ONLY
            respond(error_response(request, status))
            return
        if self._deferred or self._journal.queued_bytes > self.config.journal_queue_max_bytes:
            # Back-pressure: hold the request (in order) until the journal drains.
            self._deferred.append((request, respond))
            return
        self._add(request, respond)

    def _add(self, request: AddRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        st = self._states.get(ledger_id)
        if st is not None and st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        entries = request.entries
        count = len(entries)
        if count == 1:  # the common case of a lightly loaded writer: no batch machinery
            blob = entries[0]
            size = len(blob)
            if size < ENTRY_HEADER_SIZE:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            blob_ledger_id, entry_id, lac = _HEADER3.unpack_from(blob)
            if blob_ledger_id != ledger_id or entry_id < 0:
                respond(error_response(request, Status.BAD_REQUEST))
                return
        else:
            try:
                headers = list(map(_HEADER3.unpack_from, entries))
            except struct.error:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            if not headers:
                respond(error_response(request, Status.BAD_REQUEST))
                return
            ledger_ids, entry_ids, lacs = zip(*headers)  # noqa: B905 - rows of three
            sizes = list(map(len, entries))
            if (
                min(sizes) < ENTRY_HEADER_SIZE
                or ledger_ids.count(ledger_id) != count
                or min(entry_ids) < 0
            ):
                respond(error_response(request, Status.BAD_REQUEST))
                return
        key = request.master_key
        journal = self._journal
        if st is None:
            st = self.storage.create_state(ledger_id)
            st.master_key = key
            journal.append(master_key_record(ledger_id, key), None)
        elif st.master_key != key and st.master_key is not None:
            respond(error_response(request, Status.UNAUTHORIZED))  # R10
            return
        if st.fenced and not request.flags & AddFlag.RECOVERY:
            respond(error_response(request, Status.FENCED))  # R7
            return
        if st.master_key is None:  # a state recovered without its key: take this one
            st.master_key = key
            self.storage.mark_dirty(st)
            journal.append(master_key_record(ledger_id, key), None)
        if count == 1:
            data = self.storage.add_one(st, blob, size, entry_id)
        else:
            data = self.storage.add_entries(st, entries, sizes, entry_ids, max(entry_ids))
            lac = max(lacs)
        if lac > st.lac:
            st.lac = lac
            if ledger_id in self._polls:
                self._wake_polls(st)
        journal.append(
            add_record(ledger_id, data),
            (respond, AddResponse(request.request_id, _OK, ledger_id, count)),
        )

    def _drain_deferred(self) -> None:
        limit = self.config.journal_queue_max_bytes
        deferred = self._deferred
        while deferred and self._journal.queued_bytes <= limit:
            request, respond = deferred.popleft()
            if self._read_only:
                status = Status.IO_ERROR if self._journal_failed else Status.READ_ONLY
                respond(error_response(request, status))
                continue
            self._run_guarded(Bookie._add, request, respond)

    # -------------------------------------------------------------- journal completions

    def _on_journal_batch(
        self, dones: list[journal_mod.Done], size: int, error: BaseException | None
    ) -> None:
        if error is None:
            for fn, arg in dones:
                try:
                    fn(arg)
                except Exception:
                    log.exception("bookie %s: answering a request failed", self.data_dir)
        else:
            if not self._journal_failed:
                log.error(
                    "bookie %s: journal %s failed (%s): refusing adds from now on",
                    self.data_dir,
                    self.journal_dir,
                    error,
                )
                self._journal_failed = True
                self._update_read_only()
            for fn, arg in dones:
                try:
                    if isinstance(arg, tuple):  # (request, respond) of a continuation
                        arg[1](error_response(arg[0], Status.IO_ERROR))
                    else:
                        arg.status = Status.IO_ERROR
                        fn(arg)
                except Exception:
                    log.exception("bookie %s: answering a request failed", self.data_dir)
        if self._deferred:
            self._drain_deferred()

    def _keyed_state(
        self, request: FenceRequest | ReadRequest | WriteLacRequest, key: bytes, respond: Respond
    ) -> LedgerState | None:
        """The ledger's state for a keyed request that changes it (fence, explicit LAC).

        Answers the request and returns None when the journal has failed, the ledger was
        deleted here, or ``key`` is not the ledger's master key (R10: nothing changes).
        Otherwise creates the state if this bookie never saw the ledger, and records the
        key on first use (journaled before the request that follows it is answered).
        """
        if self._journal_failed:
            respond(error_response(request, Status.IO_ERROR))
            return None
        ledger_id = request.ledger_id
        st = self._states.get(ledger_id)
        if st is not None:
            if st.deleted:
                respond(error_response(request, Status.NO_SUCH_LEDGER))
                return None
            if st.master_key is not None and st.master_key != key:
                respond(error_response(request, Status.UNAUTHORIZED))  # R10
                return None
        else:
            st = self.storage.create_state(ledger_id)
        if st.master_key is None:
            st.master_key = key
            self.storage.mark_dirty(st)
            self._journal.append(master_key_record(ledger_id, key), None)
        return st

    # -------------------------------------------------------------- fencing

    def _fence(
        self,
        request: FenceRequest | ReadRequest,
        respond: Respond,
        then: Callable[[tuple[Any, Respond]], None],
    ) -> None:
        """Fence (R7): in memory at once, answered through ``then`` once durable."""
        st = self._keyed_state(request, request.master_key, respond)
        if st is None:
            return
        if st.fenced and st.fence_durable:
            then((request, respond))
            return
        if not st.fenced:
            st.fenced = True
            self.storage.mark_dirty(st)
        self._journal.append(
            fence_record(st.ledger_id), (self._fence_durable, (request, respond, then))
        )

    def _fence_durable(self, arg: tuple[Any, Respond, Callable[[Any], None]]) -> None:
        request, respond, then = arg
        st = self._states.get(request.ledger_id)
        if st is not None and st.fenced:
            st.fence_durable = True
        try:
            then((request, respond))
        except BKError as exc:
            log.warning("bookie %s: %s failed: %s", self.data_dir, type(request).__name__, exc)
            respond(error_response(request, exc.status))
        except Exception:
            log.exception("bookie %s: %r failed", self.data_dir, request)
            respond(error_response(request, Status.IO_ERROR))

    def _on_fence(self, request: FenceRequest, respond: Respond) -> None:
        self._fence(request, respond, self._answer_fence)

    def _answer_fence(self, arg: tuple[FenceRequest, Respond]) -> None:
        request, respond = arg
        st = self._states.get(request.ledger_id)
        if st is None or st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        respond(FenceResponse(request.request_id, _OK, request.ledger_id, st.lac, st.last_entry_id))

    # -------------------------------------------------------------- reads

    def _on_read(self, request: ReadRequest, respond: Respond) -> None:
        if request.first_entry_id < 0 or request.count < 0:
            respond(error_response(request, Status.BAD_REQUEST))
            return
        if request.flags & ReadFlag.FENCE:
            self._fence(request, respond, self._read_after_fence)
            return
        self._read(request, respond)

    def _read_after_fence(self, arg: tuple[ReadRequest, Respond]) -> None:
        request, respond = arg
        self._read(request, respond)

    def _read(self, request: ReadRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        st = self._states.get(ledger_id)
        if st is not None and st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        if request.flags & ReadFlag.LONG_POLL:
            self._long_poll(request, respond, st)
            return
        if st is None:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        entries = self.storage.read_entries(
            st, request.first_entry_id, request.count, self._max_bytes(request)
        )
        status = _OK if entries else Status.NO_SUCH_ENTRY
        respond(
            ReadResponse(
                request.request_id, status, ledger_id, request.first_entry_id, st.lac, entries
            )
        )

    def _max_bytes(self, request: ReadRequest) -> int:
        return min(request.max_bytes, self.config.read_response_max_bytes)

    def _long_poll(self, request: ReadRequest, respond: Respond, st: LedgerState | None) -> None:
        lac = st.lac if st is not None else -1
        timeout_ms = min(request.timeout_ms, self.config.long_poll_max_timeout_ms)
        if lac > request.previous_lac or timeout_ms <= 0:
            self._answer_poll_now(Poll(request, respond), with_entries=True)
            return
        if not self._polls.park(request, respond, timeout_ms / 1000, self._poll_timed_out):
            respond(error_response(request, Status.TOO_MANY_REQUESTS))

    def _poll_timed_out(self, poll: Poll) -> None:
        self._answer_poll_now(poll, with_entries=False)

    def _wake_polls(self, st: LedgerState) -> None:
        for poll in self._polls.ready(st.ledger_id, st.lac):
            self._answer_poll_now(poll, with_entries=True)

    def _answer_poll_now(self, poll: Poll, with_entries: bool) -> None:
        request = poll.request
        try:
            st = self._states.get(request.ledger_id)
            if st is not None and st.deleted:
                poll.respond(error_response(request, Status.NO_SUCH_LEDGER))
                return
            lac = st.lac if st is not None else -1
            entries: list[bytes] = []
            if with_entries and st is not None:
                entries = self.storage.read_entries(
                    st, request.first_entry_id, request.count, self._max_bytes(request)
                )
            poll.respond(
                ReadResponse(
                    request.request_id, _OK, request.ledger_id, request.first_entry_id, lac, entries
                )
            )
        except BKError as exc:
            log.warning("bookie %s: long poll: %s", self.data_dir, exc)
            poll.respond(error_response(request, exc.status))
        except Exception:
            log.exception("bookie %s: long poll %r failed", self.data_dir, request)
            poll.respond(error_response(request, Status.IO_ERROR))

    def _on_read_lac(self, request: ReadLacRequest, respond: Respond) -> None:
        st = self._states.get(request.ledger_id)
        if st is None or st.deleted:
            respond(error_response(request, Status.NO_SUCH_LEDGER))
            return
        respond(
            ReadLacResponse(request.request_id, _OK, request.ledger_id, st.lac, st.last_entry_id)
        )

    # -------------------------------------------------------------- LAC, delete, info

    def _set_explicit_lac(self, st: LedgerState, lac: int) -> None:
        if lac > st.explicit_lac:
            st.explicit_lac = lac
            self.storage.mark_dirty(st)
        if lac > st.lac:
            st.lac = lac
            self.storage.mark_dirty(st)
            if st.ledger_id in self._polls:
                self._wake_polls(st)

    def _on_write_lac(self, request: WriteLacRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        st = self._keyed_state(request, request.master_key, respond)
        if st is None:
            return
        self._set_explicit_lac(st, request.lac)
        self._journal.append(
            lac_record(ledger_id, request.lac),
            (respond, StatusResponse(request.request_id, Op.WRITE_LAC, _OK, ledger_id)),
        )

    def _on_delete(self, request: DeleteLedgerRequest, respond: Respond) -> None:
        ledger_id = request.ledger_id
        if self._journal_failed:
            respond(error_response(request, Status.IO_ERROR))
            return
        self._drop_polls(ledger_id)
        self.storage.drop_ledger(ledger_id, tombstone=True)
        self._journal.append(
            delete_record(ledger_id),
            (respond, StatusResponse(request.request_id, Op.DELETE_LEDGER, _OK, ledger_id)),
        )

    def _drop_polls(self, ledger_id: int) -> None:
        for poll in self._polls.take(ledger_id):
            poll.respond(error_response(poll.request, Status.NO_SUCH_LEDGER))

    def _on_info(self, request: BookieInfoRequest, respond: Respond) -> None:
        usage = disk_usage(self.data_dir)
        respond(
            BookieInfoResponse(
                request.request_id, _OK, self._read_only, usage.free_bytes, usage.total_bytes
            )
        )

    _handlers: dict[type, Callable[[Bookie, Any, Respond], None]] = {
        AddRequest: _on_add,
        ReadRequest: _on_read,
        ReadLacRequest: _on_read_lac,
        FenceRequest: _on_fence,
        WriteLacRequest: _on_write_lac,
        DeleteLedgerRequest: _on_delete,
        BookieInfoRequest: _on_info,
    }

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
        live = set(live_ledger_ids)
        dropped = 0
        for ledger_id in snapshot:
            if ledger_id in live:
                continue
            st = self._states.get(ledger_id)
            if st is None or st.deleted:
                continue
            self._drop_polls(ledger_id)
            self.storage.drop_ledger(ledger_id, tombstone=False)
            dropped += 1
        if dropped and self._loop is not None and not self._closing:
            self._loop.call_soon(self._checkpoint_tick)
        return dropped

    # ------------------------------------------------------------ checkpoints

    def _checkpoint_tick(self) -> None:
        if self._closing:
            return
        if self._checkpoint_running is None:
            self._start_checkpoint()

    def _start_checkpoint(self) -> asyncio.Future[None]:
        assert self._loop is not None and self._executor is not None
        work = self.storage.capture(self._journal.mark, self.journal_dir)
        future = self._loop.run_in_executor(self._executor, self.storage.commit, work)
        done: asyncio.Future[None] = self._loop.create_future()
        self._checkpoint_running = done

        def finished(f: asyncio.Future[None]) -> None:
            error = f.exception() if not f.cancelled() else asyncio.CancelledError()
            ok = error is None
            self.storage.finish(work, ok)
            if ok:
                self.checkpoints_done += 1
            else:
                log.error("bookie %s: checkpoint failed: %s", self.data_dir, error)
            self._checkpoint_running = None
            if not done.done():
                done.set_result(None)
            if not self._closing:
                self._schedule(self.config.checkpoint_interval_ms, self._checkpoint_tick)

        future.add_done_callback(finished)
        return done

    async def checkpoint(self) -> None:
        """Run a checkpoint now (after any running one) and wait for it."""
        if self._checkpoint_running is not None:
            await self._checkpoint_running
        await self._start_checkpoint()

    # ------------------------------------------------------------ introspection

    def stats(self) -> dict[str, int]:
        """Counters for benchmarks and tests."""
        return {
            "journal_syncs": self._journal.sync_count,
            "journal_batches": self._journal.batch_count,
            "journal_records": self._journal.records_written,
            "journal_queued_bytes": self._journal.queued_bytes,
            "checkpoints": self.checkpoints_done,
            "ledgers": len(self._states),
            "deferred_adds": len(self._deferred),
            "parked_polls": self._polls.total,
            "read_cache_bytes": self.storage.read_cache.size_bytes,
        }

    def state(self, ledger_id: int) -> LedgerState | None:
        """The in-memory state of a ledger (tests and tools; do not modify)."""
        return self._states.get(ledger_id)

    @property
    def journal(self) -> Journal:
        return self._journal

    def __repr__(self) -> str:
        return f"<Bookie {self.data_dir} read_only={self._read_only}>"
