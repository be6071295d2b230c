"""A history checker for log streams, kept apart from the code it checks.

Observers report what they saw as ``(position, value)`` pairs, in the order they
saw them (a :class:`~quorumlog.log.position.Record` will do: its append time, after
the pair, is not compared):

- a **prefix observer** (a tailing reader, an instance of the dice application)
  shows the log in order from its beginning: its sequence must be exactly the
  first records of the final log;
- a **subset observer** (a writer reporting what was confirmed to it) must find
  each of its pairs in the final log, in increasing positions.

Across all observers, no position may carry two different values, and no observer
may report one position twice. :func:`check_observations` returns a report whose
``problems`` list is empty when every rule held.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from quorumlog.log.position import Position

Observation = tuple[Position, Hashable]


@dataclass
class CheckReport:
    """What the checker found; ``ok`` when ``problems`` is empty."""

    log_records: int
    observers: int
    observations: int
    divergent_positions: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"{self.log_records} records in the log, {self.observers} observers, "
            f"{self.observations} observations, {self.divergent_positions} divergent positions, "
            f"{len(self.problems)} problems"
        )


def check_observations(
    final_log: Sequence[Observation],
    prefixes: Mapping[str, Sequence[Observation]] | None = None,
    subsets: Mapping[str, Sequence[Observation]] | None = None,
    *,
    max_problems: int = 20,
) -> CheckReport:
    """Check observers against the log as read at the end (see the module docstring)."""
    prefixes = prefixes or {}
    subsets = subsets or {}
    report = CheckReport(
        log_records=len(final_log),
        observers=len(prefixes) + len(subsets),
        observations=sum(len(s) for s in prefixes.values()) + sum(len(s) for s in subsets.values()),
    )
    problems = report.problems

    def problem(text: str) -> None:
        if len(problems) < max_problems:
            problems.append(text)

    in_log: dict[Position, Hashable] = {}
    previous: Position | None = None
    for position, value, *_ in final_log:
        if previous is not None and position <= previous:
            problem(f"final log: position {position} after {previous}")
        previous = position
        in_log[position] = value

    seen: dict[Position, tuple[str, Hashable]] = {}
    divergent: set[Position] = set()
    for kind, observers in (("prefix", prefixes), ("subset", subsets)):
        for name, sequence in observers.items():
            last: Position | None = None
            for index, (position, value, *_) in enumerate(sequence):
                if last is not None and position <= last:
                    what = "twice" if position == last else "out of order"
                    problem(f"{name}: position {position} reported {what} (after {last})")
                last = position
                first = seen.setdefault(position, (name, value))
                if first[1] != value:
                    divergent.add(position)
                    problem(f"{name} shows {value!r} at {position}, {first[0]} showed {first[1]!r}")
                if kind == "prefix":
                    if index >= len(final_log):
                        problem(f"{name}: shows {position} beyond the end of the log")
                        break
                    expected = final_log[index]
                    if (position, value) != tuple(expected)[:2]:
                        problem(
                            f"{name}: record #{index} is {value!r} at {position}, the log has "
                            f"{expected[1]!r} at {expected[0]} (not a prefix of the log)"
                        )
                        break
                elif position not in in_log:
                    problem(f"{name}: {position} was reported done but is not in the log")
                elif in_log[position] != value:
                    problem(
                        f"{name}: {position} was reported as {value!r}, the log has "
                        f"{in_log[position]!r}"
                    )
    report.divergent_positions = len(divergent)
    return report
