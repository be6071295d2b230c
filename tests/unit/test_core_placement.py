"""Placement across racks and regions (core/placement.py): pure choices and the
auditor's verdict."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quorumlog.core.placement import (
    DEFAULT_LOCATION,
    PlacementPolicy,
    check_location,
    choose_ensemble,
    choose_replacements,
    violations,
)
from quorumlog.errors import InvalidArgumentError, NotEnoughBookiesError

RACK_AWARE = PlacementPolicy("rack-aware")


def cluster(racks: int, per_rack: int, regions: int = 1) -> dict[str, str]:
    """bookie -> location: ``racks`` racks in each of ``regions`` regions."""
    return {
        f"10.{g}.{r}.{b}:3181": f"/region{g}/rack{r}"
        for g in range(regions)
        for r in range(racks)
        for b in range(per_rack)
    }


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    ensemble=st.integers(2, 6),
    data=st.data(),
)
def test_rack_aware_write_sets_span_two_racks_whenever_three_racks_hold_enough(
    seed: int, ensemble: int, data: st.DataObject
) -> None:
    write_quorum = data.draw(st.integers(2, ensemble))
    writable = cluster(racks=3, per_rack=3)
    chosen = choose_ensemble(RACK_AWARE, random.Random(seed), writable, ensemble, write_quorum)
    assert len(set(chosen)) == ensemble
    assert violations(RACK_AWARE, chosen, writable, write_quorum) == []


def test_random_draws_as_before_and_may_put_a_write_set_in_one_rack() -> None:
    writable = cluster(racks=2, per_rack=3)
    policy = PlacementPolicy()
    seen_broken = False
    for seed in range(50):
        chosen = choose_ensemble(policy, random.Random(seed), writable, 3, 3)
        assert chosen == tuple(random.Random(seed).sample(sorted(writable), 3))
        seen_broken |= bool(violations(RACK_AWARE, chosen, writable, 2))
    assert seen_broken  # which is why rack-aware exists


def test_enforced_rack_aware_refuses_one_rack_and_best_effort_takes_it() -> None:
    one_rack = cluster(racks=1, per_rack=5)
    enforced = PlacementPolicy("rack-aware", enforce=True)
    with pytest.raises(NotEnoughBookiesError, match="spans 1 rack"):
        choose_ensemble(enforced, random.Random(1), one_rack, 3, 2)
    chosen = choose_ensemble(RACK_AWARE, random.Random(1), one_rack, 3, 2)
    assert len(chosen) == 3 and violations(RACK_AWARE, chosen, one_rack, 2)


def test_a_replacement_keeps_its_write_sets_across_racks() -> None:
    writable = {"a1:1": "/r/A", "a2:1": "/r/A", "a3:1": "/r/A", "b2:1": "/r/B"}
    ensemble = ["a1:1", "b1:1", "a2:1"]  # b1 (rack B) is lost, no longer writable
    for seed in range(20):
        (chosen,) = choose_replacements(
            RACK_AWARE, random.Random(seed), writable, ensemble, [1], 2, exclude={"b1:1"}
        )
        assert chosen == "b2:1"
    with pytest.raises(NotEnoughBookiesError, match="spans 1 rack"):
        choose_replacements(
            PlacementPolicy("rack-aware", enforce=True),
            random.Random(0),
            {k: v for k, v in writable.items() if k != "b2:1"},
            ensemble,
            [1],
            2,
        )


def test_region_aware_spreads_each_write_set_over_regions() -> None:
    writable = cluster(racks=2, per_rack=2, regions=2)
    policy = PlacementPolicy("region-aware")
    for seed in range(30):
        chosen = choose_ensemble(policy, random.Random(seed), writable, 4, 2)
        assert violations(policy, chosen, writable, 2) == []
        for i in range(4):
            pair = {writable[chosen[i]].split("/")[1], writable[chosen[(i + 1) % 4]].split("/")[1]}
            assert len(pair) == 2, chosen


def test_locations_and_policies_are_checked_by_name() -> None:
    assert check_location(DEFAULT_LOCATION) == DEFAULT_LOCATION
    for bad in ("rack1", "/r", "/r/", "//x", "/a/b/c"):
        with pytest.raises(InvalidArgumentError, match="/REGION/RACK"):
            check_location(bad)
    with pytest.raises(InvalidArgumentError, match="rack_aware"):
        PlacementPolicy("rack_aware")
    with pytest.raises(InvalidArgumentError, match="min_racks_per_write_quorum=0"):
        PlacementPolicy("rack-aware", min_racks_per_write_quorum=0)


def test_the_bookie_to_move_is_one_of_two_sharing_a_rack_when_a_move_mends_it() -> None:
    from quorumlog.core.placement import bookie_to_move, shortfall

    places = cluster(3, 2)  # racks 0, 1, 2 with two bookies each
    a1, a2, b1, b2, c1, c2 = sorted(places)
    ensemble = [a1, a2, b1]  # Qw 2: the write set (a1, a2) sits in one rack
    assert violations(RACK_AWARE, ensemble, places, 2)
    moved = bookie_to_move(RACK_AWARE, ensemble, places, 2, list(places))
    assert moved in (a1, a2)
    slot = ensemble.index(moved)
    assert shortfall(RACK_AWARE, ensemble, slot, c1, places, 2) == (0, 0)
    assert shortfall(RACK_AWARE, ensemble, slot, moved, places, 2) == (0, 1)
    # Nothing to mend, a random policy, or no bookie that would do better: no move.
    assert bookie_to_move(RACK_AWARE, [a1, b1, c1], places, 2, list(places)) is None
    assert bookie_to_move(PlacementPolicy(), ensemble, places, 2, list(places)) is None
    assert bookie_to_move(RACK_AWARE, ensemble, places, 2, [a1, a2, b1, b2]) is None
    assert bookie_to_move(RACK_AWARE, [a1, a2], places, 2, [c1, c2]) in (a1, a2)


def test_a_rack_lost_leaves_two_racks_that_hold_some_shapes_in_both_modes_not_others() -> None:
    """Rack a is gone (both its bookies): an ensemble change keeps 3/3/2, 4/3/2 and
    2/2/2 within the policy whether enforced or not (two racks are what a write set
    needs); 3/2/2 and a 4/2/2 with rack a at two slots cannot be kept: enforced, the
    change is refused (the writer's ledger stops taking writes); best effort, it goes
    on with a write set in one rack, for the auditor to mend once a third rack is back."""
    left = {"b1:1": "/r/b", "b2:1": "/r/b", "c1:1": "/r/c", "c2:1": "/r/c"}
    places = {**left, "a1:1": "/r/a", "a2:1": "/r/a"}
    enforced = PlacementPolicy("rack-aware", enforce=True)
    held = [
        (("a1:1", "b1:1", "c1:1"), [0], 3),
        (("a1:1", "b1:1", "c1:1", "a2:1"), [0, 3], 3),
        (("a1:1", "b1:1"), [0], 2),
    ]
    not_held = [
        (("a1:1", "b1:1", "c1:1"), [0], 2),
        (("a1:1", "b1:1", "a2:1", "c1:1"), [0, 2], 2),
    ]
    for seed in range(20):
        for ensemble, slots, quorum in held:
            for policy in (enforced, RACK_AWARE):
                rng = random.Random(seed)
                chosen = choose_replacements(policy, rng, left, ensemble, slots, quorum)
                after = list(ensemble)
                for slot, bookie in zip(slots, chosen, strict=True):
                    after[slot] = bookie
                assert violations(RACK_AWARE, after, places, quorum) == [], (ensemble, after)
        for ensemble, slots, quorum in not_held:
            with pytest.raises(NotEnoughBookiesError, match="spans 1 rack"):
                choose_replacements(enforced, random.Random(seed), left, ensemble, slots, quorum)
            chosen = choose_replacements(
                RACK_AWARE, random.Random(seed), left, ensemble, slots, quorum
            )
            assert len(chosen) == len(slots) and not set(chosen) & set(ensemble)
