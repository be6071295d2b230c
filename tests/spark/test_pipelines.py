"""The shipped pipelines (quorumlog pipeline ...) on the shared SparkSession and real
bookies: exact results on small logs, the audit report before and after a bookie dies,
and the command line once in a process of its own."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import quorumlog
from quorumlog import LogNamespace
from quorumlog.commands import OneLineArgumentParser
from quorumlog.commands.pipeline import add_pipelines
from quorumlog.errors import InvalidArgumentError, NoSuchLedgerError
from quorumlog.formats.dice import decode_value, encode_value
from quorumlog.log import LogConfig
from quorumlog.log.errors import NoSuchLogError
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.spark.pipelines import common, dice_stats, ledger_audit, log_to_parquet

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Ack quorum = write quorum: every confirmed entry is on its whole write set when an
# audit runs (with Qa < Qw the last copies may still be on their way).
FULL_COPIES = LogConfig(ensemble=3, write_quorum=3, ack_quorum=3)
STAGE_LINE = re.compile(
    r"^\[(?P<name>[a-z-]+)\] stage (?P<n>\d)/(?P<of>\d): .+ \.\.\. .+ \(\d+\.\d s\)$"
)


def parse(*argv: str) -> argparse.Namespace:
    """The pipeline's arguments as ``quorumlog pipeline`` parses them."""
    parser = OneLineArgumentParser(prog="pipeline")
    add_pipelines(parser)
    return parser.parse_args(list(argv))


def stage_lines(text: str, name: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith(f"[{name}] stage ")]
    assert lines and all(STAGE_LINE.match(line) for line in lines), text
    return lines


def write_epochs(bk: quorumlog.BookKeeper, name: str, epochs: list[list[bytes]]) -> list[int]:
    """A log with one ledger per list (each written by a writer of its own, as a new
    leader would), every ledger closed; returns the ledger ids."""
    log = LogNamespace(bk).open_log(name, FULL_COPIES)
    ledgers = []
    for records in epochs:
        writer = log.open_writer()
        ledgers.append(writer.ledger_id)
        for data in records:
            writer.append(data)
        writer.close()
    return ledgers


def rolls(*values: int) -> list[bytes]:
    return [encode_value(v) for v in values]


# ---------------------------------------------------------------- pure helpers


def test_face_rows_cover_every_face_and_skip_what_is_not_a_roll():
    counts = {1: 2, 6: 1, 9: 4, None: 3}
    assert dice_stats.face_rows(counts) == [
        (1, 2, 2 / 3),
        (2, 0, 0.0),
        (3, 0, 0.0),
        (4, 0, 0.0),
        (5, 0, 0.0),
        (6, 1, 1 / 3),
    ]
    assert dice_stats.skipped_count(counts) == 7
    assert [row[2] for row in dice_stats.face_rows({})] == [0.0] * 6


def test_reference_stats_uses_the_ledger_as_the_epoch():
    records = [(7, encode_value(2)), (7, encode_value(4)), (9, encode_value(6)), (9, b"x")]
    faces, epochs, skipped = dice_stats.reference_stats(records)
    assert [count for _, count, _ in faces] == [0, 1, 0, 1, 0, 1]
    assert epochs == [(7, 2, 3.0), (9, 1, 6.0)]
    assert skipped == 1


def test_audit_rows_verdicts_and_lines():
    healthy = {"ledger_id": 3, "healthy": True, "under_replicated": False, "missing": []}
    row = dict(zip(ledger_audit.REPORT_COLUMNS, ledger_audit.report_row(healthy), strict=True))
    assert (row["ledger_id"], row["verdict"], row["healthy"], row["missing"]) == (
        3,
        "HEALTHY",
        True,
        [],
    )
    missing = {
        "ledger_id": 4,
        "healthy": False,
        "under_replicated": True,
        "missing_count": 2,
        "missing": [{"entry_id": 0, "bookie": "b:1"}, {"entry_id": 1, "bookie": "b:1"}],
        "unreachable_bookies": ["b:1"],
        "replicas_checked": 6,
        "entries_checked": 2,
    }
    row = dict(zip(ledger_audit.REPORT_COLUMNS, ledger_audit.report_row(missing), strict=True))
    assert row["verdict"] == "UNDER_REPLICATED" and row["missing"] == [(0, "b:1"), (1, "b:1")]
    assert ledger_audit.describe(row) == (
        "ledger 4: UNDER_REPLICATED: 2 missing, 0 damaged, unreachable b:1 "
        "of 6 replicas (2 entries)"
    )
    assert ledger_audit.verdict({"damaged_count": 1, "missing_count": 3}) == "DAMAGED"
    assert ledger_audit.verdict({"unreadable_entry_count": 1, "damaged_count": 1}) == "UNREADABLE"
    assert ledger_audit.verdict({"unreachable_bookies": ["b:1"]}) == "INCOMPLETE"
    gone = dict(
        zip(
            ledger_audit.REPORT_COLUMNS,
            ledger_audit.failed_row(5, "DELETED", "ledger 5 was deleted"),
            strict=True,
        )
    )
    assert gone["verdict"] == "DELETED" and gone["error"] == "ledger 5 was deleted"
    assert not ledger_audit.is_failure("DELETED") and ledger_audit.is_failure("ERROR")
    assert [ledger_audit.partitions_for(n, None, 2) for n in (0, 1, 5)] == [1, 1, 2]
    assert ledger_audit.partitions_for(100, 7, 2) == 7


