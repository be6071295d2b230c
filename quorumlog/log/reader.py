"""A tailing reader of a log stream.

The reader never fences: it opens each ledger without recovery and reads up to
the LAC its bookies report. It reads a ledger until the ledger is closed and read
to its last entry, then moves to the next ledger of the list. While it is caught
up on a ledger still being written it long-polls the bookies for the next entry,
so a record is seen a few milliseconds after its confirmation even when the writer
then goes idle (the writer's explicit LAC wakes the poll).

Two watches keep it moving without polling the metadata: one on the log's ledger
list (a rollover or a new writer appended a ledger, a truncation removed some) and
one on the current ledger (closed by its writer, or by a new writer's recovery).
A change wakes a pending long poll at once. Each wait is bounded (``long_poll_ms``)
and followed by a fresh look at the list and the ledger, so a missed event costs
at most that long.

Positions: a reader from position ``p`` returns every record at or after ``p``, in
order. Records before the log's truncation point are gone: asking for them raises
:class:`LogTruncatedError`. A position after every removed record (the end of the
last ledger removed, say, where a reader that had read it stood) lost nothing: the
reader resumes at the truncation point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from quorumlog.errors import BKError, InvalidArgumentError, NoSuchLedgerError, UnauthorizedError
from quorumlog.log.context import LogContext
from quorumlog.log.errors import (
    LogClosedError,
    LogRecordFormatError,
    LogTruncatedError,
    NoSuchLogError,
)
from quorumlog.log.metadata import LogMetadata, log_path, read_log
from quorumlog.log.position import Position, Record
from quorumlog.log.record_format import record_of

if TYPE_CHECKING:
    from quorumlog.client.reading import ReadHandle
    from quorumlog.meta.ledger_metadata import LedgerMetadata
    from quorumlog.meta.store import Watch, WatchEvent

log = logging.getLogger(__name__)

# How long to wait before trying again after a read failed (a bookie down, say).
RETRY_DELAY_S = 0.1


class LogReader:
    """Reads a log in order from a start position, then follows it as it grows.

    Example::

        reader = await log.open_reader()             # from the beginning
        record = await reader.read_next(timeout_ms=1000)   # Record or None
        async for record in reader:                  # waits for new records
            print(record.position, record.data)
    """

    def __init__(self, ctx: LogContext, start: Position | None) -> None:
        self._ctx = ctx
        self._bk = ctx.bk
        self._loop = asyncio.get_running_loop()
        self._start = start
        self._next: Position = start if start is not None else Position(0, 0)
        self._metadata: LogMetadata | None = None
        self._list_stale = True
        self._buffer: deque[Record] = deque()
        self._handle: ReadHandle | None = None
        self._changed = asyncio.Event()
        self._list_watch: Watch | None = None
        self._ledger_watch: Watch | None = None
        self._closed = False
        self._last_look = self._loop.time()
        self.records_read = 0
        # Loop times of the last answer of a bookie, of the metadata store, and of the
        # last step that learnt that nothing confirmed lay beyond what it had fetched.
        self._bookie_s: float | None = None
        self._store_s: float | None = None
        self._frontier_s: float | None = None
        self._news_s: float | None = None  # the last step that fetched new entries

    async def _open(self) -> None:
        """Read the list and check the start position (called by :meth:`Log.open_reader`)."""
        self._list_watch = self._ctx.store.watch(log_path(self._ctx.name), self._on_list_event)
        await self._refresh_list()
        assert self._metadata is not None
        cut = self._metadata.truncated_before
        if cut is not None and (self._start is None or self._next < cut):
            if self._start is not None and self._metadata.is_truncated(self._start):
                await self.close()
                raise LogTruncatedError(
                    f"log {self._ctx.name}: position {self._start} is before the truncation "
                    f"point {cut}; records before it were removed"
                )
            self._next = cut

    # ------------------------------------------------------------ state

    @property
    def position(self) -> Position:
        """The position of the next record this reader returns (or a lower bound of it:
        a record at or after it)."""
        if self._buffer:
            return self._buffer[0].position
        return self._next

    @property
    def name(self) -> str:
        return self._ctx.name

    @property
    def buffered(self) -> int:
        """How many records were fetched and not yet returned."""
        return len(self._buffer)

    def _listed_s(self) -> float | None:
        """By when the ledger read was known to be the one written: the metadata store
        answered (a new writer's ledger would be listed there), or new entries came
        from it while it was open (its writer was still adding them: a new writer
        fences a ledger before it writes its own)."""
        known = [t for t in (self._store_s, self._news_s) if t is not None]
        return max(known) if known else None

    @property
    def contact_s(self) -> float | None:
        """The loop time by which the reader was last in contact with the log: its
        bookies answered, and the ledger read was still the one written (see
        :meth:`_listed_s`). None before it was. A reader cut off from the bookies or
        the store stops moving it on."""
        listed = self._listed_s()
        if self._bookie_s is None or listed is None:
            return None
        return min(self._bookie_s, listed)

    @property
    def caught_up_s(self) -> float | None:
        """The loop time at which this reader had fetched every record confirmed then:
        once the records fetched are all returned and handled, the reader's copy is no
        older than this. None before it knew."""
        listed = self._listed_s()
        if self._frontier_s is None or listed is None:
            return None
        return min(self._frontier_s, listed)

    # ------------------------------------------------------------ reading

    async def read_next(self, timeout_ms: float | None = None) -> Record | None:
        """The next record, waiting up to ``timeout_ms`` for it (None: no limit).

        ``timeout_ms <= 0`` waits for nothing but still reads: it returns the next
        record readable now (read from the bookies if it is not buffered: a closed
        ledger's records, an open ledger's up to the LAC its bookies report now), and
        None if there is none. Returns None when the time is up. Raises
        LogTruncatedError when the next record was truncated away, NoSuchLogError when
        the log was deleted, LogRecordFormatError when an entry is not a log record.
        """
        now_only = timeout_ms is not None and timeout_ms <= 0
        deadline = None if timeout_ms is None else self._loop.time() + timeout_ms / 1000
        for _ in range(1_000_000):  # bounded; each turn reads, moves on, or waits
            if self._buffer:
                record = self._buffer.popleft()
                self.records_read += 1
                return record
            if self._closed:
                raise LogClosedError(f"log {self._ctx.name}: reader is closed")
            if deadline is not None and not now_only and self._loop.time() >= deadline:
                return None
            try:
                moved = await self._step(deadline)
            except (
                LogTruncatedError,
                LogRecordFormatError,
                NoSuchLogError,
                LogClosedError,
                UnauthorizedError,
                InvalidArgumentError,
            ):
                raise  # retrying cannot help
            except BKError as exc:
                # A bookie or the store failed for now: try again, within the time allowed.
                log.debug("log %s: read at %s failed: %s", self._ctx.name, self._next, exc)
                await self._drop_handle()
                self._list_stale = True
                if now_only:
                    return None
                await self._sleep_until(deadline, RETRY_DELAY_S)
                continue
            if now_only and not moved and not self._buffer:
                return None  # nothing more is readable without waiting
        return None

    async def read_available(self, max_records: int = 10_000) -> list[Record]:
        """The records readable now, without waiting (up to ``max_records``): those
        buffered, then what the bookies serve now (see ``read_next(timeout_ms=0)``)."""
        out: list[Record] = []
        while len(out) < max_records:
            record = await self.read_next(timeout_ms=0)
            if record is None:
                break
            out.append(record)
        return out

    def take_buffered(self, max_records: int = 10_000) -> list[Record]:
        """The records this reader has already fetched and not yet returned (up to
        ``max_records``), with no I/O at all: for a caller that applies a record and
        whatever arrived with it in one go, and must not wait on a bookie meanwhile."""
        out: list[Record] = []
        while self._buffer and len(out) < max_records:
            out.append(self._buffer.popleft())
        self.records_read += len(out)
        return out

    def __aiter__(self) -> LogReader:
        return self

    async def __anext__(self) -> Record:
        if self._closed:
            raise StopAsyncIteration
        try:
            record = await self.read_next(None)
        except LogClosedError:
            raise StopAsyncIteration from None
        assert record is not None
        return record

    # ------------------------------------------------------------ one step

    async def _step(self, deadline: float | None) -> bool:
        """Read what is readable, move to the next ledger, or wait for news. Whether it
        moved (read records, changed ledger, learnt of more) rather than only waited: a
        call that may not wait stops at the first step that did not move."""
        # Cleared before looking at any state, so a change made after this point wakes
        # the wait below instead of being lost.
        self._changed.clear()
        if self._list_stale:
            await self._refresh_list()
        metadata = self._metadata
        assert metadata is not None
        cut = metadata.truncated_before
        if cut is not None and self._next < cut:
            if metadata.is_truncated(self._next):
                raise LogTruncatedError(
                    f"log {self._ctx.name}: the reader is at {self._next}, but records "
                    f"before {cut} were truncated"
                )
            self._next = cut  # nothing lies between: the reader missed no record
        ledger_id = metadata.first_ledger_from(self._next.ledger_id)
        if ledger_id is None:
            return await self._wait(deadline)  # nothing written there yet
        if ledger_id != self._next.ledger_id:
            self._next = Position(ledger_id, 0)
        handle = await self._handle_for(ledger_id)
        if handle is None:
            return True  # gone from the list: the next step looks at the list read
        md = handle.metadata
        limit = md.last_entry_id if md.is_closed else handle.last_add_confirmed
        entry_id = self._next.entry_id
        if entry_id <= limit:
            last = min(limit, entry_id + self._ctx.config.read_batch_entries - 1)
            entries = await handle.read_entries(entry_id, last)
            self._bookie_s = self._loop.time()
            if not md.is_closed:  # its writer was still adding them
                self._news_s = self._bookie_s
            # All decoded before any is buffered: a bad entry leaves the reader where it was.
            self._buffer.extend([record_of(ledger_id, e.entry_id, e.data) for e in entries])
            self._next = Position(ledger_id, entry_id + len(entries))
            return bool(entries)
        if md.is_closed:
            following = metadata.next_ledger(ledger_id)
            if following is None:
                return await self._wait(deadline)  # closed, and no ledger added yet
            await self._drop_handle()
            self._next = Position(following, 0)
            return True
        return await self._long_poll(handle, entry_id, deadline)

    async def _long_poll(self, handle: ReadHandle, entry_id: int, deadline: float | None) -> bool:
        wait_ms = float(self._ctx.config.long_poll_ms)
        if deadline is not None:
            wait_ms = min(wait_ms, (deadline - self._loop.time()) * 1000)
        if wait_ms <= 0:
            # No time to wait (read_next(0)): ask the bookies for their LAC once, so
            # that what they confirmed since is readable now.
            lac = await handle.read_last_add_confirmed()
            self._bookie_s = now = self._loop.time()
            if lac < entry_id:
                self._frontier_s = now
            return lac >= entry_id
        poll = asyncio.ensure_future(
            handle.read_last_add_confirmed_and_entry(entry_id, max(1, int(wait_ms)))
        )
        news = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({poll, news}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()
        if not poll.done():
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, BKError):
                await poll
            await self._look_again(forced=True)  # the list or the ledger changed
            return True
        lac, entry = poll.result()  # a BKError here is handled by read_next
        self._bookie_s = now = self._loop.time()
        if entry is None:
            self._frontier_s = now  # nothing confirmed beyond what is fetched
        if entry is not None and self._next == Position(handle.ledger_id, entry_id):
            self._buffer.append(record_of(handle.ledger_id, entry_id, entry.data))
            self._next = Position(handle.ledger_id, entry_id + 1)
            self._news_s = now
            if lac <= entry_id:
                self._frontier_s = now  # the entry fetched was the last confirmed
            return True
        if entry is None:
            # No news within the poll: now and then, look at the ledger and the list
            # again in case a watch event was missed.
            await self._look_again(forced=False)
        return False

    async def _look_again(self, *, forced: bool) -> None:
        """Re-read the current ledger's metadata and mark the list stale: at once after
        an event, else at most once per ``long_poll_ms``."""
        now = self._loop.time()
        if not forced and now - self._last_look < self._ctx.config.long_poll_ms / 1000:
            return
        self._last_look = now
        self._list_stale = True
        if self._handle is not None:
            await self._refresh_handle(self._handle)

    async def _refresh_handle(self, handle: ReadHandle) -> None:
        try:
            await handle.refresh_metadata()
        except NoSuchLedgerError:
            self._list_stale = True
            await self._drop_handle()
        self._store_s = self._loop.time()

    async def _wait(self, deadline: float | None) -> bool:
        """Wait for a change of the list (or of the ledger), at most ``long_poll_ms``;
        whether one came."""
        wait_s = self._ctx.config.long_poll_ms / 1000
        if deadline is not None:
            wait_s = min(wait_s, deadline - self._loop.time())
        if wait_s > 0 and not self._changed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), wait_s)
        news = self._changed.is_set()
        await self._look_again(forced=news)
        return news

    async def _sleep_until(self, deadline: float | None, delay_s: float) -> None:
        if deadline is not None:
            delay_s = min(delay_s, max(0.0, deadline - self._loop.time()))
        if delay_s > 0:
            await asyncio.sleep(delay_s)

    # ------------------------------------------------------------ list and handles

    async def _refresh_list(self) -> None:
        self._list_stale = False
        try:
            self._metadata, _ = await read_log(self._ctx.store, self._ctx.name)
            self._store_s = self._loop.time()
        except NoSuchLogError:
            raise NoSuchLogError(
                f"log {self._ctx.name} was deleted (reader at {self._next})"
            ) from None

    async def _handle_for(self, ledger_id: int) -> ReadHandle | None:
        if self._handle is not None and self._handle.ledger_id == ledger_id:
            return self._handle
        await self._drop_handle()
        try:
            handle = await self._bk.open_ledger_no_recovery(ledger_id, self._ctx.config.password)
        except NoSuchLedgerError:
            # Deleted by a truncation, or by a writer that lost the race to add it.
            await self._refresh_list()
            assert self._metadata is not None
            if ledger_id in self._metadata.ledgers:
                raise
            return None
        self._handle = handle
        if not handle.is_closed:
            self._ledger_watch = self._bk.ledgers.watch(ledger_id, self._on_ledger_change)
        return handle

    async def _drop_handle(self) -> None:
        if self._ledger_watch is not None:
            self._ledger_watch.cancel()
            self._ledger_watch = None
        handle, self._handle = self._handle, None
        if handle is not None:
            await handle.close()

    def _on_list_event(self, event: WatchEvent) -> None:
        self._list_stale = True
        self._changed.set()

    def _on_ledger_change(self, metadata: LedgerMetadata | None) -> None:
        self._changed.set()

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """Stop following the log and release the ledger handle."""
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        if self._list_watch is not None:
            self._list_watch.cancel()
            self._list_watch = None
        await self._drop_handle()

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<LogReader log={self._ctx.name} at {self.position}>"


__all__ = ["LogReader"]
