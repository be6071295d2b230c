"""The source's Kafka-like options, read by a real SparkSession from real bookies:
admission control, positions per log, several logs, failOnDataLoss, the latest offset
in the query's progress."""

from __future__ import annotations

import json
import logging
import time

import pytest
from support import poll_until

import quorumlog
from quorumlog.log import Position

pytestmark = pytest.mark.spark


def write_log(
    bk: quorumlog.BookKeeper, name: str, counts: list[int], *, close: bool = False
) -> list[bytes]:
    """A log whose ledgers hold ``counts`` records of 10 bytes each (``name`` padded)."""
    writer = quorumlog.LogNamespace(bk).open_log(name).open_writer()
    records: list[bytes] = []
    for index, count in enumerate(counts):
        if index:
            writer.rollover()
        for _ in range(count):
            data = f"{name[:4]}{len(records):06d}".encode()
            assert len(data) == 10
            writer.append(data)
            records.append(data)
    if close:
        writer.close()
    return records


def stream(spark, uri: str, **options: str):
    reader = spark.readStream.format("quorumlog").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def batch(spark, uri: str, **options: str):
    reader = spark.read.format("quorumlog").option("metadata", uri)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def to_memory(df, name: str, checkpoint):
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
    )


def drain(df, name: str, checkpoint):
    """A Trigger.AvailableNow query into the memory table ``name``, run to its end,
    which it must reach without an error."""
    q = to_memory(df, name, checkpoint).trigger(availableNow=True).start()
    assert q.awaitTermination(120)
    assert q.exception() is None
    return q


def batch_sizes(query) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def rows_of(spark, table: str) -> list[tuple[str, bytes]]:
    return sorted((r.log, bytes(r.data)) for r in spark.table(table).collect())


# ---------------------------------------------------------------- admission control


