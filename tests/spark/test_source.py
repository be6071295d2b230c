"""The quorumlog data source read by a real SparkSession (local[2]) from real bookies."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from support import poll_until

import quorumlog
from quorumlog import LogNamespace
from quorumlog.log.record_format import encode
from quorumlog.server.local_cluster import LocalCluster

pytestmark = pytest.mark.spark


def write_records(bk: quorumlog.BookKeeper, name: str, counts: list[int]) -> list[bytes]:
    """A log whose ledgers hold ``counts`` records each (the last ledger left open)."""
    log = LogNamespace(bk).open_log(name)
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
    ledgers = LogNamespace(bk).open_log("multi").ledgers()
    df = read_df(spark, uri, log="multi", entriesPerPartition="200")
    assert df.schema.simpleString() == (
        "struct<log:string,ledger_id:bigint,entry_id:bigint,data:binary,timestamp:timestamp>"
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
    log = LogNamespace(bk).open_log("growing")
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
    first, second = LogNamespace(bk).open_log("ranged").ledgers()
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
    log = LogNamespace(bk).open_log("tailed")
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
        # Run, stop mid-stream, restart from the checkpoint: each run stops once it has read
        # past a rollover (records 601 and 1,201 start new ledgers).
        for rows in (800, 600):
            query = (
                run_stream_to_parquet(
                    spark, uri, "tailed", out, checkpoint, maxRecordsPerTrigger="300"
                )
                .trigger(processingTime="300 milliseconds")
                .start()
            )
            poll_until(
                lambda q=query, rows=rows: (
                    not q.isActive or sum(p["numInputRows"] for p in q.recentProgress) >= rows
                ),
                timeout_s=120,
                what=f"the streaming query reads {rows} records",
                interval_s=0.1,
            )
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
    log = LogNamespace(bk).open_log("handover")
    first = log.open_writer()
    for i in range(30):
        first.append(b"a%d" % i)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    once = run_stream_to_parquet(spark, uri, "handover", out, checkpoint).trigger(availableNow=True)
    assert once.start().awaitTermination(120)
    second = LogNamespace(bk).open_log("handover").open_writer()  # fences the first writer's ledger
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
    writer = LogNamespace(bk).open_log("offsets").open_writer()
    writer.append(b"after the target")
    final = new_style.latestOffset(end, ReadAllAvailable())
    assert rows_between(new_style, end, final) == records[50:]  # not the later record
    # Closed first: an open ledger's bookies learn the writer's last LAC a moment after
    # the append returns (explicit LAC), and a reader right away may not see it yet.
    writer.close()
    later = QuorumlogStreamReader(opts)
    assert rows_between(later, final, later.latestOffset(final, ReadAllAvailable())) == [
        b"after the target"
    ]
    assert new_style.partitions(final, final) == []


def split_lac_ledger(cluster: LocalCluster, name: str) -> tuple[list[bytes], list[int]]:
    """A log whose only ledger a writer left open when it died, with its bookies knowing
    different LACs: entries 0..9 on all three bookies, entry 10 on bookies A and B (so
    confirmed, Qa = 2), entry 11 on A only, carrying LAC 10. A knows LAC 10, B and C 9.
    A no-recovery LAC read takes the largest of two answers: 10 unless A is silent.
    Returns the confirmed records (0..10) and the cluster indexes of A, B, C."""
    import asyncio

    from quorumlog.proto.codec import ReadLacRequest, ReadLacResponse
    from quorumlog.testing.raw_client import RawClient, make_entry, master_key

    with quorumlog.BookKeeper(cluster.metadata_uri) as client:
        writer = LogNamespace(client).open_log(name).open_writer()
        records = [b"%s-%d" % (name.encode(), i) for i in range(12)]
        for data in records[:10]:
            writer.append(data)
        ledger_id = writer.ledger_id
        ensemble = client.ledger_metadata(ledger_id).last_ensemble
    # The client is closed with the writer's ledger still open: the writer is dead.
    index_of = {address: i for i, address in enumerate(cluster.addresses)}
    a, b, c = (index_of[address] for address in ensemble)
    key = master_key(b"")

    async def extend() -> list[int]:
        lacs = []
        for address, entries in zip(ensemble, ([(10, 9), (11, 10)], [(10, 9)], []), strict=True):
            raw = await RawClient.connect(address)
            for entry_id, lac in entries:
                blob = make_entry(ledger_id, entry_id, encode(records[entry_id], 0), lac=lac)
                assert (await raw.add(ledger_id, key, [blob])).status == 0
            answer = await raw.request(ReadLacRequest(0, ledger_id))
            assert isinstance(answer, ReadLacResponse)
            lacs.append(answer.lac)
            await raw.close()
        return lacs

    lacs = asyncio.run(extend())
    assert lacs[0] == 10 and lacs[1] == 9 and lacs[2] <= 9, lacs
    return records[:11], [a, b, c]


def test_l1_a_micro_batch_reads_up_to_its_planned_end_when_a_later_lac_read_is_lower(
    fresh_cluster,
):
    """Spark's calling sequence on the stream reader: latestOffset plans the batch from
    one LAC read, partitions() and the executors run after it and may see a lower LAC
    (another pair of bookies answers). They still read every record up to the planned
    end, which was seen confirmed, and the next batch starts there: nothing skipped."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    records, (a, _b, c) = split_lac_ledger(fresh_cluster, "lac-split")
    opts = ReadOptions.parse(
        {"metadata": fresh_cluster.metadata_uri, "log": "lac-split"}, streaming=True
    )
    reader = QuorumlogStreamReader(opts)
    fresh_cluster.pause(c)  # A and B answer: LAC 10
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
    finally:
        fresh_cluster.resume(c)
    fresh_cluster.pause(a)  # B and C answer: LAC 9
    try:
        seen = []
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                seen += batch.column("data").to_pylist()
        assert seen == records  # entry 10 is confirmed and was planned: it is read
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # nothing new, none skipped
    finally:
        fresh_cluster.resume(a)
