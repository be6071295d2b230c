"""A streaming query copies one log into another, end to end, exactly once: the source
log rolls over every few records while the query runs, is truncated behind the query,
the query is stopped and restarted from its checkpoint, a task fails once and Spark
runs a micro-batch again; and a truncation ahead of the query, with failOnDataLoss
true and false.

The tests wait for events (the target log's record count, the query's progress,
termination), each under a bound that only says the event did not happen at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import poll_until, staging_left

import quorumlog
from quorumlog import LogNamespace
from quorumlog.log import LogConfig, Position

pytestmark = pytest.mark.spark

RECORD_BYTES = 6
RECORDS_PER_LEDGER = 4
# The writer starts a new ledger once the current one holds this many bytes: a
# rollover every RECORDS_PER_LEDGER records.
SMALL_LEDGERS = LogConfig(rollover_size_bytes=RECORDS_PER_LEDGER * RECORD_BYTES)
EVENT_TIMEOUT_S = 90.0


def record(index: int) -> bytes:
    data = b"r%05d" % index
    assert len(data) == RECORD_BYTES
    return data


def copy_query(
    spark,
    uri: str,
    source: str,
    target: str,
    checkpoint: Path,
    *,
    fail_once_on: bytes | None = None,
    marker: Path | None = None,
    available_now: bool = False,
    **read_options: str,
):
    """A streaming copy of the log ``source`` into the log ``target`` (sinkId ``copy``).
    With ``fail_once_on``, the task that meets that payload fails on its first attempt
    (``marker`` remembers it)."""
    from pyspark.sql.functions import col, udf

    @udf(returnType="binary", useArrow=False)
    def fail_once(data):
        if data == fail_once_on and marker is not None and not marker.exists():
            marker.write_text("x")
            raise RuntimeError(f"injected failure at record {data!r}")
        return data

    reader = spark.readStream.format("quorumlog").option("metadata", uri).option("log", source)
    for key, value in read_options.items():
        reader = reader.option(key, value)
    writer = (
        reader.load()
        .select(fail_once(col("data")).alias("data"))
        .writeStream.format("quorumlog")
        .option("metadata", uri)
        .option("log", target)
        .option("sinkId", "copy")
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="100 milliseconds")
    return writer.start()


def record_count(bk: quorumlog.BookKeeper, name: str) -> int:
    """What readers of the log see now (an open ledger up to its LAC)."""
    return LogNamespace(bk).open_log(name).positions().record_count


def payloads(bk: quorumlog.BookKeeper, name: str) -> list[bytes]:
    return [r.data for r in LogNamespace(bk).open_log(name).read_all()]


def wait_for_copy(query, done: Callable[[], bool], what: str) -> None:
    """Until ``done()``; a query that stopped with an error fails the wait at once."""

    def check() -> bool:
        if not query.isActive:
            error = query.exception()
            raise AssertionError(f"{what}: the query stopped ({error})")
        return done()

    poll_until(check, timeout_s=EVENT_TIMEOUT_S, what=what, interval_s=0.1)


def read_past(query, end: Position) -> None:
    """Wait until the query's progress reports a batch read up to ``end``: its sink's
    commit and Spark's commit of it in the checkpoint are done (Spark reports a batch
    after both), so stopping the query then interrupts no commit."""
    wait_for_copy(query, lambda: read_through(query) >= end, f"the query's progress at {end}")


def data_batches(query) -> list[dict[str, Any]]:
    """The query's progress reports of batches that read records, oldest first."""
    return [p for p in query.recentProgress if p["numInputRows"]]


def offset_of(progress: dict[str, Any], key: str) -> Position:
    value = progress["sources"][0][key]
    return Position.of(json.loads(value) if isinstance(value, str) else value)


def read_through(query) -> Position:
    """The end offset of the query's last batch that read records (its commit is in
    the checkpoint), or 0:0."""
    batches = data_batches(query)
    return offset_of(batches[-1], "endOffset") if batches else Position(0, 0)


