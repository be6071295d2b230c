"""Counterexamples the model checker found, as transcripts the real core plays again.

Each test plays a trace the checker printed (``python -m tests.harness.model``
with the world given beside it), step by step, against fresh state machines, and
checks every rule after each step (``check_trace``). On the code the trace was found
on, a rule breaks at its last step. Once the defect is fixed the core answers
differently at some step, so the trace stops there (or runs to its end with every
rule held); every continuation from that state is then explored, and the rules must
hold in all of them.

P1, P2 and P3 were found on 9f27dc5, before their fixes (P1 in a world narrowed so
that P3 and P4 cannot come first: the recovery makes one ensemble change and the two
clients never choose the same spare; the same search finds it on 2b39da7 with only
P1's fix taken out); P4 on 2b39da7 and on the fixes under way after it.
"""

from __future__ import annotations

from tests.harness.model import WorldConfig, check_trace


def steps(trace: str) -> list[str]:
    return [line.strip() for line in trace.strip().splitlines() if line.strip()]


def assert_rules_hold(cfg: WorldConfig, trace: str) -> None:
    checked = check_trace(cfg, steps(trace), max_states=500_000)
    assert checked.continuation is None or checked.continuation.complete or not checked.held
    assert checked.held, checked.text


# ------------------------------------------------------------------ P1

# E=3 Qw=Qa=2. A acknowledges entry 0 and C entry 1; then C's add of 2 is lost: the
# writer holds confirmations and replaces C by X1 from entry 0 (nothing is confirmed:
# B has not acknowledged 0 yet), while B acknowledges 0 and 1 and A 2. The fragment is
# written, its reply lost. A recovery reads
# that fragment (A, B, X1 from 0), finds 0, and ends at 0 (X1: no entry 1); its rewrite
# of 0 to B loses its answer, so it replaces B by X2 from entry 0, which replaces the
# writer's fragment. The writer reads the metadata back: its fragment is not there and
# the ledger is not OPEN, so it took the write as never made (Refused) and confirmed 0
# and 1 from the old write sets; under the fragments recorded, entry 1 lives on X2 and
# X1, which never had it (R8, R13).
P1_WORLD = WorldConfig(
    entries=3,
    spares=2,
    drops=2,
    bookie_failures=0,
    metadata_losses=1,
    delays=0,
    reorders=2,
    close=False,
    shared_spares=False,
)
P1_TRACE = """
writer adds entry 0
writer adds entry 1
writer adds entry 2
deliver add [0] -> A (slot 0 gen 0)
deliver add [1] -> C (slot 2 gen 0), out of order
drop add [2] -> C (slot 2 gen 0)
deliver add [0] -> B (slot 1 gen 0)
deliver add [1] -> B (slot 1 gen 0)
deliver add [2] -> A (slot 0 gen 0)
choose X1 for writer's slot 2
metadata: writer's update writes fragment 0: A,B,X1, reply lost
recovery starts
metadata: recovery's update writes MarkInRecovery
deliver fence -> A (slot 0)
deliver fence -> B (slot 1)
deliver fence -> X1 (slot 2)
deliver read 0 -> A (slot 0)
deliver read 0 -> B (slot 1)
deliver rewrite 0 -> A (slot 0)
deliver rewrite 0 -> B (slot 1), answer lost
deliver read 1 -> X1 (slot 2), out of order
deliver read 1 -> B (slot 1)
choose X2 for recovery's slot 1
deliver rewrite 0 -> X2 (slot 1)
metadata: recovery's update writes fragment 0: A,X2,X1
metadata: writer reads
"""


def test_p1_r13_a_refusal_after_an_unknown_outcome_confirms_nothing_from_the_old_fragment():
    assert_rules_hold(P1_WORLD, P1_TRACE)


# ------------------------------------------------------------------ P2

# E=3 Qw=Qa=2, no recovery: the owner gives up entry 0 (its future is cancelled, the
# core still tracks it), so close() does not wait for it. The close is decided at LAC
# -1; entry 0's acknowledgements arrive during the close's compare-and-set and confirm
# it; the ledger is CLOSED at -1 with entry 0 confirmed (R6), and a tailing reader
# learns LAC 0 (R4).
P2_WORLD = WorldConfig(
    entries=2,
    cancels=1,
    recovery=False,
    drops=0,
    bookie_failures=0,
    metadata_losses=0,
    delays=0,
    reorders=None,
)
P2_TRACE = """
writer adds entry 0
owner gives up entry 0
writer closes
deliver add [0] -> A (slot 0 gen 0)
deliver add [0] -> B (slot 1 gen 0)
metadata: writer's update writes CLOSED at -1
"""


