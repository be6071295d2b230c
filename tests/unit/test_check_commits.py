"""scripts/check_commits.py: commit subjects read ``area: imperative summary``, at most
72 characters, from the commit that added the script on (fake commit lists, no git)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_commits.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_commits", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_commits", module)
    spec.loader.exec_module(module)
    return module


cc = _load()


@pytest.mark.parametrize(
    "subject",
    [
        "journal: cut a torn tail at the damaged record",
        "docs/TESTING.md: list the storage layer and its time",
        "bench/read_hot_path.py: print the disk's state",
        "tests, docs: rename the review tests after what they check",
        "db: a follower waits up to 2 s for a leader",
        "x" * 10 + ": " + "y" * 60,  # 72 characters
    ],
)
def test_subjects_of_the_form_area_summary_pass(subject: str) -> None:
    assert cc.subject_problem(subject) == ""
    assert cc.check([("a" * 40, subject)]) == []


@pytest.mark.parametrize(
    ("subject", "why"),
    [
        ("x" * 10 + ": " + "y" * 61, "73 characters"),
        ("Fix the journal scan", "not of the form"),
        ("journal:cut a torn tail", "not of the form"),
        ("journal: ", "not of the form"),
        ("the journal: cut a tail", "not of the form"),
        ("journal: cut a torn tail.", "full stop"),
        ("journal: fixed the torn tail", "past tense"),
        ("Merge branch 'wt-split'", "not of the form"),
    ],
)
def test_other_subjects_are_named_with_their_hash(subject: str, why: str) -> None:
    commit = "0123456789abcdef" * 2 + "01234567"
    (line,) = cc.check([("f" * 40, "tests: keep this one"), (commit, subject)])
    assert line.startswith(commit[:12])
    assert repr(subject) in line
    assert why in line


def test_commits_after_the_one_that_added_the_script_are_checked() -> None:
    seen: list[Sequence[str]] = []

    def git(args: Sequence[str]) -> str | None:
        seen.append(args)
        if args[0] == "rev-parse":
            return ".git\n"
        if "--diff-filter=A" in args:
            return "b" * 40 + "\n"
        return "c" * 40 + "\0scripts: add a check\n" + "d" * 40 + "\0Added things\n"

    commits, what = cc.commits_to_check(git)
    assert commits == [("c" * 40, "scripts: add a check"), ("d" * 40, "Added things")]
    assert "2 commits after bbbbbbbbbbbb" in what
    (log,) = [args for args in seen if f"{'b' * 40}..HEAD" in args]
    assert "--no-merges" in log
    assert len(cc.check(commits)) == 1


def test_a_shallow_clone_checks_after_its_first_commit_and_says_so() -> None:
    def git(args: Sequence[str]) -> str | None:
        if args[0] == "rev-parse":
            return "true\n" if "--is-shallow-repository" in args else ".git\n"
        if args[0] == "rev-list":
            return "b" * 40 + "\n"  # no parent: where the shallow history begins
        if "--diff-filter=A" in args:
            return "b" * 40 + "\n"
        return "c" * 40 + "\0scripts: add a check\n"

    commits, what = cc.commits_to_check(git)
    assert commits == [("c" * 40, "scripts: add a check")]
    assert "shallow clone" in what


def test_without_a_clone_it_says_what_it_skipped() -> None:
    commits, what = cc.commits_to_check(lambda args: None)
    assert commits is None
    assert what.startswith("skipped:")


def test_before_the_script_is_committed_nothing_is_checked() -> None:
    def git(args: Sequence[str]) -> str | None:
        return ".git\n" if args[0] == "rev-parse" else ""

    commits, what = cc.commits_to_check(git)
    assert commits == []
    assert "nothing to check" in what


def test_a_history_that_does_not_reach_the_range_is_skipped() -> None:
    def git(args: Sequence[str]) -> str | None:
        if args[0] == "rev-parse":
            return ".git\n"
        return "b" * 40 + "\n" if "--diff-filter=A" in args else None

    commits, what = cc.commits_to_check(git)
    assert commits is None
    assert what.startswith("skipped:")
