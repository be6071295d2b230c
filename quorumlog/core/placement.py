"""Which bookies hold a ledger, across racks and regions: pure decisions, no I/O.

A bookie's place is a network location ``/REGION/RACK`` (BookKeeper's), recorded in its
registration; one without is at :data:`DEFAULT_LOCATION`. Three policies, as
BookKeeper has them:

- ``random``: any writable bookies, chance deciding (the default);
- ``rack-aware``: every write set (R1: Qw consecutive slots of the ensemble, wrapping)
  spans at least ``min_racks_per_write_quorum`` racks;
- ``region-aware``: every write set spans as many regions as it can (up to its size),
  and within that as many racks as the rack-aware policy asks.

With ``enforce``, a choice that cannot meet the policy is refused
(NotEnoughBookiesError naming what was short); without it, the best the writable
bookies allow is taken (BookKeeper's best effort). The same rules decide new ensembles,
replacements in ensemble changes and recoveries, and re-replication targets
(:func:`shortfall`); :func:`violations` tells the auditor which write sets break the
policy, and :func:`bookie_to_move` which bookie to move to mend them.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from quorumlog.core.quorum import all_write_sets
from quorumlog.errors import InvalidArgumentError, NotEnoughBookiesError

__all__ = [
    "DEFAULT_LOCATION",
    "POLICIES",
    "PlacementPolicy",
    "bookie_to_move",
    "check_location",
    "choose_ensemble",
    "choose_replacements",
    "shortfall",
    "violations",
]

DEFAULT_LOCATION = "/default-region/default-rack"
PolicyName = Literal["random", "rack-aware", "region-aware"]
POLICIES: tuple[PolicyName, ...] = ("random", "rack-aware", "region-aware")


def check_location(location: str) -> str:
    """``location`` if it is ``/REGION/RACK`` (two non-empty parts), else
    InvalidArgumentError naming it."""
    parts = location.split("/")
    if len(parts) != 3 or parts[0] != "" or not parts[1] or not parts[2]:
        raise InvalidArgumentError(
            f"bad bookie location {location!r}: expected /REGION/RACK, "
            f"for example {DEFAULT_LOCATION}"
        )
    return location


def _region(location: str) -> str:
    return location.split("/")[1]


@dataclass(frozen=True)
class PlacementPolicy:
    name: str = "random"  # one of POLICIES, checked
    min_racks_per_write_quorum: int = 2
    enforce: bool = False

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise InvalidArgumentError(
                f"unknown placement policy {self.name!r}: expected one of {', '.join(POLICIES)}"
            )
        if self.min_racks_per_write_quorum < 1:
            raise InvalidArgumentError(
                f"min_racks_per_write_quorum={self.min_racks_per_write_quorum}: must be at least 1"
            )

    def wanted(self, write_quorum: int) -> tuple[int, int]:
        """(regions, racks) every write set of ``write_quorum`` bookies should span."""
        racks = min(self.min_racks_per_write_quorum, write_quorum)
        if self.name == "random":
            return 1, 1
        if self.name == "rack-aware":
            return 1, racks
        return write_quorum, racks


def _spread(slots: Sequence[str | None], locations: Mapping[str, str]) -> tuple[int, int]:
    """(regions, racks) the chosen bookies of one write set span."""
    places = [locations.get(b, DEFAULT_LOCATION) for b in slots if b is not None]
    return len({_region(p) for p in places}), len(set(places))


def _score(
    ensemble: Sequence[str | None],
    slot: int,
    sets: Sequence[tuple[int, ...]],
    locations: Mapping[str, str],
    wanted: tuple[int, int],
) -> tuple[int, int]:
    """How well the write sets through ``slot`` meet the policy: (regions, racks) short
    of it, summed, negated (higher is better)."""
    regions_short = racks_short = 0
    for members in sets:
        if slot not in members:
            continue
        regions, racks = _spread([ensemble[i] for i in members], locations)
        chosen = sum(1 for i in members if ensemble[i] is not None)
        # Only what the chosen ones could already span counts against them.
        regions_short += max(0, min(wanted[0], chosen) - regions)
        racks_short += max(0, min(wanted[1], chosen) - racks)
    return -regions_short, -racks_short


def _fill(
    policy: PlacementPolicy,
    rng: random.Random,
    ensemble: list[str | None],
    slots: Sequence[int],
    candidates: Sequence[str],
    locations: Mapping[str, str],
    write_quorum: int,
) -> None:
    """Fill ``slots`` of ``ensemble`` from ``candidates``, one at a time, each with a
    candidate that leaves the write sets through it closest to the policy; among
    equals, the least used place, then chance."""
    sets = all_write_sets(len(ensemble), write_quorum)
    wanted = policy.wanted(write_quorum)
    left = sorted(candidates)
    rng.shuffle(left)
    for slot in slots:
        used: dict[str, int] = {}
        for bookie in ensemble:
            if bookie is not None:
                place = locations.get(bookie, DEFAULT_LOCATION)
                used[place] = used.get(place, 0) + 1

        def rank(
            bookie: str, slot: int = slot, used: dict[str, int] = used
        ) -> tuple[int, int, int]:
            ensemble[slot] = bookie
            regions, racks = _score(ensemble, slot, sets, locations, wanted)
            ensemble[slot] = None
            return regions, racks, -used.get(locations.get(bookie, DEFAULT_LOCATION), 0)

        best = left[0] if policy.name == "random" else max(left, key=rank)
        ensemble[slot] = best
        left.remove(best)


def _refuse_if_short(
    policy: PlacementPolicy,
    ensemble: Sequence[str],
    locations: Mapping[str, str],
    write_quorum: int,
) -> None:
    if policy.enforce:
        broken = violations(policy, ensemble, locations, write_quorum)
        if broken:
            raise NotEnoughBookiesError(
                f"the {policy.name} placement cannot be met by the writable bookies: "
                + "; ".join(broken)
            )


def choose_ensemble(
    policy: PlacementPolicy,
    rng: random.Random,
    writable: Mapping[str, str],
    size: int,
    write_quorum: int,
) -> tuple[str, ...]:
    """``size`` distinct bookies for a new ledger from ``writable`` (bookie ->
    location). NotEnoughBookiesError if too few, or (enforced) if the policy cannot be
    met."""
    if len(writable) < size:
        raise NotEnoughBookiesError(
            f"an ensemble of {size} bookies is needed, {len(writable)} writable bookie(s) "
            f"available: {', '.join(sorted(writable)) or 'none'}"
        )
    if policy.name == "random":
        return tuple(rng.sample(sorted(writable), size))
    ensemble: list[str | None] = [None] * size
    _fill(policy, rng, ensemble, range(size), list(writable), writable, write_quorum)
    chosen = tuple(b for b in ensemble if b is not None)
    _refuse_if_short(policy, chosen, writable, write_quorum)
    return chosen


def choose_replacements(
    policy: PlacementPolicy,
    rng: random.Random,
    writable: Mapping[str, str],
    ensemble: Sequence[str],
    slots: Sequence[int],
    write_quorum: int,
    exclude: Collection[str] = (),
) -> list[str]:
    """Replacements for ``slots`` of ``ensemble``, from the writable bookies outside
    the ensemble and ``exclude``; NotEnoughBookiesError if too few, or (enforced) if the
    write sets through the slots cannot meet the policy."""
    candidates = [b for b in writable if b not in exclude and b not in ensemble]
    if len(candidates) < len(slots):
        raise NotEnoughBookiesError(f"{len(candidates)} writable bookie(s) outside the ensemble")
    if policy.name == "random":
        return rng.sample(sorted(candidates), len(slots))
    # The other slots' bookies keep their places (their locations as last known:
    # a replaced bookie is often no longer registered).
    locations = {**{b: DEFAULT_LOCATION for b in ensemble}, **writable}
    working: list[str | None] = list(ensemble)
    for slot in slots:
        working[slot] = None
    _fill(policy, rng, working, slots, candidates, locations, write_quorum)
    chosen = [working[slot] for slot in slots]
    assert all(b is not None for b in chosen)
    result = [b for b in chosen if b is not None]
    if policy.enforce:
        after = list(ensemble)
        for slot, bookie in zip(slots, result, strict=True):
            after[slot] = bookie
        sets = [s for s in all_write_sets(len(after), write_quorum) if set(s) & set(slots)]
        broken = _broken(policy, after, locations, write_quorum, sets)
        if broken:
            raise NotEnoughBookiesError(
                f"the {policy.name} placement cannot be met by the writable bookies: "
                + "; ".join(broken)
            )
    return result


def _broken(
    policy: PlacementPolicy,
    ensemble: Sequence[str],
    locations: Mapping[str, str],
    write_quorum: int,
    sets: Sequence[tuple[int, ...]],
) -> list[str]:
    regions_wanted, racks_wanted = policy.wanted(write_quorum)
    found: list[str] = []
    for members in sets:
        bookies = [ensemble[i] for i in members]
        regions, racks = _spread(bookies, locations)
        if racks < racks_wanted:
            found.append(
                f"write set {', '.join(bookies)} spans {racks} rack(s), {racks_wanted} wanted"
            )
        elif policy.name == "region-aware" and regions < min(
            regions_wanted, _regions_in(locations)
        ):
            found.append(f"write set {', '.join(bookies)} spans {regions} region(s)")
    return found


def _regions_in(locations: Mapping[str, str]) -> int:
    return len({_region(p) for p in locations.values()})


def violations(
    policy: PlacementPolicy,
    ensemble: Sequence[str],
    locations: Mapping[str, str],
    write_quorum: int,
) -> list[str]:
    """The write sets of ``ensemble`` that break ``policy``, each said in a line (empty
    when it holds). ``locations`` holds the bookies' places (missing: the default);
    region-aware asks a write set for as many regions as ``locations`` knows of."""
    sets = all_write_sets(len(ensemble), write_quorum)
    unique = list(dict.fromkeys(tuple(sorted(s)) for s in sets))
    return _broken(policy, ensemble, locations, write_quorum, unique)


def shortfall(
    policy: PlacementPolicy,
    ensemble: Sequence[str],
    slot: int,
    bookie: str,
    locations: Mapping[str, str],
    write_quorum: int,
) -> tuple[int, int]:
    """How far the write sets through ``slot`` of ``ensemble`` fall short of ``policy``
    with ``bookie`` in that slot: (regions, racks) missing, summed over them; (0, 0)
    when they meet it. Smaller is better (regions first)."""
    working: list[str | None] = list(ensemble)
    working[slot] = bookie
    sets = all_write_sets(len(working), write_quorum)
    regions, racks = _score(working, slot, sets, locations, policy.wanted(write_quorum))
    return -regions, -racks


def bookie_to_move(
    policy: PlacementPolicy,
    ensemble: Sequence[str],
    locations: Mapping[str, str],
    write_quorum: int,
    candidates: Collection[str],
) -> str | None:
    """The bookie of ``ensemble`` to move elsewhere so that its write sets come closer to
    ``policy``: one sharing a rack (or region) with another of a broken write set, the
    one whose slot one of ``candidates`` (bookies outside the ensemble, placed in
    ``locations``) improves most, the first of equals. None when the ensemble meets the
    policy, or no candidate would improve it (moving then would only churn)."""
    if policy.name == "random":
        return None
    outside = [b for b in candidates if b not in ensemble]
    best: tuple[tuple[int, int], str] | None = None
    for slot, bookie in enumerate(ensemble):
        now = shortfall(policy, ensemble, slot, bookie, locations, write_quorum)
        if now == (0, 0) or not outside:
            continue
        after = min(shortfall(policy, ensemble, slot, c, locations, write_quorum) for c in outside)
        if after >= now:
            continue
        gain = (now[0] - after[0], now[1] - after[1])
        if best is None or gain > best[0]:
            best = (gain, bookie)
    return None if best is None else best[1]
