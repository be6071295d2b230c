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