def test_p2_r6_an_add_given_up_during_the_close_is_not_confirmed_past_it():
    assert_rules_hold(P2_WORLD, P2_TRACE)


# ------------------------------------------------------------------ P3

# E=Qw=Qa=3 on A, B, C with C dead from the start; four entries, nothing confirmed
# (Qa=3). The recovery rewrites 0-3, C fails them, X1 replaces C from entry 0; X1
# takes 0-2 and crashes on 3; X2 replaces X1, but only 3 is sent to it: the fragment
# recorded from 0 names X2 for 0-2, which it never received (R8).
P3_WORLD = WorldConfig(
    write_quorum=3,
    ack_quorum=3,
    dead_at_start=("C",),
    entries=4,
    spares=2,
    bookie_failures=1,
    drops=0,
    metadata_losses=0,
    delays=0,
    reorders=0,
    close=False,
)
P3_TRACE = """
writer adds entry 0
writer adds entry 1
writer adds entry 2
writer adds entry 3
recovery starts
deliver add [0] -> A (slot 0 gen 0)
deliver add [0] -> B (slot 1 gen 0)
deliver add [0] -> C (slot 2 gen 0)
deliver add [1] -> A (slot 0 gen 0)
deliver add [1] -> B (slot 1 gen 0)
deliver add [1] -> C (slot 2 gen 0)
deliver add [2] -> A (slot 0 gen 0)
deliver add [2] -> B (slot 1 gen 0)
deliver add [2] -> C (slot 2 gen 0)
deliver add [3] -> A (slot 0 gen 0)
deliver add [3] -> B (slot 1 gen 0)
deliver add [3] -> C (slot 2 gen 0)
choose X1 for writer's slot 2
metadata: recovery's update writes MarkInRecovery
deliver fence -> A (slot 0)
deliver fence -> B (slot 1)
deliver fence -> C (slot 2)
deliver read 0 -> A (slot 0)
deliver read 0 -> B (slot 1)
deliver read 0 -> C (slot 2)
deliver rewrite 0 -> A (slot 0)
deliver rewrite 0 -> B (slot 1)
deliver rewrite 0 -> C (slot 2)
deliver read 1 -> B (slot 1)
deliver read 1 -> C (slot 2)
deliver read 1 -> A (slot 0)
deliver rewrite 1 -> B (slot 1)
deliver rewrite 1 -> C (slot 2)
deliver rewrite 1 -> A (slot 0)
deliver read 2 -> C (slot 2)
deliver read 2 -> A (slot 0)
deliver read 2 -> B (slot 1)
deliver rewrite 2 -> C (slot 2)
deliver rewrite 2 -> A (slot 0)
deliver rewrite 2 -> B (slot 1)
deliver read 3 -> A (slot 0)
deliver read 3 -> B (slot 1)
deliver read 3 -> C (slot 2)
deliver rewrite 3 -> A (slot 0)
deliver rewrite 3 -> B (slot 1)
deliver rewrite 3 -> C (slot 2)
deliver read 4 -> B (slot 1)
deliver read 4 -> C (slot 2)
deliver read 4 -> A (slot 0)
metadata: writer's update refused
choose X1 for recovery's slot 2
deliver rewrite 0 -> X1 (slot 2)
deliver rewrite 1 -> X1 (slot 2)
deliver rewrite 2 -> X1 (slot 2)
crash X1: rewrite 3 -> X1 (slot 2) times out
choose X2 for recovery's slot 2
deliver rewrite 3 -> X2 (slot 2)
metadata: recovery's update writes fragment 0: A,B,X2
metadata: recovery's update writes CLOSED at 3
"""


def test_p3_r8_a_second_replacement_gets_every_entry_of_the_recorded_fragment():
    assert_rules_hold(P3_WORLD, P3_TRACE)


