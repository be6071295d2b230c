"""A write task on an executor: its rows into a ledger of its own.

Each row becomes a log record (:mod:`quorumlog.log.record_format`): the header, with
the time the task sent the row's record batch, then the row's ``data``.

The task's ledger id comes from :func:`quorumlog.spark.commit.task_ledger_id` (so
ledgers sort in partition order and can be cleaned up); adds are pipelined, a
record batch at a time, while Spark produces the next batch; the ledger is closed
before the task reports, so what the driver appends never changes again (R6).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.client.writing import LedgerHandle
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.log.record_format import header
from quorumlog.spark import scan
from quorumlog.spark.commit import (
    TaskResult,
    create_task_ledger,
    keep_alive,
    open_staging,
    task_ledger_id,
)
from quorumlog.spark.options import WriteOptions

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

SUBMIT_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """Where a task sits in its job (from Spark's TaskContext)."""

    stage_id: int
    partition: int
    task_attempt: int
    # Spark's job group: a streaming query's run id, unique per start of the query,
    # while stage ids start from 0 again in a new driver.
    job_group: str | None = None
    # A streaming task's query id (the same across restarts) and micro-batch id.
    query_id: str | None = None
    batch_id: int | None = None

    @property
    def stage_key(self) -> str:
        group = "".join(c for c in (self.job_group or "") if c.isalnum() or c in "-_")
        return f"{group}-{self.stage_id}" if group else str(self.stage_id)


def data_column(batch: pa.RecordBatch, partition: int) -> list[bytes]:
    """The ``data`` column of a record batch as bytes (strings are UTF-8 encoded)."""
    import pyarrow as pa

    index = batch.schema.get_field_index("data")
    if index < 0:
        raise InvalidArgumentError(
            f"quorumlog sink: the DataFrame has no column named data (columns: "
            f"{', '.join(batch.schema.names)})"
        )
    column = batch.column(index)
    if column.null_count:
        raise InvalidArgumentError(
            f"quorumlog sink: partition {partition} has {column.null_count} row(s) whose data is "
            "null; a log record needs bytes"
        )
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [value.encode() for value in column.to_pylist()]
    # A binary column: pyarrow gives bytes (its stubs say Any).
    values: list[bytes] = column.to_pylist()
    return values


async def _open_ledger(opts: WriteOptions, token: str, who: TaskIdentity) -> LedgerHandle:
    bk = await scan.client_for(opts.metadata_uri)
    if who.batch_id is not None:
        # No driver code runs before a micro-batch's tasks: the first one opens the
        # staging. A batch write's driver opened it when the job was planned.
        await open_staging(bk, token, opts.log)
    ledger_id = await task_ledger_id(
        bk,
        token,
        opts.log,
        who.stage_key,
        who.partition,
        who.task_attempt,
        opts.max_write_partitions,
    )
    return await create_task_ledger(
        bk,
        token,
        opts.log,
        who.partition,
        ledger_id,
        opts.ensemble,
        opts.write_quorum,
        opts.ack_quorum,
        password=opts.password,
    )


async def _append_all(
    handle: LedgerHandle, records: list[bytes], in_flight: int, timestamp_ms: int
) -> None:
    """Append ``records`` as log records (record_format.py) stamped ``timestamp_ms``."""
    append = handle.append
    head = header(timestamp_ms)
    for data in records:
        if handle.outstanding_adds >= in_flight:  # a coroutine only when it must wait
            await handle.wait_for_capacity()
        append(head + data)


async def _close(handle: LedgerHandle, rows: int) -> None:
    await handle.close()
    last = handle.metadata.last_entry_id
    if last != rows - 1:
        raise BKError(
            f"ledger {handle.ledger_id}: closed with {last + 1} of the task's {rows} records; "
            "the task fails and its ledger is discarded"
        )


async def _keep_alive(opts: WriteOptions, token: str, who: TaskIdentity, ledger_id: int) -> None:
    bk = await scan.client_for(opts.metadata_uri)
    await keep_alive(bk, token, opts.log, who.partition, ledger_id)


def write_task(
    opts: WriteOptions, token: str, who: TaskIdentity, batches: Iterable[pa.RecordBatch]
) -> TaskResult:
    """Write the task's rows into its ledger and close it; the report for the driver.

    While it writes, the task's registration in the staging is kept alive (the sweep of
    abandoned writes spares a write whose tasks show life, however long it runs)."""
    handle: LedgerHandle | None = None
    heartbeat: concurrent.futures.Future[None] | None = None
    rows = 0
    in_flight = None
    # The records' append time: the task's clock when it sends a batch, never going back.
    timestamp_ms = 0
    try:
        for batch in batches:
            records = data_column(batch, who.partition)
            if not records:
                continue
            if handle is None:
                handle = scan.run(_open_ledger(opts, token, who))
                heartbeat = scan.submit(_keep_alive(opts, token, who, handle.ledger_id))
            if in_flight is not None:
                in_flight.result(SUBMIT_TIMEOUT_S)
            limit = scan.max_outstanding_adds()
            timestamp_ms = max(timestamp_ms, time.time_ns() // 1_000_000)
            in_flight = scan.submit(_append_all(handle, records, limit, timestamp_ms))
            rows += len(records)
        if in_flight is not None:
            in_flight.result(SUBMIT_TIMEOUT_S)
        if handle is None:
            return TaskResult(who.partition, None, 0, who.query_id)
        scan.run(_close(handle, rows))
        return TaskResult(who.partition, handle.ledger_id, rows, who.query_id)
    finally:
        if heartbeat is not None:
            heartbeat.cancel()


__all__ = ["TaskIdentity", "data_column", "write_task"]
