"""The single writer of a log stream (R11).

Opening (:func:`open_writer`):

1. read the ledger list and its version;
2. fence the ledgers a previous writer may still hold: every listed ledger not yet
   closed is opened with recovery (fenced, recovered, closed), newest first; an
   older ledger can be open behind a closed one when writers crashed one after
   another, so the walk does not stop at the first closed ledger;
3. create a new ledger;
4. append it to the list with a compare-and-set on the version read in 1;
5. only then accept appends.

If the compare-and-set of step 4 loses because another writer appended a ledger,
this writer lost the race: its new ledger is deleted and :class:`LogFencedError`
raised. If it lost only to a truncation (ledgers removed from the front), it
tries again on the new version. A compare-and-set whose outcome is unknown (the
connection was lost: it may have been applied) is resolved by reading the list
back (R13); a ledger is deleted only once a read shows it is not in the list.

Rolling over (by size or age, checked on each append): create a ledger, append
it to the list with a compare-and-set, wait for the adds still in flight on the
old ledger, close it, then send the appends that queued meanwhile to the new
ledger. Waiting before sending keeps the log's order strict: if an add in the old
ledger fails, nothing sent after it can succeed.

A writer that is fenced on an add, or whose compare-and-set loses to another
writer, fails that append and every later one with :class:`LogFencedError`. An
append reported done is confirmed in a ledger that is in the list, so it is in
the log for every reader and every later writer (recovery keeps it, R7/R8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from functools import partial
from typing import TYPE_CHECKING

from quorumlog.core.log_metadata import decide_append_ledger
from quorumlog.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    TooManyRequestsError,
)
from quorumlog.log.context import LogContext
from quorumlog.log.errors import LogClosedError, LogFencedError, NoSuchLogError
from quorumlog.log.metadata import LogMetadata, log_path, read_log
from quorumlog.log.metadata_updates import log_view, update_log
from quorumlog.log.position import Position
from quorumlog.log.record_format import HEADER_BYTES, VERSION, check_timestamp, pack_header
from quorumlog.meta.ledgers import MetadataConflictsError

if TYPE_CHECKING:
    from quorumlog.client.writing import LedgerHandle
    from quorumlog.meta.ledger_metadata import LedgerMetadata

log = logging.getLogger(__name__)

# A writer whose ledger was fenced watches the list this long for the writer that fenced
# it (a new writer appends its ledger moments after fencing): none, and the list not
# sealed, means a recovery of the ledger itself fenced it (autorecovery of a lost bookie).
FENCE_CAUSE_WAIT_S = 1.0


async def append_ledger_to_list(
    ctx: LogContext,
    metadata: LogMetadata,
    version: int,
    ledger_id: int,
    *,
    opening: bool = False,
    closed_through: int = -1,
) -> tuple[LogMetadata, int]:
    """Compare-and-set ``ledger_id`` onto the end of the list read at ``version``.

    Through the log's one update path (``log/metadata_updates.py``, deciding with
    ``core.log_metadata.decide_append_ledger``): retried only when the list changed by
    truncation; a ledger appended by someone else means another writer owns the log
    now: LogFencedError. So does a Log.fence() since ``version``, unless ``opening``: a
    writer being opened has fenced the listed ledgers itself, while one rolling over
    must stop (the fence made the log final until a next writer opens).
    ``closed_through``: every listed ledger up to this id is known closed, noted in the
    list for the next fence to skip. A set whose outcome is unknown is resolved by
    reading the list again (R13); when that does not tell, LogOutcomeUnknownError: the
    ledger may be in the list, so the caller must not delete it.
    """
    decide = partial(
        decide_append_ledger,
        base=log_view(metadata),
        ledger_id=ledger_id,
        opening=opening,
        closed_through=closed_through,
    )
    try:
        done = await update_log(
            ctx.store,
            ctx.name,
            decide,
            what=f"adding ledger {ledger_id}",
            attempts=ctx.config.list_cas_retries,
            known=(metadata, version),
        )
    except NoSuchLogError:
        raise LogFencedError(
            f"log {ctx.name}: deleted while ledger {ledger_id} was being added"
        ) from None
    except MetadataConflictsError as exc:
        raise LogFencedError(exc.message) from None
    if done.metadata.ledgers[-1] != ledger_id:
        raise LogFencedError(
            f"log {ctx.name}: ledger {ledger_id} was added, but another writer added "
            f"ledger {done.metadata.ledgers[-1]} after it"
        )
    return done.metadata, done.version


async def _discard(ctx: LogContext, handle: LedgerHandle) -> None:
    """Close a ledger this writer could not add to the list, and delete it once a read of
    the list shows it is not there (best effort).

    A compare-and-set that failed with an unknown outcome may have added it (R13):
    a listed ledger that was deleted would stop every reader at it. When the list
    cannot be read, the ledger is only closed (empty and closed, readers pass it).
    """
    ledger_id = handle.ledger_id
    with contextlib.suppress(BKError):
        await handle.close()
    try:
        # R18: the list as the store holds it now, not as a lagging server has it.
        await ctx.store.sync(log_path(ctx.name))
        metadata, _ = await read_log(ctx.store, ctx.name)
    except NoSuchLogError:
        pass  # the log is gone: nothing can list the ledger
    except BKError as exc:
        log.warning(
            "log %s: ledger %d kept (closed): the list could not be read to see whether "
            "it holds it: %s",
            ctx.name,
            ledger_id,
            exc.message,
        )
        return
    else:
        if ledger_id in metadata.ledgers:
            return  # added after all, by a set whose reply was lost: it stays, closed
    try:
        await ctx.bk.delete_ledger(ledger_id, ctx.config.password)
    except BKError as exc:
        log.warning("log %s: could not delete unused ledger %d: %s", ctx.name, ledger_id, exc)


_NOT_CONFIRMED = "appends not confirmed may or may not be in it"

# Ledger metadata reads in flight at once while looking for ledgers to fence.
_FENCE_READS_AT_ONCE = 32


async def fence_previous_ledgers(ctx: LogContext, metadata: LogMetadata) -> list[int]:
    """Step 2 of R11: open with recovery every listed ledger that is not closed.

    Every ledger is looked at, not only the trailing ones: writers that crash one
    after another can leave an older ledger open behind a closed one (one crashed
    mid-rollover, the next while fencing, after closing the newer ledger), and a
    reader waits for an open ledger to close. Only the ledgers the list does not note
    as closed (``closed_through``) are read. Returns the ledgers fenced (newest first).
    """
    ids = [x for x in reversed(metadata.ledgers) if x > metadata.closed_through]
    found: list[LedgerMetadata | None] = []
    for start in range(0, len(ids), _FENCE_READS_AT_ONCE):
        chunk = ids[start : start + _FENCE_READS_AT_ONCE]
        found += await asyncio.gather(*(_ledger_metadata(ctx, x) for x in chunk))
    fenced: list[int] = []
    for ledger_id, ledger_md in zip(ids, found, strict=True):
        if ledger_md is None or ledger_md.is_closed:
            continue
        handle = await ctx.bk.open_ledger(ledger_id, ctx.config.password)
        await handle.close()
        fenced.append(ledger_id)
    return fenced


async def _ledger_metadata(ctx: LogContext, ledger_id: int) -> LedgerMetadata | None:
    try:
        return await ctx.bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        log.warning("log %s: ledger %d is listed but does not exist", ctx.name, ledger_id)
        return None


async def open_writer(ctx: LogContext) -> LogWriter:
    """Become the log's writer (R11). See the module docstring for the steps."""
    metadata, version = await read_log(ctx.store, ctx.name)
    fenced = await fence_previous_ledgers(ctx, metadata)
    handle = await ctx.create_ledger()
    try:
        # Every ledger listed was closed or fenced above: the list notes it.
        closed_through = metadata.ledgers[-1] if metadata.ledgers else -1
        metadata, version = await append_ledger_to_list(
            ctx,
            metadata,
            version,
            handle.ledger_id,
            opening=True,
            closed_through=closed_through,
        )
    except BaseException:
        await _discard(ctx, handle)
        raise
    if fenced:
        log.info("log %s: fenced ledger(s) %s", ctx.name, fenced)
    return LogWriter(ctx, metadata, version, handle)


