"""The seeded simulator: the real client code against simulated bookies and network faults.

Each seed is one run with its own quorum shape, message drops and delays, bookie
crashes, a tailing reader, one to three concurrent recoveries and a zombie writer.
Any failing seed replays exactly: ``run_scenario(seed)``.
"""

import os

import pytest

from quorumlog.testing.sim_scenarios import check_history, run_scenario

SEEDS = int(os.environ.get("QUORUMLOG_SIM_SEEDS", "600"))


def test_r3_r4_r7_r8_hold_over_many_seeded_fault_schedules():
    failures = {}
    recoveries = confirmed = zombie_adds = crashes = 0
    for seed in range(SEEDS):
        history = run_scenario(seed)
        problems = check_history(history)
        if problems:
            failures[seed] = problems
        recoveries += len(history.recovered_last)
        confirmed += len(history.confirmed)
        zombie_adds += len(history.zombie_confirmed)
        crashes += history.crashes
    assert not failures, f"rule violations (seed: problems): {failures}"
    # The runs must have exercised what they claim to.
    assert recoveries >= SEEDS
    assert confirmed > SEEDS * 10
    assert crashes > SEEDS // 4
    assert zombie_adds > 0


def test_same_seed_replays_the_same_history():
    first, second = run_scenario(42), run_scenario(42)
    assert first == second


@pytest.mark.parametrize("seed", [7, 1234])
def test_a_single_seed_passes_the_checker(seed):
    assert check_history(run_scenario(seed)) == []
