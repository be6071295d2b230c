"""The ``quorumlog`` data source for Spark (PySpark's Python Data Source API).

Rows are ``log string, ledger_id bigint, entry_id bigint, data binary, timestamp
timestamp``: a log record's payload and append time (a ledger's raw entries, with a
null timestamp, when reading by ``ledgers``). Batch and streaming reads plan on the
driver (:mod:`quorumlog.spark.planning`) and read on executors as Arrow record
batches (:mod:`quorumlog.spark.scan`); writes go through ledgers of the tasks' own,
appended by the driver's commit (:mod:`quorumlog.spark.commit`). Everything kept on
these objects is plain data: Spark pickles them to its Python workers, which open their
own clients.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from quorumlog.client.bookkeeper import password_fits
from quorumlog.errors import InvalidArgumentError, NoSuchEntryError, NoSuchLedgerError
from quorumlog.log.errors import LogTruncatedError, NoSuchLogError
from quorumlog.log.metadata import list_log_names, read_log
from quorumlog.log.position import Position
from quorumlog.log.record_format import HEADER_BYTES
from quorumlog.spark import commit as commits
from quorumlog.spark import planning, scan
from quorumlog.spark.options import SOURCE_NAME, AtTime, Bound, ReadOptions, WriteOptions
from quorumlog.spark.writing import TaskIdentity, write_task

SCHEMA = "log string, ledger_id bigint, entry_id bigint, data binary, timestamp timestamp"
# What Spark's micro-batch execution tells each task of a streaming query.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
log = logging.getLogger(__name__)


class QuorumlogDataSource(DataSource):
    """``spark.read.format("quorumlog")``, ``readStream``, ``write`` and ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        # Spark asks for the schema when a read is defined (load()), not for writes:
        # the place to reject bad read options and missing logs before any task.
        scan.freeze_startup_objects()  # in the Python worker that answers this
        opts = ReadOptions.parse(self.options, streaming=False, lenient_stream=True)
        scan.run(_check_exists(opts))
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return QuorumlogBatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QuorumlogStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> QuorumlogWriter:
        return QuorumlogWriter(_write_options(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> QuorumlogStreamWriter:
        return QuorumlogStreamWriter(_write_options(self.options, schema, overwrite))


# ---------------------------------------------------------------- reading


def _partitions(
    log_name: str | None, ranges: Sequence[planning.EntryRange]
) -> list[InputPartition]:
    # Spark wants a list; the value is plain data so that it pickles cheaply.
    return [
        InputPartition((log_name, r.ledger_id, r.first_entry_id, r.last_entry_id)) for r in ranges
    ]


def _read_partition(opts: ReadOptions, partition: InputPartition) -> Iterator[Any]:
    value = partition.value
    if value is None:  # Spark's stand-in for "no partitions"
        return iter(())
    log_name, ledger_id, first, last = value
    scan.freeze_startup_objects()  # in a Python worker of an executor
    entry_range = planning.EntryRange(ledger_id, first, last)
    batches = scan.read_range_batches(opts.metadata_uri, opts.password, log_name, entry_range)
    if log_name is None:
        return batches  # ledgers read by id: a missing one is the user's error
    return _read_log_range(opts, log_name, entry_range, batches)


def _read_log_range(
    opts: ReadOptions, log_name: str, entry_range: planning.EntryRange, batches: Iterator[Any]
) -> Iterator[Any]:
    """A task's read of a log's range. A truncation after the driver planned the batch
    may delete the range's ledger before the task reads it: that is data loss as the
    driver's check would have seen it (LogTruncatedError naming the log, the position
    and the truncation point), or with failOnDataLoss=false a WARNING and no more
    records from this range (those still stored are read, as planned)."""
    try:
        yield from batches
    except (NoSuchLedgerError, NoSuchEntryError) as exc:
        # The ledger itself (at open), or its entries once the bookies collected it.
        try:
            cut = scan.run(_truncation_point(opts, log_name))
        except NoSuchLogError:
            if opts.fail_on_data_loss:
                raise
            log.warning("log %s was deleted; failOnDataLoss=false: reading on without it", log_name)
            return
        ledger_id = entry_range.ledger_id
        if cut is None or not ledger_id < cut.ledger_id:
            raise  # not a ledger that a truncation deletes
        begin = Position(ledger_id, entry_range.first_entry_id)
        if opts.fail_on_data_loss:
            raise LogTruncatedError(
                f"log {log_name}: position {begin} is before the truncation point {cut}; "
                f"ledger {ledger_id} was deleted after the read was planned "
                "(failOnDataLoss=false reads on without it)"
            ) from exc
        log.warning(
            "log %s: ledger %d was deleted by a truncation (before %s) after the read "
            "was planned; failOnDataLoss=false: reading on without its entries %d..%d",
            log_name,
            ledger_id,
            cut,
            entry_range.first_entry_id,
            entry_range.last_entry_id,
        )


async def _truncation_point(opts: ReadOptions, log_name: str) -> Position | None:
    bk = await scan.client_for(opts.metadata_uri)
    metadata, _ = await read_log(bk.store, log_name)
    return metadata.truncated_before


async def _check_exists(opts: ReadOptions) -> None:
    """That the logs named (not those of a pattern) or the ledgers exist."""
    bk = await scan.client_for(opts.metadata_uri)
    for name in opts.logs or ():
        await read_log(bk.store, name)
    for ledger_id in opts.ledgers or ():
        await bk.ledger_metadata(ledger_id)


async def _log_names(opts: ReadOptions) -> list[str]:
    """The logs read now: those named, or those whose names match logPattern."""
    if opts.log_pattern is None:
        return list(opts.logs or ())
    bk = await scan.client_for(opts.metadata_uri)
    return [name for name in await list_log_names(bk.store) if opts.wants(name)]


async def _snapshot(
    opts: ReadOptions,
    log_name: str,
    *,
    from_ledger_id: int = 0,
    to_ledger_id: int | None = None,
    read_lac: bool = True,
) -> tuple[Position | None, list[planning.LedgerExtent]]:
    """The truncation point and the readable extents of a log's ledgers from
    ``from_ledger_id`` on, up to ``to_ledger_id``, looked at now; without ``read_lac``,
    an open ledger's extent comes from its metadata alone (see :func:`scan.log_snapshot`)."""
    bk = await scan.client_for(opts.metadata_uri)
    metadata, extents = await scan.log_snapshot(
        bk,
        log_name,
        opts.password,
        from_ledger_id,
        to_ledger_id=to_ledger_id,
        read_lac=read_lac,
    )
    # Records end at removed_end when it is set (nothing lies between it and the
    # truncation point): an offset at a removed ledger's end lost nothing.
    cut = metadata.truncated_before if metadata.removed_end is None else metadata.removed_end
    return cut, extents


async def _ledgers_snapshot(opts: ReadOptions) -> list[planning.LedgerExtent]:
    assert opts.ledgers is not None
    bk = await scan.client_for(opts.metadata_uri)
    return await scan.ledger_snapshot(bk, opts.ledgers, opts.password)


async def _at_time(
    opts: ReadOptions, extents: Sequence[planning.LedgerExtent], timestamp_ms: int
) -> Position:
    bk = await scan.client_for(opts.metadata_uri)
    return await scan.position_at_time(bk, opts.password, extents, timestamp_ms)


def _resolve(opts: ReadOptions, bound: Bound, extents: Sequence[planning.LedgerExtent]) -> Position:
    if bound == "earliest":
        return planning.earliest(extents)
    if bound == "latest":
        return planning.latest(extents)
    if isinstance(bound, AtTime):
        # A binary search over the records' headers, on the driver (a few reads).
        return scan.run(_at_time(opts, extents, bound.timestamp_ms))
    assert isinstance(bound, Position)
    return bound


def _skipped(begin: Position, cut: Position, seen: Sequence[planning.LedgerExtent]) -> int:
    """The records in ``[begin, cut)`` this reader knows of: those of the ledgers it saw
    before they were removed, or at least the entries cut off in the cut's own ledger."""
    counted = planning.count_between(seen, begin, cut)
    below_cut = cut.entry_id - (begin.entry_id if begin.ledger_id == cut.ledger_id else 0)
    return max(counted, below_cut)


def _after_loss(
    opts: ReadOptions,
    log_name: str,
    begin: Position,
    cut: Position | None,
    seen: Sequence[planning.LedgerExtent] = (),
    *,
    warn: bool = True,
) -> tuple[Position, int]:
    """Where reading from ``begin`` goes on, and how many records were skipped: a
    position before the truncation point is LogTruncatedError, or with
    failOnDataLoss=false the truncation point itself. ``warn=False`` for a second
    look at a skip already counted and reported, whose count would be short, or one
    reported only once the query moves on."""
    if cut is None or not begin < cut:
        return begin, 0
    if opts.fail_on_data_loss:
        raise LogTruncatedError(
            f"log {log_name}: position {begin} is before the truncation point {cut}; "
            "records before it were removed (failOnDataLoss=false reads on from there)"
        )
    skipped = _skipped(begin, cut, seen)
    if warn:
        _warn_skip(log_name, begin, cut, skipped)
    return cut, skipped


def _warn_skip(log_name: str, begin: Position, cut: Position, skipped: int) -> None:
    log.warning(
        "log %s: position %s is before the truncation point %s; failOnDataLoss=false: "
        "reading on from there, %d record(s) skipped (ledgers removed before this reader "
        "saw them are not counted)",
        log_name,
        begin,
        cut,
        skipped,
    )


class QuorumlogBatchReader(DataSourceReader):
    """Plans on the driver when created: a missing log or ledger fails here, before
    any task runs."""

    def __init__(self, opts: ReadOptions) -> None:
        scan.freeze_startup_objects()  # in the Python worker that plans the read
        self.opts = opts
        partitions: list[InputPartition] = []
        if opts.ledgers is not None:
            # Each ledger on its own: every one is read up to its own last confirmed entry.
            for extent in scan.run(_ledgers_snapshot(opts)):
                start = _resolve(opts, opts.start, [extent])
                end = _resolve(opts, opts.end, [extent])
                ranges = planning.split([extent], start, end, opts.entries_per_partition)
                partitions += _partitions(None, ranges)
        else:
            for name in scan.run(_log_names(opts)):
                cut, extents = scan.run(_snapshot(opts, name))
                start = _resolve(opts, opts.start_of(name), extents)
                end = _resolve(opts, opts.end_of(name), extents)
                if opts.start_of(name) != "earliest":
                    start, _ = _after_loss(opts, name, start, cut)
                ranges = planning.split(extents, start, end, opts.entries_per_partition)
                partitions += _partitions(name, ranges)
        self._partitions = partitions

    def partitions(self) -> list[InputPartition]:
        return self._partitions

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)


class QuorumlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are bounds ``{"ledger": L, "entry": E}``, the next record to read: one
    for a read of ``log``, one per log by name for ``logs`` and ``logPattern``.

    Only confirmed records are offered (the LAC of an open ledger, nothing after
    an open ledger), so a batch never contains a record that could later vanish,
    and the same ``(start, end)`` always plans the same records. A log that appears
    in an end offset but not in the start (created while the query ran, found by
    logPattern) is read from its earliest record.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: dict[str, Position] | None = None  # Trigger.AvailableNow's end
        self._last_end: dict[str, Any] | None = None  # for PySpark's older latestOffset()
        # Kafka's source starts with 0 too: the first batch never waits for the minimum.
        self._last_batch_s = 0.0
        self._seen: dict[str, list[planning.LedgerExtent]] = {}  # the last snapshot of each
        # For the query's progress: each log's end and the records between the end of
        # the batch just planned and it, as the last latestOffset saw them.
        self._latest: dict[str, Position] = {}
        self._behind: dict[str, int] = {}
        self._skipped_of: dict[str, int] = {}  # failOnDataLoss=false: records skipped, by log
        scan.run(_check_exists(opts))  # fail on the driver if a log is missing

    @property
    def skipped_records(self) -> int:
        """failOnDataLoss=false: the records this reader skipped over, in all logs."""
        return sum(self._skipped_of.values())

    # Offsets as Spark keeps them.

    def _encode(self, positions: dict[str, Position]) -> dict[str, Any]:
        if self.opts.log is not None:
            return planning.offset_of(positions[self.opts.log])
        return planning.log_offsets_of(positions)

    def _decode(self, offset: object) -> dict[str, Position]:
        if self.opts.log is not None:
            return {self.opts.log: planning.position_of(offset)}
        return planning.log_positions_of(offset)

    def initialOffset(self) -> dict[str, Any]:
        positions: dict[str, Position] = {}
        for name in scan.run(_log_names(self.opts)):
            _, extents = scan.run(_snapshot(self.opts, name))
            positions[name] = _resolve(self.opts, self.opts.start_of(name), extents)
        return self._encode(positions)

    def getDefaultReadLimit(self) -> ReadLimit:
        # PySpark 4.3 has ReadMaxRows, ReadMaxBytes and ReadMinRows but no
        # CompositeReadLimit, and its ReadMinRows carries no maxTriggerDelay: Spark hands
        # the limit returned here back to latestOffset (or ReadAllAvailable when the
        # trigger wants everything), so the reader applies every limit of its options
        # itself whenever Spark asks for anything but ReadAllAvailable.
        opts = self.opts
        if opts.max_records_per_trigger is not None:
            return ReadMaxRows(opts.max_records_per_trigger)
        if opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(opts.max_bytes_per_trigger)
        if opts.min_records_per_trigger is not None:
            return ReadMinRows(opts.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        target: dict[str, Position] = {}
        for name in scan.run(_log_names(self.opts)):
            _, extents = scan.run(_snapshot(self.opts, name))
            target[name] = planning.latest(extents)
        self._target = target

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        # Both forms Spark calls: latestOffset(start, limit) (PySpark 4.2+, chosen since
        # the method takes parameters) and latestOffset() (before 4.2; the reader then
        # goes on from the end it returned last, with its options' limits).
        if start is None:
            given = self._last_end or self.initialOffset()
            limited = True
        else:
            given = start
            limited = not isinstance(limit, ReadAllAvailable)
        positions = self._decode(given)
        names = set(positions)
        if self.opts.log_pattern is not None:
            found = set(scan.run(_log_names(self.opts)))
            if self._target is not None:
                found &= set(self._target)  # Trigger.AvailableNow: only logs it started with
            names |= found
        begins: dict[str, Position] = {}
        extents_of: dict[str, list[planning.LedgerExtent]] = {}
        available: dict[str, int] = {}
        latest: dict[str, Position] = {}
        # Counted (and each snapshot kept for the next count) once the query moves on:
        # a reader that waits for more records is asked again from the same start.
        skipped_of: dict[str, int] = {}
        for name in sorted(names):
            known = positions.get(name)
            try:
                cut, extents = scan.run(
                    _snapshot(self.opts, name, from_ledger_id=known.ledger_id if known else 0)
                )
            except NoSuchLogError:
                if known is None:
                    continue  # matched the pattern, and was deleted since
                if self.opts.fail_on_data_loss:
                    raise
                log.warning("log %s was deleted; failOnDataLoss=false: reading on without it", name)
                continue
            if known is None:
                begin = planning.earliest(extents)  # a log new to this query
            else:
                begin, skipped_of[name] = _after_loss(
                    self.opts, name, known, cut, self._seen.get(name, ()), warn=False
                )
            top = max(begin, planning.latest(extents))
            if self._target is not None:
                # Trigger.AvailableNow reads to each log's end when it started: that is
                # the latest offset its progress reports, and its lag counts to it (as
                # Kafka's source does), so its last batch shows none.
                top = max(begin, min(top, self._target.get(name, begin)))
            latest[name] = top
            begins[name], extents_of[name] = begin, extents
            available[name] = planning.count_between(extents, begin, top)
        opts = self.opts
        if opts.log is not None and opts.log not in begins:
            self._latest, self._behind = {}, {}
            return dict(given)  # the log was deleted (failOnDataLoss=false): nothing to read
        waiting = sum(available.values())
        if (
            limited
            and opts.min_records_per_trigger is not None
            and self._target is None  # Trigger.AvailableNow must reach its end
            and waiting < opts.min_records_per_trigger
            and time.monotonic() - self._last_batch_s < opts.max_trigger_delay_s
        ):
            self._note_progress(latest, begins, extents_of)
            return dict(given)  # no batch yet: wait for more records or for the delay
        shares = dict(available)
        if limited:
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            max_rows = min(
                x for x in (max_rows, opts.max_records_per_trigger, waiting) if x is not None
            )
            shares = planning.prorate(max_rows, available)
        ends: dict[str, Position] = {}
        for name, begin in begins.items():
            extents = extents_of[name]
            ends[name] = planning.advance(extents, begin, shares[name]) if shares[name] else begin
        if limited and opts.max_bytes_per_trigger is not None and waiting:
            for name, begin in begins.items():
                if ends[name] == begin:
                    continue
                budget = max(1, opts.max_bytes_per_trigger * available[name] // waiting)
                ends[name] = scan.run(
                    _cut_by_bytes(opts, extents_of[name], begin, ends[name], budget)
                )
        if any(ends[name] != positions.get(name) for name in ends):
            self._last_batch_s = time.monotonic()
        for name, skipped in skipped_of.items():
            if begins[name] != positions[name]:
                _warn_skip(name, positions[name], begins[name], skipped)
            self._skipped_of[name] = self._skipped_of.get(name, 0) + skipped
        self._seen.update(extents_of)
        self._note_progress(latest, ends, extents_of)
        offset = self._encode(ends)
        self._last_end = offset
        return offset

    def _note_progress(
        self,
        latest: dict[str, Position],
        ends: dict[str, Position],
        extents_of: dict[str, list[planning.LedgerExtent]],
    ) -> None:
        """Each log's end and how many records lie between ``ends`` and it: arithmetic
        over the snapshot latestOffset took (ledger list, closed ledgers' last entries,
        the open ledger's LAC), one record per entry, nothing read."""
        self._latest = latest
        self._behind = {
            name: planning.count_between(extents_of[name], ends[name], latest[name])
            for name in latest
        }

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Each log's end as last seen, with how far behind it the batch just planned
        ends (:func:`planning.lag_report`): Spark shows it as the source's latestOffset
        in the query's progress, beside the batch's endOffset, and uses it for nothing
        else (it plans and checkpoints from latestOffset's answer)."""
        if not self._latest or (self.opts.log is not None and self.opts.log not in self._latest):
            return None
        skipped = None if self.opts.fail_on_data_loss else self._skipped_of
        return planning.lag_report(self._latest, self._behind, skipped, self.opts.log)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        # Planned from the offsets alone: latestOffset saw everything before ``end``
        # confirmed, while a LAC read now may answer lower (another pair of bookies);
        # cutting there would skip records, as the next batch starts at ``end``.
        begins, stops = self._decode(start), self._decode(end)
        out: list[InputPartition] = []
        for name in sorted(stops):
            stop, known = stops[name], begins.get(name)
            if known is not None and stop <= known:
                continue
            try:
                cut, extents = scan.run(
                    _snapshot(
                        self.opts,
                        name,
                        from_ledger_id=known.ledger_id if known else 0,
                        to_ledger_id=stop.ledger_id,
                        read_lac=False,
                    )
                )
            except NoSuchLogError:
                if self.opts.fail_on_data_loss:
                    raise
                log.warning("log %s was deleted; failOnDataLoss=false: reading on without it", name)
                continue
            if known is None:
                begin = planning.earliest(extents)  # a log new to this query
            else:
                # latestOffset counted and reported the skip; this only moves past it.
                begin, _ = _after_loss(self.opts, name, known, cut, warn=False)
            ranges = planning.split_planned(extents, begin, stop, self.opts.entries_per_partition)
            out += _partitions(name, ranges)
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the log keeps its records until it is truncated."""


async def _cut_by_bytes(
    opts: ReadOptions,
    extents: Sequence[planning.LedgerExtent],
    begin: Position,
    end: Position,
    budget: int,
) -> Position:
    """The end of the records of ``[begin, end)`` whose payloads fit in ``budget``
    bytes, and at least one record. A whole closed ledger counts by the length in its
    metadata (less a record header per entry); elsewhere the payloads are read here,
    on the driver (up to the budget)."""
    bk = await scan.client_for(opts.metadata_uri)
    remaining, took = budget, False
    for extent, low, high in planning.ranges_between(extents, begin, end):
        whole = extent.closed and extent.length >= 0 and low == 0 and high == extent.last_entry_id
        payload_bytes = extent.length - HEADER_BYTES * (extent.last_entry_id + 1)
        if whole and payload_bytes <= remaining:
            remaining -= payload_bytes
            took = True
            continue
        sizes = await scan.payload_sizes(
            bk, opts.password, extent.ledger_id, low, high, max(remaining, 0)
        )
        for index, size in enumerate(sizes):
            if took and size > remaining:
                return Position(extent.ledger_id, low + index)
            remaining -= size
            took = True
        if len(sizes) < high - low + 1:
            return Position(extent.ledger_id, low + len(sizes))
    return end


# ---------------------------------------------------------------- writing


@dataclass(frozen=True)
class QuorumlogCommitMessage(WriterCommitMessage):
    """One task's report: its partition, its ledger (None: no rows), the rows in it."""

    result: commits.TaskResult


def _write_options(options: Any, schema: StructType, overwrite: bool) -> WriteOptions:
    opts = WriteOptions.parse(options)
    if overwrite:
        raise InvalidArgumentError(
            f"quorumlog sink, log {opts.log}: a log is append-only; use mode('append')"
        )
    field = next((f for f in schema.fields if f.name == "data"), None)
    if field is None or not isinstance(field.dataType, BinaryType | StringType):
        found = "no data column" if field is None else f"data is {field.dataType.simpleString()}"
        raise InvalidArgumentError(
            f"quorumlog sink, log {opts.log}: needs a column data of type binary or string "
            f"({found}; columns: {', '.join(schema.names)})"
        )
    scan.run(_prepare(opts))
    return opts


async def _prepare(opts: WriteOptions) -> None:
    """Create the log if absent, and check on the driver, before any task runs, what
    every task would fail on: enough writable bookies for the option ensemble, and the
    option password being the one of the log's ledgers (a log of ledgers with two
    passwords opens with neither)."""
    bk = await scan.client_for(opts.metadata_uri)
    await commits.prepare_log(bk, opts.log)
    writable = await bk.registry.writable_bookies()
    if len(writable) < opts.ensemble:
        raise InvalidArgumentError(
            f"{SOURCE_NAME} sink, log {opts.log}: option ensemble={opts.ensemble}, but "
            f"{len(writable)} writable bookie(s) are registered"
        )
    metadata, _ = await read_log(bk.store, opts.log)
    for ledger_id in reversed(metadata.ledgers):
        try:
            md = await bk.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            continue  # deleted by a truncation under way
        if not password_fits(md, opts.password):
            raise InvalidArgumentError(
                f"{SOURCE_NAME} sink, log {opts.log}: option password is not the password "
                f"of the log's ledgers (ledger {ledger_id}); every ledger of a log needs "
                "the same one, which its readers use"
            )
        break


def _task_identity() -> TaskIdentity:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise InvalidArgumentError("quorumlog sink: write() ran outside a Spark task")
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
    return TaskIdentity(
        context.stageId(),
        context.partitionId(),
        context.attemptNumber(),
        context.getLocalProperty("spark.jobGroup.id"),
        context.getLocalProperty(QUERY_ID_PROPERTY),
        None if batch_id is None else int(batch_id),
    )


def _results(messages: Sequence[WriterCommitMessage | None]) -> list[commits.TaskResult | None]:
    return [m.result if isinstance(m, QuorumlogCommitMessage) else None for m in messages]


async def _commit(
    opts: WriteOptions,
    token: str,
    messages: Sequence[WriterCommitMessage | None],
    sink: commits.SinkBatch | None,
) -> commits.CommitOutcome:
    bk = await scan.client_for(opts.metadata_uri)
    try:
        return await commits.commit(
            bk, opts.log, token, _results(messages), password=opts.password, sink=sink
        )
    except BaseException:
        # The commit's own error is the one to report. abort deletes nothing while the
        # commit's outcome is unknown (the commit left its marker for that).
        try:
            await commits.abort(bk, opts.log, token, password=opts.password)
        except Exception as exc:
            log.warning("log %s: aborting the write failed: %s", opts.log, exc)
        raise


async def _open_staging(opts: WriteOptions, token: str) -> None:
    bk = await scan.client_for(opts.metadata_uri)
    await commits.open_staging(bk, token, opts.log)


async def _abort(opts: WriteOptions, token: str) -> None:
    bk = await scan.client_for(opts.metadata_uri)
    await commits.abort(bk, opts.log, token, password=opts.password)


class QuorumlogWriter(DataSourceArrowWriter):
    """``df.write.format("quorumlog").option("log", ...).mode("append").save()``: all
    the rows in the log, in partition order, or none of them."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.token = commits.new_write_token()
        # Opened here, on the driver, before any task: a task that straggles behind
        # the job's abort or commit finds it gone and creates nothing.
        scan.run(_open_staging(opts, self.token))

    def write(self, iterator: Iterator[Any]) -> QuorumlogCommitMessage:
        return QuorumlogCommitMessage(write_task(self.opts, self.token, _task_identity(), iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        scan.run(_commit(self.opts, self.token, messages, None))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        scan.run(_abort(self.opts, self.token))


class QuorumlogStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("quorumlog")``: each micro-batch's rows in the log exactly
    once, even when Spark runs a batch again after a restart.

    Each micro-batch stages under a name of its own query and batch id (Spark tells
    the tasks both; the driver's commit gets the batch id and learns the query from
    the tasks' reports), and the sinkId belongs to one query."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> QuorumlogCommitMessage:
        who = _task_identity()
        if who.query_id is None or who.batch_id is None:
            raise InvalidArgumentError(
                f"quorumlog streaming sink, log {self.opts.log}: Spark told the task no "
                "streaming query id and batch id"
            )
        token = commits.stream_token(who.query_id, who.batch_id)
        return QuorumlogCommitMessage(write_task(self.opts, token, who, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query_id = commits.query_of(_results(messages))
        if query_id is None:
            raise InvalidArgumentError(
                f"quorumlog streaming sink, log {self.opts.log}: batch {batchId} has no task "
                "report naming its query; nothing was committed"
            )
        sink = commits.SinkBatch(self.opts.sink_id, query_id, batchId)
        token = commits.stream_token(query_id, batchId)
        scan.run(_commit(self.opts, token, messages, sink))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        query_id = commits.query_of(_results(messages))
        if query_id is None:
            # No report says which query this is, so whose staging to clean is unknown:
            # the batch's run after a restart (same name) or the sweep of abandoned
            # writes does it.
            log.warning(
                "log %s: batch %d aborted with no task report; its staged ledgers are "
                "left for a later clean-up",
                self.opts.log,
                batchId,
            )
            return
        scan.run(_abort(self.opts, commits.stream_token(query_id, batchId)))


async def log_exists(metadata_uri: str, name: str) -> bool:
    """Whether ``name`` is a log (for the pipelines' own checks)."""
    from quorumlog.log.errors import NoSuchLogError

    bk = await scan.client_for(metadata_uri)
    try:
        await read_log(bk.store, name)
    except NoSuchLogError:
        return False
    return True
