"""Checks of a recorded history, apart from the system that made it (no I/O).

The append workloads (ledger entries, log-stream records) write unique values and
read everything back at the end; :func:`check_appends` judges that:

- ``lost``: acknowledged (``ok``) but absent from the final read;
- ``duplicated``: present more than once in some read;
- ``unexpected``: read but never written (a corrupt or invented value);
- ``failed_present``: reported failed (certainly not done) yet in the final read;
- ``divergent``: readers that saw another order (every reader must see one order;
  a tailing reader may stop early, so it must see a prefix of the final read, and a
  reader of a live system that read before the final one may miss a tail of it made
  of unknown outcomes only: writes still on their way when it read);
- ``real_time``: an acknowledged value placed before one whose append completed
  before it was even invoked (the log's order must respect real time);
- ``fenced_acks``: a value acknowledged by a writer session after a later session
  had written (a fenced writer must acknowledge nothing: in the final log, each
  session's records form one run, and no session writes again after the next one).

:func:`recovery_time_ns` measures how soon service came back after the faults healed,
:func:`longest_stall_ns` how long service stopped while they held.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.harness.netns.history import Operation


@dataclass
class AppendReport:
    """What :func:`check_appends` found; ``valid`` when no rule broke."""

    operations: int = 0
    acknowledged: int = 0
    failed: int = 0
    unknown: int = 0
    read_length: int = 0
    lost: list[Any] = field(default_factory=list)
    duplicated: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    real_time: list[tuple[Any, Any]] = field(default_factory=list)
    fenced_acks: list[Any] = field(default_factory=list)
    failed_present: list[Any] = field(default_factory=list)
    unknown_kept: int = 0  # unknown outcomes found in the log (allowed either way)

    @property
    def valid(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.unexpected
            or self.divergent
            or self.real_time
            or self.fenced_acks
            or self.failed_present
        )

    def problems(self) -> list[str]:
        """One line per broken rule, with a few examples each."""
        lines = []
        names = (
            "lost",
            "duplicated",
            "unexpected",
            "divergent",
            "real_time",
            "fenced_acks",
            "failed_present",
        )
        for name in names:
            found = getattr(self, name)
            if found:
                lines.append(f"{name}: {len(found)} (e.g. {found[:5]})")
        return lines


def check_appends(
    operations: Sequence[Operation],
    final_read: Sequence[Any],
    other_reads: Mapping[str, Sequence[Any]] | None = None,
    *,
    prefix_readers: Sequence[str] = (),
    earlier_readers: Sequence[str] = (),
    session_of: Mapping[Any, str] | None = None,
    f: str = "append",
) -> AppendReport:
    """Judge the appends (operations named ``f``) against the reference ``final_read``.

    ``other_reads`` are more readers' complete sequences (each must equal the final
    read), or, for the names in ``prefix_readers``, a prefix of it (tailing readers
    stopped at some point), or, for the names in ``earlier_readers``, a prefix that
    misses only values whose appends are unknown (``info``). ``session_of`` maps a
    value to its writer session (for ``fenced_acks``); a log with one writer session,
    or a ledger, needs none.
    """
    appends = [op for op in operations if op.f == f]
    report = AppendReport(operations=len(appends))
    acknowledged = [op for op in appends if op.ok]
    report.acknowledged = len(acknowledged)
    report.failed = sum(1 for op in appends if op.completion == "fail")
    report.unknown = sum(1 for op in appends if op.completion == "info")
    report.read_length = len(final_read)
    written = {op.value for op in appends}
    in_log = set(final_read)

    report.lost = [op.value for op in acknowledged if op.value not in in_log]
    report.failed_present = [
        op.value for op in appends if op.completion == "fail" and op.value in in_log
    ]
    reads: dict[str, Sequence[Any]] = {"final": final_read, **(other_reads or {})}
    duplicated: set[Any] = set()
    unexpected: set[Any] = set()
    for values in reads.values():
        duplicated.update(value for value, count in Counter(values).items() if count > 1)
        unexpected.update(value for value in values if value not in written)
    report.duplicated = sorted(duplicated, key=repr)
    report.unexpected = sorted(unexpected, key=repr)
    unknown = {op.value for op in appends if op.completion == "info"}
    for name, values in (other_reads or {}).items():
        prefix = name in prefix_readers or name in earlier_readers
        expected = final_read[: len(values)] if prefix else final_read
        missed = final_read[len(values) :] if name in earlier_readers else []
        if list(values) != list(expected) or not unknown.issuperset(missed):
            report.divergent.append(name)
    report.unknown_kept = sum(1 for op in appends if op.completion == "info" and op.value in in_log)
    report.real_time = _real_time_violations(acknowledged, final_read)
    if session_of is not None:
        report.fenced_acks = _fenced_acks(acknowledged, final_read, session_of)
    return report


def _real_time_violations(
    acknowledged: Sequence[Operation], final_read: Sequence[Any]
) -> list[tuple[Any, Any]]:
    """Pairs (a, b) of acknowledged values with b before a in the log although a's
    append completed before b's was invoked. Checked in O(n log n): walking the
    acknowledged appends by invocation time, each must lie after every value whose
    completion came before its invocation, that is after the furthest of them."""
    position = {value: index for index, value in enumerate(final_read)}
    placed = [op for op in acknowledged if op.value in position and op.end_ns is not None]
    by_start = sorted(placed, key=lambda op: op.start_ns)
    by_end = sorted(placed, key=lambda op: op.end_ns or 0)
    violations: list[tuple[Any, Any]] = []
    furthest: Operation | None = None
    done = 0
    for op in by_start:
        while done < len(by_end) and (by_end[done].end_ns or 0) < op.start_ns:
            earlier = by_end[done]
            if furthest is None or position[earlier.value] > position[furthest.value]:
                furthest = earlier
            done += 1
        if furthest is not None and position[op.value] < position[furthest.value]:
            violations.append((furthest.value, op.value))
    return violations


def _fenced_acks(
    acknowledged: Sequence[Operation], final_read: Sequence[Any], session_of: Mapping[Any, str]
) -> list[Any]:
    """Acknowledged values of a session that wrote again after a later session began
    (interleaved runs in the log), or acknowledged and missing after a later session
    began: either means a writer kept acknowledging after it was fenced."""
    acked = {op.value for op in acknowledged}
    finished: set[str] = set()
    current: str | None = None
    fenced: list[Any] = []
    for value in final_read:
        session = session_of.get(value)
        if session is None:
            continue
        if session != current:
            if current is not None:
                finished.add(current)
            current = session
        if session in finished and value in acked:
            fenced.append(value)
    return fenced


def recovery_time_ns(operations: Sequence[Operation], healed_ns: int) -> int | None:
    """Time from ``healed_ns`` (every fault undone) to the first acknowledged
    operation invoked after it; None if none was (service did not come back)."""
    after = [op.end_ns for op in operations if op.ok and op.start_ns >= healed_ns and op.end_ns]
    return min(after) - healed_ns if after else None


def longest_stall_ns(operations: Sequence[Operation], start_ns: int, end_ns: int) -> int:
    """The longest time within [start_ns, end_ns] with no operation acknowledged."""
    acks = sorted(
        op.end_ns for op in operations if op.ok and op.end_ns and start_ns <= op.end_ns <= end_ns
    )
    edges = [start_ns, *acks, end_ns]
    return max(later - earlier for earlier, later in itertools.pairwise(edges))
