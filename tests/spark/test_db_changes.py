"""The db-changes pipeline: a quorumlog db database's log, written by a real replica,
read with the ``quorumlog`` source into a Parquet change table on the real session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support import poll_until_async

from quorumlog.aio import BookKeeper
from quorumlog.commands import OneLineArgumentParser
from quorumlog.commands.pipeline import add_pipelines
from quorumlog.db import Replica, ReplicaConfig, Statement
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.spark.pipelines import db_changes

FIG = Statement("INSERT INTO fruit(name, n) VALUES (:name, random())", {"name": "fig"})


async def _write_database(uri: str, data_dir: Path) -> tuple[str, list[str]]:
    """Three write requests and a strong read's barrier through one replica; the log's
    name and each write's position."""
    bk = await BookKeeper.connect(uri)
    replica = Replica(bk, ReplicaConfig(name="shop", data_dir=data_dir, node_id="a"))
    try:
        await replica.start()
        await poll_until_async(
            lambda: replica.is_leader,
            timeout_s=30,
            what="the replica elected and caught up",
            interval_s=0.05,
        )
        requests = [
            ([Statement("CREATE TABLE fruit (id INTEGER PRIMARY KEY, name TEXT, n INT)")], False),
            (
                [
                    Statement("INSERT INTO fruit(name, n) VALUES (?, ?)", ["apple", 3]),
                    Statement(
                        "INSERT INTO fruit(name, n) VALUES (:name, random())", {"name": "fig"}
                    ),
                ],
                True,
            ),
            ([Statement("UPDATE fruit SET n = n + 1 WHERE name = 'apple'")], False),
        ]
        written = []
        for statements, transaction in requests:
            answer = await replica.execute(statements, transaction=transaction)
            written.append(str(answer.position))
            if len(written) == 2:
                await replica.barrier()  # a record that changes nothing: not in the table
        return replica.log_name, written
    finally:
        await replica.close()
        await bk.close()


def test_db_changes_writes_one_row_per_logged_statement(
    spark, module_cluster: LocalCluster, tmp_path: Path
) -> None:
    uri = module_cluster.metadata_uri
    log_name, written = asyncio.run(_write_database(uri, tmp_path / "replica"))
    assert log_name == "db/shop"
    parser = OneLineArgumentParser(prog="pipeline")
    add_pipelines(parser)
    out = tmp_path / "changes"
    args = parser.parse_args(
        ["db-changes", "--metadata", uri, "--log", log_name, "--out", str(out)]
    )
    assert db_changes.run(spark, args) == 0

    table = spark.read.parquet(str(out))
    assert table.columns == db_changes.COLUMNS
    rows = table.orderBy("ledger_id", "entry_id", "statement").collect()
    positions = [f"{r.ledger_id}:{r.entry_id}" for r in rows]
    first, second, third = written
    assert positions == [first, second, second, third]
    assert [r.statement for r in rows] == [0, 0, 1, 0]
    assert [r.transaction for r in rows] == [False, True, True, False]
    assert rows[0].sql.startswith("CREATE TABLE fruit")
    assert (rows[1].sql, json.loads(rows[1].params)) == (
        "INSERT INTO fruit(name, n) VALUES (?, ?)",
        ["apple", 3],
    )
    # random() was replaced by the leader's value before logging: the table holds it
    assert "random()" not in rows[2].sql and rows[2].sql.startswith(
        "INSERT INTO fruit(name, n) VALUES (:name, ("
    )
    assert json.loads(rows[2].params) == {"name": "fig"}
    assert rows[3].sql == "UPDATE fruit SET n = n + 1 WHERE name = 'apple'"
    assert {r.log for r in rows} == {"db/shop"}
