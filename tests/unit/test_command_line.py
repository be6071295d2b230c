"""The ``quorumlog`` command's parsers: whole flags only, errors that name the subcommand."""

from __future__ import annotations

import argparse
import ast
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.commands import build_parser, main
from quorumlog.commands.pipeline import main as pipeline_main

ROOT = Path(__file__).resolve().parents[2]


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases: once each
                yield from walk(sub)


def test_every_parser_refuses_abbreviated_flags() -> None:
    parsers = list(walk(build_parser()))
    assert len(parsers) > 40  # the walk reached the subcommands' subcommands
    abbreviating = [p.prog for p in parsers if p.allow_abbrev]
    assert abbreviating == []


def test_an_abbreviated_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["dice", "--interval", "500"])
    assert exited.value.code == 2
    assert "--interval" in capsys.readouterr().err


def test_every_argument_parser_in_the_sources_refuses_abbreviations() -> None:
    """Scripts beside the command (benchmarks, the simulator's and the namespace tests'
    entry points) build parsers of their own with argparse's class, whose subcommands'
    parsers do not inherit the setting: each of them passes allow_abbrev=False."""
    offenders = []
    sources = ("quorumlog/**/*.py", "bench/**/*.py", "tests/harness/**/*.py")
    for path in sorted(p for pattern in sources for p in ROOT.glob(pattern)):
        calls = [
            n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, ast.Call)
        ]
        names = {id(c): getattr(c.func, "attr", getattr(c.func, "id", "")) for c in calls}
        if "ArgumentParser" not in names.values():
            continue  # the command's modules: OneLineArgumentParser, checked above
        for call in calls:
            if names[id(call)] in ("ArgumentParser", "add_parser") and not any(
                k.arg == "allow_abbrev"
                and isinstance(k.value, ast.Constant)
                and k.value.value is False
                for k in call.keywords
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert offenders == [], "pass allow_abbrev=False: flags are taken only whole"


@pytest.mark.parametrize(
    ("argv", "prog", "flag", "suggestion"),
    [
        (["dice", "--interval", "500"], "quorumlog dice", "--interval", "--interval-ms"),
        # cut short: the flag it begins, not the nearest spelling (--metadata)
        (["bookie", "--data", "/tmp/d"], "quorumlog bookie", "--data", "--data-dir"),
        (
            ["shell", "readledger", "1", "--frist", "2"],
            "quorumlog shell readledger",
            "--frist",
            "--first",
        ),
        (
            ["bench", "tail", "--duration", "1"],
            "quorumlog bench tail",
            "--duration",
            "--duration-s",
        ),
        (["localbookie", "3", "--nosuchflag"], "quorumlog localbookie", "--nosuchflag", None),
    ],
)
def test_a_mistyped_flag_names_the_subcommands_usage(
    argv: list[str],
    prog: str,
    flag: str,
    suggestion: str | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{prog}: error: unrecognized arguments: {flag}")
    assert f"see {prog} --help" in err
    if suggestion is not None:
        assert f"did you mean {suggestion}?" in err


def test_the_spark_submit_entry_point_names_the_pipelines_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        pipeline_main(["dice-stats", "--outt", "/tmp/x"])
    err = capsys.readouterr().err
    assert err.startswith("pipeline dice-stats: error: unrecognized arguments: --outt")
    assert "did you mean --out?" in err


def test_the_servers_entry_point_has_the_bookies_flags_but_not_the_commands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m quorumlog.server`` takes every flag of ``quorumlog bookie`` but the
    command's own (the configuration file, the co-hosted autorecovery)."""
    from quorumlog.commands import autorecovery
    from quorumlog.server.__main__ import main as server_main

    bookie = next(p for p in walk(build_parser()) if p.prog == "quorumlog bookie")
    flags = {f for a in bookie._actions for f in a.option_strings}
    daemon = argparse.ArgumentParser()
    autorecovery.add_options(daemon)
    command_only = {f for a in daemon._actions for f in a.option_strings} - {"-h", "--help"}
    command_only |= {"--autorecovery", "--config"}
    with pytest.raises(SystemExit) as exited:
        server_main(["--help"])
    assert exited.value.code == 0
    usage = capsys.readouterr().out
    missing = sorted(f for f in flags - command_only if f not in usage)
    assert missing == []
    with pytest.raises(SystemExit) as exited:
        server_main(["--data-dir", str(ROOT), "--autorecovery"])
    assert exited.value.code == 2
    assert "--autorecovery" in capsys.readouterr().err


def test_a_bookie_names_the_autorecovery_options_it_ignores_without_autorecovery() -> None:
    """``quorumlog bookie --placement rack-aware`` without ``--autorecovery`` ran with no
    word that the policy went unused: the options given are named in a warning."""
    from quorumlog.commands import build_parser
    from quorumlog.commands.bookie import _autorecovery_options_given

    parser = build_parser()
    plain = parser.parse_args(["bookie", "--data-dir", "/tmp/d"])
    assert _autorecovery_options_given(plain) == []
    given = parser.parse_args(
        ["bookie", "--data-dir", "/tmp/d", "--placement", "rack-aware", "--password", "x"]
    )
    assert _autorecovery_options_given(given) == ["--placement", "--password"]


def test_a_reader_of_stdout_that_leaves_stops_a_command_quietly() -> None:
    """``quorumlog shell listledgers | head`` printed ``[Errno 32] Broken pipe``: a
    command whose stdout closes now stops as a Unix tool does, with nothing on stderr
    and the status of a death by SIGPIPE."""
    import subprocess
    import sys

    script = (
        "import argparse, sys\n"
        "from quorumlog.commands import run_parsed\n"
        "parser = argparse.ArgumentParser(allow_abbrev=False)\n"
        "def func(args):\n"
        "    for i in range(200_000):\n"
        "        print('line', i)\n"
        "    return 0\n"
        "parser.set_defaults(func=func)\n"
        "sys.exit(run_parsed(parser, []))\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline() == b"line 0\n"
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=30) == 141, stderr
    assert stderr == b""


@pytest.mark.parametrize(
    "argv",
    [
        ["shell", "listledgers", "--reads-per-s", "0"],
        ["shell", "migratelayout", "--reads-per-s", "-1"],
        ["shell", "orphans", "--reads-per-s", "nan"],
    ],
)
def test_a_read_rate_that_is_not_above_0_is_refused_naming_the_flag(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Once, 0 went through to the walk and failed as ``reads_per_s must be positive or
    None, got 0.0``, a name the user never typed."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--reads-per-s" in err and "above 0" in err and "reads_per_s" not in err


def test_a_stopped_bookies_file_command_leaves_a_closed_stdout_to_main(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``shell readjournal ... | head`` printed ``[Errno 32] Broken pipe`` with status 1:
    the offline commands' error handler took the closed pipe for a failure."""
    from quorumlog.commands import bookie_files, shell

    def reader_left(args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(bookie_files, "run", reader_left)
    args = build_parser().parse_args(["shell", "readjournal", "1", "--data-dir", "/tmp/none"])
    kazoo = logging.getLogger("kazoo")
    level = kazoo.level
    try:
        with pytest.raises(BrokenPipeError):
            shell.run(args)
    finally:
        kazoo.setLevel(level)  # the shell quiets kazoo for its process; not for later tests