def _transfer(target: asyncio.Future[Position], source: asyncio.Future[Position]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())


class LogWriter:
    """Appends records to a log; the only writer as long as it is not fenced.

    Example::

        writer = await log.open_writer()
        position = await writer.append(b"hello")          # waits for confirmation
        futures = [writer.append_nowait(b"x") for _ in range(100)]  # pipelined
        await asyncio.gather(*futures)
        await writer.close()
    """

    def __init__(
        self, ctx: LogContext, metadata: LogMetadata, version: int, handle: LedgerHandle
    ) -> None:
        self._ctx = ctx
        self._loop = asyncio.get_running_loop()
        self._metadata = metadata
        self._version = version
        self._last_position: Position | None = None
        # The append time of the latest record: the next one gets no earlier time
        # (record_format.py; a log's times are then in order while one writer writes).
        self._last_timestamp_ms = 0
        self._handle = self._own(handle)
        self._ledger_opened_at = self._loop.time()
        self._ledger_bytes = 0
        self._failure: BKError | None = None
        self._closed = False
        self._rolling: asyncio.Task[None] | None = None
        # Finding out who fenced this writer's ledger (see _explain_fence).
        self._explaining: asyncio.Task[None] | None = None
        self._queue: deque[tuple[bytes, asyncio.Future[Position]]] = deque()
        self._max_outstanding = ctx.bk.config.max_outstanding_adds
        self._no_roll_before = 0.0
        # The cheap per-append test of whether _should_roll may say yes (see _plan_roll).
        self._roll_check_bytes = 0.0
        self._roll_check_at = 0.0
        self._plan_roll()
        self.rollovers = 0

    # ------------------------------------------------------------ state

    @property
    def name(self) -> str:
        return self._ctx.name

    @property
    def ledger_id(self) -> int:
        """The ledger appends go to now (the last of the list)."""
        return self._handle.ledger_id

    @property
    def last_position(self) -> Position | None:
        """The last position confirmed through this writer."""
        return self._last_position

    @property
    def last_timestamp_ms(self) -> int:
        """The highest append time given to a record so far (0 before the first)."""
        return self._last_timestamp_ms

    @property
    def is_fenced(self) -> bool:
        return isinstance(self._failure, LogFencedError)

    @property
    def failure(self) -> BKError | None:
        """Why this writer stopped (None while it can append)."""
        return self._failure

    @property
    def outstanding(self) -> int:
        """Appends sent or queued and not yet confirmed."""
        return self._handle.outstanding_adds + len(self._queue)

    # ------------------------------------------------------------ appending

    def append_nowait(
        self, data: bytes, timestamp_ms: int | None = None
    ) -> asyncio.Future[Position]:
        """Send a record without waiting; the future gives its position once confirmed.

        The record carries its append time in its header (record_format.py): the wall
        clock in milliseconds since the epoch, or the time of the record before if the
        clock went back, or ``timestamp_ms`` when given (a replay, a test; taken as is).
        Futures complete in append order. Raises at once if the writer lost the log
        (LogFencedError) or was closed, and TooManyRequestsError when the client's
        ``max_outstanding_adds`` appends are unconfirmed (queued ones count): wait first
        (:meth:`wait_for_capacity`; :meth:`append` does).
        """
        if self._failure is not None or self._closed:
            self._check_usable()
        last_ms = self._last_timestamp_ms
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
            if timestamp_ms < last_ms:
                timestamp_ms = last_ms
        else:
            check_timestamp(timestamp_ms)
        if timestamp_ms > last_ms:
            self._last_timestamp_ms = timestamp_ms
        # One buffer, header and payload: the entry (bytes + any bytes-like object).
        data = pack_header(VERSION, timestamp_ms) + data
        if (
            self._rolling is None
            and not self._queue
            and self._ledger_bytes < self._roll_check_bytes
            and self._loop.time() < self._roll_check_at
        ):
            # No rollover due or running, nothing queued: the handle's own bound is the
            # writer's (R16); _send inlined (a Python call less per append).
            handle = self._handle
            try:
                added = handle.append(data)
            except TooManyRequestsError:
                raise  # back-pressure: the writer goes on
            except BKError as exc:
                raise self._lose(exc, handle.ledger_id) from None
            self._ledger_bytes += len(data) - HEADER_BYTES  # payload bytes
            return added  # type: ignore[return-value]  # completes with a Position (_own)
        if self._handle.outstanding_adds + len(self._queue) >= self._max_outstanding:
            # Back-pressure, not a lost log: the queue of a rollover is bounded too (R16).
            raise TooManyRequestsError(
                f"log {self.name}: {self.outstanding} appends unconfirmed (max_outstanding_adds)"
            )
        if self._rolling is None and self._should_roll():
            self._start_rollover()
        if self._rolling is not None:
            future: asyncio.Future[Position] = self._loop.create_future()
            self._queue.append((data, future))
            return future
        return self._send(data)

    async def append(self, data: bytes, timestamp_ms: int | None = None) -> Position:
        """Append one record and wait until it is confirmed; returns its position.
        ``timestamp_ms``: as in :meth:`append_nowait`.

        A LogFencedError raised here names who fenced the writer (another writer, a
        ``log.fence()``, or a recovery of its ledger), once the list has told."""
        try:
            await self.wait_for_capacity()
            return await self.append_nowait(data, timestamp_ms)
        except LogFencedError as exc:
            raise await self._fence_explained(exc) from None

    async def wait_for_capacity(self) -> None:
        """Wait for a rollover in progress, then for the ledger's in-flight bound."""
        self._check_usable()
        if self._rolling is not None:
            await asyncio.shield(self._rolling)
            self._check_usable()
        await self._handle.wait_for_capacity()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise LogClosedError(f"log {self.name}: writer is closed")

    def _own(self, handle: LedgerHandle) -> LedgerHandle:
        """Make ``handle``'s add futures this writer's: positions, or the writer's failure."""
        ledger_id = handle.ledger_id
        make_tuple = tuple.__new__

        def position_of(entry_id: int) -> Position:
            # Once per confirmed append: tuple.__new__ skips the Python-level __new__
            # a NamedTuple has (the same Position).
            return make_tuple(Position, (ledger_id, entry_id))

        def settled(count: int) -> None:
            # Once per batch of confirmations, not per append: adds confirm in order.
            lac = handle.last_add_confirmed
            if lac >= 0:
                position = Position(ledger_id, lac)
                if self._last_position is None or position > self._last_position:
                    self._last_position = position

        handle.deliver_results(position_of, partial(self._error_of, ledger_id))
        handle.on_settled(settled)
        return handle

    def _send(self, data: bytes) -> asyncio.Future[Position]:
        handle = self._handle
        try:
            added = handle.append(data)
        except TooManyRequestsError:
            raise  # back-pressure: the writer goes on
        except BKError as exc:
            error = self._lose(exc, handle.ledger_id)
            raise error from None
        self._ledger_bytes += len(data) - HEADER_BYTES  # payload bytes
        return added  # type: ignore[return-value]  # completes with a Position (_own)

    def _error_of(self, ledger_id: int, exc: BKError) -> BKError:
        # An add that failed stops the writer: every later append gets the same error.
        return self._lose(exc, ledger_id)

    def _lose(self, exc: BaseException, ledger_id: int) -> BKError:
        """Record why the writer stops; a fencing becomes LogFencedError."""
        if self._failure is not None:
            return self._failure
        if isinstance(exc, LedgerFencedError):
            # Who fenced it is not known yet: the list tells (_explain_fence), and the
            # writer's failure then names the cause.
            error: BKError = LogFencedError(
                f"log {self.name}: ledger {ledger_id} was fenced (opened with recovery by "
                "another client: a new writer of the log, log.fence(), or a recovery of the "
                "ledger such as autorecovery of a lost bookie); this writer lost the log "
                f"({_NOT_CONFIRMED})"
            )
            self._explaining = self._loop.create_task(self._explain_fence(ledger_id))
        elif isinstance(exc, NoSuchLedgerError):
            error = LogFencedError(
                f"log {self.name}: ledger {ledger_id} was deleted (the log was deleted?)"
            )
        elif isinstance(exc, LogFencedError | BKError):
            error = exc
        else:
            error = LogClosedError(f"log {self.name}: ledger {ledger_id}: {exc!r}")
        self._failure = error
        self._fail_queue(error)
        log.warning("log %s: writer stops: %s", self.name, error.message)
        return error

    async def _explain_fence(self, ledger_id: int) -> None:
        """Find out who fenced ``ledger_id`` and make the writer's failure say so."""
        try:
            cause = await self._fence_cause(ledger_id)
        except BKError as exc:
            log.debug("log %s: who fenced ledger %d is unknown: %s", self.name, ledger_id, exc)
            return
        if cause is None:
            return
        self._failure = LogFencedError(
            f"log {self.name}: ledger {ledger_id} {cause}; this writer lost the log "
            f"({_NOT_CONFIRMED})"
        )
        log.warning("log %s: ledger %d %s", self.name, ledger_id, cause)

    async def _fence_cause(self, ledger_id: int) -> str | None:
        """What the list says of who fenced ``ledger_id``: a writer that appended a ledger
        after it, a Log.fence() that sealed it, or, when neither shows within
        FENCE_CAUSE_WAIT_S, a recovery of the ledger itself. None: it does not tell."""
        store = self._ctx.store
        path = log_path(self.name)
        mine = set(self._metadata.ledgers)  # a rollover's new ledger is this writer's own
        changed = asyncio.Event()
        watch = store.watch(path, lambda _event: changed.set())
        deadline = self._loop.time() + FENCE_CAUSE_WAIT_S
        try:
            for _ in range(1_000):  # bounded by the deadline
                changed.clear()  # before the read: a change after it wakes the wait
                await store.sync(path)  # R18: not a lagging server's list
                try:
                    metadata, _ = await read_log(store, self.name)
                except NoSuchLogError:
                    return "was fenced, and the log was deleted"
                others = [x for x in metadata.ledgers if x > ledger_id and x not in mine]
                if others:
                    return (
                        f"was fenced by another writer, which added ledger {others[0]} to the log"
                    )
                if metadata.fences > self._metadata.fences:
                    return "was fenced by log.fence(), which made the log final"
                if ledger_id not in metadata.ledgers:
                    return None
                left = deadline - self._loop.time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        finally:
            watch.cancel()
        return (
            "was fenced by a recovery of the ledger itself, not by another writer: no other "
            "writer took the log (its list still ends with this writer's ledgers, unsealed). "
            "Autorecovery does this to an open ledger on a lost bookie, as does any client "
            "that opens the ledger with recovery; open a new writer to go on"
        )

    async def _fence_explained(self, exc: BKError) -> BKError:
        """The writer's failure once who fenced it is known (or ``exc``)."""
        task = self._explaining
        if task is not None and not task.done():
            await asyncio.wait({task})  # bounded (FENCE_CAUSE_WAIT_S), and not cancelled
        return self._failure or exc

    def _fail_queue(self, error: BKError) -> None:
        while self._queue:
            _, future = self._queue.popleft()
            if not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------ rolling over

    def _plan_roll(self) -> None:
        """Set the bytes and the time before which _should_roll cannot say yes, so that
        an append tests two numbers instead of reading the config and computing an age.
        Called whenever what _should_roll reads changes (a new ledger, a retry delay)."""
        config = self._ctx.config
        size = config.rollover_size_bytes
        self._roll_check_bytes = size if size else float("inf")
        at = float("inf")
        if config.rollover_age_ms:
            # A microsecond early: _should_roll decides, on its own arithmetic.
            at = self._ledger_opened_at + config.rollover_age_ms / 1000 - 1e-6
        self._roll_check_at = at

    def _should_roll(self) -> bool:
        config = self._ctx.config
        now = self._loop.time()
        if now < self._no_roll_before:
            return False
        if config.rollover_size_bytes and self._ledger_bytes >= config.rollover_size_bytes:
            return True
        age_ms = (now - self._ledger_opened_at) * 1000
        return bool(config.rollover_age_ms) and age_ms >= config.rollover_age_ms

    def _start_rollover(self) -> None:
        self._rolling = self._loop.create_task(self._rollover())
        self._rolling.add_done_callback(self._rollover_done)

    def _rollover_done(self, task: asyncio.Task[None]) -> None:
        self._rolling = None
        if task.cancelled():
            self._lose(LogClosedError(f"log {self.name}: rollover cancelled"), self.ledger_id)
        elif task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            self._lose(exc, self.ledger_id)
        self._flush_queue()

    def _flush_queue(self) -> None:
        while self._queue and self._failure is None and self._rolling is None:
            data, future = self._queue.popleft()
            if future.done():
                continue
            try:
                sent = self._send(data)
            except BKError as exc:
                future.set_exception(exc)
                continue
            sent.add_done_callback(partial(_transfer, future))
        if self._failure is not None:
            self._fail_queue(self._failure)

    async def rollover(self) -> int:
        """Start a new ledger now (create, append to the list, close the old one).

        Returns the new ledger id. Appends made meanwhile wait for the new ledger.
        """
        try:
            self._check_usable()
            if self._rolling is None:
                self._start_rollover()
            assert self._rolling is not None
            await asyncio.shield(self._rolling)
            self._check_usable()
        except LogFencedError as exc:
            raise await self._fence_explained(exc) from None
        return self.ledger_id

    async def _rollover(self) -> None:
        old = self._handle
        try:
            new = self._own(await self._ctx.create_ledger())
        except BKError as exc:
            if isinstance(exc, LogFencedError):
                raise
            # No new ledger now (too few bookies?): keep writing to the current one.
            retry_ms = self._ctx.config.rollover_retry_ms
            self._no_roll_before = self._loop.time() + retry_ms / 1000
            self._plan_roll()
            log.warning(
                "log %s: rollover from ledger %d failed, retry in %d ms: %s",
                self.name,
                old.ledger_id,
                retry_ms,
                exc.message,
            )
            return
        # The ledgers before the current one are closed: fenced when this writer opened,
        # or its own, closed by its earlier rollovers.
        before = [x for x in self._metadata.ledgers if x < old.ledger_id]
        try:
            self._metadata, self._version = await append_ledger_to_list(
                self._ctx,
                self._metadata,
                self._version,
                new.ledger_id,
                closed_through=before[-1] if before else -1,
            )
        except BaseException:
            await _discard(self._ctx, new)
            raise
        # The new ledger is in the list: close the old one once its adds settled (R11).
        try:
            await old.close()
        except (LedgerFencedError, LedgerClosedError) as exc:
            # Someone fenced the old ledger: a newer writer fences the new one too.
            raise self._lose(LedgerFencedError(exc.message), old.ledger_id) from None
        # An add of the old ledger that failed has stopped the writer (see _error_of).
        if self._failure is not None:
            with contextlib.suppress(BKError):
                await new.close()
            raise self._failure
        self._handle = new
        self._ledger_bytes = 0
        self._ledger_opened_at = self._loop.time()
        self._plan_roll()
        self.rollovers += 1
        log.debug("log %s: rolled over %d -> %d", self.name, old.ledger_id, new.ledger_id)

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """Wait for the appends sent so far, then close the current ledger.

        The log stays open for a next writer (which finds the ledger closed and
        has nothing to fence). A fenced writer's close only releases it.
        """
        if self._closed:
            return
        if self._rolling is not None:
            with contextlib.suppress(BKError, asyncio.CancelledError):
                await asyncio.shield(self._rolling)
        self._closed = True
        if self._failure is not None:
            if self._explaining is not None:
                self._explaining.cancel()  # nobody asks any more
            with contextlib.suppress(BKError):
                await self._handle.close()
            return
        try:
            await self._handle.close()
        except (LedgerFencedError, LedgerClosedError) as exc:
            error = self._lose(LedgerFencedError(exc.message), self._handle.ledger_id)
            raise await self._fence_explained(error) from None

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "fenced" if self.is_fenced else "closed" if self._closed else "open"
        return f"<LogWriter log={self.name} ledger={self.ledger_id} {state}>"
