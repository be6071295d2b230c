"""BookiePlacement: the bookies chosen for a new ledger, an ensemble change and a
re-replication, drawn from a seeded random source."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from quorumlog.client.placement import BookiePlacement
from quorumlog.errors import NotEnoughBookiesError

BOOKIES = [f"10.0.0.{i}:3181" for i in range(1, 7)]


def test_a_new_ensemble_is_distinct_writable_bookies() -> None:
    placement = BookiePlacement(random.Random(1))
    for size in range(1, len(BOOKIES) + 1):
        chosen = placement.new_ensemble(BOOKIES, size)
        assert len(chosen) == size == len(set(chosen)) and set(chosen) <= set(BOOKIES)


def test_too_few_bookies_for_a_new_ensemble_says_which_there_are() -> None:
    with pytest.raises(NotEnoughBookiesError, match=r"ensemble of 4 .* 3 writable .*10\.0\.0\.1"):
        BookiePlacement(random.Random(1)).new_ensemble(BOOKIES[:3], 4)
    with pytest.raises(NotEnoughBookiesError, match="available: none"):
        BookiePlacement(random.Random(1)).new_ensemble([], 1)


def test_the_same_seed_places_the_same_way_whatever_the_listing_order() -> None:
    def run(seed: int, listing: list[str]) -> list[object]:
        placement = BookiePlacement(random.Random(seed))
        return [
            placement.new_ensemble(listing, 3),
            placement.replacements(listing, BOOKIES[:3], 2),
            placement.least_loaded(listing, BOOKIES[:2], Counter()),
        ]

    assert run(5, BOOKIES) == run(5, list(reversed(BOOKIES)))
    assert len({repr(run(seed, BOOKIES)) for seed in range(20)}) > 1


def test_replacements_come_from_outside_the_excluded_bookies() -> None:
    placement = BookiePlacement(random.Random(2))
    excluded = set(BOOKIES[:3])
    for _ in range(50):
        chosen = placement.replacements(BOOKIES, excluded, 2)
        assert len(set(chosen)) == 2 and not set(chosen) & excluded
    too_few = r"^1 writable bookie\(s\) outside the ensemble$"
    with pytest.raises(NotEnoughBookiesError, match=too_few):
        placement.replacements(BOOKIES, set(BOOKIES[:5]), 2)


def test_least_loaded_spreads_the_entries_and_breaks_ties_at_random() -> None:
    placement = BookiePlacement(random.Random(3))
    load = Counter({BOOKIES[2]: 5, BOOKIES[3]: 1})
    assert placement.least_loaded(BOOKIES[2:4], (), load) == BOOKIES[3]
    assert placement.least_loaded(BOOKIES, BOOKIES, load) is None
    firsts = {placement.least_loaded(BOOKIES[4:], (), Counter()) for _ in range(50)}
    assert firsts == set(BOOKIES[4:])
    given: Counter[str] = Counter()
    for _ in range(60):
        chosen = placement.least_loaded(BOOKIES, BOOKIES[:1], given)
        assert chosen is not None
        given[chosen] += 1
    assert set(given.values()) == {12} and BOOKIES[0] not in given


RACKS = {
    "a1:1": "/east/a",
    "a2:1": "/east/a",
    "b1:1": "/east/b",
    "b2:1": "/east/b",
    "c1:1": "/east/c",
    "c2:1": "/east/c",
}


def test_a_rack_aware_re_replication_target_keeps_write_sets_across_racks() -> None:
    # Slot 1 of (a1, a2, b1) with Qw 2: its write sets are (a1, X) and (X, b1), so only
    # a bookie of rack c keeps both within two racks, however loaded it is.
    from quorumlog.core.placement import PlacementPolicy

    placement = BookiePlacement(random.Random(3), PlacementPolicy("rack-aware"))
    ensemble = ("a1:1", "a2:1", "b1:1")
    load = Counter({"c1:1": 50, "c2:1": 70})
    for _ in range(20):
        target = placement.least_loaded_placed(RACKS, set(ensemble), load, ensemble, 1, 2)
        assert target == "c1:1"  # rack c first, then the least loaded of it
    # Rack c excluded: the best left (b2 leaves one write set in rack b) is still chosen.
    excluded = {*ensemble, "c1:1", "c2:1"}
    assert placement.least_loaded_placed(RACKS, excluded, load, ensemble, 1, 2) == "b2:1"
    everything = set(RACKS)
    assert placement.least_loaded_placed(RACKS, everything, load, ensemble, 1, 2) is None


def test_a_random_policy_re_replication_target_is_the_least_loaded_as_before() -> None:
    # The rack-blind choice draws exactly as least_loaded does (seeded runs replay).
    one, two = BookiePlacement(random.Random(9)), BookiePlacement(random.Random(9))
    load = Counter({"a1:1": 1})
    excluded = {"b1:1"}
    for _ in range(10):
        assert one.least_loaded(RACKS, excluded, load) == two.least_loaded(RACKS, excluded, load)
