"""A streaming offset at the end of a closed ledger resumes after a truncation next to
it: the stream reader as Spark drives it, called directly (no SparkSession)."""

from __future__ import annotations

import pytest

import quorumlog
from quorumlog import LogNamespace
from quorumlog.log import Position
from quorumlog.server.local_cluster import LocalCluster

pytestmark = pytest.mark.spark


def test_l6_a_stream_checkpointed_at_a_closed_ledgers_end_resumes_after_truncation(
    module_cluster: LocalCluster, bk: quorumlog.BookKeeper
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    opts = ReadOptions.parse(
        {"metadata": module_cluster.metadata_uri, "log": "resumed"}, streaming=True
    )
    log = LogNamespace(bk).open_log("resumed")
    writer = log.open_writer()
    first = [writer.append(b"a%d" % i) for i in range(3)]
    writer.close()
    before = QuorumlogStreamReader(opts)
    checkpoint = before.latestOffset(before.initialOffset(), ReadAllAvailable())
    assert checkpoint == {"ledger": first[-1].ledger_id, "entry": 3}  # the ledger's end

    writer = log.open_writer()
    later = writer.append(b"b")
    writer.close()
    log.truncate(Position(later.ledger_id, 0))  # removes the ledger the stream finished

    after = QuorumlogStreamReader(opts)  # the query restarted from its checkpoint
    end = after.latestOffset(checkpoint, ReadAllAvailable())
    rows = [
        row
        for partition in after.partitions(checkpoint, end)
        for batch in after.read(partition)
        for row in batch.column("data").to_pylist()
    ]
    assert rows == [b"b"]


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_truncation_between_a_batchs_planning_and_its_read(
    module_cluster: LocalCluster, bk: quorumlog.BookKeeper, fail_on_data_loss: bool
) -> None:
    """The driver plans a micro-batch, then a truncation deletes a ledger before the
    batch's tasks read it. failOnDataLoss=true: the task fails with LogTruncatedError
    naming the log, the position and the truncation point (not a bare "no such
    ledger"); false: the task reads nothing of the deleted ledger, and the batch's
    other records as planned."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from quorumlog.log import LogTruncatedError
    from quorumlog.spark.datasource import QuorumlogStreamReader
    from quorumlog.spark.options import ReadOptions

    name = f"raced-{str(fail_on_data_loss).lower()}"
    opts = ReadOptions.parse(
        {
            "metadata": module_cluster.metadata_uri,
            "log": name,
            "failOnDataLoss": str(fail_on_data_loss).lower(),
        },
        streaming=True,
    )
    log = LogNamespace(bk).open_log(name)
    writer = log.open_writer()
    first = [writer.append(b"a%d" % i) for i in range(3)]
    writer.rollover()
    second = [writer.append(b"b%d" % i) for i in range(3)]
    writer.close()
    reader = QuorumlogStreamReader(opts)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    partitions = reader.partitions(start, end)  # on the driver
    assert [p.value[1] for p in partitions] == [first[0].ledger_id, second[0].ledger_id]
    assert log.truncate(second[1]) == [first[0].ledger_id]  # before the tasks run

    def read(partition) -> list[bytes]:
        return [row for batch in reader.read(partition) for row in batch.column("data").to_pylist()]

    if fail_on_data_loss:
        with pytest.raises(
            LogTruncatedError,
            match=f"log {name}: position {first[0]} is before the truncation point {second[1]}",
        ):
            read(partitions[0])
    else:
        assert read(partitions[0]) == []
    assert read(partitions[1]) == [b"b0", b"b1", b"b2"]  # still stored, as planned
