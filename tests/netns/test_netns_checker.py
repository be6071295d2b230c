"""The namespace suite's checkers on hand-made histories (pure: no namespaces, no I/O
beyond a temporary file): each rule catches its violation and passes a valid history."""

from __future__ import annotations

import random
from pathlib import Path

from tests.harness.netns.checker import check_appends, longest_stall_ns, recovery_time_ns
from tests.harness.netns.history import (
    Event,
    HistoryRecorder,
    Operation,
    pair_operations,
    read_events,
)
from tests.harness.netns.linearizability import (
    ListAppendModel,
    OrderedListAppendModel,
    RegisterModel,
    check_by_key,
    check_linearizable,
)


def op(
    value: object,
    start: int,
    end: int | None,
    completion: str = "ok",
    *,
    f: str = "append",
    result: object = None,
    key: str = "k",
    process: str = "p",
) -> Operation:
    return Operation(
        process=process,
        f=f,
        key=key,
        value=value,
        op_id=f"{process}:{value}:{start}",
        start_ns=start,
        end_ns=end,
        completion=completion,  # type: ignore[arg-type]
        result=result,
    )


# ---------------------------------------------------------------- history files


def test_recorded_history_pairs_invocations_with_completions(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryRecorder(path, "writer-0") as history:
        first = history.invoke("append", "log", "a")
        second = history.invoke("append", "log", "b")
        history.complete(second, "fail", "append", "log")
        history.complete(first, "ok", "append", "log", [1, 0])
        history.invoke("append", "log", "c")  # never completes: unknown
    with open(path, "a") as torn:
        torn.write('{"process": "writer-0", "ty')  # killed mid-line
    operations = pair_operations(read_events([path]))
    assert [(o.value, o.completion) for o in operations] == [
        ("a", "ok"),
        ("b", "fail"),
        ("c", "info"),
    ]
    assert operations[0].result == [1, 0]
    assert operations[0].end_ns is not None and operations[0].end_ns >= operations[0].start_ns
    assert operations[2].end_ns is None


def test_a_completion_without_invocation_is_a_broken_history() -> None:
    stray = Event("p", "ok", "append", "k", None, "p:9", 5)
    try:
        pair_operations([stray])
    except ValueError as error:
        assert "p:9" in str(error)
    else:
        raise AssertionError("a completion without an invocation was accepted")


# ---------------------------------------------------------------- appends


def test_a_valid_append_history_passes() -> None:
    ops = [op("a", 0, 10), op("b", 5, 20), op("c", 30, None, "info"), op("d", 40, 50, "fail")]
    report = check_appends(ops, ["a", "b", "c"], {"tail": ["a", "b"]}, prefix_readers=["tail"])
    assert report.valid, report.problems()
    assert (report.operations, report.acknowledged, report.failed, report.unknown) == (4, 2, 1, 1)
    assert report.unknown_kept == 1


def test_lost_duplicated_unexpected_and_divergent_are_caught() -> None:
    ops = [op("a", 0, 10), op("b", 20, 30), op("c", 40, 50)]
    report = check_appends(ops, ["a", "a", "x", "c"], {"other": ["c", "a"]})
    assert report.lost == ["b"]
    assert report.duplicated == ["a"]
    assert report.unexpected == ["x"]
    assert report.divergent == ["other"]
    assert not report.valid


def test_a_failed_append_found_in_the_log_is_caught() -> None:
    ops = [op("a", 0, 10), op("b", 20, 30, "fail")]
    assert check_appends(ops, ["a", "b"]).failed_present == ["b"]
    assert check_appends(ops, ["a"]).valid


def test_real_time_order_is_checked() -> None:
    # "a" completed before "b" was invoked, yet "b" sits first in the log.
    ops = [op("a", 0, 10), op("b", 20, 30)]
    assert check_appends(ops, ["b", "a"]).real_time == [("a", "b")]
    # Concurrent appends may land in either order.
    concurrent = [op("a", 0, 30), op("b", 10, 40)]
    assert check_appends(concurrent, ["b", "a"]).valid


def test_a_fenced_writer_acknowledging_after_the_next_one_wrote_is_caught() -> None:
    ops = [op("w1-0", 0, 10), op("w2-0", 20, 30), op("w1-1", 25, 35)]
    sessions = {"w1-0": "w1", "w1-1": "w1", "w2-0": "w2"}
    report = check_appends(ops, ["w1-0", "w2-0", "w1-1"], session_of=sessions)
    assert report.fenced_acks == ["w1-1"]
    handed_over = check_appends(ops[:2], ["w1-0", "w2-0"], session_of=sessions)
    assert handed_over.valid, handed_over.problems()


def test_recovery_time_is_the_first_acknowledgement_invoked_after_healing() -> None:
    ops = [op("a", 0, 100), op("b", 60, 90, "fail"), op("c", 70, 130), op("d", 80, 120)]
    assert recovery_time_ns(ops, healed_ns=50) == 70  # d: invoked 80, done 120
    assert recovery_time_ns(ops[:2], healed_ns=50) is None


def test_longest_stall_is_the_widest_gap_between_acknowledgements_in_the_window() -> None:
    ops = [op("a", 0, 20), op("b", 0, 30), op("c", 0, 90, "info"), op("d", 0, 100)]
    assert longest_stall_ns(ops, 10, 110) == 70  # from b's ack at 30 to d's at 100
    assert longest_stall_ns([], 10, 110) == 100  # nothing acknowledged at all


# ---------------------------------------------------------------- linearizability


def test_register_histories() -> None:
    model = RegisterModel()
    good = [
        op(1, 0, 10, f="write"),
        op(None, 5, 15, f="read", result=1),  # concurrent with the write: may see it
        op(2, 20, 30, f="write"),
        op(None, 35, 40, f="read", result=2),
    ]
    assert check_linearizable(model, good).linearizable
    stale = [*good[:3], op(None, 35, 40, f="read", result=1)]  # reads an overwritten value
    result = check_linearizable(model, stale)
    assert not result.linearizable
    assert "no order fits" in result.explanation


def test_list_append_with_unknown_and_failed_outcomes() -> None:
    model = ListAppendModel()
    ops = [
        op("a", 0, 10),
        op("b", 12, None, "info"),  # unknown: may appear any time later, or never
        op("x", 13, 14, "fail"),  # certainly never happened
        op(None, 20, 30, f="read", result=["a"]),
        op(None, 40, 50, f="read", result=["a", "b"]),
    ]
    assert check_linearizable(model, ops).linearizable
    # A read that loses "b" after another read saw it: not linearizable.
    lost = [*ops, op(None, 60, 70, f="read", result=["a"])]
    assert not check_linearizable(model, lost).linearizable
    # A failed append that shows up anyway: not linearizable.
    ghost = [*ops[:3], op(None, 20, 30, f="read", result=["a", "x"])]
    assert not check_linearizable(model, ghost).linearizable


def test_keys_are_checked_apart() -> None:
    ops = [
        op("a", 0, 10, key="k1"),
        op(None, 20, 30, f="read", result=["a"], key="k1"),
        op("b", 0, 10, key="k2"),
        op(None, 20, 30, f="read", result=[], key="k2"),  # misses an acknowledged append
    ]
    results = check_by_key(ListAppendModel(), ops)
    assert results["k1"].linearizable
    assert not results["k2"].linearizable


def test_random_sequential_histories_are_linearizable_and_a_mutation_is_not() -> None:
    """Histories made by running the model with overlapping windows around each
    instant pass; the same history with one read's answer changed fails."""
    rng = random.Random(7)
    for _ in range(30):
        state: list[str] = []
        ops = []
        for i in range(14):
            instant = 100 * i
            start, end = instant - rng.randint(0, 150), instant + rng.randint(0, 150)
            if rng.random() < 0.5:
                state.append(f"v{i}")
                ops.append(op(f"v{i}", start, end))
            else:
                ops.append(op(None, start, end, f="read", result=list(state)))
        assert check_linearizable(ListAppendModel(), ops).linearizable
        reads = [i for i, o in enumerate(ops) if o.f == "read" and o.result]
        if reads:
            i = reads[-1]
            broken = ops[i]
            ops[i] = op(None, broken.start_ns, broken.end_ns, f="read", result=["nope"])
            assert not check_linearizable(ListAppendModel(), ops).linearizable


def test_ordered_list_append_checks_many_unknown_outcomes_quickly() -> None:
    """Forty appends left unknown (a partitioned leader) would be every interleaving for
    the plain list model; with the order the final read found the search is linear."""
    ops = [op(f"v{i}", i, None, "info") for i in range(40)]
    final = [f"v{i}" for i in range(0, 40, 2)]  # half of them took effect
    ops.append(op(None, 100, 110, f="read", result=final))
    result = check_linearizable(OrderedListAppendModel(final), ops)
    assert result.linearizable, result.explanation
    assert result.states_explored < 10_000
    # A read that skips a value the final read has before it: not linearizable.
    bad = [*ops, op(None, 120, 130, f="read", result=final[1:])]
    assert not check_linearizable(OrderedListAppendModel(final), bad).linearizable
    # An acknowledged append missing from the order can never take effect.
    lost = [*ops, op("gone", 50, 60)]
    assert not check_linearizable(OrderedListAppendModel(final), lost).linearizable