# The same defect with striping (E=3, Qw=Qa=2), found first when looking for P1: the
# writer confirmed 0-2; the recovery replaces C by X1 from entry 1 (a rewrite's answer
# lost), X1 loses a rewrite's answer for 2, X2 replaces X1 and gets only 2, and the
# fragment recorded from 1 names X2 for entry 1, confirmed, which X2 never got.
P3_STRIPED_WORLD = WorldConfig(
    entries=3,
    spares=2,
    drops=2,
    bookie_failures=0,
    metadata_losses=1,
    delays=0,
    reorders=0,
    close=False,
)
P3_STRIPED_TRACE = """
writer adds entry 0
writer adds entry 1
writer adds entry 2
recovery starts
deliver add [0] -> A (slot 0 gen 0)
deliver add [0] -> B (slot 1 gen 0)
deliver add [1] -> B (slot 1 gen 0)
deliver add [1] -> C (slot 2 gen 0)
deliver add [2] -> A (slot 0 gen 0)
deliver add [2] -> C (slot 2 gen 0)
metadata: recovery's update writes MarkInRecovery
deliver fence -> A (slot 0)
deliver fence -> B (slot 1)
deliver fence -> C (slot 2)
deliver read 0 -> A (slot 0)
deliver read 0 -> B (slot 1)
deliver rewrite 0 -> A (slot 0)
deliver rewrite 0 -> B (slot 1)
deliver read 1 -> B (slot 1)
deliver read 1 -> C (slot 2)
deliver rewrite 1 -> B (slot 1)
deliver rewrite 1 -> C (slot 2), answer lost
deliver read 2 -> C (slot 2)
deliver read 2 -> A (slot 0)
deliver rewrite 2 -> C (slot 2)
deliver rewrite 2 -> A (slot 0)
deliver read 3 -> A (slot 0)
deliver read 3 -> B (slot 1)
choose X1 for recovery's slot 2
deliver rewrite 1 -> X1 (slot 2)
deliver rewrite 2 -> X1 (slot 2), answer lost
choose X2 for recovery's slot 2
deliver rewrite 2 -> X2 (slot 2)
metadata: recovery's update writes fragment 1: A,B,X2
"""


def test_p3_r8_a_second_replacement_keeps_confirmed_entries_with_striping():
    assert_rules_hold(P3_STRIPED_WORLD, P3_STRIPED_TRACE)


# ------------------------------------------------------------------ P4

# E=3 Qw=Qa=2. A acknowledges entry 0; B's add of 1 is lost, so the writer replaces B
# by X1 from entry 0 (B's late acknowledgement of 0 no longer counts), and that write
# is lost before it is applied (unknown); the writer reads the metadata back and will
# try again. A recovery fences A, B, C, finds 0 on A and ends at 0 (B: no entry 1); B
# crashes on the rewrite of 0, so the recovery replaces B by X1 too, and records the
# same fragment the writer wanted (0: A, X1, C). The writer's retry finds it and takes
# it for its own write (Settled), sends 0 and 1 to X1, which no one fenced, and
# confirms 1 (on X1 and C); the recovery closes at 0 (R6, R4). Nothing in the metadata
# tells the writer's write from the recovery's: a fragment found after an unknown
# outcome, on a ledger that is no longer OPEN, does not prove the writer wrote it.
P4_WORLD = WorldConfig(
    entries=2, spares=1, drops=1, bookie_failures=1, metadata_losses=1, delays=0, reorders=1
)
P4_TRACE = """
writer adds entry 0
writer adds entry 1
deliver add [0] -> A (slot 0 gen 0)
drop add [1] -> B (slot 1 gen 0)
deliver add [0] -> B (slot 1 gen 0)
deliver add [1] -> C (slot 2 gen 0)
choose X1 for writer's slot 1
metadata: writer's update would write fragment 0: A,X1,C, lost before it
metadata: writer reads
writer closes
recovery starts
metadata: recovery's update writes MarkInRecovery
deliver fence -> A (slot 0)
deliver fence -> B (slot 1)
deliver fence -> C (slot 2)
deliver read 0 -> A (slot 0)
deliver read 0 -> B (slot 1)
deliver rewrite 0 -> A (slot 0)
deliver read 1 -> B (slot 1), out of order
crash B: rewrite 0 -> B (slot 1) times out
deliver read 1 -> C (slot 2)
choose X1 for recovery's slot 1
deliver rewrite 0 -> X1 (slot 1)
metadata: recovery's update writes fragment 0: A,X1,C
metadata: writer's update settled
deliver add [0,1] -> X1 (slot 1 gen 2)
metadata: recovery's update writes CLOSED at 0
"""


def test_p4_r5_r13_a_fragment_the_recovery_recorded_is_not_the_writers_own():
    assert_rules_hold(P4_WORLD, P4_TRACE)
