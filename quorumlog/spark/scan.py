"""The I/O of the Spark data source: snapshots of what is readable, and reading it.

The driver side (:func:`log_snapshot`, :func:`ledger_snapshot`) learns each ledger's
readable extent without fencing: a closed ledger's last entry from its metadata,
an open one's last add confirmed from its bookies (the writer carries on).

The executor side (:func:`read_range_batches`) reads one :class:`EntryRange` as
Arrow record batches, keeping the next chunk's reads in flight while Spark
consumes the current one. A Python worker process keeps one event loop thread and
one client per metadata URI across the tasks it runs (Spark reuses its Python
workers), so a task does not pay for a new metadata session and new bookie
connections.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import gc
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from quorumlog.client.bookkeeper import BookKeeper, check_password
from quorumlog.client.config import ClientConfig
from quorumlog.client.reading import ReadHandle, gather_in_order
from quorumlog.client.sync import LoopThread
from quorumlog.errors import BKError, NoSuchLedgerError, UnauthorizedError
from quorumlog.log.metadata import LogMetadata, read_log
from quorumlog.log.position import Position
from quorumlog.log.record_format import HEADER_BYTES, decode_arrow, timestamp_of
from quorumlog.spark.planning import EntryRange, LedgerExtent, search_by_time

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Entries per read_entries call on an executor, and how many such calls run ahead.
READ_CHUNK_ENTRIES = 8_192
CHUNKS_AHEAD = 2
METADATA_READS_IN_FLIGHT = 32
CALL_TIMEOUT_S = 300.0
CANCEL_MARGIN_S = 30.0

# ---------------------------------------------------------------- one loop per process

_lock = threading.Lock()
_runner: LoopThread | None = None
_clients: dict[str, BookKeeper] = {}


def _loop_thread() -> LoopThread:
    global _runner
    with _lock:
        if _runner is None:
            _runner = LoopThread("quorumlog-spark")
            atexit.register(shutdown)
        return _runner


def run(coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
    """Run ``coro`` on this process's quorumlog event loop and wait for it; after
    ``timeout_s``, cancel it and raise TimeoutError.

    Cancelled, and waited for, on the loop: a coroutine the caller gave up on must not
    carry on behind its back (a commit going on to append ledgers that the abort
    which follows a failed commit is deleting). A commit answers the cancellation
    itself: CommitOutcomeUnknownError while its compare-and-set is on its way, and
    success once it was applied (its clean-up then goes on, bounded, on the loop)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    # The margin only matters if the loop itself is stuck.
    return _loop_thread().run(bounded(), timeout_s + CANCEL_MARGIN_S)


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    return asyncio.run_coroutine_threadsafe(coro, _loop_thread().loop)


async def client_for(metadata_uri: str) -> BookKeeper:
    """This process's client for ``metadata_uri`` (opened on first use)."""
    client = _clients.get(metadata_uri)
    if client is None or client._closed:
        client = await BookKeeper.connect(metadata_uri)
        _clients[metadata_uri] = client
    return client


def max_outstanding_adds() -> int:
    """The in-flight bound of this process's clients (their ClientConfig)."""
    return ClientConfig().max_outstanding_adds


def shutdown() -> None:
    """Close this process's clients and stop its loop (at exit, and in tests)."""
    global _runner
    with _lock:
        runner, _runner = _runner, None
    if runner is None:
        return
    clients = list(_clients.values())
    _clients.clear()

    async def close_all() -> None:
        for client in clients:
            try:
                await client.close()
            except Exception:  # closing at exit: nothing more to do about it
                log.debug("closing a quorumlog client failed", exc_info=True)

    try:
        runner.run(close_all(), 10.0)
    except Exception:
        log.debug("closing quorumlog clients failed", exc_info=True)
    runner.stop()


_startup_objects_frozen = False


def freeze_startup_objects() -> None:
    """Once per process: put the objects alive now (the modules of PySpark, Arrow,
    numpy and quorumlog, the worker's own state) out of the garbage collector's reach.
    Called where the source first runs in one of Spark's Python workers: the schema,
    the planning, an executor's read.

    PySpark's worker daemon runs ``gc.collect()`` after every task, and a full
    collection walks every tracked object of the process: about 70,000 in an
    executor's Python worker, 90 ms a task, a quarter of the worker's CPU in a 1M-row
    read, and 25-35 ms of CPU per job in each worker that plans it (see
    docs/PERFORMANCE.md). Frozen objects are never collected, which is right for
    modules; freezing only once keeps what escapes collection to what the process
    held at its first call."""
    global _startup_objects_frozen
    with _lock:
        if _startup_objects_frozen:
            return
        _startup_objects_frozen = True
    gc.freeze()


# ---------------------------------------------------------------- driver: snapshots


