"""How a run's recorded history is judged (pure, hand-made histories): the glue between
the workloads' records and the checkers, each rule failing a run that breaks it."""

from __future__ import annotations

from typing import Any

from tests.harness.netns.history import Operation
from tests.harness.netns.runner import RunResult, judge_history


def op(
    process: str,
    f: str,
    value: Any,
    start: int,
    end: int | None,
    completion: str = "ok",
    *,
    key: str = "log",
    result: Any = None,
) -> Operation:
    return Operation(
        process,
        f,
        key,
        value,
        f"{process}:{start}",
        start,
        end,
        completion,
        result,  # type: ignore[arg-type]
    )


def judged(workload: str, operations: list[Operation]) -> RunResult:
    result = RunResult("sqlite", "test", "test", "none", workload)
    judge_history(workload, operations, result)
    return result


def final_reads(values: list[str], key: str = "log", f: str = "read") -> list[Operation]:
    return [
        op("final", f, None, 1000 + i, 1001 + i, key=key, result={"reader": r, "values": values})
        for i, r in enumerate(("final", "final-2"))
    ]


def test_a_log_handed_over_cleanly_is_valid_and_counts_the_sessions() -> None:
    history = [
        op("writer1", "append", "writer1.1.0", 0, 10),
        op("writer1", "append", "writer1.1.1", 20, None, "info"),  # fenced: unknown
        op("writer2", "append", "writer2.1.0", 30, 40),
        op("tail", "read", None, 0, 900, result={"reader": "tail", "values": ["writer1.1.0"]}),
    ]
    result = judged("log", history + final_reads(["writer1.1.0", "writer2.1.0"]))
    assert result.valid, result.problems
    assert (result.acknowledged, result.unknown, result.lost) == (2, 1, 0)
    assert result.notes["writer_sessions"] == 2


def test_a_zombie_writer_acknowledged_after_its_successor_fails_the_run() -> None:
    history = [
        op("writer1", "append", "writer1.1.0", 0, 10),
        op("writer2", "append", "writer2.1.0", 30, 40),
        op("writer1", "append", "writer1.1.1", 35, 50),  # acknowledged after the handover
    ]
    final = ["writer1.1.0", "writer2.1.0", "writer1.1.1"]
    result = judged("log", history + final_reads(final))
    assert result.fenced_acks == 1 and not result.valid


def test_a_tail_reader_that_saw_another_order_fails_the_run() -> None:
    history = [
        op("w", "append", "w.1.0", 0, 10),
        op("w", "append", "w.1.1", 20, 30),
        op("tail", "read", None, 0, 900, result={"reader": "tail", "values": ["w.1.1"]}),
    ]
    result = judged("log", history + final_reads(["w.1.0", "w.1.1"]))
    assert result.divergent == 1 and not result.valid


def test_ledger_runs_report_lost_entries_and_fragments() -> None:
    history = [
        op("writer", "create", None, 0, 1, key="ledgers", result={"ledger_id": 1}),
        op("writer", "append", "e0", 2, 10, key="ledgers"),
        op("writer", "append", "e1", 3, 11, key="ledgers"),
        op("final", "read", None, 100, 110, key="ledgers",
           result={"reader": "final", "values": ["e0"], "fragments": 2}),
        op("final", "read", None, 120, 130, key="ledgers",
           result={"reader": "final-2", "values": ["e0"], "fragments": 2}),
    ]  # fmt: skip
    result = judged("ledger", history)
    assert result.lost == 1 and not result.valid
    assert result.notes == {"ledgers": 1, "fragments": 2}


def test_database_runs_check_strong_reads_per_key() -> None:
    fine = [
        op("c", "append", "a", 0, 10, key="k0"),
        op("c", "read", None, 20, 30, key="k0", result=["a"]),
        *final_reads(["a"], key="k0", f="final-read"),
    ]
    result = judged("db", fine)
    assert result.valid and result.linearizable, result.problems
    stale = [
        op("c", "append", "a", 0, 10, key="k0"),
        op("c", "read", None, 20, 30, key="k0", result=[]),  # misses an acknowledged append
        *final_reads(["a"], key="k0", f="final-read"),
    ]
    result = judged("db", stale)
    assert result.linearizable is False and not result.valid


def two_final_reads(first: list[str], second: list[str], key: str) -> list[Operation]:
    return [
        op("final", "final-read", None, 1000, 1001, key=key,
           result={"reader": "final", "values": first}),
        op("final", "final-read", None, 1100, 1101, key=key,
           result={"reader": "final-2", "values": second}),
    ]  # fmt: skip


def test_an_unknown_append_landing_between_the_final_reads_is_not_divergence() -> None:
    # A write whose client timed out may still be on its way (a follower forwarding it
    # to the leader, resent by TCP once a partition heals): it may take effect after
    # the first final read and before the second, as linearizability allows.
    history = [
        op("c", "append", "a", 0, 10, key="k0"),
        op("c", "append", "late", 20, 30, "info", key="k0"),
        *two_final_reads(["a"], ["a", "late"], key="k0"),
    ]
    result = judged("db", history)
    assert result.valid and result.linearizable, result.problems


def test_final_reads_that_disagree_on_an_acknowledged_append_fail_the_run() -> None:
    acked_late = [
        op("c", "append", "a", 0, 10, key="k0"),
        op("c", "append", "b", 20, 30, key="k0"),
        *two_final_reads(["a"], ["a", "b"], key="k0"),  # the first misses an acked "b"
    ]
    assert not judged("db", acked_late).valid
    shrunk = [
        op("c", "append", "a", 0, 10, key="k0"),
        op("c", "append", "late", 20, 30, "info", key="k0"),
        *two_final_reads(["a", "late"], ["a"], key="k0"),  # the later read lost a value
    ]
    result = judged("db", shrunk)
    assert not result.valid and result.linearizable is False
    reordered = [
        op("c", "append", "x", 20, 30, "info", key="k0"),
        op("c", "append", "y", 20, 30, "info", key="k0"),
        *two_final_reads(["x", "y"], ["y", "x"], key="k0"),
    ]
    assert not judged("db", reordered).valid
