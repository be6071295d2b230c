"""``ledger-audit``: every ledger of the metadata store audited, in parallel on the
executors, into one report.

The driver lists the ledgers; each Spark task audits its share with
:func:`quorumlog.replication.audit_ledger` (each copy of each entry read from the bookies
of its write set and checked against the digest; nothing fenced, nothing
changed), a few ledgers at a time, on its Python worker's own client. One report
row per ledger (:data:`REPORT_SCHEMA`) goes to ``DIR/ledgers.parquet`` and
``DIR/ledgers.json`` (JSON lines) with ``--out``; the ledgers that are not healthy
are printed, and the exit status is 1 if there is any.

A ledger deleted between the listing and its audit is reported as ``DELETED``
and is not a failure.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from quorumlog.errors import BKError, NoSuchLedgerError
from quorumlog.meta.factory import resolve_metadata_uri
from quorumlog.spark.pipelines.common import (
    PRINTED_ROWS_MAX,
    Progress,
    check_outputs_free,
    output_path,
    write_mode,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from quorumlog.client.bookkeeper import BookKeeper

NAME = "ledger-audit"
HELP = "audit every ledger on the executors; exit status 1 if any is not healthy"
DESCRIPTION = (
    "Lists the ledgers of the metadata store and audits them in parallel across the "
    "executors (every copy of every entry, read from the bookies of its write set, "
    "checked against its digest; nothing is fenced or changed). Writes one report row per "
    "ledger under --out (ledgers.parquet, ledgers.json), prints the ledgers that are not "
    "healthy, and exits with status 1 if there is any."
)

HEALTHY = "HEALTHY"
UNDER_REPLICATED = "UNDER_REPLICATED"  # copies missing, every entry still has a good one
DAMAGED = "DAMAGED"  # some copy fails its digest or cannot be read back
UNREADABLE = "UNREADABLE"  # some entry has no good copy left
INCOMPLETE = "INCOMPLETE"  # bookies did not answer, no copy found missing
DELETED = "DELETED"  # gone between the listing and the audit
ERROR = "ERROR"  # the audit could not run (wrong password, metadata unreadable)
NOT_FAILURES = frozenset({HEALTHY, DELETED})

# One report row per ledger: the audit's figures, the verdict, and ``error`` for an
# audit that could not run (its other columns null).
REPORT_FIELDS: tuple[tuple[str, str], ...] = (
    ("ledger_id", "bigint"),
    ("verdict", "string"),
    ("healthy", "boolean"),
    ("under_replicated", "boolean"),
    ("state", "string"),
    ("closed", "boolean"),
    ("last_entry_id", "bigint"),
    ("ensemble_size", "int"),
    ("write_quorum", "int"),
    ("ack_quorum", "int"),
    ("fragments", "int"),
    ("entries_checked", "bigint"),
    ("replicas_checked", "bigint"),
    ("good_replicas", "bigint"),
    ("missing_count", "bigint"),
    ("damaged_count", "bigint"),
    ("under_replicated_entry_count", "bigint"),
    ("unreadable_entry_count", "bigint"),
    ("unreachable_bookies", "array<string>"),
    ("missing", "array<struct<entry_id: bigint, bookie: string>>"),
    ("damaged", "array<struct<entry_id: bigint, bookie: string, reason: string>>"),
    ("unreadable_entries", "array<bigint>"),
    ("error", "string"),
    ("elapsed_ms", "double"),
)
REPORT_SCHEMA = ", ".join(f"{name} {kind}" for name, kind in REPORT_FIELDS)
REPORT_COLUMNS = tuple(name for name, _ in REPORT_FIELDS)

# Ledgers one worker audits at once (each audit keeps reads in flight to every bookie).
DEFAULT_LEDGERS_IN_FLIGHT = 4
# A safety net around one batch of audits; each audit is bounded by its request timeouts.
BATCH_TIMEOUT_S = 3_600.0
AUDITS_PER_BATCH = 4  # times the ledgers in flight: rows leave the worker per batch


def output_paths(args: argparse.Namespace) -> list[str]:
    """The report's two tables (none without ``--out``)."""
    if not args.out:
        return []
    return [output_path(args.out, "ledgers.parquet"), output_path(args.out, "ledgers.json")]


# ---------------------------------------------------------------- pure helpers


def verdict(row: Mapping[str, Any]) -> str:
    """The one word for an audit row (from :meth:`LedgerAudit.to_dict`)."""
    if row.get("healthy"):
        return HEALTHY
    if row.get("unreadable_entry_count"):
        return UNREADABLE
    if row.get("damaged_count"):
        return DAMAGED
    if row.get("missing_count") or row.get("under_replicated"):
        return UNDER_REPLICATED
    return INCOMPLETE


