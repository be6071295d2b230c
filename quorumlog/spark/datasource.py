"""The ``quorumlog`` data source for Spark (PySpark's Python Data Source API).

Rows are ``log string, ledger_id bigint, entry_id bigint, data binary``. Batch and
streaming reads plan on the driver (:mod:`quorumlog.spark.planning`) and read on
executors as Arrow record batches (:mod:`quorumlog.spark.scan`); writes go through
ledgers of the tasks' own, appended by the driver's commit
(:mod:`quorumlog.spark.commit`). Everything kept on these objects is plain data:
Spark pickles them to its Python workers, which open their own clients.
"""

from __future__ import annotations

import logging
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
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from quorumlog.errors import InvalidArgumentError
from quorumlog.log.metadata import read_log
from quorumlog.log.position import Position
from quorumlog.spark import commit as commits
from quorumlog.spark import planning, scan
from quorumlog.spark.options import SOURCE_NAME, Bound, ReadOptions, WriteOptions
from quorumlog.spark.writing import TaskIdentity, write_task

SCHEMA = "log string, ledger_id bigint, entry_id bigint, data binary"
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
        scan.run(_snapshot(opts, check_only=True))
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


def _partitions(ranges: Sequence[planning.EntryRange]) -> list[InputPartition]:
    # Spark wants a list; the value is plain data so that it pickles cheaply.
    return [InputPartition((r.ledger_id, r.first_entry_id, r.last_entry_id)) for r in ranges]


def _read_partition(opts: ReadOptions, partition: InputPartition) -> Iterator[Any]:
    value = partition.value
    if value is None:  # Spark's stand-in for "no partitions"
        return iter(())
    ledger_id, first, last = value
    scan.freeze_startup_objects()  # in a Python worker of an executor
    return scan.read_range_batches(
        opts.metadata_uri, opts.password, opts.log, planning.EntryRange(ledger_id, first, last)
    )


async def _snapshot(
    opts: ReadOptions,
    *,
    check_only: bool = False,
    from_ledger_id: int = 0,
    to_ledger_id: int | None = None,
    read_lac: bool = True,
) -> tuple[Position | None, list[planning.LedgerExtent]]:
    """The truncation point (logs) and the readable extents (of a log's ledgers from
    ``from_ledger_id`` on, up to ``to_ledger_id``), looked at now. With ``check_only``,
    only that the log or the ledgers exist; without ``read_lac``, an open ledger's
    extent comes from its metadata alone (see :func:`scan.log_snapshot`)."""
    bk = await scan.client_for(opts.metadata_uri)
    if check_only:
        if opts.log is not None:
            await read_log(bk.store, opts.log)
        for ledger_id in opts.ledgers or ():
            await bk.ledger_metadata(ledger_id)
        return None, []
    if opts.log is not None:
        metadata, extents = await scan.log_snapshot(
            bk,
            opts.log,
            opts.password,
            from_ledger_id,
            to_ledger_id=to_ledger_id,
            read_lac=read_lac,
        )
        # Records end at removed_end when it is set (nothing lies between it and the
        # truncation point): an offset at a removed ledger's end lost nothing.
        cut = metadata.truncated_before if metadata.removed_end is None else metadata.removed_end
        return cut, extents
    assert opts.ledgers is not None
    return None, await scan.ledger_snapshot(bk, opts.ledgers, opts.password)


def _resolve(bound: Bound, extents: Sequence[planning.LedgerExtent]) -> Position:
    if bound == "earliest":
        return planning.earliest(extents)
    if bound == "latest":
        return planning.latest(extents)
    assert isinstance(bound, Position)
    return bound


def _check_not_truncated(opts: ReadOptions, start: Position, cut: Position | None) -> None:
    if cut is not None and start < cut:
        raise InvalidArgumentError(
            f"log {opts.log}: position {start} is before the truncation point {cut}; "
            "records before it were removed"
        )


class QuorumlogBatchReader(DataSourceReader):
    """Plans on the driver when created: a missing log or ledger fails here, before
    any task runs."""

    def __init__(self, opts: ReadOptions) -> None:
        scan.freeze_startup_objects()  # in the Python worker that plans the read
        self.opts = opts
        cut, extents = scan.run(_snapshot(opts))
        if opts.ledgers is not None:
            # Each ledger on its own: every one is read up to its own last confirmed entry.
            ranges: list[planning.EntryRange] = []
            for extent in extents:
                start = _resolve(opts.start, [extent])
                end = _resolve(opts.end, [extent])
                ranges += planning.split([extent], start, end, opts.entries_per_partition)
        else:
            start = _resolve(opts.start, extents)
            end = _resolve(opts.end, extents)
            if opts.start != "earliest":
                _check_not_truncated(opts, start, cut)
            ranges = planning.split(extents, start, end, opts.entries_per_partition)
        self.ranges = ranges

    def partitions(self) -> list[InputPartition]:
        return _partitions(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)


class QuorumlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are bounds ``{"ledger": L, "entry": E}``: the next record to read.

    Only confirmed records are offered (the LAC of an open ledger, nothing after
    an open ledger), so a batch never contains a record that could later vanish,
    and the same ``(start, end)`` always plans the same records.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._target: Position | None = None  # Trigger.AvailableNow's stopping point
        self._last_end: Position | None = None  # for PySpark's older latestOffset()
        scan.run(_snapshot(opts, check_only=True))  # fail on the driver if the log is missing

    def initialOffset(self) -> dict[str, int]:
        _, extents = scan.run(_snapshot(self.opts))
        return planning.offset_of(_resolve(self.opts.start, extents))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        _, extents = scan.run(_snapshot(self.opts))
        self._target = planning.latest(extents)

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        # Both forms Spark calls: latestOffset(start, limit) (PySpark 4.2+, chosen since
        # the method takes parameters) and latestOffset() (before 4.2; the reader then
        # goes on from the end it returned last, with maxRecordsPerTrigger as the limit).
        if start is None:
            begin = self._last_end or planning.position_of(self.initialOffset())
            max_records = self.opts.max_records_per_trigger
        else:
            begin = planning.position_of(start)
            max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        cut, extents = scan.run(_snapshot(self.opts, from_ledger_id=begin.ledger_id))
        _check_not_truncated(self.opts, begin, cut)
        end = planning.advance(extents, begin, max_records)
        if self._target is not None and self._target < end:
            end = max(begin, self._target)
        self._last_end = end
        return planning.offset_of(end)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        # Planned from the offsets alone: latestOffset saw everything before ``end``
        # confirmed, while a LAC read now may answer lower (another pair of bookies);
        # cutting there would skip records, as the next batch starts at ``end``.
        begin, stop = planning.position_of(start), planning.position_of(end)
        if stop <= begin:
            return []
        cut, extents = scan.run(
            _snapshot(
                self.opts,
                from_ledger_id=begin.ledger_id,
                to_ledger_id=stop.ledger_id,
                read_lac=False,
            )
        )
        _check_not_truncated(self.opts, begin, cut)
        ranges = planning.split_planned(extents, begin, stop, self.opts.entries_per_partition)
        return _partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: the log keeps its records until it is truncated."""


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
    bk = await scan.client_for(opts.metadata_uri)
    await commits.prepare_log(bk, opts.log)


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