async def _extent(
    bk: BookKeeper, ledger_id: int, first_entry_id: int, password: bytes
) -> LedgerExtent | None:
    """One ledger's extent (None if it does not exist): opened without recovery, which
    reads its metadata and, when it is open, its LAC from the bookies."""
    try:
        handle = await bk.open_ledger_no_recovery(ledger_id, password)
    except NoSuchLedgerError:
        return None
    try:
        if handle.is_closed:
            md = handle.metadata
            return LedgerExtent(ledger_id, first_entry_id, md.last_entry_id, True, md.length)
        return LedgerExtent(ledger_id, first_entry_id, handle.last_add_confirmed, False)
    finally:
        await handle.close()


async def log_snapshot(
    bk: BookKeeper,
    name: str,
    password: bytes = b"",
    from_ledger_id: int = 0,
    *,
    to_ledger_id: int | None = None,
    read_lac: bool = True,
) -> tuple[LogMetadata, list[LedgerExtent]]:
    """A log's metadata and the extents of its ledgers from ``from_ledger_id`` on (up to
    ``to_ledger_id``), in list order, up to the first open one (see
    :func:`quorumlog.spark.planning.readable`).

    A stream passes its position's ledger: each trigger then looks only at the ledgers
    it has not finished, not at the whole history of the log. Without ``read_lac`` an
    open ledger's extent is its metadata only (last entry -1): for a batch whose end
    was planned already, which needs no bookie's answer."""
    metadata, _ = await read_log(bk.store, name)
    cut = metadata.truncated_before
    wanted = [
        ledger_id
        for ledger_id in metadata.ledgers
        if ledger_id >= from_ledger_id and (to_ledger_id is None or ledger_id <= to_ledger_id)
    ]
    firsts = {
        ledger_id: (cut.entry_id if cut is not None and cut.ledger_id == ledger_id else 0)
        for ledger_id in wanted
    }
    # Metadata first, many at a time; the LAC only for the first open ledger.
    factories: list[Callable[[], Awaitable[tuple[bool, LedgerExtent | None]]]] = [
        partial(_closed_extent, bk, ledger_id, firsts[ledger_id], password) for ledger_id in wanted
    ]
    try:
        found_extents = await gather_in_order(factories, METADATA_READS_IN_FLIGHT)
    except UnauthorizedError as exc:
        # Here, on the driver, before any task runs and fails on it.
        raise UnauthorizedError(
            f"log {name}: the option password does not open its ledgers ({exc.message})"
        ) from None
    extents: list[LedgerExtent] = []
    for ledger_id, (exists, found) in zip(wanted, found_extents, strict=True):
        if not exists:
            continue  # listed but deleted: a truncation is under way
        if found is None and not read_lac:
            extents.append(LedgerExtent(ledger_id, firsts[ledger_id], -1, False))
            break
        if found is None:
            extent = await _extent(bk, ledger_id, firsts[ledger_id], password)
            if extent is None:
                continue
            extents.append(extent)
            if not extent.closed:
                break
            continue
        extents.append(found)
    return metadata, extents


async def _closed_extent(
    bk: BookKeeper, ledger_id: int, first: int, password: bytes
) -> tuple[bool, LedgerExtent | None]:
    """(whether the ledger exists, its extent if it is closed). UnauthorizedError when
    ``password`` is not the ledger's (R10)."""
    try:
        metadata = await bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return False, None
    check_password(metadata, password)
    if not metadata.is_closed:
        return True, None
    return True, LedgerExtent(ledger_id, first, metadata.last_entry_id, True, metadata.length)


async def ledger_snapshot(
    bk: BookKeeper, ledger_ids: Sequence[int], password: bytes = b""
) -> list[LedgerExtent]:
    """The extents of the given ledgers (each one on its own: an open ledger up to its
    last add confirmed). NoSuchLedgerError names a ledger that does not exist."""
    out: list[LedgerExtent] = []
    for ledger_id in ledger_ids:
        extent = await _extent(bk, ledger_id, 0, password)
        if extent is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        out.append(extent)
    return out


async def payload_sizes(
    bk: BookKeeper,
    password: bytes,
    ledger_id: int,
    first: int,
    last: int,
    budget: int,
    chunk_entries: int = 1_024,
) -> list[int]:
    """The payload sizes of the log records in entries ``first..last`` (all confirmed;
    each without its record header), in order, read in chunks until they add up to
    more than ``budget`` bytes: what maxBytesPerTrigger needs where a ledger's length
    from its metadata does not answer."""
    handle = await bk.open_ledger_no_recovery(ledger_id, password)
    handle.learn_last_add_confirmed(last)
    sizes: list[int] = []
    total = 0
    try:
        for low in range(first, last + 1, chunk_entries):
            payloads = await handle.read_payloads(low, min(last, low + chunk_entries - 1))
            for payload in payloads:
                size = len(payload) - HEADER_BYTES
                sizes.append(size)
                total += size
            if total > budget:
                break
    finally:
        await handle.close()
    return sizes