def report_row(audit: Mapping[str, Any]) -> tuple[Any, ...]:
    """A report row (in :data:`REPORT_SCHEMA` order) from an audit's ``to_dict()``."""
    missing = [(int(m["entry_id"]), str(m["bookie"])) for m in audit.get("missing", ())]
    damaged = [
        (int(d["entry_id"]), str(d["bookie"]), str(d["reason"])) for d in audit.get("damaged", ())
    ]
    unreachable = [str(b) for b in audit.get("unreachable_bookies", ())]
    return (
        int(audit["ledger_id"]),
        verdict(audit),
        bool(audit.get("healthy", False)),
        bool(audit.get("under_replicated", bool(missing or damaged))),
        audit.get("state"),
        audit.get("closed"),
        audit.get("last_entry_id"),
        audit.get("ensemble_size"),
        audit.get("write_quorum"),
        audit.get("ack_quorum"),
        audit.get("fragments"),
        audit.get("entries_checked"),
        audit.get("replicas_checked"),
        audit.get("good_replicas"),
        audit.get("missing_count", len(missing)),
        audit.get("damaged_count", len(damaged)),
        audit.get("under_replicated_entry_count"),
        audit.get("unreadable_entry_count"),
        unreachable,
        missing,
        damaged,
        [int(e) for e in audit.get("unreadable_entries", ())],
        None,
        audit.get("elapsed_ms"),
    )


def failed_row(ledger_id: int, verdict_word: str, message: str) -> tuple[Any, ...]:
    """A report row for a ledger whose audit did not run (``DELETED`` or ``ERROR``)."""
    row: list[Any] = [None] * len(REPORT_COLUMNS)
    row[0] = ledger_id
    row[1] = verdict_word
    row[2] = False
    row[REPORT_COLUMNS.index("error")] = message
    return tuple(row)


def is_failure(verdict_word: str) -> bool:
    """Whether a ledger with this verdict makes the exit status 1."""
    return verdict_word not in NOT_FAILURES


def describe(row: Mapping[str, Any]) -> str:
    """One line for a ledger that is not healthy."""
    head = f"ledger {row['ledger_id']}: {row['verdict']}"
    if row.get("error"):
        return f"{head}: {row['error']}"
    parts = [f"{row.get('missing_count') or 0} missing", f"{row.get('damaged_count') or 0} damaged"]
    if row.get("unreadable_entry_count"):
        parts.append(f"{row['unreadable_entry_count']} entries with no good copy")
    if row.get("unreachable_bookies"):
        parts.append("unreachable " + ", ".join(row["unreachable_bookies"]))
    checked = f"of {row.get('replicas_checked')} replicas ({row.get('entries_checked')} entries)"
    return f"{head}: {', '.join(parts)} {checked}"


def partitions_for(ledger_count: int, wanted: int | None, default_parallelism: int) -> int:
    """How many tasks audit ``ledger_count`` ledgers: ``wanted`` or the default
    parallelism, never more than the ledgers (at least one)."""
    return max(1, min(ledger_count, wanted or default_parallelism))


# ---------------------------------------------------------------- executors


async def _audit_one(
    bk: BookKeeper, ledger_id: int, password: bytes, request_timeout_ms: int | None
) -> tuple[Any, ...]:
    from quorumlog.replication import audit_ledger

    try:
        audit = await audit_ledger(
            bk, ledger_id, password=password, request_timeout_ms=request_timeout_ms
        )
    except NoSuchLedgerError:
        return failed_row(ledger_id, DELETED, f"ledger {ledger_id} was deleted")
    except BKError as exc:
        return failed_row(ledger_id, ERROR, exc.message)
    return report_row(audit.to_dict())


async def _audit_batch(
    metadata_uri: str,
    ledger_ids: Sequence[int],
    password: bytes,
    in_flight: int,
    request_timeout_ms: int | None,
) -> list[tuple[Any, ...]]:
    from quorumlog.client.reading import gather_in_order
    from quorumlog.spark import scan

    bk = await scan.client_for(metadata_uri)
    return await gather_in_order(
        [
            functools.partial(_audit_one, bk, ledger_id, password, request_timeout_ms)
            for ledger_id in ledger_ids
        ],
        in_flight,
    )


def audit_partition(
    metadata_uri: str,
    password: bytes,
    in_flight: int,
    request_timeout_ms: int | None,
    ledger_ids: Iterable[int],
) -> Iterator[tuple[Any, ...]]:
    """One Spark task: report rows for ``ledger_ids``, audited ``in_flight`` at a time on
    this Python worker's event loop and client (:mod:`quorumlog.spark.scan`)."""
    from quorumlog.spark import scan

    batch_size = in_flight * AUDITS_PER_BATCH
    batch: list[int] = []
    for ledger_id in ledger_ids:
        batch.append(int(ledger_id))
        if len(batch) == batch_size:
            yield from scan.run(
                _audit_batch(metadata_uri, batch, password, in_flight, request_timeout_ms),
                BATCH_TIMEOUT_S,
            )
            batch = []
    if batch:
        yield from scan.run(
            _audit_batch(metadata_uri, batch, password, in_flight, request_timeout_ms),
            BATCH_TIMEOUT_S,
        )


