"""Quorum arithmetic (R1, R7 coverage) and add tracking (R3)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quorumlog.core.adds import AddTracker
from quorumlog.core.quorum import (
    all_write_sets,
    can_still_cover,
    check_quorum_shape,
    is_covered,
    stores_entry,
    write_set,
)
from quorumlog.core.recovery import (
    EntryRecoveryRead,
    FenceProgress,
    ReadOutcome,
    first_entry_to_recover,
)
from quorumlog.errors import InvalidArgumentError


@pytest.mark.parametrize("shape", [(3, 4, 2), (3, 3, 4), (0, 0, 0), (3, 2, 0), (2, 3, 3)])
def test_r1_bad_shapes_are_refused(shape):
    with pytest.raises(InvalidArgumentError, match="ensemble"):
        check_quorum_shape(*shape)


def test_r1_write_set_starts_at_entry_mod_ensemble_and_wraps():
    assert write_set(0, 5, 3) == (0, 1, 2)
    assert write_set(3, 5, 3) == (3, 4, 0)
    assert write_set(7, 5, 2) == (2, 3)
    assert write_set(4, 3, 3) == (1, 2, 0)


@given(
    st.integers(1, 9).flatmap(
        lambda e: st.tuples(st.just(e), st.integers(1, e), st.integers(0, 10_000))
    )
)
def test_r1_write_set_is_qw_distinct_bookies_and_stores_entry_agrees(args):
    ensemble, wq, entry = args
    ws = write_set(entry, ensemble, wq)
    assert len(set(ws)) == wq
    for index in range(ensemble):
        assert stores_entry(index, entry, ensemble, wq) == (index in ws)


def test_r1_striping_spreads_entries_over_the_ensemble():
    counts = [0] * 5
    for entry in range(1000):
        for index in write_set(entry, 5, 2):
            counts[index] += 1
    assert counts == [400] * 5


def test_r7_coverage_needs_qw_minus_qa_plus_one_of_every_write_set():
    # 3/3/2: any 2 bookies cover; 1 does not.
    assert is_covered({0, 1}, 3, 3, 2)
    assert not is_covered({0}, 3, 3, 2)
    # 5/3/2: write sets {0,1,2},{1,2,3},{2,3,4},{3,4,0},{4,0,1}: need 2 of each.
    assert not is_covered({0, 1}, 5, 3, 2)
    assert not is_covered({0, 2, 4}, 5, 3, 2)  # write set {1, 2, 3} holds only bookie 2
    assert is_covered({0, 1, 2, 3}, 5, 3, 2)
    assert len(all_write_sets(5, 3)) == 5
    assert can_still_cover({0}, 3, 3, 2)
    assert not can_still_cover({0, 1}, 3, 3, 2)


def test_r3_entries_confirm_in_order_only_after_qa_acks():
    tracker = AddTracker(3, 3, 2)
    for i in range(3):
        tracker.add(b"blob%d" % i, token=i)
    # entry 1 gets its quorum first: nothing is confirmed while entry 0 lacks one
    assert not tracker.ack([1], 0)
    assert tracker.ack([1], 1)
    assert tracker.confirm() == []
    assert tracker.lac == -1
    tracker.ack([0], 2)
    assert tracker.confirm() == []
    tracker.ack([0], 1)
    confirmed = tracker.confirm()
    assert [p.entry_id for p in confirmed] == [0, 1]
    assert tracker.lac == 1
    assert len(tracker) == 1


def test_r3_duplicate_and_foreign_acks_do_not_count():
    tracker = AddTracker(4, 2, 2)
    tracker.add(b"e0", None)  # write set (0, 1)
    tracker.ack([0], 0)
    tracker.ack([0], 0)  # duplicate
    tracker.ack([0], 3)  # not in the write set (a late answer from elsewhere)
    assert tracker.confirm() == []
    tracker.ack([0], 1)
    assert [p.entry_id for p in tracker.confirm()] == [0]


def test_r5_replacing_a_bookie_forgets_its_acks_in_the_new_fragment():
    tracker2 = AddTracker(3, 3, 3)
    for i in range(4):
        tracker2.add(b"e", i)
    tracker2.ack([0, 1, 2, 3], 0)
    tracker2.ack([0, 1, 2, 3], 1)
    tracker2.ack([2], 2)
    resend = tracker2.replace_bookie(2, from_entry_id=0)
    assert [p.entry_id for p in resend] == [0, 1, 2, 3]
    assert tracker2.confirm() == []  # bookie 2's ack of entry 2 no longer counts
    tracker2.ack([0, 1, 2, 3], 2)
    assert [p.entry_id for p in tracker2.confirm()] == [0, 1, 2, 3]


def test_r7_fence_progress_tolerates_a_hung_bookie():
    progress = FenceProgress(3, 3, 2)
    progress.on_fenced(0, lac=5)
    assert not progress.is_fenced
    progress.on_fenced(2, lac=7)
    assert progress.is_fenced  # bookie 1 never answered: not needed
    assert progress.max_lac == 7


def test_r7_fence_is_hopeless_when_too_many_bookies_fail():
    progress = FenceProgress(3, 3, 2)
    progress.on_failed(0)
    assert not progress.is_hopeless
    progress.on_failed(1)
    assert progress.is_hopeless


def test_r8_recovery_starts_after_lac_and_never_before_the_last_fragment():
    assert first_entry_to_recover(9, 0) == 10
    assert first_entry_to_recover(-1, 100) == 100
    assert first_entry_to_recover(150, 100) == 151


def test_r8_missing_needs_explicit_answers_and_errors_are_unknown():
    read = EntryRecoveryRead(write_quorum=3, ack_quorum=2)
    read.on_missing(0)
    assert read.outcome is ReadOutcome.WAIT
    read.on_unknown(1)
    assert read.outcome is ReadOutcome.WAIT
    read.on_unknown(2)
    assert read.outcome is ReadOutcome.UNKNOWN  # never MISSING on errors (R9)
    read2 = EntryRecoveryRead(3, 2)
    read2.on_missing(0)
    read2.on_missing(1)
    assert read2.outcome is ReadOutcome.MISSING
    read3 = EntryRecoveryRead(3, 2)
    read3.on_missing(0)
    read3.on_found(b"blob")
    assert read3.outcome is ReadOutcome.FOUND
