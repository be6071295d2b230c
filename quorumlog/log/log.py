"""Named log streams: a log is an ordered list of ledgers kept in the metadata store.

Example::

    async with await BookKeeper.connect(uri) as bk:
        log = await LogNamespace(bk).open_log("orders")  # created on first use
        writer = await log.open_writer()            # fences any previous writer (R11)
        position = await writer.append(b"first")    # Position(ledger_id, entry_id)
        reader = await log.open_reader()            # from the beginning, never fences
        record = await reader.read_next(timeout_ms=1000)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial
from typing import TYPE_CHECKING

from quorumlog.core.log_metadata import decide_seal, decide_truncate
from quorumlog.errors import (
    BKError,
    MetadataVersionError,
    NoNodeError,
    NoSuchLedgerError,
)
from quorumlog.log.config import LogConfig
from quorumlog.log.context import LedgerClient, LogContext
from quorumlog.log.errors import NoSuchLogError
from quorumlog.log.metadata import (
    LogMetadata,
    check_log_name,
    create_log_if_absent,
    list_log_names,
    log_path,
    read_log,
)
from quorumlog.log.metadata_updates import log_view, update_log
from quorumlog.log.position import LogPositions, Position, Record
from quorumlog.log.reader import LogReader
from quorumlog.log.record_format import record_of
from quorumlog.log.writer import LogWriter, fence_previous_ledgers, open_writer

if TYPE_CHECKING:
    from quorumlog.client.writing import LedgerHandle
    from quorumlog.meta.ledger_metadata import LedgerMetadata
    from quorumlog.meta.store import MetadataStore, Watch

log = logging.getLogger(__name__)

# Compare-and-set attempts of fence, truncate and delete against concurrent list changes.
_CAS_ATTEMPTS = 50
# While a truncation waits for a rollover to close a ledger: a look at its metadata at
# least this often, in case the watch missed the change.
_CLOSE_POLL_S = 0.25


class Log:
    """One named log on a client (see :class:`~quorumlog.log.namespace.LogNamespace`)."""

    def __init__(self, bk: LedgerClient, name: str, config: LogConfig | None = None) -> None:
        # What its writer and readers use; they do not refer to this object.
        self.ctx = LogContext(bk, check_log_name(name), config or LogConfig())

    @property
    def bk(self) -> LedgerClient:
        return self.ctx.bk

    @property
    def name(self) -> str:
        return self.ctx.name

    @property
    def config(self) -> LogConfig:
        return self.ctx.config

    @property
    def store(self) -> MetadataStore:
        return self.ctx.store

    @property
    def path(self) -> str:
        """Where the ledger list lives in the metadata store."""
        return log_path(self.name)

    async def metadata(self) -> tuple[LogMetadata, int]:
        """The ledger list (and truncation point) with its version."""
        return await read_log(self.store, self.name)

    async def ledgers(self) -> list[int]:
        """The log's ledgers, oldest first."""
        metadata, _ = await self.metadata()
        return list(metadata.ledgers)

    async def create_ledger(self) -> LedgerHandle:
        """A new ledger with this log's settings (tagged with the log's name)."""
        return await self.ctx.create_ledger()

    # ------------------------------------------------------------ writing and reading

    async def open_writer(self) -> LogWriter:
        """Become the log's writer: fence the previous one, add a ledger (R11)."""
        return await open_writer(self.ctx)

    async def open_reader(self, start: Position | tuple[int, int] | None = None) -> LogReader:
        """A tailing reader of every record at or after ``start`` (None: the beginning)."""
        reader = LogReader(self.ctx, None if start is None else Position.of(start))
        await reader._open()
        return reader

    async def fence(self) -> list[int]:
        """Fence and close the ledgers a writer may still hold, without becoming the writer.

        Afterwards the log holds exactly what it will hold until a next writer opens:
        the current writer (if any) gets LogFencedError on its next append.
        Returns the ledgers fenced.

        First the list is sealed (its ``fences`` count raised with a compare-and-set):
        a writer rolling over afterwards loses its own compare-and-set of the list and
        stops, even when the ledger it leaves was closed exactly where it would have
        closed it. Then every ledger of the sealed list that is not closed is fenced.
        The seal goes through the log's one update path (``log/metadata_updates.py``):
        a seal whose reply was lost is not applied twice, and one whose outcome cannot
        be told fails with LogOutcomeUnknownError (R13).
        """
        metadata, version = await self.metadata()
        sealed = await update_log(
            self.store,
            self.name,
            partial(decide_seal, base=log_view(metadata)),
            what="sealing the list",
            attempts=_CAS_ATTEMPTS,
            known=(metadata, version),
        )
        return await fence_previous_ledgers(self.ctx, sealed.metadata)

    async def read_all(self, *, fence: bool = False) -> list[Record]:
        """Every record of the log, read ledger by ledger (up to each ledger's LAC when
        it is still open). With ``fence``, :meth:`fence` first, so the result is final."""
        if fence:
            await self.fence()
        metadata, _ = await self.metadata()
        cut = metadata.truncated_before
        out: list[Record] = []
        for ledger_id in metadata.ledgers:
            handle = await self.bk.open_ledger_no_recovery(ledger_id, self.config.password)
            try:
                md = handle.metadata
                last = md.last_entry_id if md.is_closed else handle.last_add_confirmed
                first = cut.entry_id if cut is not None and cut.ledger_id == ledger_id else 0
                step = self.config.read_batch_entries
                for low in range(first, last + 1, step):
                    for entry in await handle.read_entries(low, min(last, low + step - 1)):
                        out.append(record_of(ledger_id, entry.entry_id, entry.data))
            finally:
                await handle.close()
        return out

    async def positions(self) -> LogPositions:
        """The first and last positions and the number of records between them."""
        metadata, _ = await self.metadata()
        cut = metadata.truncated_before
        first: Position | None = None
        last: Position | None = None
        count = 0
        exact = True
        for ledger_id in metadata.ledgers:
            end = await self._written_end(ledger_id)
            if end is None:
                continue
            top = end[0] - 1
            exact = exact and end[1]
            bottom = cut.entry_id if cut is not None and cut.ledger_id == ledger_id else 0
            if top >= bottom:
                if first is None:
                    first = Position(ledger_id, bottom)
                last = Position(ledger_id, top)
                count += top - bottom + 1
        return LogPositions(first, last, count, exact, metadata.ledgers)

    # ------------------------------------------------------------ truncation

    async def truncate(self, before: Position | tuple[int, int]) -> list[int]:
        """Remove the ledgers that lie wholly before ``before`` from the list (CAS), then
        delete them. ``before``'s ledger must be in the log; its records before
        ``before`` stay stored but readers no longer return them. Returns the ledgers
        removed. Readers asking for a removed position get LogTruncatedError.

        The list changes through the log's one update path (``log/metadata_updates.py``):
        a truncation whose reply was lost is found applied when the list is read again,
        and is neither applied again nor reported failed (R13)."""
        cut = Position.of(before)
        metadata, version = await self.metadata()
        removed_end = written_end = None
        if cut.ledger_id in metadata.ledgers:
            # From the closed ledgers just before the cut's: later lists hold the same
            # ones (or fewer, truncated), and a closed ledger never changes.
            removed_end = await self._removed_end(metadata, cut)
            end = await self._written_end(cut.ledger_id)
            written_end = None if end is None else end[0]
        done = await update_log(
            self.store,
            self.name,
            partial(decide_truncate, before=cut, removed_end=removed_end, written_end=written_end),
            what=f"truncating before {cut}",
            attempts=_CAS_ATTEMPTS,
            known=(metadata, version),
        )
        # The ledgers this truncation removed from the list: those before the cut in the
        # list it changed; when a read settled it after a write with no answer, those of
        # the list first read (any removed since were removed before the cut, by it or
        # by another truncation, and are deleted by either). Settled with no write of
        # its own: truncated there already, nothing removed.
        changed = done.applied_to
        if changed is None and done.in_doubt:
            changed = metadata
        if changed is None:
            return []
        kept = set(done.metadata.ledgers)
        removed = [x for x in changed.ledgers if x < cut.ledger_id and x not in kept]
        await self._delete_ledgers(removed)
        return removed

    async def _written_end(self, ledger_id: int) -> tuple[int, bool] | None:
        """The entry after the last one ``ledger_id`` holds, and whether that is final:
        its last entry once closed, its last add confirmed while open (a record
        confirmed since is at or after it). None when the ledger is gone."""
        try:
            md = await self.bk.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return None
        if md.is_closed:
            return md.last_entry_id + 1, True
        handle = await self.bk.open_ledger_no_recovery(ledger_id, self.config.password)
        try:
            return handle.last_add_confirmed + 1, False
        finally:
            await handle.close()

    async def _removed_end(self, metadata: LogMetadata, cut: Position) -> Position | None:
        """Where the records before ``cut`` end, when that is below ``cut``: the position
        after the last record of the closed ledgers just before a cut at a ledger's first
        entry (empty closed ledgers hold none). None when unknown (a ledger gone, or
        still open) or ``cut`` itself. A reader checkpointed there lost nothing to the cut.

        A ledger still open there has a later one listed: a rollover is under way (its
        writer closes the old ledger once its adds settle), or its writer died
        mid-rollover. The truncation waits for the close, up to
        ``truncate_close_wait_ms``: the old ledger's end is known only once it is closed."""
        if cut.entry_id != 0:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.truncate_close_wait_ms / 1000
        end: Position | None = None
        for ledger_id in reversed([x for x in metadata.ledgers if x < cut.ledger_id]):
            md = await self._closed_metadata(ledger_id, deadline)
            if md is None:
                break
            end = Position(ledger_id, md.last_entry_id + 1)
            if md.last_entry_id >= 0:
                break
        return end

    async def _closed_metadata(self, ledger_id: int, deadline: float) -> LedgerMetadata | None:
        """The ledger's metadata once it is closed, waiting until ``deadline`` (the
        loop's time) for a close; None if it is gone or still open then."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        watch: Watch | None = None
        try:
            for _ in range(1_000_000):  # bounded by the deadline
                changed.clear()  # before the read: a change after it wakes the wait
                try:
                    md = await self.bk.ledger_metadata(ledger_id)
                except NoSuchLedgerError:
                    return None
                if md.is_closed:
                    return md
                left = deadline - loop.time()
                if left <= 0:
                    break
                if watch is None:
                    watch = self.bk.ledgers.watch(ledger_id, lambda _md: changed.set())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, _CLOSE_POLL_S))
        finally:
            if watch is not None:
                watch.cancel()
        log.info(
            "log %s: ledger %d before the truncation point is still open after %d ms (a "
            "writer died mid-rollover?): where its records end is not recorded, and "
            "positions in it count as truncated",
            self.name,
            ledger_id,
            self.config.truncate_close_wait_ms,
        )
        return None

    async def _delete_ledgers(self, ledger_ids: list[int]) -> None:
        for ledger_id in ledger_ids:
            try:
                await self.bk.delete_ledger(ledger_id, self.config.password)
            except NoSuchLedgerError:
                continue
            except BKError as exc:
                log.warning("log %s: ledger %d not deleted: %s", self.name, ledger_id, exc)

    def __repr__(self) -> str:
        return f"<Log {self.name}>"


async def open_log(bk: LedgerClient, name: str, config: LogConfig | None = None) -> Log:
    """The log ``name`` on ``bk``, created (empty) if it does not exist."""
    check_log_name(name)
    await create_log_if_absent(bk.store, name)
    return Log(bk, name, config)


async def list_logs(bk: LedgerClient) -> list[str]:
    """Names of the logs in the store, sorted."""
    return await list_log_names(bk.store)


async def delete_log(bk: LedgerClient, name: str) -> list[int]:
    """Delete a log: its list first (a writer then fails), then its ledgers.

    Returns the ledgers deleted. NoSuchLogError if the log does not exist.
    """
    path = log_path(name)
    for _ in range(_CAS_ATTEMPTS):
        metadata, version = await read_log(bk.store, name)
        try:
            await bk.store.delete(path, version)
        except MetadataVersionError:
            continue
        except NoNodeError:
            raise NoSuchLogError(f"log {name} does not exist ({path})") from None
        await Log(bk, name)._delete_ledgers(list(metadata.ledgers))
        return list(metadata.ledgers)
    raise BKError(f"log {name}: could not be deleted ({path} kept changing)")