def test_common_helpers():
    assert common.format_table(("a", "bb"), [(1, 2.5), (None, "x")]) == (
        "a     bb\n1  2.500\n-      x"
    )
    assert common.output_path("hdfs://nn/out/", "faces") == "hdfs://nn/out/faces"
    assert common.output_path("rel", "faces") == os.path.join(os.getcwd(), "rel", "faces")
    assert common.describe_bound('{"ledger": 3, "entry": 1}', "latest") == "3:1"
    assert common.describe_bound(None, "latest") == "latest"
    wrapped = RuntimeError(
        "Traceback (most recent call last):\n  File x\n"
        "quorumlog.errors.NoSuchLedgerError: ledger 9 does not exist\n"
    )
    assert common.error_line(wrapped) == (
        "quorumlog.errors.NoSuchLedgerError: ledger 9 does not exist"
    )
    assert common.error_line(NoSuchLedgerError("ledger 9 does not exist")) == (
        "ledger 9 does not exist"
    )


def test_bad_arguments_are_refused_by_the_parser(capsys):
    for argv in (
        ["log-to-parquet", "--log", "x"],  # no --out
        ["log-to-parquet", "--log", "x", "--out", "o", "--from", "3"],
        ["ledger-audit", "--partitions", "0"],
        ["dice-stats", "--conf", "novalue"],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse(*argv)
        assert exit_info.value.code == 2
    assert "--from" in capsys.readouterr().err


# ---------------------------------------------------------------- dice-stats


def test_value_column_decodes_as_the_dice_application_does(spark):
    samples = [encode_value(v) for v in (1, 6, 0, -1, 2**31 - 1, -(2**31))]
    samples += [b"", b"abc", b"12345"]
    df = spark.createDataFrame([(data,) for data in samples], "data binary")
    decoded = [row[0] for row in df.select(dice_stats.value_column(df["data"])).collect()]
    assert decoded == [decode_value(data) for data in samples]


def test_dice_stats_counts_each_face_and_the_values_per_epoch(
    spark, module_cluster: LocalCluster, tmp_path, capsys
):
    uri = module_cluster.metadata_uri
    epochs = [rolls(1, 2, 3, 4, 5, 6, 6), rolls(3, 3, 1), [*rolls(6, 5), b"not-a-roll"]]
    with quorumlog.BookKeeper(uri) as bk:
        ledgers = write_epochs(bk, "dice-known", epochs)
    out = tmp_path / "stats"

    status = dice_stats.run(
        spark, parse("dice-stats", "--metadata", uri, "--log", "dice-known", "--out", str(out))
    )

    assert status == 0
    faces = spark.read.parquet(str(out / "faces")).orderBy("face").collect()
    assert [(r.face, r["count"]) for r in faces] == [(1, 2), (2, 1), (3, 3), (4, 1), (5, 2), (6, 3)]
    assert sum(r.share for r in faces) == pytest.approx(1.0)
    epochs_rows = spark.read.parquet(str(out / "epochs")).orderBy("epoch").collect()
    assert [tuple(r) for r in epochs_rows] == [
        (ledgers[0], 7, 27 / 7),
        (ledgers[1], 3, 7 / 3),
        (ledgers[2], 2, 5.5),
    ]
    records = [
        (ledger, data) for ledger, datas in zip(ledgers, epochs, strict=True) for data in datas
    ]
    ref_faces, ref_epochs, skipped = dice_stats.reference_stats(records)
    assert [(r.face, r["count"], r.share) for r in faces] == ref_faces
    assert [tuple(r) for r in epochs_rows] == ref_epochs and skipped == 1

    printed = capsys.readouterr().out
    lines = stage_lines(printed, "dice-stats")
    assert lines[0].startswith("[dice-stats] stage 1/3: reading log dice-known ... 13 rows (")
    assert "12 rolls, 3 epochs, 1 skipped" in lines[1]
    assert "faces of log dice-known (12 rolls, 1 skipped):" in printed
    assert re.search(r"^\s+3\s+3\s+0\.250$", printed, re.MULTILINE)
    assert re.search(rf"^\s*{ledgers[2]}\s+2\s+5\.500$", printed, re.MULTILINE)

    # Output that exists is kept unless --overwrite: the check comes before any reading.
    again = parse("dice-stats", "--metadata", uri, "--log", "dice-known", "--out", str(out))
    with pytest.raises(InvalidArgumentError, match="exists already"):
        dice_stats.run(spark, again)
    with pytest.raises(NoSuchLogError, match="log no-such-dice does not exist"):
        dice_stats.run(spark, parse("dice-stats", "--metadata", uri, "--log", "no-such-dice"))


# ---------------------------------------------------------------- log-to-parquet


def test_log_to_parquet_copies_the_log_and_a_position_range(
    spark, module_cluster: LocalCluster, tmp_path, capsys
):
    uri = module_cluster.metadata_uri
    epochs = [[b"r-%d-%d" % (i, j) for j in range(n)] for i, n in enumerate((40, 25, 30))]
    with quorumlog.BookKeeper(uri) as bk:
        ledgers = write_epochs(bk, "copied", epochs)
    log_rows = [
        ("copied", ledger, entry, data)
        for ledger, datas in zip(ledgers, epochs, strict=True)
        for entry, data in enumerate(datas)
    ]

    def parquet_rows(path: Path) -> list[tuple]:
        df = spark.read.parquet(str(path))
        assert df.columns == ["log", "ledger_id", "entry_id", "data", "timestamp"]
        return [
            (r.log, r.ledger_id, r.entry_id, bytes(r.data))
            for r in df.orderBy("ledger_id", "entry_id").collect()
        ]

    whole = tmp_path / "whole"
    argv = ["log-to-parquet", "--metadata", uri, "--log", "copied", "--out", str(whole)]
    assert log_to_parquet.run(spark, parse(*argv, "--entries-per-partition", "16")) == 0
    assert parquet_rows(whole) == log_rows
    printed = capsys.readouterr().out
    lines = stage_lines(printed, "log-to-parquet")
    assert "(earliest..latest) ... 7 partitions" in lines[0]  # 3 + 2 + 2 ranges of <= 16
    assert lines[2].startswith("[log-to-parquet] stage 3/3: counting rows written ... 95 rows")
    assert f"95 rows of log copied (earliest..latest) in {whole}" in printed

    part = tmp_path / "part"
    start, end = f"{ledgers[0]}:35", f"{ledgers[2]}:3"
    argv = ["log-to-parquet", "--metadata", uri, "--log", "copied", "--out", str(part)]
    assert log_to_parquet.run(spark, parse(*argv, "--from", start, "--to", end)) == 0
    expected = [row for row in log_rows if (ledgers[0], 35) <= (row[1], row[2]) < (ledgers[2], 3)]
    assert len(expected) == 5 + 25 + 3
    assert parquet_rows(part) == expected
    assert f"33 rows of log copied ({start}..{end})" in capsys.readouterr().out

    # --overwrite replaces a table; an end before the start is refused before Spark reads.
    argv = ["log-to-parquet", "--metadata", uri, "--log", "copied", "--out", str(part)]
    assert log_to_parquet.run(spark, parse(*argv, "--overwrite", "--from", end)) == 0
    assert parquet_rows(part) == log_rows[-27:]
    with pytest.raises(InvalidArgumentError, match="endingPosition"):
        log_to_parquet.run(spark, parse(*argv, "--overwrite", "--from", end, "--to", start))


# ---------------------------------------------------------------- ledger-audit


def read_report(out: Path) -> list[dict]:
    rows = []
    for part in sorted((out / "ledgers.json").glob("part-*.json")):
        rows += [json.loads(line) for line in part.read_text().splitlines() if line]
    return rows


def test_ledger_audit_reports_healthy_ledgers_then_the_under_replicated_ones(
    spark, fresh_cluster: LocalCluster, tmp_path, capsys
):
    uri = fresh_cluster.metadata_uri
    with quorumlog.BookKeeper(uri) as bk:
        ledgers = []
        for count in (20, 7, 0, 33):
            handle = bk.create_ledger(3, 3, 3)
            for i in range(count):
                handle.add_entry(b"audit-%d" % i)
            handle.close()
            ledgers.append(handle.ledger_id)
        ledgers += write_epochs(bk, "audited", [[b"a"] * 5])  # a log's ledger is one too
    entries = {ledger: n for ledger, n in zip(ledgers, (20, 7, 0, 33, 5), strict=True)}
    out = tmp_path / "audit"

    args = parse("ledger-audit", "--metadata", uri, "--out", str(out), "--partitions", "3")
    assert ledger_audit.run(spark, args) == 0
    report = read_report(out)
    assert [row["ledger_id"] for row in report] == sorted(ledgers)
    assert {row["verdict"] for row in report} == {"HEALTHY"}
    assert {row["ledger_id"]: row["entries_checked"] for row in report} == entries
    assert all(row["replicas_checked"] == 3 * row["entries_checked"] for row in report)
    parquet = spark.read.parquet(str(out / "ledgers.parquet")).orderBy("ledger_id").collect()
    assert [r.ledger_id for r in parquet] == sorted(ledgers) and all(r.healthy for r in parquet)
    printed = capsys.readouterr().out
    lines = stage_lines(printed, "ledger-audit")
    assert "stage 1/3: listing ledgers ... 5 ledgers" in lines[0]
    assert "stage 2/3: auditing 5 ledgers in 3 tasks ... 5 healthy" in lines[1]
    assert "all 5 ledgers healthy" in printed

    victim = fresh_cluster.bookies[1]
    fresh_cluster.kill(victim.index)
    args = parse(
        "ledger-audit",
        "--metadata",
        uri,
        "--out",
        str(out),
        "--overwrite",
        "--request-timeout-ms",
        "2000",
    )
    assert ledger_audit.run(spark, args) == 1
    report = {row["ledger_id"]: row for row in read_report(out)}
    assert set(report) == set(ledgers)
    empty = ledgers[2]
    assert report[empty]["verdict"] == "HEALTHY"  # no entry: no bookie to ask
    assert (report[empty]["missing_count"], report[empty]["unreachable_bookies"]) == (0, [])
    for ledger, count in entries.items():
        if not count:
            continue
        row = report[ledger]
        assert row["verdict"] == "UNDER_REPLICATED" and row["under_replicated"]
        assert row["unreachable_bookies"] == [victim.address]
        assert row["missing_count"] == count  # every entry has a copy on each of the 3
        assert row["missing"][0] == {"entry_id": 0, "bookie": victim.address}
        assert row["unreadable_entry_count"] == 0
    printed = capsys.readouterr().out
    assert "4 of 5 ledgers not healthy:" in printed
    assert (
        f"ledger {ledgers[0]}: UNDER_REPLICATED: 20 missing, 0 damaged, unreachable "
        f"{victim.address} of 60 replicas (20 entries)" in printed
    )
    assert "1 healthy, 4 under-replicated" in stage_lines(printed, "ledger-audit")[1]


# ---------------------------------------------------------------- the command line


def test_cli_runs_dice_stats_in_a_process_of_its_own(module_cluster: LocalCluster, tmp_path):
    uri = module_cluster.metadata_uri
    with quorumlog.BookKeeper(uri) as bk:
        write_epochs(bk, "dice-cli", [rolls(2, 2, 5), rolls(6)])
    out = tmp_path / "cli-stats"
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "pipeline",
            "dice-stats",
            "--metadata",
            uri,
            "--log",
            "dice-cli",
            "--out",
            str(out),
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("[dice-stats] Spark ") and " on local[1], " in result.stdout
    lines = stage_lines(result.stdout, "dice-stats")
    assert [line.split(" ...")[0] for line in lines] == [
        "[dice-stats] stage 1/3: reading log dice-cli",
        "[dice-stats] stage 2/3: counting faces and epochs",
        f"[dice-stats] stage 3/3: writing Parquet to {out}",
    ]
    assert "4 rows" in lines[0]
    import pyarrow.parquet as pq

    faces = pq.read_table(out / "faces").to_pydict()
    assert dict(zip(faces["face"], faces["count"], strict=True)) == {
        1: 0,
        2: 2,
        3: 0,
        4: 0,
        5: 1,
        6: 1,
    }
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "pipeline",
            "dice-stats",
            "--metadata",
            uri,
            "--log",
            "no such log!",
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("quorumlog pipeline dice-stats: ")
