"""``dice-stats``: how often each face came up in the dice log, and how many values
each leader epoch wrote.

A dice record is the rolled value alone, 4 bytes big-endian (the tutorial's
``Ints.toByteArray``; :mod:`quorumlog.formats.dice`). It carries no term:
as in the tutorial's output (``Value = 4, epoch = 12, ...``), a leader's epoch is
the ledger it wrote, since every new leader opens the log for writing and so
starts a ledger of its own (R11). Records that are not a value 1..6 are counted
as skipped.

Stages: read the log (cached), count, write ``DIR/faces`` and ``DIR/epochs`` as
Parquet (with ``--out``); then print both tables.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from quorumlog.formats.dice import decode_value
from quorumlog.meta.factory import resolve_metadata_uri
from quorumlog.spark.pipelines.common import (
    PRINTED_ROWS_MAX,
    Progress,
    check_outputs_free,
    format_table,
    log_source_options,
    output_path,
    read_log,
    require_log,
    write_mode,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

NAME = "dice-stats"
HELP = "count the faces of the dice log and the values of each leader epoch"
DESCRIPTION = (
    "Reads the dice log through the quorumlog source, counts each face (1..6) and the "
    "values written in each leader epoch (epoch = ledger), writes both tables as Parquet "
    "under --out and prints them."
)
FACES = tuple(range(1, 7))
FACES_SCHEMA = "face int, count bigint, share double"
EPOCHS_COLUMNS = ("epoch", "values", "mean")

FaceRow = tuple[int, int, float]
EpochRow = tuple[int, int, float]


def output_paths(args: argparse.Namespace) -> list[str]:
    """The tables this run writes (none without ``--out``)."""
    if not args.out:
        return []
    return [output_path(args.out, "faces"), output_path(args.out, "epochs")]


# ---------------------------------------------------------------- pure helpers


def face_rows(counts: Mapping[int | None, int]) -> list[FaceRow]:
    """``(face, count, share)`` for faces 1..6, from counts per decoded value (None:
    not a value); ``share`` is the face's fraction of all faces rolled (0.0 if none)."""
    rolled = sum(counts.get(face, 0) for face in FACES)
    return [
        (face, counts.get(face, 0), counts.get(face, 0) / rolled if rolled else 0.0)
        for face in FACES
    ]


def skipped_count(counts: Mapping[int | None, int]) -> int:
    """How many records are not a face 1..6 (other values, or not a value at all)."""
    return sum(count for value, count in counts.items() if value not in FACES)


def reference_stats(
    records: Iterable[tuple[int, bytes]],
) -> tuple[list[FaceRow], list[EpochRow], int]:
    """The whole computation without Spark, over ``(ledger_id, data)`` pairs: the face
    rows, ``(epoch, values, mean)`` per epoch in epoch order, and the skipped count.
    What the Spark pipeline computes, for checking it and for small logs."""
    counts: collections.Counter[int | None] = collections.Counter()
    per_epoch: dict[int, list[int]] = {}
    for ledger_id, data in records:
        value = decode_value(data)
        counts[value] += 1
        if value in FACES:
            assert value is not None
            per_epoch.setdefault(ledger_id, []).append(value)
    epochs = [
        (epoch, len(values), sum(values) / len(values))
        for epoch, values in sorted(per_epoch.items())
    ]
    return face_rows(counts), epochs, skipped_count(counts)


def value_column(data: Column) -> Column:
    """:func:`quorumlog.formats.dice.decode_value` as a Spark expression: the signed
    big-endian int of a 4-byte ``data``, else null. Runs in the JVM: no Python worker
    sees the rows."""
    from pyspark.sql import functions as F

    unsigned = F.conv(F.hex(data), 16, 10).cast("bigint")
    signed = F.when(unsigned >= F.lit(1 << 31), unsigned - F.lit(1 << 32)).otherwise(unsigned)
    return F.when(F.octet_length(data) == 4, signed)


# ---------------------------------------------------------------- the pipeline


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run dice-stats; returns the exit status (0)."""
    from pyspark.sql import functions as F

    metadata_uri = resolve_metadata_uri(args.metadata)
    outputs = output_paths(args)
    check_outputs_free(outputs, args.overwrite)
    progress = Progress(NAME, 3 if args.out else 2)

    with progress.stage(f"reading log {args.log}") as stage:
        require_log(metadata_uri, args.log)
        records = read_log(
            spark, log_source_options(metadata_uri, args.log, password=args.password)
        )
        rolls = records.select(
            F.col("ledger_id").alias("epoch"), value_column(F.col("data")).alias("value")
        ).cache()
        total = rolls.count()
        stage.text = f"{total} rows"

    try:
        with progress.stage("counting faces and epochs") as stage:
            counts = {
                row["value"]: row["count"] for row in rolls.groupBy("value").count().collect()
            }
            faces = face_rows(counts)
            skipped = skipped_count(counts)
            # One row per leader epoch: few, so one sorted partition.
            epochs = (
                rolls.filter(F.col("value").between(1, 6))
                .groupBy("epoch")
                .agg(F.count(F.lit(1)).alias("values"), F.avg("value").alias("mean"))
                .orderBy("epoch")
                .coalesce(1)
                .cache()
            )
            epoch_count = epochs.count()
            shown = [tuple(row) for row in epochs.limit(PRINTED_ROWS_MAX).collect()]
            stage.text = f"{total - skipped} rolls, {epoch_count} epochs, {skipped} skipped"

        if args.out:
            with progress.stage(f"writing Parquet to {args.out}") as stage:
                mode = write_mode(args.overwrite)
                faces_path, epochs_path = outputs
                faces_df = spark.createDataFrame(faces, FACES_SCHEMA).coalesce(1)
                faces_df.write.mode(mode).parquet(faces_path)
                epochs.write.mode(mode).parquet(epochs_path)
                stage.text = f"faces ({len(faces)} rows), epochs ({epoch_count} rows)"
        epochs.unpersist()
    finally:
        rolls.unpersist()

    progress.print(f"faces of log {args.log} ({total - skipped} rolls, {skipped} skipped):")
    progress.print(format_table(("face", "count", "share"), faces))
    more = f", first {PRINTED_ROWS_MAX} shown" if epoch_count > len(shown) else ""
    progress.print(f"values per leader epoch (epoch = ledger; {epoch_count} epochs{more}):")
    progress.print(format_table(EPOCHS_COLUMNS, shown))
    return 0
