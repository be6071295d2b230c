"""``log-to-parquet``: a log, or a position range of it, copied into a Parquet table.

The table at ``--out`` has the source's columns ``log, ledger_id, entry_id, data,
timestamp`` (the record's append time), one row per record. ``--from`` is inclusive
and ``--to`` exclusive, each ``earliest``, ``latest``, ``L:E`` or
``{"ledger": L, "entry": E}``, as the source's ``startingPosition`` / ``endingPosition``.
Only confirmed records are copied: an open ledger up to its last add confirmed, nothing
after it (R4).

Stages: plan the read (the source snapshots the log on the driver), write the
table, count its rows (from the Parquet files' footers, not by reading the log
again).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quorumlog.spark.pipelines.common import output_path
from quorumlog.spark.pipelines.log_table import write_log_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "log-to-parquet"
HELP = "copy a log (or a position range of it) into Parquet"
DESCRIPTION = (
    "Copies the confirmed records of a log, from --from (inclusive) to --to (exclusive), "
    "into a Parquet table at --out with columns log, ledger_id, entry_id, data, timestamp; "
    "prints "
    "the row count."
)


def output_paths(args: argparse.Namespace) -> list[str]:
    """The table this run writes."""
    return [output_path(args.out)]


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run log-to-parquet; returns the exit status (0)."""
    return write_log_table(
        spark,
        args,
        pipeline=NAME,
        table_name="Parquet",
        row_noun="rows",
        entries_per_partition=args.entries_per_partition,
    )