def committed_batches(checkpoint: Path) -> list[int]:
    """The batch ids in the checkpoint's commit log (Spark marks a batch done there
    after the sink's commit returned)."""
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def test_streaming_copy_is_exactly_once_across_rollovers_truncation_restart_and_replay(
    spark, module_cluster, bk, tmp_path
):
    """A writer appends to eo-src in ledgers of four records while a query copies it
    into eo-dst. Mid-run eo-src is truncated at the query's committed position (whole
    ledgers deleted, the cut at the end of the writer's open ledger), and the writer
    rolls over past the cut. The query is stopped; the driver's death right after the
    sink's commit of its last batch is replayed; eo-src is truncated again, at that
    batch's start; the query restarts from its checkpoint: Spark runs that batch again,
    and a later task fails once. eo-dst ends with every record of eo-src, in order,
    once, and no ledger or staging is left behind."""
    uri = module_cluster.metadata_uri
    before = set(bk.list_ledgers())
    src = LogNamespace(bk).open_log("eo-src", SMALL_LEDGERS)
    writer = src.open_writer()
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "failed"
    written: list[bytes] = []
    positions: list[Position] = []

    def append(count: int) -> None:
        for _ in range(count):
            data = record(len(written))
            positions.append(writer.append(data))
            written.append(data)

    def start():
        return copy_query(
            spark,
            uri,
            "eo-src",
            "eo-dst",
            checkpoint,
            fail_once_on=record(100),
            marker=marker,
            maxRecordsPerTrigger="10",
        )

    query = start()
    append(40)
    # The query's committed position: the end offset of a batch in its progress.
    # Records 36..39 fill the writer's current ledger, still open: the cut is at its end.
    committed = positions[-1].next()
    assert committed.entry_id == RECORDS_PER_LEDGER
    read_past(query, committed)
    assert read_through(query) == committed and record_count(bk, "eo-dst") == 40
    removed = src.truncate(committed)
    assert len(removed) == 9 and all(p.ledger_id not in removed for p in positions[36:])
    append(40)  # the first append rolls over, past the cut
    read_past(query, positions[-1].next())
    assert record_count(bk, "eo-dst") == 80
    query.stop()

    # As if the driver died right after the sink's commit of the last batch, before
    # Spark recorded it in the checkpoint: Spark has no hook between the two, so the
    # commit log's entry goes (Spark writes it after the sink's commit returned).
    last = committed_batches(checkpoint)[-1]
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replayed = next(p for p in data_batches(query) if p["batchId"] == last)
    # The checkpoint's committed position is now that batch's start: truncate there.
    src.truncate(offset_of(replayed, "startOffset"))

    query = start()
    append(40)
    read_past(query, positions[-1].next())
    writer.close()
    query.stop()

    assert len({p.ledger_id for p in positions}) >= 30  # a rollover every four records
    assert marker.exists()  # the task failure did happen
    rerun = [p for p in data_batches(query) if p["batchId"] == last]
    assert rerun and rerun[0]["numInputRows"] == replayed["numInputRows"]  # run again
    dst = LogNamespace(bk).open_log("eo-dst")
    copied = [r.data for r in dst.read_all()]
    assert len(copied) == 120 and copied == written  # each record once, in order
    assert dst.metadata()[0].sink_batches["copy"] == committed_batches(checkpoint)[-1]
    # The truncated ledgers, the failed attempt's and the replayed batch's are deleted.
    assert set(bk.list_ledgers()) - before == set(src.ledgers()) | set(dst.ledgers())
    assert staging_left(bk) == []


@pytest.mark.parametrize("cut_entry", [0, 2], ids=["at-a-ledger-start", "mid-ledger"])
def test_a_truncation_ahead_of_the_query_fails_it_or_with_fail_on_data_loss_false_skips(
    spark, module_cluster, bk, tmp_path, cut_entry
):
    """eo-ahead-src loses records the query has not read yet. With failOnDataLoss=true
    (the default) the restarted query fails, naming the log and its position; restarted
    with false, it goes on from the earliest record left, and the target holds what
    was copied before and everything from the truncation point on, each once."""
    from pyspark.errors import StreamingQueryException

    uri = module_cluster.metadata_uri
    name, target = f"eo-ahead-{cut_entry}", f"eo-ahead-{cut_entry}-dst"
    src = LogNamespace(bk).open_log(name, SMALL_LEDGERS)
    writer = src.open_writer()
    checkpoint = tmp_path / "checkpoint"
    positions = [writer.append(record(i)) for i in range(20)]
    written = [record(i) for i in range(20)]

    def run(**options: str):
        return copy_query(
            spark,
            uri,
            name,
            target,
            checkpoint,
            available_now=True,
            maxRecordsPerTrigger="10",
            **options,
        )

    query = run()
    assert query.awaitTermination(EVENT_TIMEOUT_S)
    assert payloads(bk, target) == written
    read_up_to = offset_of(data_batches(query)[-1], "endOffset")

    for i in range(20, 60):
        positions.append(writer.append(record(i)))
        written.append(record(i))
    # Records 20..(first kept - 1) go before the query read them.
    first_kept = next(i for i, p in enumerate(positions) if i > 30 and p.entry_id == cut_entry)
    cut = positions[first_kept]
    assert read_up_to < cut
    src.truncate(cut)

    failing = run()
    with pytest.raises(StreamingQueryException) as failed:
        failing.awaitTermination(EVENT_TIMEOUT_S)
    message = str(failed.value)
    assert "LogTruncatedError" in message
    assert f"log {name}: position {read_up_to} is before the truncation point" in message
    assert payloads(bk, target) == written[:20]

    going_on = run(failOnDataLoss="false")
    assert going_on.awaitTermination(EVENT_TIMEOUT_S)
    expected = written[:20] + written[first_kept:]
    assert payloads(bk, target) == expected

    for i in range(60, 70):
        writer.append(record(i))
        expected.append(record(i))
    writer.close()
    assert run(failOnDataLoss="false").awaitTermination(EVENT_TIMEOUT_S)
    assert payloads(bk, target) == expected  # each once, in order
    assert staging_left(bk) == []