async def position_at_time(
    bk: BookKeeper, password: bytes, extents: Sequence[LedgerExtent], timestamp_ms: int
) -> Position:
    """The bound before the first record of ``extents`` appended at or after
    ``timestamp_ms`` (the end when there is none): the binary search of
    :func:`quorumlog.spark.planning.search_by_time`, reading one record header per step."""
    search = search_by_time(extents, timestamp_ms)
    handles: dict[int, ReadHandle] = {}
    lasts = {extent.ledger_id: extent.last_entry_id for extent in extents}
    try:
        probe = next(search)
        while True:
            handle = handles.get(probe.ledger_id)
            if handle is None:
                handle = await bk.open_ledger_no_recovery(probe.ledger_id, password)
                handle.learn_last_add_confirmed(lasts[probe.ledger_id])
                handles[probe.ledger_id] = handle
            entry = (await handle.read_payloads(probe.entry_id, probe.entry_id))[0]
            probe = search.send(timestamp_of(entry, probe.ledger_id, probe.entry_id))
    except StopIteration as done:
        found: Position = done.value
        return found
    finally:
        for handle in handles.values():
            await handle.close()


# ---------------------------------------------------------------- executors: reading


# Spark's TimestampType in the Arrow batches of a Python data source.
TIMESTAMP_ARROW_UNIT = "us"


def _arrow_batch(
    log_name: str | None, ledger_id: int, first_entry_id: int, entries: Sequence[bytes]
) -> pa.RecordBatch:
    """A log's records (``log_name`` set: each entry is a record, its header gives the
    timestamp and its payload the data) or a ledger's raw entries (timestamp null)."""
    # Columns built without a Python object per row where possible: repeated
    # scalars and a numpy range cost a third of building them from lists.
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    count = len(entries)
    timestamp_type = pa.timestamp(TIMESTAMP_ARROW_UNIT, tz="UTC")
    if log_name is None:
        payloads = pa.array(entries, pa.binary())
        times = pa.nulls(count, timestamp_type)
    else:
        millis, payloads = decode_arrow(entries, ledger_id, first_entry_id)
        times = pc.multiply(millis, 1000).cast(timestamp_type)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(log_name, pa.string()), count),
            pa.repeat(pa.scalar(ledger_id, pa.int64()), count),
            pa.array(np.arange(first_entry_id, first_entry_id + count, dtype=np.int64)),
            payloads,
            times,
        ],
        names=["log", "ledger_id", "entry_id", "data", "timestamp"],
    )


async def _open(metadata_uri: str, password: bytes, ledger_id: int) -> ReadHandle:
    bk = await client_for(metadata_uri)
    return await bk.open_ledger_no_recovery(ledger_id, password)


async def _read_chunk(handle: ReadHandle, first: int, last: int) -> list[bytes]:
    # Payloads only: the ids are the range's, so no Entry per row is built.
    payloads = await handle.read_payloads(first, last)
    if len(payloads) != last - first + 1:
        raise BKError(
            f"ledger {handle.ledger_id}: asked entries {first}..{last}, got {len(payloads)}"
        )
    return payloads


def read_range_batches(
    metadata_uri: str,
    password: bytes,
    log_name: str | None,
    entry_range: EntryRange,
    chunk_entries: int = READ_CHUNK_ENTRIES,
) -> Iterator[pa.RecordBatch]:
    """The entries of ``entry_range`` as record batches (log, ledger_id, entry_id, data,
    timestamp), in entry order, with up to ``CHUNKS_AHEAD`` further chunks being read meanwhile."""
    ledger_id = entry_range.ledger_id
    bounds = [
        (low, min(entry_range.last_entry_id, low + chunk_entries - 1))
        for low in range(entry_range.first_entry_id, entry_range.last_entry_id + 1, chunk_entries)
    ]
    if not bounds:
        return
    handle = run(_open(metadata_uri, password, ledger_id))
    # The driver planned this range from what it saw confirmed; this handle's own LAC
    # read may have reached bookies that know a lower one (R4: confirmed stays readable).
    handle.learn_last_add_confirmed(entry_range.last_entry_id)
    pending: list[concurrent.futures.Future[list[bytes]]] = []
    next_index = 0
    try:
        while next_index < len(bounds) or pending:
            while next_index < len(bounds) and len(pending) <= CHUNKS_AHEAD:
                low, high = bounds[next_index]
                pending.append(submit(_read_chunk(handle, low, high)))
                next_index += 1
            low = bounds[next_index - len(pending)][0]
            payloads = pending.pop(0).result(CALL_TIMEOUT_S)
            yield _arrow_batch(log_name, ledger_id, low, payloads)
    finally:
        for future in pending:
            future.cancel()
        run(handle.close())
