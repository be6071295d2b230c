"""``quorumlog pipeline`` checks what the metadata store can tell before Spark starts
(a JVM start costs seconds, and under load close to a minute)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

import pytest

import quorumlog
from quorumlog import LogNamespace
from quorumlog.commands import pipeline
from quorumlog.commands.pipeline import add_pipelines


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quorumlog pipeline")
    add_pipelines(parser)
    return parser.parse_args(argv)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(args: argparse.Namespace) -> NoReturn:
        pytest.fail("Spark was started before the checks")

    monkeypatch.setattr(pipeline, "session_for", refuse)


@pytest.mark.parametrize(
    "argv",
    [
        ["log-to-parquet", "--log", "nope", "--out", "OUT"],
        ["dice-stats", "--log", "nope"],
        ["db-changes", "--log", "db/nope", "--out", "OUT"],
    ],
    ids=lambda argv: argv[0],
)
def test_a_missing_log_is_reported_before_spark_starts(
    metadata_uri: str,
    tmp_path: Path,
    argv: list[str],
    no_spark: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with quorumlog.BookKeeper(metadata_uri) as bk:
        LogNamespace(bk).open_log("dice")  # a log that exists: the message lists it
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    status = pipeline.run(parse(*argv, "--metadata", metadata_uri))
    assert status == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"quorumlog pipeline {argv[0]}: log {argv[2]} does not exist")
    assert "dice" in err


def test_a_missing_store_is_reported_before_spark_starts(
    tmp_path: Path, no_spark: None, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo" / "metadata.db"
    status = pipeline.run(parse("dice-stats", "--metadata", f"sqlite://{missing}"))
    assert status == 1
    err = capsys.readouterr().err
    assert "no metadata store" in err and len(err.strip().splitlines()) == 1
    assert not missing.parent.exists()
