"""The quorumlog sink, batch and streaming: exactly once through task failures,
aborted jobs and a batch that Spark runs again after a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import staging_left

import quorumlog
from quorumlog import LogNamespace

pytestmark = pytest.mark.spark


def failing_once(marker_dir: Path, partition_to_fail: int, at_row: int, always: bool = False):
    """A row mapper that raises in one partition, at one row, on the first attempt only
    (every attempt with ``always``): the marker file remembers the failure."""

    def mapper(index: int, rows: Iterator[int]) -> Iterator[tuple[str]]:
        marker = marker_dir / f"failed-{index}"
        for count, value in enumerate(rows):
            if index == partition_to_fail and count == at_row and (always or not marker.exists()):
                marker.write_text("x")
                raise RuntimeError(f"injected failure in partition {index} at row {count}")
            yield (f"{value:06d}",)

    return mapper


def test_batch_write_appends_every_row_once_in_partition_order_after_a_task_failure(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    before = set(bk.list_ledgers())
    rows = spark.sparkContext.parallelize(range(1_000), 4).mapPartitionsWithIndex(
        failing_once(tmp_path, partition_to_fail=2, at_row=180)
    )
    df = spark.createDataFrame(rows, "data string")
    df.write.format("quorumlog").option("metadata", uri).option("log", "batch-out").mode(
        "append"
    ).save()
    assert (tmp_path / "failed-2").exists()  # the failure did happen, mid-partition
    log = LogNamespace(bk).open_log("batch-out")
    data = [r.data for r in log.read_all()]
    assert data == [b"%06d" % i for i in range(1_000)]  # all, once, in partition order
    ledgers = log.ledgers()
    assert len(ledgers) == 4 and ledgers == sorted(ledgers)
    # The failed attempt's ledger (it held rows) was deleted; nothing else is left over.
    assert set(bk.list_ledgers()) - before == set(ledgers)
    assert staging_left(bk) == []


def test_batch_write_of_a_failed_job_leaves_no_record_and_no_ledger(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    log = LogNamespace(bk).open_log("aborted-out")
    writer = log.open_writer()
    writer.append(b"kept")
    writer.close()
    before = set(bk.list_ledgers())
    rows = spark.sparkContext.parallelize(range(600), 3).mapPartitionsWithIndex(
        failing_once(tmp_path, partition_to_fail=1, at_row=120, always=True)
    )
    df = spark.createDataFrame(rows, "data string")
    with pytest.raises(Exception, match="injected failure"):
        df.write.format("quorumlog").option("metadata", uri).option("log", "aborted-out").mode(
            "append"
        ).save()
    assert [r.data for r in log.read_all()] == [b"kept"]
    assert set(bk.list_ledgers()) == before
    assert staging_left(bk) == []


def test_bad_writes_are_refused_on_the_driver(spark, module_cluster):
    from pyspark.errors import AnalysisException, PySparkException

    uri = module_cluster.metadata_uri
    numbers = spark.range(3)
    with pytest.raises((AnalysisException, PySparkException), match="column data"):
        numbers.write.format("quorumlog").option("metadata", uri).option("log", "x").mode(
            "append"
        ).save()
    texts = spark.createDataFrame([("a",)], "data string")
    with pytest.raises((AnalysisException, PySparkException), match="append-only"):
        texts.write.format("quorumlog").option("metadata", uri).option("log", "x").mode(
            "overwrite"
        ).save()


def test_a_password_or_ensemble_no_task_could_use_is_refused_on_the_driver(
    spark, module_cluster, bk
):
    """A second password in one log would leave it readable with neither; an ensemble
    larger than the bookies registered fails every task: both are refused before any
    task runs, naming the option, and nothing is written."""
    from pyspark.errors import AnalysisException, PySparkException

    uri = module_cluster.metadata_uri

    def write(value: str, **options: str) -> None:
        writer = spark.createDataFrame([(value,)], "data string").write.format("quorumlog")
        writer = writer.option("metadata", uri).option("log", "one-password")
        for key, option in options.items():
            writer = writer.option(key, option)
        writer.mode("append").save()

    write("first", password="sekret")
    ledgers = set(bk.list_ledgers())
    with pytest.raises((AnalysisException, PySparkException), match="option password is not"):
        write("second", password="other")
    with pytest.raises((AnalysisException, PySparkException), match="option ensemble=4"):
        write("third", password="sekret", ensemble="4", writeQuorum="3")
    assert set(bk.list_ledgers()) == ledgers  # no task ran
    log = LogNamespace(bk).open_log("one-password", quorumlog.LogConfig(password=b"sekret"))
    assert [r.data for r in log.read_all()] == [b"first"]
    # A read with another password fails at load(), on the driver, naming the log.
    with pytest.raises((AnalysisException, PySparkException), match="log one-password: the"):
        spark.read.format("quorumlog").option("metadata", uri).option("log", "one-password").option(
            "password", "other"
        ).load().collect()


def test_streaming_write_is_exactly_once_through_a_task_failure_and_a_replayed_batch(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    src = LogNamespace(bk).open_log("stream-src")
    writer = src.open_writer()
    for i in range(900):
        writer.append(b"%06d" % i)
    checkpoint = tmp_path / "checkpoint"
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()

    def start(max_records: str):
        from pyspark.sql.functions import col, udf

        marker = marker_dir / "failed"

        @udf(returnType="binary", useArrow=False)
        def fail_once(data):
            if data == b"000450" and not marker.exists():
                marker.write_text("x")
                raise RuntimeError("injected failure at record 450")
            return data

        return (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", "stream-src")
            .option("maxRecordsPerTrigger", max_records)
            .load()
            .select(fail_once(col("data")).alias("data"))
            .writeStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", "stream-dst")
            .option("sinkId", "copy")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    assert start("200").awaitTermination(180)
    assert (marker_dir / "failed").exists()
    dst = LogNamespace(bk).open_log("stream-dst")
    expected = [b"%06d" % i for i in range(900)]
    assert [r.data for r in dst.read_all()] == expected
    metadata, _ = dst.metadata()
    last_batch = metadata.sink_batches["copy"]
    assert last_batch >= 4  # 900 records, at most 200 per batch

    # Spark forgets it committed the last batch (as if it died right after the sink's
    # commit): the restarted query runs that batch again, and the sink skips it.
    (checkpoint / "commits" / str(last_batch)).unlink()
    (checkpoint / "commits" / f".{last_batch}.crc").unlink(missing_ok=True)
    assert start("200").awaitTermination(180)
    assert [r.data for r in dst.read_all()] == expected
    assert dst.metadata()[0].sink_batches["copy"] == last_batch

    for i in range(900, 1_000):
        writer.append(b"%06d" % i)
    assert start("1000").awaitTermination(180)
    assert [r.data for r in dst.read_all()] == [b"%06d" % i for i in range(1_000)]
    left = staging_left(bk)
    detail = [(t, bk.run(bk.aio.store.children(f"/spark-staging/{t}"))) for t in left]
    assert left == [], detail
    writer.close()


def test_r11_a_batch_write_takes_the_log_over_from_a_live_writer(spark, module_cluster, bk):
    """The commit fences the ledger a writer still holds, as open_writer does: the
    writer's confirmed records stay, before the job's rows, and its next append fails."""
    uri = module_cluster.metadata_uri
    log = LogNamespace(bk).open_log("taken-over")
    writer = log.open_writer()
    for i in range(20):
        writer.append(b"w%d" % i)
    rows = spark.createDataFrame([(b"s%d" % i,) for i in range(30)], "data binary").repartition(2)
    rows.write.format("quorumlog").option("metadata", uri).option("log", "taken-over").mode(
        "append"
    ).save()
    with pytest.raises(quorumlog.LogFencedError):
        writer.append(b"late")
    data = [r.data for r in log.read_all()]
    assert data[:20] == [b"w%d" % i for i in range(20)]
    assert sorted(data[20:]) == sorted(b"s%d" % i for i in range(30)) and len(data) == 50
    assert bk.ledger_metadata(log.ledgers()[0]).is_closed  # fenced, recovered, closed


def test_l2_a_second_query_on_a_sink_id_in_use_fails_and_no_row_is_lost(
    spark, module_cluster, bk, tmp_path
):
    """Two streaming queries copy into one log, both with the default sinkId. The second
    one's first batch does not pass for a replay of the first one's (its rows silently
    dropped): the query fails with an error naming the sinkId, and the log holds the
    first query's rows, once."""
    from pyspark.errors import StreamingQueryException

    uri = module_cluster.metadata_uri
    for source, prefix in (("l2-src-a", b"a"), ("l2-src-b", b"b")):
        writer = LogNamespace(bk).open_log(source).open_writer()
        for i in range(40):
            writer.append(prefix + b"%03d" % i)
        writer.close()

    def copy(source: str, checkpoint: Path):
        return (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", source)
            .load()
            .select("data")
            .writeStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", "l2-dst")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    assert copy("l2-src-a", tmp_path / "a").awaitTermination(180)
    first = [b"a%03d" % i for i in range(40)]
    assert sorted(r.data for r in LogNamespace(bk).open_log("l2-dst").read_all()) == first
    second = copy("l2-src-b", tmp_path / "b")
    with pytest.raises(StreamingQueryException, match="sinkId"):
        second.awaitTermination(180)
    assert sorted(r.data for r in LogNamespace(bk).open_log("l2-dst").read_all()) == first
