"""``db-changes``: a ``quorumlog db`` database's change stream as a Parquet table.

A database's log (``db/NAME``, docs/DB.md) holds one record per write request, in
commit order, each a JSON object::

    {"v": 1, "kind": "execute", "tx": false, "stmts": [[sql, params], ...]}
    {"v": 1, "kind": "barrier"}                       (a strong read; changes nothing)
    {"v": 1, "kind": "verify", "checks": [...]}       (replicas compared; changes nothing)

with the statements as every replica applied them (non-deterministic calls already
replaced by the leader's values). The table at ``--out`` has one row per statement:

=================  ==================================================================
``log``            the database's log
``ledger_id``,     the record's position: the ``position`` a write answer carried
``entry_id``
``statement``      the statement's index in its request (0, 1, ...)
``sql``            the statement, as applied
``params``         its parameters as JSON text (``[1, "a"]`` or ``{"name": "x"}``)
``transaction``    whether the request was one transaction (all its statements, or none)
=================  ==================================================================

A statement that failed on the leader failed identically on every replica and is
in the table all the same (the log holds requests, not their outcomes). Barriers
are left out. The decoding is Spark expressions (``from_json``, ``posexplode``), so
rows never pass through a Python worker.

Stages: plan the read, write the table, count its rows.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quorumlog.spark.pipelines.common import output_path
from quorumlog.spark.pipelines.log_table import write_log_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NAME = "db-changes"
HELP = "a quorumlog db database's change stream (its log) as a Parquet table"
DESCRIPTION = (
    "Reads the log of a quorumlog db database (--log db/NAME) and writes one row per "
    "logged statement (log, ledger_id, entry_id, statement, sql, params, transaction) to "
    "a Parquet table at --out; prints the row count."
)
COLUMNS = ["log", "ledger_id", "entry_id", "statement", "sql", "params", "transaction"]
# The record's shape as Spark reads it. A statement is [sql, params]: read as an array
# of strings, Spark keeps the params' JSON text as it is (an array or an object).
RECORD_SCHEMA = "struct<v:int,kind:string,tx:boolean,stmts:array<array<string>>>"
RECORD_FORMAT = 1


def output_paths(args: argparse.Namespace) -> list[str]:
    """The table this run writes."""
    return [output_path(args.out)]


def change_rows(records: DataFrame) -> DataFrame:
    """The change table of a database log's records (the source's columns ``log,
    ledger_id, entry_id, data``): one row per statement of each write record."""
    from pyspark.sql import functions as F

    record = F.from_json(F.col("data").cast("string"), RECORD_SCHEMA)
    writes = records.select("log", "ledger_id", "entry_id", record.alias("record")).where(
        (F.col("record.v") == RECORD_FORMAT) & (F.col("record.kind") == "execute")
    )
    exploded = writes.select(
        "log",
        "ledger_id",
        "entry_id",
        F.col("record.tx").alias("transaction"),
        F.posexplode("record.stmts").alias("statement", "stmt"),
    )
    return exploded.select(
        "log",
        "ledger_id",
        "entry_id",
        "statement",
        F.col("stmt")[0].alias("sql"),
        F.col("stmt")[1].alias("params"),
        F.coalesce(F.col("transaction"), F.lit(False)).alias("transaction"),
    )


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run db-changes; returns the exit status (0)."""
    return write_log_table(
        spark,
        args,
        pipeline=NAME,
        table_name="the change table",
        row_noun="statements",
        table_rows=change_rows,
    )
