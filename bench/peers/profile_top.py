"""The top of a py-spy profile, per process: where the samples are, by own and total time.

    py-spy record --subprocesses --rate 500 --format raw -o /tmp/p.txt -- \\
        python -m quorumlog bench write --entries 200000 --json --quiet
    python bench/peers/profile_top.py /tmp/p.txt --top 15

Each line of py-spy's raw format is ``frame;frame;...;frame COUNT``; with
``--subprocesses`` the leading frames name the process (``process PID:"command"``).
Processes are grouped by role (the bench client, each bookie) and, per role, the
functions listed with their share of that process's samples: ``self`` (the function
itself) and ``total`` (it or anything it called). Idle frames (a selector waiting, a
thread waiting on a lock or queue) are counted separately, so the shares are of
the time the process was busy.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

_PROCESS = re.compile(r'^process (\d+):"(.*)"$')
# Frames in which a thread is waiting, not working.
IDLE_MARKERS = (
    "select (selectors.py",
    "poll (selectors.py",
    "_run_once (asyncio/base_events.py",  # only as a leaf: the loop waiting in select
    "wait (threading.py",
    "get (queue.py",
    "_worker (concurrent/futures/thread.py",
)


def _role(command: str) -> str:
    if " bookie " in f" {command} " or " quorumlog.server " in f" {command} ":
        match = re.search(r"bookie-(\d+)", command)
        return f"bookie-{match.group(1)}" if match else "bookie"
    if " bench " in command:
        return "client (quorumlog bench)"
    return command[:60]


def _short(frame: str) -> str:
    # "Name.method (path/to/file.py:123)" -> "Name.method (file.py)"
    match = re.match(r"^(.*) \((.*?):\d+\)$", frame)
    if not match:
        return frame
    name, path = match.groups()
    return f"{name} ({path.rsplit('/', 1)[-1]})"


# Frames at the bottom of every thread's stack.
ENTRY_POINTS = (
    "_run_module_as_main (",
    "_run_code (",
    "<module> (__main__.py)",
    "main (__init__.py)",  # quorumlog.commands.main
    "run_parsed (__init__.py)",
    "Thread._bootstrap",
    "Thread.run (",
)
# Stacks outside the timed part of a run: imports at start-up, the summary and the
# removal of the temporary cluster at the end.
DEFAULT_EXCLUDE = (
    "_find_and_load (",
    "Result.summary (",
    "_print_summary (",
    "TemporaryDirectory.cleanup (",
)


def _pid_roles(lines: list[str]) -> dict[str, str]:
    """pid -> role. py-spy can label a freshly forked child with its parent's command
    line, so a bookie is also recognised by its frames (the bookie server's module)."""
    labels: dict[str, str] = {}
    for line in lines:
        frames = line.rpartition(" ")[0].split(";")
        processes = [m for m in map(_PROCESS.match, frames) if m]
        if not processes:
            continue
        pid, command = processes[-1].group(1), processes[-1].group(2)
        role = _role(command)
        if role.startswith("bookie"):
            labels[pid] = role
        elif "quorumlog/server/process.py" in line and not labels.get(pid, "").startswith("b"):
            labels[pid] = f"bookie (pid {pid})"
        else:
            labels.setdefault(pid, role)
    return labels


def summarize(
    lines: list[str], exclude: tuple[str, ...] = DEFAULT_EXCLUDE
) -> dict[str, dict[str, Counter[str]]]:
    """{role: {"self": Counter, "total": Counter, "all": Counter(busy=, idle=, excluded=)}}."""
    pid_roles = _pid_roles(lines)
    roles: dict[str, dict[str, Counter[str]]] = defaultdict(
        lambda: {"self": Counter(), "total": Counter(), "all": Counter()}
    )
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack_text, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack_text.split(";")
        processes = [m for m in map(_PROCESS.match, frames) if m]
        code = [f for f in frames if not _PROCESS.match(f)]
        if not processes or not code:
            continue
        role = roles[pid_roles[processes[-1].group(1)]]
        if any(marker in stack_text for marker in exclude):
            role["all"]["excluded"] += count
            continue
        leaf = code[-1]
        if any(marker in leaf for marker in IDLE_MARKERS):
            role["all"]["idle"] += count
            continue
        role["all"]["busy"] += count
        role["self"][_short(leaf)] += count
        for name in {_short(f) for f in code}:
            role["total"][name] += count
    return roles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    parser.add_argument("raw", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--exclude",
        action="append",
        default=list(DEFAULT_EXCLUDE),
        help="drop stacks with this text (start-up, summary); repeatable",
    )
    parser.add_argument("--role", help="only processes whose role contains this")
    args = parser.parse_args()
    roles = summarize(args.raw.read_text().splitlines(), tuple(args.exclude))
    for role, data in sorted(roles.items()):
        if args.role and args.role not in role:
            continue
        busy = data["all"]["busy"]
        idle = data["all"]["idle"]
        if not busy:
            continue
        print(f"\n## {role}: {busy} busy samples, {idle} idle")
        print("| self % | function |")
        print("|---:|---|")
        for name, count in data["self"].most_common(args.top):
            print(f"| {100 * count / busy:.1f} | {name} |")
        print("\n| total % | function |")
        print("|---:|---|")
        # Frames (nearly) every sample passes through are entry points: left out.
        inner = [
            (n, c)
            for n, c in data["total"].most_common()
            if c < 0.9 * busy and not n.startswith(ENTRY_POINTS)
        ]
        for name, count in inner[: args.top]:
            print(f"| {100 * count / busy:.1f} | {name} |")


if __name__ == "__main__":
    main()