def test_available_now_honours_max_records_and_max_bytes(spark, module_cluster, bk, tmp_path):
    uri = module_cluster.metadata_uri
    records = write_log(bk, "admit", [20, 80])  # the first ledger closed, the last open
    q = drain(
        stream(spark, uri, log="admit", maxRecordsPerTrigger="30"), "admit_rows", tmp_path / "a"
    )
    assert batch_sizes(q) == [30, 30, 30, 10]
    assert [data for _, data in rows_of(spark, "admit_rows")] == records

    # 10-byte records: 250 bytes is 25 records (the closed ledger counted by its length,
    # the open one by reading its payloads on the driver).
    q = drain(
        stream(spark, uri, log="admit", maxBytesPerTrigger="250"), "admit_bytes", tmp_path / "b"
    )
    assert batch_sizes(q) == [25, 25, 25, 25]
    assert [data for _, data in rows_of(spark, "admit_bytes")] == records

    # A record larger than the budget still goes, alone.
    tiny = write_log(bk, "admittiny", [6, 6], close=True)
    query = to_memory(
        stream(spark, uri, log="admittiny", maxBytesPerTrigger="4"), "admit_tiny", tmp_path / "c"
    )
    q = query.trigger(availableNow=True).start()
    assert q.awaitTermination(120)
    assert batch_sizes(q) == [1] * 12
    assert [data for _, data in rows_of(spark, "admit_tiny")] == tiny


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    writer = quorumlog.LogNamespace(bk).open_log("minimum").open_writer()
    for i in range(5):
        writer.append(b"m%d" % i)
    q = (
        to_memory(
            stream(
                spark,
                uri,
                log="minimum",
                minOffsetsPerTrigger="20",
                maxTriggerDelay="8s",
            ),
            "minimum_rows",
            tmp_path / "ckpt",
        )
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def read_rows() -> int:
            assert q.exception() is None
            return sum(batch_sizes(q))

        # As Kafka's source: the first batch does not wait.
        poll_until(lambda: read_rows() == 5, timeout_s=60, what="the first 5 records")
        for i in range(5, 10):
            writer.append(b"m%d" % i)
        appended = time.monotonic()
        poll_until(lambda: read_rows() == 10, timeout_s=60, what="the delayed batch")
        waited = time.monotonic() - appended
        assert waited >= 4.0, waited  # held back (the delay runs from the last batch)
        for i in range(10, 30):
            writer.append(b"m%d" % i)
        appended = time.monotonic()
        poll_until(lambda: read_rows() == 30, timeout_s=60, what="the batch at the minimum")
        assert time.monotonic() - appended < 6.0  # no wait once the minimum is there
        assert batch_sizes(q) == [5, 5, 20]
    finally:
        q.stop()
        writer.close()


def test_trigger_options_are_checked():
    from quorumlog.errors import InvalidArgumentError
    from quorumlog.spark.options import ReadOptions, parse_duration

    base = {"metadata": "sqlite:///tmp/x.db", "log": "x"}
    assert parse_duration("maxTriggerDelay", "15m") == 900.0
    assert parse_duration("maxTriggerDelay", "30s") == 30.0
    assert parse_duration("maxTriggerDelay", "500") == 0.5  # milliseconds, as Spark's
    opts = ReadOptions.parse({**base, "maxTriggerDelay": "2h"}, streaming=True)
    assert opts.max_trigger_delay_s == 7200.0
    for options, message in (
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"maxBytesPerTrigger": "0"}, "maxBytesPerTrigger"),
        ({"minOffsetsPerTrigger": "9", "maxRecordsPerTrigger": "5"}, "above"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            ReadOptions.parse({**base, **options}, streaming=True)
    with pytest.raises(InvalidArgumentError, match="only streaming"):
        ReadOptions.parse({**base, "maxBytesPerTrigger": "5"})


# ---------------------------------------------------------------- positions per log


def test_starting_and_ending_positions_per_log(spark, module_cluster, bk, tmp_path):
    uri = module_cluster.metadata_uri
    a = write_log(bk, "posa", [10, 10], close=True)
    b = write_log(bk, "posb", [10], close=True)
    c = write_log(bk, "posc", [5], close=True)
    first_a, second_a = quorumlog.LogNamespace(bk).open_log("posa").ledgers()
    df = batch(
        spark,
        uri,
        logs="posa,posb,posc",
        startingPositions=json.dumps({"posa": {"ledger": first_a, "entry": 5}, "posb": "latest"}),
        endingPositions=json.dumps({"posa": f"{second_a}:3", "posc": -1}),
    )
    got = sorted((r.log, bytes(r.data)) for r in df.collect())
    assert got == sorted([("posa", x) for x in a[5:13]] + [("posc", x) for x in c])
    assert batch(spark, uri, logs="posa,posb", startingPositions="latest").count() == 0
    both = batch(spark, uri, logs="posa,posb", startingPositions=json.dumps({"posb": -2}))
    assert both.count() == len(a) + len(b)
    # The singular options keep working.
    one = batch(spark, uri, log="posa", startingPosition=f"{second_a}:8")
    assert [bytes(r.data) for r in one.collect()] == a[18:]

    # Streaming: a new query starts where startingPositions says.
    drain(
        stream(
            spark,
            uri,
            logs="posa,posb",
            startingPositions=json.dumps({"posa": [second_a, 7], "posb": "earliest"}),
        ),
        "positions_rows",
        tmp_path / "ckpt",
    )
    assert rows_of(spark, "positions_rows") == sorted(
        [("posa", x) for x in a[17:]] + [("posb", x) for x in b]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"log": "posa", "startingPositions": '{"posb": -2}'}, "log posb is not read"),
        ({"log": "posa", "startingPositions": "[1, 2]"}, "startingPositions"),
        ({"log": "posa", "startingPosition": "1:0", "startingPositions": "latest"}, "not both"),
        ({"logs": "posa,posa"}, "names a log twice"),
        ({"logPattern": "pos("}, "not a regular expression"),
        ({"logs": "posa", "log": "posb"}, "got both"),
    ],
)
def test_bad_positions_and_log_options_fail_on_the_driver(spark, module_cluster, options, message):
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException, match=message):
        batch(spark, module_cluster.metadata_uri, **options)


