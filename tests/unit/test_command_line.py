"""The ``quorumlog`` command's parsers: whole flags only."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.commands import build_parser, main

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
    for path in sorted([*ROOT.glob("quorumlog/**/*.py"), *ROOT.glob("bench/**/*.py")]):
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
    assert offenders == []
