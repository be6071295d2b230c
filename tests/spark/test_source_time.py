"""Records' append times in Spark, read by a real SparkSession from real bookies: the
timestamp column, startingTimestamp / endingTimestamp and the per-log
...PositionsByTimestamp options (Kafka's semantics: the first record appended at or
after the time), and a watermark with a windowed count over the column."""

from __future__ import annotations

import datetime as dt

import pytest
from support import poll_until

import quorumlog
from quorumlog.log import Position

pytestmark = pytest.mark.spark

BASE_MS = 1_700_000_040_000  # 2023-11-14T22:14:00Z, a whole minute (windows align on them)


def write_timed(
    bk: quorumlog.BookKeeper, name: str, counts: list[int], *, step_ms: int = 10
) -> list[tuple[bytes, int]]:
    """A log whose ledgers hold ``counts`` records, the i-th appended at BASE_MS + i*step."""
    writer = quorumlog.LogNamespace(bk).open_log(name).open_writer()
    records: list[tuple[bytes, int]] = []
    for index, count in enumerate(counts):
        if index:
            writer.rollover()
        for _ in range(count):
            data = f"{name}-{len(records)}".encode()
            stamp = BASE_MS + len(records) * step_ms
            writer.append(data, stamp)
            records.append((data, stamp))
    writer.close()
    return records


def batch(spark, uri: str, **options: str):
    reader = spark.read.format("quorumlog").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def as_ms(value: dt.datetime) -> int:
    # PySpark gives a naive datetime in the driver's local time: .timestamp() reads it so.
    return round(value.timestamp() * 1000)


def test_rows_carry_the_payload_and_the_append_time(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    records = write_timed(bk, "stamped", [3, 2])
    df = batch(spark, uri, log="stamped")
    assert df.schema["timestamp"].dataType.simpleString() == "timestamp"
    rows = df.orderBy("ledger_id", "entry_id").collect()
    assert [(bytes(r.data), as_ms(r.timestamp)) for r in rows] == records
    # A read of ledgers gives the raw entries (header and all) and no time.
    ledger_id = rows[0].ledger_id
    raw = batch(spark, uri, ledgers=str(ledger_id)).orderBy("entry_id").collect()
    assert [r.timestamp for r in raw] == [None] * 3
    assert [bytes(r.data)[9:] for r in raw] == [d for d, _ in records[:3]]


def test_starting_and_ending_timestamp_find_the_first_record_at_or_after(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    records = write_timed(bk, "bytime", [5, 0, 5, 5])  # an empty ledger in between

    def read(**options: str) -> list[bytes]:
        df = batch(spark, uri, log="bytime", **options)
        return [bytes(r.data) for r in df.orderBy("ledger_id", "entry_id").collect()]

    data = [d for d, _ in records]
    # Record i was appended at BASE + 10 i: from 55 the first is #6, up to 125 (excl.) #12.
    assert (
        read(startingTimestamp=str(BASE_MS + 55), endingTimestamp=str(BASE_MS + 125))
        == (data[6:13])
    )
    assert read(startingTimestamp=str(BASE_MS + 60)) == data[6:]  # inclusive
    assert read(startingTimestamp=str(BASE_MS + 40)) == data[4:]  # the end of a ledger
    assert read(startingTimestamp="0") == data
    # Past the end: the end, for starting and for ending.
    assert read(startingTimestamp=str(BASE_MS + 10_000)) == []
    assert read(endingTimestamp=str(BASE_MS + 10_000)) == data
    assert read(endingTimestamp=str(BASE_MS)) == []


def test_positions_by_timestamp_per_log(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    a = write_timed(bk, "tsa", [4, 4])
    b = write_timed(bk, "tsb", [6], step_ms=100)
    df = batch(
        spark,
        uri,
        logs="tsa,tsb",
        startingPositionsByTimestamp=f'{{"tsa": {BASE_MS + 25}}}',
        endingPositionsByTimestamp=f'{{"tsb": {BASE_MS + 300}}}',
    )
    got = sorted((r.log, bytes(r.data)) for r in df.collect())
    assert got == sorted(
        [("tsa", d) for d, _ in a[3:]] + [("tsb", d) for d, _ in b[:3]]  # tsa: #3 on
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"log": "tsa", "startingTimestamp": "5", "startingPosition": "earliest"},
            "give startingPosition or startingTimestamp, not both",
        ),
        (
            {"logs": "tsa", "startingPositions": "earliest", "startingTimestamp": "5"},
            "give startingPositions or startingTimestamp, not both",
        ),
        ({"log": "tsa", "endingTimestamp": "later"}, "endingTimestamp='later'"),
    ],
)
def test_bad_time_options_fail_on_the_driver(spark, module_cluster, options, message):
    with pytest.raises(Exception, match=message):
        batch(spark, module_cluster.metadata_uri, **options).collect()


def test_a_stream_starts_at_a_timestamp(spark, module_cluster, bk, tmp_path):
    uri = module_cluster.metadata_uri
    records = write_timed(bk, "tsstream", [4, 4])
    df = (
        spark.readStream.format("quorumlog")
        .option("metadata", uri)
        .option("log", "tsstream")
        .option("startingTimestamp", str(BASE_MS + 35))
        .load()
    )
    q = (
        df.writeStream.format("memory")
        .queryName("tsstream_rows")
        .option("checkpointLocation", str(tmp_path / "c"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert q.exception() is None
    rows = spark.table("tsstream_rows").orderBy("ledger_id", "entry_id").collect()
    assert [bytes(r.data) for r in rows] == [d for d, _ in records[4:]]
    assert Position(rows[0].ledger_id, rows[0].entry_id).entry_id == 0


def test_a_watermark_and_a_windowed_count_over_the_append_time(spark, module_cluster, bk, tmp_path):
    """Append mode emits a window once the watermark (the latest time seen less 1 min)
    passed its end; a record that arrives later than that for a closed window is dropped."""
    from pyspark.sql import functions as F

    uri = module_cluster.metadata_uri
    minute = 60_000
    writer = quorumlog.LogNamespace(bk).open_log("ticks").open_writer()
    for offset_ms in (0, 10_000, 50_000, minute + 5_000, minute + 6_000):
        writer.append(b"tick", BASE_MS + offset_ms)
    df = (
        spark.readStream.format("quorumlog")
        .option("metadata", uri)
        .option("log", "ticks")
        .load()
        .withWatermark("timestamp", "1 minute")
        .groupBy(F.window("timestamp", "1 minute"))
        .count()
    )
    q = (
        df.writeStream.format("memory")
        .queryName("ticks_per_minute")
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "w"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def counts() -> dict[int, int]:
            rows = spark.table("ticks_per_minute").collect()
            return {as_ms(r.window.start) - BASE_MS: r["count"] for r in rows}

        poll_until(lambda: q.lastProgress is not None, timeout_s=60, what="a first batch")
        assert counts() == {}  # no window closed yet
        writer.append(b"tick", BASE_MS + 3 * minute + 1)  # the watermark passes minute 2
        poll_until(lambda: len(counts()) >= 2, timeout_s=60, what="minutes 0 and 1 closed")
        writer.append(b"late", BASE_MS + 20_000)  # for minute 0, closed: dropped
        writer.append(b"tick", BASE_MS + 5 * minute + 1)  # closes minute 3
        poll_until(lambda: 3 * minute in counts(), timeout_s=60, what="minute 3 closed")
        assert counts() == {0: 3, minute: 2, 3 * minute: 1}
        assert q.exception() is None
    finally:
        q.stop()
        writer.close()
