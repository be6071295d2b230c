"""Check the subjects of the commits made since this script was added.

Every subject reads ``area: imperative summary`` in at most 72 characters, e.g.
``journal: cut a torn tail at the damaged record``. Commits older than the commit that
added this file are not checked (the history before it followed looser habits); that
commit is found by content, not by hash, so the check holds after a cherry-pick too.
Merge commits are not checked: git writes their subjects.

    python scripts/check_commits.py     # exit 1 and the offending commits, if any

Without git, or outside a clone (a source archive), it says what it skipped and exits 0;
in a shallow clone that does not reach the commit that added this file, it checks the
commits after the first one it has, and says so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

MAX_SUBJECT_CHARS = 72
SCRIPT_PATH = "scripts/check_commits.py"
# ``area: summary``: an area is a word or a path (``bookie``, ``docs/TESTING.md``,
# ``bench/read_hot_path.py``), optionally several joined by ", ".
_SUBJECT = re.compile(
    r"^(?P<area>[A-Za-z0-9_.*/{}-]+(?:, [A-Za-z0-9_.*/{}-]+)*): (?P<summary>\S.*)$"
)
# A summary says what the commit does ("add", "fix"), not what was done ("added").
_PAST_TENSE = re.compile(r"^[A-Za-z]+ed$")
_NOT_PAST_TENSE = frozenset({"need", "seed", "speed", "feed", "embed", "shed", "bed", "red"})

# Runs git with these arguments; returns its output, or None when git failed.
Git = Callable[[Sequence[str]], str | None]


def subject_problem(subject: str) -> str:
    """Why ``subject`` is not ``area: imperative summary`` of at most 72 characters,
    or "" when it is."""
    if len(subject) > MAX_SUBJECT_CHARS:
        return f"{len(subject)} characters, more than {MAX_SUBJECT_CHARS}"
    match = _SUBJECT.match(subject)
    if match is None:
        return "not of the form 'area: imperative summary'"
    summary = match.group("summary")
    if summary.endswith("."):
        return "ends with a full stop"
    first = summary.split()[0]
    if _PAST_TENSE.match(first) and first.lower() not in _NOT_PAST_TENSE:
        return f"'{first}' is past tense: say what the commit does ('add', not 'added')"
    return ""


def check(commits: Sequence[tuple[str, str]]) -> list[str]:
    """One line per commit (hash, subject) whose subject does not fit, naming why."""
    return [
        f"{commit[:12]} {subject!r}: {problem}"
        for commit, subject in commits
        if (problem := subject_problem(subject))
    ]


def commits_to_check(git: Git) -> tuple[list[tuple[str, str]] | None, str]:
    """The (hash, subject) of every non-merge commit after the one that added this
    script, oldest first; or None and what was skipped, and why."""
    if git(["rev-parse", "--git-dir"]) is None:
        return None, "skipped: not a git clone (or git failed), no history to check"
    added = git(["log", "--diff-filter=A", "--format=%H", "--", SCRIPT_PATH])
    if added is None:
        return None, "skipped: git log failed, no history to check"
    if not added.split():
        return [], f"nothing to check: no commit adds {SCRIPT_PATH} yet"
    since = added.split()[0]  # the latest addition, should it have been removed and re-added
    log = git(["log", "--no-merges", "--reverse", "--format=%H%x00%s", f"{since}..HEAD"])
    if log is None:
        return None, f"skipped: git log {since[:12]}..HEAD failed (a shallow clone?)"
    commits = []
    for line in log.splitlines():
        commit, _, subject = line.partition("\0")
        commits.append((commit, subject))
    parents = git(["rev-list", "--parents", "-n", "1", since]) or ""
    if (
        len(parents.split()) == 1
        and (git(["rev-parse", "--is-shallow-repository"]) or "").strip() == "true"
    ):
        # A shallow clone's first commit shows every file as added: the script's
        # addition is there or before it, so the commits after it are still checked.
        return commits, (
            f"{len(commits)} commits after {since[:12]}, where this shallow clone's "
            f"history begins (the commit that added {SCRIPT_PATH} is not here)"
        )
    return commits, f"{len(commits)} commits after {since[:12]}, which added {SCRIPT_PATH}"


def run_git(root: Path) -> Git:
    def git(args: Sequence[str]) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
            )
        except OSError:
            return None
        return done.stdout if done.returncode == 0 else None

    return git


def main() -> int:
    if shutil.which("git") is None:
        print("check_commits: skipped: git is not installed, no history to check")
        return 0
    root = Path(__file__).resolve().parent.parent
    commits, what = commits_to_check(run_git(root))
    print(f"check_commits: {what}")
    if not commits:
        return 0
    problems = check(commits)
    for line in problems:
        print(f"check_commits: {line}")
    if problems:
        print("check_commits: subjects read 'area: imperative summary', at most 72 characters")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
