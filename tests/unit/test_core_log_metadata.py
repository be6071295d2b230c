"""The decisions of a log's ledger list (quorumlog/core/log_metadata.py), and their update
path (quorumlog/log/metadata_updates.py) on an in-memory store.

A decision is a pure function of the list as read: a change to write, Settled (what is
stored shows the change happened) or Refused. Each must answer Settled for every list
its own write can have led to, since after a write whose reply was lost the same
decision runs on the list read again (R13, core.metadata.PendingUpdate).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from quorumlog.core.log_metadata import (
    AppendLedgers,
    ListChangedError,
    LogDecision,
    LogView,
    SealList,
    TruncateBefore,
    decide_append_ledger,
    decide_commit_staged,
    decide_seal,
    decide_truncate,
)
from quorumlog.core.metadata import (
    MetadataRead,
    MetadataUnknown,
    PendingUpdate,
    Refused,
    Retry,
    Settled,
    Unresolved,
)
from quorumlog.errors import InvalidArgumentError, MetadataError
from quorumlog.log import LogFencedError, LogMetadata, Position
from quorumlog.log.errors import LogOutcomeUnknownError
from quorumlog.log.metadata import log_path, read_log
from quorumlog.log.metadata_updates import apply_log_change, log_view, update_log
from quorumlog.meta.store import Versioned
from quorumlog.testing.memory_store import MemoryStore


def view(*ledgers: int, **fields: object) -> LogView:
    return LogView("orders", tuple(ledgers), **fields)  # type: ignore[arg-type]


def refusal(decision: LogDecision) -> Exception:
    assert isinstance(decision, Refused), decision
    return decision.error


# ---------------------------------------------------------------- a writer's append


def append(current: LogView, base: LogView, *, opening: bool = False) -> LogDecision:
    return decide_append_ledger(
        current, base=base, ledger_id=20, opening=opening, closed_through=12
    )


def test_r11_append_writes_the_ledger_onto_the_list_it_read() -> None:
    base = view(12, 15)
    assert append(base, base) == AppendLedgers((20,), 12)


def test_r13_append_is_settled_once_the_ledger_is_listed_even_when_not_last() -> None:
    base = view(12, 15)
    assert isinstance(append(view(12, 15, 20), base), Settled)
    assert isinstance(append(view(15, 20), base), Settled)  # and truncated since
    assert isinstance(append(view(12, 15, 20, 31), base), Settled)  # the caller lost the log


def test_r11_append_goes_on_after_a_truncation_only() -> None:
    base = view(12, 15)
    assert append(view(15), base) == AppendLedgers((20,), 12)
    assert append(view(), base) == AppendLedgers((20,), 12)


def test_r11_append_is_refused_when_another_writer_appended() -> None:
    base = view(12, 15)
    assert isinstance(refusal(append(view(12, 15, 17), base)), ListChangedError)
    assert isinstance(refusal(append(view(12, 15, 25), base)), ListChangedError)
    assert isinstance(refusal(append(view(15, 17), base)), ListChangedError)


def test_r11_a_fence_stops_a_rollover_but_not_an_opening_writer() -> None:
    base = view(12, 15)
    sealed = view(12, 15, fences=1)
    assert "fenced" in str(refusal(append(sealed, base)))
    assert append(sealed, base, opening=True) == AppendLedgers((20,), 12)


# ---------------------------------------------------------------- Log.fence


def test_r11_seal_raises_the_count_once() -> None:
    base = view(12, fences=2)
    assert decide_seal(base, base=base) == SealList()
    assert isinstance(decide_seal(view(12, fences=3), base=base), Settled)
    assert isinstance(decide_seal(view(12, 15, fences=3), base=base), Settled)  # and more since


# ---------------------------------------------------------------- Log.truncate


def test_truncate_removes_before_a_listed_ledger() -> None:
    decision = decide_truncate(view(12, 15, 19), before=(15, 0), removed_end=(12, 9))
    assert decision == TruncateBefore((15, 0), (12, 9))


def test_r13_truncate_is_settled_once_truncated_at_or_after_its_point() -> None:
    for listed in (
        view(15, 19, truncated_before=(15, 0)),  # its own write, read again
        view(15, 19, 23, truncated_before=(15, 0)),  # ... and a ledger appended since
        view(15, 19, truncated_before=(15, 4)),  # truncated further in the same ledger
        view(19, 23, truncated_before=(19, 0)),  # further still: its ledger is gone
    ):
        assert isinstance(decide_truncate(listed, before=(15, 0)), Settled), listed


def test_truncate_further_than_before_is_a_change() -> None:
    decision = decide_truncate(view(15, 19, truncated_before=(15, 0)), before=(19, 0))
    assert decision == TruncateBefore((19, 0), None)


def test_truncate_before_a_ledger_not_in_the_log_is_refused() -> None:
    assert isinstance(refusal(decide_truncate(view(12, 15), before=(13, 0))), InvalidArgumentError)


def test_truncate_past_the_written_end_of_its_ledger_is_refused() -> None:
    """Records appended past the end later would read as truncated: a cut may reach the
    entry after the last one written, not beyond."""
    error = refusal(decide_truncate(view(12, 15), before=(15, 6), written_end=5))
    assert isinstance(error, InvalidArgumentError)
    assert "15:6" in error.message and "at most before 15:5" in error.message
    assert decide_truncate(view(12, 15), before=(15, 5), written_end=5) == TruncateBefore(
        (15, 5), None
    )
    # Settled stays settled: a truncation already applied is not judged again.
    done = view(15, truncated_before=(15, 9))
    assert isinstance(decide_truncate(done, before=(15, 9), written_end=5), Settled)


# ---------------------------------------------------------------- a Spark sink's commit


def commit(
    current: LogView, base: LogView, ledgers: tuple[int, ...] = (100, 101), batch: int | None = 4
) -> LogDecision:
    sink = None if batch is None else ("sink", batch)
    return decide_commit_staged(current, base=base, ledger_ids=ledgers, sink=sink)


def test_r11_commit_appends_the_staged_ledgers_and_the_batch_noting_the_list_closed() -> None:
    base = view(12, 15)
    assert commit(base, base) == AppendLedgers((100, 101), 15, ("sink", 4))
    assert commit(base, base, batch=None) == AppendLedgers((100, 101), 15, None)
    assert commit(view(), view()) == AppendLedgers((100, 101), -1, ("sink", 4))


def test_r13_commit_is_settled_once_its_batch_or_its_ledgers_are_in() -> None:
    base = view(12, 15)
    batch_in = view(12, 15, 100, 101, sink_batches={"sink": 4})
    assert isinstance(commit(batch_in, base), Settled)
    # an earlier run of the batch appended other ledgers: the caller calls it a replay
    assert isinstance(commit(view(12, 15, 90, sink_batches={"sink": 4}), base), Settled)
    assert isinstance(commit(view(15, 100, 101, 200), base, batch=None), Settled)
    # a batch write with no rows has nothing that could show it happened
    assert commit(base, base, ledgers=(), batch=None) == AppendLedgers((), 15, None)


def test_l2_commit_of_a_batch_below_the_recorded_one_is_refused() -> None:
    base = view(12, sink_batches={"sink": 7})
    assert "new query" in str(refusal(commit(base, base)))


def test_r11_commit_is_refused_when_another_writer_came_in() -> None:
    base = view(12, 15)
    assert "after this write began" in str(refusal(commit(view(12, 15, 150), base)))
    assert isinstance(refusal(commit(view(12, 15, 17), base)), ListChangedError)
    recreated = LogView("orders", (), created_ms=5)
    assert "created again" in str(refusal(commit(recreated, view(created_ms=4))))


def test_r11_commit_goes_on_after_a_truncation_or_a_fence() -> None:
    base = view(12, 15)
    assert commit(view(15), base) == AppendLedgers((100, 101), 15, ("sink", 4))
    assert commit(view(12, 15, fences=1), base) == AppendLedgers((100, 101), 15, ("sink", 4))


# ---------------------------------------------------------------- one policy for both


def test_r13_the_pending_update_policy_runs_the_log_decisions() -> None:
    """PendingUpdate is generic over the view: after an unknown outcome, a list that
    shows the change is "it happened", one without it a retry, a refusal unresolved."""
    base = view(12, 15)
    decide = lambda current: append(current, base)  # noqa: E731
    for read, expected in (
        (view(12, 15, 20), "stored"),
        (view(12, 15), Retry),
        (view(12, 15, 17), Unresolved),
    ):
        pending: PendingUpdate[LogView, LogDecision] = PendingUpdate(decide, 3)
        pending.on_event(MetadataUnknown(MetadataError("connection lost")))
        outcome = pending.on_event(MetadataRead(read))
        if expected == "stored":
            assert getattr(outcome, "view", None) == read
        else:
            assert isinstance(outcome, expected)  # type: ignore[arg-type]


# ---------------------------------------------------------------- applying a change


def test_a_change_applies_to_the_log_metadata_as_the_decision_says() -> None:
    metadata = LogMetadata("orders", (12, 15), created_ms=1)
    appended = apply_log_change(metadata, AppendLedgers((20, 21), 15, ("sink", 3)))
    assert appended.ledgers == (12, 15, 20, 21) and appended.closed_through == 15
    assert appended.sink_batches == {"sink": 3}
    assert apply_log_change(metadata, SealList()).fences == 1
    truncated = apply_log_change(appended, TruncateBefore((20, 0), (15, 6)))
    assert truncated.ledgers == (20, 21) and truncated.truncated_before == Position(20, 0)
    assert truncated.removed_end == Position(15, 6)
    assert log_view(truncated) == LogView("orders", (20, 21), (20, 0), 0, 15, 1, {"sink": 3})


# ---------------------------------------------------------------- the update path


class LostReplies(MemoryStore):
    """Sets of ``/logs/orders`` applied, then failing with their reply lost; then
    ``blind`` reads of it fail."""

    def __init__(self) -> None:
        super().__init__()
        self.lose = 0
        self.blind = 0
        self.meanwhile: Callable[[], Awaitable[object]] | None = None

    async def set(self, path: str, data: bytes, version: int = -1) -> int:
        new_version = await super().set(path, data, version)
        if path == log_path("orders") and self.lose:
            self.lose -= 1
            if self.meanwhile is not None:
                await self.meanwhile()
            raise MetadataError("connection lost: outcome unknown")
        return new_version

    async def get(self, path: str) -> Versioned:
        if path == log_path("orders") and self.blind:
            self.blind -= 1
            raise MetadataError("connection lost: not sent")
        return await super().get(path)


def run_update(
    prepare: Callable[[LostReplies], Awaitable[object]],
    decide: Callable[[LogView], LogDecision],
    **options: object,
) -> tuple[LostReplies, object]:
    async def main() -> tuple[LostReplies, object]:
        store = LostReplies()
        # created_ms 0, as the views the decisions here compare with
        await store.create(log_path("orders"), LogMetadata("orders", created_ms=0).to_bytes())
        await prepare(store)
        try:
            result: object = await update_log(
                store,
                "orders",
                decide,
                what="testing",
                attempts=3,
                **options,  # type: ignore[arg-type]
            )
        except Exception as exc:
            result = exc
        return store, result

    return asyncio.run(main())


async def listed(store: MemoryStore, *ledgers: int) -> None:
    metadata, version = await read_log(store, "orders")
    await store.set(log_path("orders"), metadata.with_ledgers(ledgers).to_bytes(), version)


def test_r13_an_append_with_its_reply_lost_is_found_and_not_written_again() -> None:
    base = view()

    async def prepare(store: LostReplies) -> None:
        store.lose = 1

    store, result = run_update(
        prepare, lambda v: decide_append_ledger(v, base=base, ledger_id=7, opening=False)
    )
    assert not isinstance(result, Exception), result
    assert result.metadata.ledgers == (7,) and result.in_doubt and result.applied_to is None  # type: ignore[attr-defined]
    assert asyncio.run(_ledgers(store)) == (7,)


async def _ledgers(store: MemoryStore) -> tuple[int, ...]:
    return (await read_log(store, "orders"))[0].ledgers


def test_r13_a_refusal_after_a_lost_reply_is_an_unknown_outcome_not_a_fencing() -> None:
    base = view()

    async def prepare(store: LostReplies) -> None:
        store.lose = 1
        # another writer appends, then the list is truncated past both: nothing left
        # shows whether the lost write was applied
        store.meanwhile = lambda: _supersede(store)

    _, result = run_update(
        prepare, lambda v: decide_append_ledger(v, base=base, ledger_id=7, opening=False)
    )
    assert isinstance(result, LogOutcomeUnknownError) and "unknown" in str(result)
    assert not isinstance(result, LogFencedError)


async def _supersede(store: MemoryStore) -> None:
    await listed(store, 9)
    metadata, version = await read_log(store, "orders")
    await store.set(log_path("orders"), metadata.truncated(Position(9, 0)).to_bytes(), version)


def test_r13_a_list_that_cannot_be_read_after_a_lost_reply_leaves_the_outcome_unknown() -> None:
    async def prepare(store: LostReplies) -> None:
        store.lose = 1
        store.meanwhile = lambda: _blind(store)

    _, result = run_update(prepare, lambda v: decide_seal(v, base=view()))
    assert isinstance(result, LogOutcomeUnknownError)


async def _blind(store: LostReplies) -> None:
    store.blind = 1_000


def test_r13_a_failure_before_a_write_after_a_lost_reply_is_an_unknown_outcome() -> None:
    """The lost write did not show in the list read again, so it is written again; the
    step before that write (a Spark commit fencing the listed ledgers) fails: the first
    write may still land late, so the failure says the outcome is unknown."""
    calls: list[int] = []

    async def before_write(metadata: LogMetadata) -> None:
        calls.append(len(metadata.ledgers))
        if len(calls) == 2:
            raise MetadataError("the ledgers could not be fenced")

    async def prepare(store: LostReplies) -> None:
        store.lose = 1
        store.meanwhile = lambda: _undo(store)

    _, result = run_update(
        prepare,
        lambda v: decide_commit_staged(v, base=view(), ledger_ids=(5,)),
        before_write=before_write,
    )
    assert isinstance(result, LogOutcomeUnknownError), result
    assert calls == [0, 0]


async def _undo(store: MemoryStore) -> None:
    """As if the write had not been applied (a list set back by hand)."""
    metadata, version = await read_log(store, "orders")
    undone = LogMetadata("orders", (), created_ms=metadata.created_ms)
    await store.set(log_path("orders"), undone.to_bytes(), version)


def test_r11_conflicts_are_read_again_and_decided_again() -> None:
    base = view()
    decisions: list[tuple[int, ...]] = []

    def decide(current: LogView) -> LogDecision:
        decisions.append(current.ledgers)
        return decide_append_ledger(current, base=base, ledger_id=7, opening=False)

    async def prepare(store: LostReplies) -> None:
        await listed(store, 3)  # after the caller's read: its version is stale

    _, result = run_update(prepare, decide, known=(LogMetadata("orders", created_ms=0), 0))
    assert isinstance(result, LogFencedError)  # another writer appended ledger 3
    assert decisions == [(), (3,)]


@pytest.mark.parametrize("lost", [0, 1])
def test_truncate_through_the_update_path_reports_what_it_removed(lost: int) -> None:
    async def prepare(store: LostReplies) -> None:
        await listed(store, 3, 5, 8)
        store.lose = lost

    _, result = run_update(prepare, lambda v: decide_truncate(v, before=(5, 0)))
    assert not isinstance(result, Exception), result
    assert result.metadata.ledgers == (5, 8)  # type: ignore[attr-defined]
    assert result.in_doubt == bool(lost)  # type: ignore[attr-defined]
