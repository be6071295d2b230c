"""``log-to-parquet``: a log, or a position range of it, copied into a Parquet table.

The table at ``--out`` has the source's columns ``log, ledger_id, entry_id, data``,
one row per record. ``--from`` is inclusive and ``--to`` exclusive, each
``earliest``, ``latest``, ``L:E`` or ``{"ledger": L, "entry": E}``, as the source's
``startingPosition`` / ``endingPosition``. Only confirmed records are copied: an
open ledger up to its last add confirmed, nothing after it (R4).

Stages: plan the read (the source snapshots the log on the driver), write the
table, count its rows (from the Parquet files' footers, not by reading the log
again).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from quorumlog.meta.factory import resolve_metadata_uri
from quorumlog.spark.options import ReadOptions
from quorumlog.spark.pipelines.common import (
    Progress,
    check_outputs_free,
    describe_bound,
    output_path,
    read_log,
    require_log,
    write_mode,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "log-to-parquet"
HELP = "copy a log (or a position range of it) into Parquet"
DESCRIPTION = (
    "Copies the confirmed records of a log, from --from (inclusive) to --to (exclusive), "
    "into a Parquet table at --out with columns log, ledger_id, entry_id, data; prints "
    "the row count."
)


def output_paths(args: argparse.Namespace) -> list[str]:
    """The table this run writes."""
    return [output_path(args.out)]


def source_options(metadata_uri: str, args: argparse.Namespace) -> dict[str, str]:
    """The source options this run reads with (checked on the driver before Spark
    plans anything: :meth:`ReadOptions.parse` says what is wrong with them)."""
    options = {"metadata": metadata_uri, "log": args.log}
    if args.password:
        options["password"] = args.password
    if args.start is not None:
        options["startingPosition"] = args.start
    if args.end is not None:
        options["endingPosition"] = args.end
    if args.entries_per_partition is not None:
        options["entriesPerPartition"] = str(args.entries_per_partition)
    return options


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run log-to-parquet; returns the exit status (0)."""
    metadata_uri = resolve_metadata_uri(args.metadata)
    ReadOptions.parse(source_options(metadata_uri, args))
    (path,) = output_paths(args)
    check_outputs_free([path], args.overwrite)
    span = f"{describe_bound(args.start, 'earliest')}..{describe_bound(args.end, 'latest')}"
    progress = Progress(NAME, 3)

    with progress.stage(f"planning the read of log {args.log} ({span})") as stage:
        require_log(metadata_uri, args.log)
        records = read_log(
            spark,
            metadata_uri,
            args.log,
            password=args.password,
            start=args.start,
            end=args.end,
            entries_per_partition=args.entries_per_partition,
        )
        partitions = records.rdd.getNumPartitions()
        stage.text = f"{partitions} partitions"

    with progress.stage(f"writing Parquet to {path}"):
        records.write.mode(write_mode(args.overwrite)).parquet(path)

    with progress.stage("counting rows written") as stage:
        rows = spark.read.parquet(path).count()
        stage.text = f"{rows} rows"

    progress.print(f"{rows} rows of log {args.log} ({span}) in {path}")
    return 0
