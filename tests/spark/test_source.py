"""The quorumlog data source read by a real SparkSession (local[2]) from real bookies."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import quorumlog
from quorumlog.server.local_cluster import LocalCluster

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def bk(module_cluster: LocalCluster) -> Iterator[quorumlog.BookKeeper]:
    with quorumlog.BookKeeper(module_cluster.metadata_uri) as client:
        yield client


def write_records(bk: quorumlog.BookKeeper, name: str, counts: list[int]) -> list[bytes]:
    """A log whose ledgers hold ``counts`` records each (the last ledger left open)."""
    log = bk.open_log(name)
    writer = log.open_writer()
    records: list[bytes] = []
    for index, count in enumerate(counts):
        if index:
            writer.rollover()
        for _ in range(count):
            data = f"{name}-{len(records)}".encode()
            writer.append(data)
            records.append(data)
    return records


def read_df(spark, uri: str, **options: str):
    reader = spark.read.format("quorumlog").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_a_multi_ledger_log_in_parallel_partitions(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    records = write_records(bk, "multi", [700, 0, 450, 300])
    ledgers = bk.open_log("multi").ledgers()
    df = read_df(spark, uri, log="multi", entriesPerPartition="200")
    assert df.schema.simpleString() == (
        "struct<log:string,ledger_id:bigint,entry_id:bigint,data:binary>"
    )
    assert df.rdd.getNumPartitions() == 4 + 3 + 2  # 700, 450 and 300 entries by 200
    rows = df.collect()
    assert len(rows) == len(records)
    assert [bytes(r.data) for r in rows] == records  # log order, byte for byte
    assert {r.log for r in rows} == {"multi"}
    per_ledger = [sorted(r.entry_id for r in rows if r.ledger_id == lid) for lid in ledgers]
    assert [len(x) for x in per_ledger] == [700, 0, 450, 300]
    assert all(x == list(range(len(x))) for x in per_ledger)


def test_batch_read_stops_at_the_open_ledgers_confirmed_entries(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    log = bk.open_log("growing")
    writer = log.open_writer()
    for i in range(50):
        writer.append(b"%d" % i)
    df = read_df(spark, uri, log="growing")
    assert df.count() == 50  # planned now: exactly the confirmed records
    for i in range(50, 80):
        writer.append(b"%d" % i)
    assert read_df(spark, uri, log="growing").count() == 80  # a new read sees more
    writer.close()


def test_batch_read_of_position_ranges_and_of_ledgers(spark, module_cluster, bk):
    uri = module_cluster.metadata_uri
    write_records(bk, "ranged", [100, 100])
    first, second = bk.open_log("ranged").ledgers()
    df = read_df(
        spark,
        uri,
        log="ranged",
        startingPosition=f'{{"ledger": {first}, "entry": 90}}',
        endingPosition=f"{second}:5",
    )
    got = [(r.ledger_id, r.entry_id) for r in df.collect()]
    assert got == [(first, e) for e in range(90, 100)] + [(second, e) for e in range(5)]
    by_ledgers = read_df(spark, uri, ledgers=f"{second},{first}").collect()
    assert len(by_ledgers) == 200 and {r.log for r in by_ledgers} == {None}
    assert [r.ledger_id for r in by_ledgers[:1]] == [second]  # the order given


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"log": "no-such-log"}, "log no-such-log does not exist"),
        ({"log": "multi", "colour": "red"}, "unknown quorumlog read option"),
        ({"log": "multi", "startingPosition": "soon"}, "startingPosition"),
        ({"ledgers": "999999999"}, "ledger 999999999 does not exist"),
    ],
)
def test_bad_reads_fail_on_the_driver_before_any_task(spark, module_cluster, options, message):
    from pyspark.errors import AnalysisException

    uri = module_cluster.metadata_uri
    with pytest.raises(AnalysisException, match=message):
        read_df(spark, uri, **options)


def run_stream_to_parquet(spark, uri: str, log: str, out: Path, checkpoint: Path, **options):
    reader = spark.readStream.format("quorumlog").option("metadata", uri).option("log", log)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )


def test_streaming_query_stopped_and_restarted_while_a_writer_appends(
    spark, module_cluster, bk, tmp_path
):
    """No record lost or repeated across a stop and a restart from the checkpoint, while
    the writer keeps appending and rolls over; availableNow drains the rest."""
    uri = module_cluster.metadata_uri
    log = bk.open_log("tailed")
    writer = log.open_writer()
    for i in range(200):
        writer.append(b"t%d" % i)
    total = 2_400
    stop = threading.Event()

    def feed() -> None:
        for i in range(200, total):  # bounded: total records, about 5 ms apart
            if stop.is_set():
                return
            writer.append(b"t%d" % i)
            if i % 600 == 0:
                writer.rollover()
            time.sleep(0.005)

    feeder = threading.Thread(target=feed, name="feeder")
    feeder.start()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        for seconds in (8, 6):  # run, stop mid-stream, restart from the checkpoint
            query = (
                run_stream_to_parquet(
                    spark, uri, "tailed", out, checkpoint, maxRecordsPerTrigger="300"
                )
                .trigger(processingTime="300 milliseconds")
                .start()
            )
            time.sleep(seconds)
            query.stop()
            assert query.exception() is None
    finally:
        feeder.join(timeout=60)
        stop.set()
    assert not feeder.is_alive()
    query = (
        run_stream_to_parquet(spark, uri, "tailed", out, checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    rows = spark.read.parquet(str(out)).collect()
    got = sorted((r.ledger_id, r.entry_id, bytes(r.data)) for r in rows)
    expected = [(r.position.ledger_id, r.position.entry_id, r.data) for r in log.read_all()]
    assert len(expected) == total
    assert got == expected  # every record exactly once
    assert len(log.ledgers()) >= 4  # the stream followed the rollovers
    writer.close()


def test_streaming_follows_a_writer_change_and_reads_only_confirmed_records(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    log = bk.open_log("handover")
    first = log.open_writer()
    for i in range(30):
        first.append(b"a%d" % i)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    once = run_stream_to_parquet(spark, uri, "handover", out, checkpoint).trigger(availableNow=True)
    assert once.start().awaitTermination(120)
    second = bk.open_log("handover").open_writer()  # fences the first writer's ledger
    for i in range(20):
        second.append(b"b%d" % i)
    assert once.start().awaitTermination(120)
    data = [bytes(r.data) for r in spark.read.parquet(str(out)).collect()]
    assert sorted(data) == sorted([b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(20)])
    with pytest.raises(quorumlog.BKError):
        first.append(b"late")  # the fenced writer's append never reaches the stream
    second.close()


def test_both_forms_of_latest_offset_and_available_now_on_the_reader_itself(module_cluster, bk):
    """The stream reader as Spark drives it, called directly: ``latestOffset()`` (PySpark
    before 4.2, the reader keeps its own last end) and ``latestOffset(start, limit)``."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    uri = module_cluster.metadata_uri
    records = write_records(bk, "offsets", [40, 25])
    opts = ReadOptions.parse({"metadata": uri, "log": "offsets"}, streaming=True)

    def rows_between(reader, start, end):
        out = []
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                out += batch.column("data").to_pylist()
        return out

    old_style = QuorumlogStreamReader(
        ReadOptions.parse(
            {"metadata": uri, "log": "offsets", "maxRecordsPerTrigger": "30"}, streaming=True
        )
    )
    start = old_style.initialOffset()
    seen = []
    for _ in range(4):  # 30 + 30 + 5, then nothing new
        end = old_style.latestOffset()
        seen += rows_between(old_style, start, end)
        start = end
    assert seen == records

    new_style = QuorumlogStreamReader(opts)
    start = new_style.initialOffset()
    end = new_style.latestOffset(start, ReadMaxRows(50))
    assert rows_between(new_style, start, end) == records[:50]
    new_style.prepareForTriggerAvailableNow()  # the target: the log's end now
    writer = bk.open_log("offsets").open_writer()
    writer.append(b"after the target")
    final = new_style.latestOffset(end, ReadAllAvailable())
    assert rows_between(new_style, end, final) == records[50:]  # not the later record
    later = QuorumlogStreamReader(opts)
    assert rows_between(later, final, later.latestOffset(final, ReadAllAvailable())) == [
        b"after the target"
    ]
    assert new_style.partitions(final, final) == []
    writer.close()
