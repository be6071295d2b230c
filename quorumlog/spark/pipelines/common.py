"""What the pipelines share: progress lines, output paths, tables, error lines.

Nothing here imports pyspark. The pipelines' command-line options are declared by
:mod:`quorumlog.commands.pipeline`.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TextIO

from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.spark.options import SOURCE_NAME, Bound, parse_bound

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_MASTER = "local[2]"
# How many rows of a table a pipeline prints (the files hold them all).
PRINTED_ROWS_MAX = 20
ERROR_LINE_MAX_CHARS = 500


# ---------------------------------------------------------------- positions


def describe_bound(raw: str | None, default: Literal["earliest", "latest"]) -> str:
    """A bound as printed in progress lines: ``earliest``, ``latest`` or ``L:E``."""
    bound: Bound = parse_bound("position", raw, default)
    return bound if isinstance(bound, str) else str(bound)


# ---------------------------------------------------------------- reading a log


def require_log(metadata_uri: str, name: str) -> None:
    """NoSuchLogError (one line, before Spark plans anything) if log ``name`` is missing."""
    from quorumlog.log.errors import NoSuchLogError
    from quorumlog.spark import scan
    from quorumlog.spark.datasource import log_exists

    if not scan.run(log_exists(metadata_uri, name)):
        raise NoSuchLogError(f"log {name} does not exist (metadata {metadata_uri})")


def log_source_options(
    metadata_uri: str,
    name: str,
    *,
    password: str = "",
    start: str | None = None,
    end: str | None = None,
    entries_per_partition: int | None = None,
) -> dict[str, str]:
    """The ``quorumlog`` source's options for a batch read of log ``name``; those not
    given are left out, so that the source's defaults apply (checked on the driver by
    :meth:`quorumlog.spark.options.ReadOptions.parse`)."""
    options = {"metadata": metadata_uri, "log": name}
    if password:
        options["password"] = password
    if start is not None:
        options["startingPosition"] = start
    if end is not None:
        options["endingPosition"] = end
    if entries_per_partition is not None:
        options["entriesPerPartition"] = str(entries_per_partition)
    return options


def read_log(spark: SparkSession, options: Mapping[str, str]) -> DataFrame:
    """The records of a log through the ``quorumlog`` source (a batch read with
    ``options``, see :func:`log_source_options`): columns log, ledger_id, entry_id, data."""
    return spark.read.format(SOURCE_NAME).options(**options).load()


# ---------------------------------------------------------------- output paths


def output_path(out: str, *parts: str) -> str:
    """``out`` joined with ``parts``; a path without a scheme is made absolute (Spark
    would resolve it against the driver's directory anyway; printed, it says where)."""
    if _has_scheme(out):
        return "/".join([out.rstrip("/"), *parts])
    return os.path.join(os.path.abspath(out), *parts)


def _has_scheme(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def check_outputs_free(paths: Sequence[str], overwrite: bool) -> None:
    """Fail before any reading if an output table exists and ``overwrite`` is off.

    Only local paths are looked at here; for others Spark's own check applies when
    the table is written."""
    if overwrite:
        return
    for path in paths:
        local = path[len("file://") :] if path.startswith("file://") else path
        if not _has_scheme(local) and os.path.exists(local):
            raise InvalidArgumentError(
                f"output {path} exists already; remove it or give --overwrite"
            )


def write_mode(overwrite: bool) -> str:
    """The Spark save mode for ``--overwrite``."""
    return "overwrite" if overwrite else "errorifexists"


# ---------------------------------------------------------------- progress


@dataclass
class StageResult:
    """What a stage reports at its end (``1234 rows``)."""

    text: str = "done"


class Progress:
    """Prints one line per stage when it ends:
    ``[dice-stats] stage 1/3: reading log dice ... 1234 rows (0.8 s)``."""

    def __init__(self, pipeline: str, stages: int, out: TextIO | None = None) -> None:
        self.pipeline = pipeline
        self.stages = stages
        self.number = 0
        self._out = out

    def print(self, text: str) -> None:
        """A line of the pipeline's output (tables, results)."""
        out = self._out or sys.stdout
        out.write(text + "\n")
        out.flush()

    @contextmanager
    def stage(self, what: str) -> Iterator[StageResult]:
        """Run one stage; the line is printed when it ends, also when it fails."""
        self.number += 1
        head = f"[{self.pipeline}] stage {self.number}/{self.stages}: {what} ..."
        result = StageResult()
        started = time.monotonic()
        try:
            yield result
        except BaseException:
            self.print(f"{head} failed ({time.monotonic() - started:.1f} s)")
            raise
        self.print(f"{head} {result.text} ({time.monotonic() - started:.1f} s)")


# ---------------------------------------------------------------- tables and errors


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table, columns right-aligned (numbers line up)."""
    cells = [list(headers)] + [[_cell(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*: \S")


def error_line(exc: BaseException) -> str:
    """One line for a failure: a BKError's message, else the innermost error named in
    the text Spark hands back (an executor's Python traceback included)."""
    if isinstance(exc, BKError):
        return exc.message
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if _ERROR_LINE.match(line)]
    chosen = named[-1] if named else (lines[0] if lines else type(exc).__name__)
    return chosen[:ERROR_LINE_MAX_CHARS]
