"""Where a ledger's entries go: the one placement policy of quorumlog.

BookKeeper asks its placement policy for bookies at three moments, and so does
quorumlog:

- a new ledger: :meth:`BookiePlacement.new_ensemble`, E bookies at random among the
  writable ones;
- an ensemble change (R5): :meth:`BookiePlacement.replacements`, bookies at random
  among the writable ones outside the ensemble (and outside the bookies this writer
  already replaced);
- re-replication of a lost bookie's fragments:
  :meth:`BookiePlacement.least_loaded`, the writable bookie outside the fragment's
  ensemble that was given the fewest entries so far, ties broken at random, so a
  lost bookie's data spreads over the survivors (with a rack- or region-aware policy,
  :meth:`BookiePlacement.least_loaded_placed`: first the bookies that keep the
  fragment's write sets closest to the policy).

With the default policy (``random``) every writable bookie is a candidate unless
excluded, and chance decides among equals. The rack-aware and region-aware policies
(``ClientConfig.placement``, decided in :mod:`quorumlog.core.placement`) choose new
ensembles and replacements so that each write set spans racks (or regions), reading
where each writable bookie stands from its registration. The policy reads nothing itself: callers
pass the writable bookies they read from the registry (:func:`choose_replacements` does
that read for a writer's and a recovery's ensemble changes). Every random draw comes
from the client's random source, which the simulator seeds so that its runs replay.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from quorumlog.client.metadata_updates import as_metadata_error
from quorumlog.core import placement as policies
from quorumlog.core.placement import DEFAULT_LOCATION, PlacementPolicy
from quorumlog.core.writer import BookiesChosen, ChooseBookies, NoBookies
from quorumlog.errors import NotEnoughBookiesError


class WritableBookies(Protocol):
    """The registry's questions placement asks (``BookieRegistry``)."""

    async def writable_bookies(self) -> Collection[str]: ...

    async def writable_locations(self) -> Mapping[str, str | None]: ...


def placed(locations: Mapping[str, str | None]) -> dict[str, str]:
    """Bookie -> /REGION/RACK, the default place for one that recorded none."""
    return {b: where or DEFAULT_LOCATION for b, where in locations.items()}


class BookiePlacement:
    """Chooses bookies among the writable ones by ``policy``, drawing from ``rng``."""

    def __init__(self, rng: random.Random, policy: PlacementPolicy | None = None) -> None:
        self.rng = rng
        self.policy = policy or PlacementPolicy()

    @property
    def needs_locations(self) -> bool:
        """Whether choices need where the bookies stand (every policy but random)."""
        return self.policy.name != "random"

    def new_placed_ensemble(
        self, writable: Mapping[str, str], size: int, write_quorum: int
    ) -> tuple[str, ...]:
        """``size`` bookies for a new ledger by the policy, from ``writable`` (bookie ->
        location); NotEnoughBookiesError if too few or (enforced) the policy is unmet."""
        return policies.choose_ensemble(self.policy, self.rng, writable, size, write_quorum)

    def placed_replacements(
        self,
        writable: Mapping[str, str],
        ensemble: Sequence[str],
        slots: Sequence[int],
        write_quorum: int,
        exclude: Collection[str],
    ) -> list[str]:
        """Replacements for ``slots`` of ``ensemble`` by the policy."""
        return policies.choose_replacements(
            self.policy, self.rng, writable, ensemble, slots, write_quorum, exclude
        )

    def new_ensemble(self, writable: Collection[str], size: int) -> tuple[str, ...]:
        """``size`` distinct bookies for a new ledger; NotEnoughBookiesError if too few."""
        if len(writable) < size:
            raise NotEnoughBookiesError(
                f"an ensemble of {size} bookies is needed, {len(writable)} writable bookie(s) "
                f"available: {', '.join(sorted(writable)) or 'none'}"
            )
        return tuple(self.rng.sample(sorted(writable), size))

    def replacements(
        self, writable: Iterable[str], exclude: Collection[str], count: int
    ) -> list[str]:
        """``count`` distinct bookies outside ``exclude`` for an ensemble change.

        NotEnoughBookiesError (saying how many were available) if too few.
        """
        candidates = [b for b in writable if b not in exclude]
        if len(candidates) < count:
            raise NotEnoughBookiesError(
                f"{len(candidates)} writable bookie(s) outside the ensemble"
            )
        return self.rng.sample(sorted(candidates), count)

    def least_loaded(
        self, writable: Iterable[str], exclude: Collection[str], load: Mapping[str, int]
    ) -> str | None:
        """The bookie outside ``exclude`` with the smallest ``load`` (ties at random);
        None if every writable bookie is excluded."""
        candidates = sorted(b for b in writable if b not in exclude)
        if not candidates:
            return None
        rng = self.rng
        return min(candidates, key=lambda b: (load.get(b, 0), rng.random()))

    def least_loaded_placed(
        self,
        writable: Mapping[str, str],
        exclude: Collection[str],
        load: Mapping[str, int],
        ensemble: Sequence[str],
        slot: int,
        write_quorum: int,
        elsewhere: Mapping[str, str] | None = None,
    ) -> str | None:
        """The re-replication target for ``slot`` of ``ensemble`` by the policy: among
        the writable bookies (bookie -> location) outside ``exclude``, those leaving the
        write sets through the slot closest to the policy, then the smallest ``load``,
        then chance; None if every writable bookie is excluded. ``elsewhere`` places
        the other slots' bookies that are registered but not writable (read-only: they
        still hold their copies); those known nowhere are taken to stand at the
        default place."""
        candidates = sorted(b for b in writable if b not in exclude)
        if not candidates:
            return None
        locations = {**{b: DEFAULT_LOCATION for b in ensemble}, **(elsewhere or {}), **writable}
        rng, policy = self.rng, self.policy

        def rank(bookie: str) -> tuple[tuple[int, int], int, float]:
            short = policies.shortfall(policy, ensemble, slot, bookie, locations, write_quorum)
            return short, load.get(bookie, 0), rng.random()

        return min(candidates, key=rank)


async def choose_replacements(
    registry: WritableBookies,
    placement: BookiePlacement,
    effect: ChooseBookies,
    refusal: str,
    *,
    ensemble: Sequence[str] = (),
    write_quorum: int = 0,
) -> BookiesChosen | NoBookies:
    """The core's answer to ``effect`` (an ensemble change of a writer or a recovery):
    replacements for its slots from the writable bookies, or NoBookies when there are
    too few (its message starts with ``refusal``) or the registry cannot be read.
    ``ensemble`` and ``write_quorum`` (the ensemble being changed) let a rack- or
    region-aware policy keep each write set spread."""
    try:
        if placement.needs_locations and ensemble and write_quorum:
            writable_at = placed(await registry.writable_locations())
            chosen = placement.placed_replacements(
                writable_at, ensemble, effect.slots, write_quorum, set(effect.excluded)
            )
            return BookiesChosen(effect.slots, tuple(chosen))
        writable = await registry.writable_bookies()
        chosen = placement.replacements(writable, set(effect.excluded), len(effect.slots))
    except NotEnoughBookiesError as exc:
        return NoBookies(NotEnoughBookiesError(f"{refusal}: {exc.message}"))
    except Exception as exc:  # the registry could not be read: nothing was written
        return NoBookies(as_metadata_error(exc))
    return BookiesChosen(effect.slots, tuple(chosen))