# ---------------------------------------------------------------- several logs


def test_a_log_pattern_stream_picks_up_logs_created_while_it_runs(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    first = write_log(bk, "feed-one", [15], close=True)
    write_log(bk, "other-feed", [7], close=True)  # does not match
    q = (
        to_memory(stream(spark, uri, logPattern="feed-.*"), "feed_rows", tmp_path / "ckpt")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        poll_until(
            lambda: q.exception() is None and sum(batch_sizes(q)) == 15,
            timeout_s=60,
            what="the first log's records",
        )
        second = write_log(bk, "feed-two", [4, 6])
        poll_until(
            lambda: q.exception() is None and sum(batch_sizes(q)) == 25,
            timeout_s=60,
            what="the records of the log created later",
        )
        end = json.loads(q.lastProgress["sources"][0]["endOffset"])
        assert set(end) == {"feed-one", "feed-two"}  # a bound per log
        assert end["feed-one"]["entry"] == 15
    finally:
        q.stop()
    assert q.exception() is None
    assert rows_of(spark, "feed_rows") == sorted(
        [("feed-one", x) for x in first] + [("feed-two", x) for x in second]
    )
    df = batch(spark, uri, logPattern="feed-.*")
    assert df.schema["log"].dataType.simpleString() == "string"
    assert sorted((r.log, bytes(r.data)) for r in df.collect()) == rows_of(spark, "feed_rows")


def test_several_logs_share_max_records_per_trigger(spark, module_cluster, bk, tmp_path):
    uri = module_cluster.metadata_uri
    big = write_log(bk, "sharebig", [90], close=True)
    small = write_log(bk, "sharesml", [10], close=True)
    q = drain(
        stream(spark, uri, logs="sharebig,sharesml", maxRecordsPerTrigger="20"),
        "share_rows",
        tmp_path / "ckpt",
    )
    sizes = batch_sizes(q)
    assert max(sizes) <= 20 and sum(sizes) == 100
    first = q.recentProgress[0]["sources"][0]
    start = json.loads(first["endOffset"])
    assert start["sharebig"]["entry"] == 18 and start["sharesml"]["entry"] == 2  # prorated
    assert rows_of(spark, "share_rows") == sorted(
        [("sharebig", x) for x in big] + [("sharesml", x) for x in small]
    )


# ---------------------------------------------------------------- failOnDataLoss


def truncated_log(bk: quorumlog.BookKeeper, name: str) -> tuple[list[bytes], int, int]:
    """Two closed ledgers of 10 records, truncated before the second's entry 4."""
    records = write_log(bk, name, [10, 10], close=True)
    first, second = quorumlog.LogNamespace(bk).open_log(name).ledgers()
    quorumlog.LogNamespace(bk).open_log(name).truncate(Position(second, 4))
    return records, first, second


def test_fail_on_data_loss(spark, module_cluster, bk, tmp_path):
    from pyspark.errors import AnalysisException, StreamingQueryException

    uri = module_cluster.metadata_uri
    records, first, _ = truncated_log(bk, "lossy")
    start = f"{first}:0"
    with pytest.raises(
        AnalysisException, match=r"LogTruncatedError: log lossy: position .* truncation"
    ):
        batch(spark, uri, log="lossy", startingPosition=start).collect()
    df = batch(spark, uri, log="lossy", startingPosition=start, failOnDataLoss="false")
    assert [bytes(r.data) for r in df.collect()] == records[14:]

    def run(checkpoint, **options):
        return (
            to_memory(
                stream(spark, uri, log="lossy", startingPosition=start, **options), *checkpoint
            )
            .trigger(availableNow=True)
            .start()
        )

    failing = run(("lossy_fail", tmp_path / "a"))
    with pytest.raises(StreamingQueryException, match="LogTruncatedError"):
        failing.awaitTermination(120)
    going_on = run(("lossy_rows", tmp_path / "b"), failOnDataLoss="false")
    assert going_on.awaitTermination(120)
    assert going_on.exception() is None
    assert [data for _, data in rows_of(spark, "lossy_rows")] == records[14:]


def test_fail_on_data_loss_false_counts_what_was_skipped(module_cluster, bk, caplog):
    """The stream reader as Spark drives it: the records it skips over are counted
    (in ``skipped_records``, and in a WARNING of the driver's log)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    records = write_log(bk, "skipper", [10, 10], close=True)
    first, second = quorumlog.LogNamespace(bk).open_log("skipper").ledgers()
    opts = ReadOptions.parse(
        {"metadata": module_cluster.metadata_uri, "log": "skipper", "failOnDataLoss": "false"},
        streaming=True,
    )
    reader = QuorumlogStreamReader(opts)
    end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(2))
    assert end == {"ledger": first, "entry": 2}
    quorumlog.LogNamespace(bk).open_log("skipper").truncate(Position(second, 4))
    with caplog.at_level(logging.WARNING, logger="quorumlog.spark.datasource"):
        later = reader.latestOffset(end, ReadMaxRows(2))
    assert later == {"ledger": second, "entry": 6}
    assert reader.skipped_records == 8 + 4  # the rest of the first ledger, 4 of the second
    assert "12 record(s) skipped" in caplog.text
    rows = [
        row
        for partition in reader.partitions(end, later)
        for batch_ in reader.read(partition)
        for row in batch_.column("data").to_pylist()
    ]
    assert rows == records[14:16]


def test_a_reader_waiting_for_more_records_counts_a_skip_once(module_cluster, bk, caplog):
    """The stream reader as Spark drives it: with minOffsetsPerTrigger, a truncation
    ahead of the query while it waits is counted and reported once, when the query
    moves on (Spark asks again from the same start while the reader waits)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    log_ = quorumlog.LogNamespace(bk).open_log("waiter")
    writer = log_.open_writer()
    try:
        for index in range(20):
            if index == 10:
                writer.rollover()
            writer.append(b"w%09d" % index)
        first, second = log_.ledgers()  # the second open, 10 records
        opts = ReadOptions.parse(
            {
                "metadata": module_cluster.metadata_uri,
                "log": "waiter",
                "failOnDataLoss": "false",
                "maxRecordsPerTrigger": "5",
                "minOffsetsPerTrigger": "3",
                "maxTriggerDelay": "1h",
            },
            streaming=True,
        )
        reader = QuorumlogStreamReader(opts)
        end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(2))
        assert end == {"ledger": first, "entry": 2}
        log_.truncate(Position(second, 8))  # 2 records left: fewer than 3
        with caplog.at_level(logging.WARNING, logger="quorumlog.spark.datasource"):
            for _ in range(3):
                assert reader.latestOffset(end, ReadMaxRows(2)) == end  # waits
            while_waiting = reader.reportLatestOffset()
            assert not caplog.records  # nothing skipped yet: the query has not moved
            writer.append(b"w%09d" % 20)
            later = reader.latestOffset(end, ReadMaxRows(2))
    finally:
        writer.close()
    (warning,) = [r.getMessage() for r in caplog.records if "truncation point" in r.getMessage()]
    assert "16 record(s) skipped" in warning
    assert later == {"ledger": second, "entry": 10}
    assert reader.skipped_records == 8 + 8  # the rest of the first ledger, 8 of the second
    assert while_waiting["recordsBehindLatest"] == 2  # from the truncation point
    assert reader.reportLatestOffset() == {
        "ledger": second,
        "entry": 11,
        "recordsBehindLatest": 1,
        "minRecordsBehindLatest": 1,
        "maxRecordsBehindLatest": 1,
        "avgRecordsBehindLatest": 1.0,
        "recordsSkipped": 16,
    }


# ---------------------------------------------------------------- progress


def latest_reports(query) -> list[dict]:
    """The source's latestOffset of each progress of a batch with records, parsed."""
    return [
        json.loads(p["sources"][0]["latestOffset"])
        for p in query.recentProgress
        if p["numInputRows"]
    ]


def test_progress_shows_how_far_behind_the_log_the_query_is(spark, module_cluster, bk, tmp_path):
    """Kafka's lag metrics by record: after each batch, the records between its end and
    the log's end, here across a closed ledger and an open one (counted to its LAC)."""
    uri = module_cluster.metadata_uri
    write_log(bk, "lagged", [20, 30])  # the first ledger closed, the last open
    _, last = quorumlog.LogNamespace(bk).open_log("lagged").ledgers()
    q = drain(
        stream(spark, uri, log="lagged", maxRecordsPerTrigger="10"),
        "lagged_rows",
        tmp_path / "ckpt",
    )
    assert batch_sizes(q) == [10] * 5
    first = q.recentProgress[0]["sources"][0]
    assert json.loads(first["endOffset"])["entry"] == 10
    reports = latest_reports(q)
    # The log's end, in the offset's own shape, beside the lag.
    assert all((r["ledger"], r["entry"]) == (last, 30) for r in reports)
    assert [r["recordsBehindLatest"] for r in reports] == [40, 30, 20, 10, 0]
    assert [r["maxRecordsBehindLatest"] for r in reports] == [40, 30, 20, 10, 0]
    assert [r["minRecordsBehindLatest"] for r in reports] == [40, 30, 20, 10, 0]
    assert [r["avgRecordsBehindLatest"] for r in reports] == [40.0, 30.0, 20.0, 10.0, 0.0]
    assert "recordsSkipped" not in reports[0]  # failOnDataLoss=true never skips


def test_progress_of_several_logs_shows_each_ones_lag_and_the_spread(
    spark, module_cluster, bk, tmp_path
):
    uri = module_cluster.metadata_uri
    write_log(bk, "spread-big", [60], close=True)
    write_log(bk, "spread-sml", [20], close=True)
    q = drain(
        stream(spark, uri, logPattern="spread-.*", maxRecordsPerTrigger="20"),
        "spread_rows",
        tmp_path / "ckpt",
    )
    reports = latest_reports(q)
    first, last = reports[0], reports[-1]
    # 20 records shared 15/5 in proportion to what waits (60/20).
    assert first["spread-big"] == {
        "ledger": first["spread-big"]["ledger"],
        "entry": 60,
        "recordsBehindLatest": 45,
    }
    assert first["spread-sml"]["entry"] == 20
    assert first["spread-sml"]["recordsBehindLatest"] == 15
    assert first["minRecordsBehindLatest"] == 15
    assert first["maxRecordsBehindLatest"] == 45
    assert first["avgRecordsBehindLatest"] == 30.0
    assert last["maxRecordsBehindLatest"] == 0 and last["avgRecordsBehindLatest"] == 0.0
    assert sum(batch_sizes(q)) == 80


def test_progress_counts_the_records_a_truncation_made_the_query_skip(
    spark, module_cluster, bk, tmp_path
):
    """failOnDataLoss=false: the log is truncated ahead of the query while its first
    batch runs; the next batch skips the rest of the first ledger and 4 records of the
    second, and every later progress shows that count."""
    uri = module_cluster.metadata_uri
    records = write_log(bk, "skipped", [10, 10], close=True)
    _, second = quorumlog.LogNamespace(bk).open_log("skipped").ledgers()
    seen: list[bytes] = []

    def sink(df, batch_id: int) -> None:
        seen.extend(bytes(r.data) for r in df.collect())
        if batch_id == 0:
            quorumlog.LogNamespace(bk).open_log("skipped").truncate(Position(second, 4))

    q = (
        stream(spark, uri, log="skipped", maxRecordsPerTrigger="2", failOnDataLoss="false")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert seen == records[:2] + records[14:]
    reports = latest_reports(q)
    assert [r["recordsSkipped"] for r in reports] == [0] + [8 + 4] * 3
    assert [r["recordsBehindLatest"] for r in reports] == [18, 4, 2, 0]


def test_available_now_on_a_pattern_ignores_logs_created_after_it_started(module_cluster, bk):
    """The stream reader as Spark drives it: the end of Trigger.AvailableNow is each log's
    end when the query started, and a log created since is left to a later query."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    write_log(bk, "now-one", [3], close=True)
    opts = ReadOptions.parse(
        {"metadata": module_cluster.metadata_uri, "logPattern": "now-.*"}, streaming=True
    )
    reader = QuorumlogStreamReader(opts)
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    write_log(bk, "now-two", [2], close=True)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert set(end) == {"now-one"} and end["now-one"]["entry"] == 3
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # done: the query stops
    later = QuorumlogStreamReader(opts)
    assert set(later.latestOffset(end, ReadAllAvailable())) == {"now-one", "now-two"}


def test_available_now_reports_its_lag_to_the_end_it_reads_to(module_cluster, bk):
    """As Kafka's source does it: under Trigger.AvailableNow the latest offset in the
    progress, and the lag counted to it, are the end the query reads to (each log's end
    when it started), so its last batch shows no lag though records came since."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    writer = quorumlog.LogNamespace(bk).open_log("now-lag").open_writer()
    try:
        for index in range(10):
            writer.append(b"n%09d" % index)
        opts = ReadOptions.parse(
            {"metadata": module_cluster.metadata_uri, "log": "now-lag"}, streaming=True
        )
        reader = QuorumlogStreamReader(opts)
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        for index in range(10, 15):
            writer.append(b"n%09d" % index)
        end = reader.latestOffset(start, ReadAllAvailable())
    finally:
        writer.close()
    assert end["entry"] == 10
    assert reader.reportLatestOffset() == {
        **end,
        "recordsBehindLatest": 0,
        "minRecordsBehindLatest": 0,
        "maxRecordsBehindLatest": 0,
        "avgRecordsBehindLatest": 0.0,
    }


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_deleted_log_fails_the_stream_unless_fail_on_data_loss_is_false(
    module_cluster, bk, fail_on_data_loss
):
    """The stream reader as Spark drives it, for a read of two logs and of one."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.log.errors import NoSuchLogError
    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    tag = str(fail_on_data_loss).lower()
    kept, gone, alone = f"kept-{tag}", f"gone-{tag}", f"alone-{tag}"
    for name in (kept, gone, alone):
        write_log(bk, name, [3], close=True)
    base = {"metadata": module_cluster.metadata_uri, "failOnDataLoss": tag}
    pair = QuorumlogStreamReader(
        ReadOptions.parse({**base, "logs": f"{kept},{gone}"}, streaming=True)
    )
    one = QuorumlogStreamReader(ReadOptions.parse({**base, "log": alone}, streaming=True))
    pair_start, one_start = pair.initialOffset(), one.initialOffset()
    quorumlog.LogNamespace(bk).delete_log(gone)
    quorumlog.LogNamespace(bk).delete_log(alone)
    if fail_on_data_loss:
        for reader, start in ((pair, pair_start), (one, one_start)):
            with pytest.raises(NoSuchLogError):
                reader.latestOffset(start, ReadAllAvailable())
        return
    end = pair.latestOffset(pair_start, ReadAllAvailable())
    assert set(end) == {kept} and end[kept]["entry"] == 3  # read on without the deleted log
    assert one.latestOffset(one_start, ReadAllAvailable()) == one_start  # nothing to read