async def _list_ledgers(metadata_uri: str) -> list[int]:
    from quorumlog.spark import scan

    bk = await scan.client_for(metadata_uri)
    return sorted(await bk.list_ledgers())


# ---------------------------------------------------------------- the pipeline


def run(spark: SparkSession, args: argparse.Namespace) -> int:
    """Run ledger-audit; returns 1 if any ledger is not healthy, else 0."""
    from quorumlog.spark import scan

    metadata_uri = resolve_metadata_uri(args.metadata)
    outputs = output_paths(args)
    check_outputs_free(outputs, args.overwrite)
    progress = Progress(NAME, 3 if args.out else 2)

    with progress.stage("listing ledgers") as stage:
        ledger_ids = scan.run(_list_ledgers(metadata_uri))
        stage.text = f"{len(ledger_ids)} ledgers"

    report, partitions = _report_frame(spark, metadata_uri, ledger_ids, args)
    try:
        tasks = f"{partitions} task{'s' if partitions != 1 else ''}"
        with progress.stage(f"auditing {len(ledger_ids)} ledgers in {tasks}") as stage:
            by_verdict = {
                row["verdict"]: row["count"] for row in report.groupBy("verdict").count().collect()
            }
            stage.text = _verdict_counts_text(by_verdict)
        if args.out:
            with progress.stage(f"writing the report to {args.out}") as stage:
                _write_report(report, outputs, args.overwrite)
                stage.text = "ledgers.parquet, ledgers.json"
        failures, shown = _failing_rows(report, by_verdict)
    finally:
        report.unpersist()

    if not failures:
        progress.print(f"all {len(ledger_ids) - by_verdict.get(DELETED, 0)} ledgers healthy")
        return 0
    more = f" (first {PRINTED_ROWS_MAX} shown)" if failures > len(shown) else ""
    progress.print(f"{failures} of {len(ledger_ids)} ledgers not healthy{more}:")
    for row in shown:
        progress.print(describe(row.asDict()))
    return 1


def _report_frame(
    spark: SparkSession, metadata_uri: str, ledger_ids: list[int], args: argparse.Namespace
) -> tuple[DataFrame, int]:
    """The report, one row per ledger, audited by the executors when first used; and
    how many tasks audit it."""
    sc = spark.sparkContext
    partitions = partitions_for(len(ledger_ids), args.partitions, sc.defaultParallelism)
    task = functools.partial(
        audit_partition,
        metadata_uri,
        args.password.encode(),
        args.ledgers_in_flight,
        args.request_timeout_ms,
    )
    # Cached: the audit runs once, for the counts, the files and the lines printed.
    report = spark.createDataFrame(
        sc.parallelize(ledger_ids, partitions).mapPartitions(task), REPORT_SCHEMA
    ).cache()
    return report, partitions


def _verdict_counts_text(by_verdict: Mapping[str, int]) -> str:
    """``"3 healthy, 1 under-replicated"``: the ledgers of each verdict, in the order
    from healthy to error."""
    return (
        ", ".join(
            f"{by_verdict[word]} {word.lower().replace('_', '-')}"
            for word in (
                HEALTHY,
                UNDER_REPLICATED,
                DAMAGED,
                UNREADABLE,
                INCOMPLETE,
                DELETED,
                ERROR,
            )
            if by_verdict.get(word)
        )
        or "nothing to audit"
    )


def _write_report(report: DataFrame, outputs: Sequence[str], overwrite: bool) -> None:
    parquet_path, json_path = outputs
    ordered = report.orderBy("ledger_id").coalesce(1)
    mode = write_mode(overwrite)
    ordered.write.mode(mode).parquet(parquet_path)
    # Every key on every line, null or not: readers need not guess.
    ordered.write.mode(mode).option("ignoreNullFields", "false").json(json_path)


def _failing_rows(report: DataFrame, by_verdict: Mapping[str, int]) -> tuple[int, list[Row]]:
    """How many ledgers are not healthy, and the first of them to print."""
    from pyspark.sql import functions as F

    failing_words = [word for word in by_verdict if is_failure(word)]
    failures = sum(by_verdict[word] for word in failing_words)
    shown = (
        report.filter(F.col("verdict").isin(failing_words))
        .orderBy("ledger_id")
        .limit(PRINTED_ROWS_MAX)
        .collect()
        if failures
        else []
    )
    return failures, shown
