"""A pipeline that reads a position range of one log and writes one Parquet table
(``log-to-parquet``, ``db-changes``).

The options are checked and the output looked at on the driver before Spark plans
anything, so a bad ``--from`` or a table that exists fails in one line. Stages: plan the
read (the source snapshots the log on the driver), write the table, count its rows (from
the Parquet files' footers, not by reading the log again).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from quorumlog.meta.factory import resolve_metadata_uri
from quorumlog.spark.options import ReadOptions
from quorumlog.spark.pipelines.common import (
    Progress,
    check_outputs_free,
    describe_bound,
    log_source_options,
    output_path,
    read_log,
    require_log,
    write_mode,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def write_log_table(
    spark: SparkSession,
    args: argparse.Namespace,
    *,
    pipeline: str,
    table_name: str,
    row_noun: str,
    table_rows: Callable[[DataFrame], DataFrame] | None = None,
    entries_per_partition: int | None = None,
) -> int:
    """Read log ``args.log`` from ``args.start`` to ``args.end`` and write the table
    ``table_rows(records)`` (the records themselves by default) at ``args.out``; returns
    the exit status (0).

    ``pipeline`` names the progress lines, ``table_name`` the table in the write stage
    (``the change table``) and ``row_noun`` its rows in the count (``statements``)."""
    metadata_uri = resolve_metadata_uri(args.metadata)
    options = log_source_options(
        metadata_uri,
        args.log,
        password=args.password,
        start=args.start,
        end=args.end,
        entries_per_partition=entries_per_partition,
    )
    ReadOptions.parse(options)
    path = output_path(args.out)
    check_outputs_free([path], args.overwrite)
    span = f"{describe_bound(args.start, 'earliest')}..{describe_bound(args.end, 'latest')}"
    progress = Progress(pipeline, 3)

    with progress.stage(f"planning the read of log {args.log} ({span})") as stage:
        require_log(metadata_uri, args.log)
        records = read_log(spark, options)
        stage.text = f"{records.rdd.getNumPartitions()} partitions"

    with progress.stage(f"writing {table_name} to {path}"):
        table = records if table_rows is None else table_rows(records)
        table.write.mode(write_mode(args.overwrite)).parquet(path)

    with progress.stage("counting rows written") as stage:
        rows = spark.read.parquet(path).count()
        stage.text = f"{rows} {row_noun}"

    progress.print(f"{rows} {row_noun} of log {args.log} ({span}) in {path}")
    return 0
