"""The README's command tables and the parsers stay in step.

Each row of the tables under "The command line" starts with a code span, ``quorumlog
SUB [SUB] ...``: its leading words (``a|b`` for several) name subcommands; every flag
it names must be one of theirs. A row whose span holds ``[...]`` shows a selection;
the rows naming a subcommand, without it, must together name every option it has.
Every subcommand (one with options of its own, or without subcommands) has a row, and
every row names subcommands that exist.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from quorumlog.commands import build_parser

README = Path(__file__).resolve().parents[2] / "README.md"
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")


def readme_rows() -> list[str]:
    """The first code span of each command-table row in "The command line"."""
    text = README.read_text()
    section = text.split("\n## The command line\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `quorumlog"):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            rows.append(first_cell.strip().strip("`").replace("\\|", "|"))
    return rows


@functools.cache
def command_parser() -> argparse.ArgumentParser:
    return build_parser()


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Its options (not positionals, help, hidden ones, or subcommands)."""
    return [
        a
        for a in parser._actions
        if a.option_strings
        and not isinstance(a, argparse._HelpAction)
        and a.help != argparse.SUPPRESS
    ]


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for sub in dict.fromkeys(subparsers(parser).values()):
        yield from walk(sub)


def resolve(row: str) -> list[argparse.ArgumentParser]:
    """The parsers a row's leading words name (several for ``a|b``)."""
    words = row.split()
    assert words[0] == "quorumlog", row
    chosen = [command_parser()]
    for word in words[1:]:
        names = word.split("|")
        choices = subparsers(chosen[0])
        if not choices or not all(name in choices for name in names):
            break
        assert len(chosen) == 1, f"{row}: alternatives only at the last subcommand"
        chosen = [choices[name] for name in names]
    return chosen


COMMAND_WORD = re.compile(r"[a-z][a-z0-9_-]*(\|[a-z][a-z0-9_-]*)*")


def unknown_subcommand(row: str) -> str | None:
    """The first word of a row that stands where a subcommand goes and names none."""
    parser = command_parser()
    for word in row.split()[1:]:
        choices = subparsers(parser)
        if not choices:
            return None
        names = word.split("|")
        if not all(name in choices for name in names):
            return word if COMMAND_WORD.fullmatch(word) else None
        parser = choices[names[0]]
    return None


@pytest.mark.parametrize("row", readme_rows())
def test_every_readme_row_names_commands_that_exist(row: str) -> None:
    assert unknown_subcommand(row) is None, f"{row}: no such subcommand"


def test_a_misspelt_subcommand_is_caught() -> None:
    assert unknown_subcommand("quorumlog shell listbokies") == "listbokies"
    assert unknown_subcommand("quorumlog db chnages --follow") == "chnages"
    assert unknown_subcommand("quorumlog shell autorecovery enable|disable|status") is None
    assert unknown_subcommand("quorumlog shell [--metadata URI] COMMAND") is None


def test_the_readme_has_command_tables() -> None:
    assert len(readme_rows()) > 30


@pytest.mark.parametrize("row", readme_rows())
def test_every_flag_of_a_readme_row_exists(row: str) -> None:
    for parser in resolve(row):
        known = {s for a in options(parser) for s in a.option_strings}
        unknown = [flag for flag in FLAG.findall(row) if flag not in known]
        assert unknown == [], f"{parser.prog} has no {unknown}"


def test_the_readme_names_every_command_and_every_option() -> None:
    named: dict[str, list[str]] = {}  # prog -> the rows naming it
    for row in readme_rows():
        for parser in resolve(row):
            named.setdefault(parser.prog, []).append(row)
    missing_commands = []
    missing_options = []
    for parser in walk(command_parser()):
        own = options(parser)
        if subparsers(parser) and not own:
            continue  # a group of subcommands, each with rows of its own
        rows = named.get(parser.prog)
        if not rows:
            missing_commands.append(parser.prog)
            continue
        if any("[...]" in row for row in rows):
            continue
        flags = {flag for row in rows for flag in FLAG.findall(row)}
        missing_options += [
            f"{parser.prog} {action.option_strings[-1]}"
            for action in own
            if not flags & set(action.option_strings)
        ]
    assert missing_commands == []
    assert missing_options == []
