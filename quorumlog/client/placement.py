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
  lost bookie's data spreads over the survivors.

The policy is the same in all three: every writable bookie is a candidate unless
excluded, and chance decides among equals. The policy reads nothing itself: callers
pass the writable bookies they read from the registry (:func:`choose_replacements` does
that read for a writer's and a recovery's ensemble changes). Every random draw comes
from the client's random source, which the simulator seeds so that its runs replay.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from quorumlog.client.metadata_updates import as_metadata_error
from quorumlog.core.writer import BookiesChosen, ChooseBookies, NoBookies
from quorumlog.errors import NotEnoughBookiesError


class WritableBookies(Protocol):
    """The registry's one question placement asks (``BookieRegistry``)."""

    async def writable_bookies(self) -> Collection[str]: ...


class BookiePlacement:
    """Chooses bookies among the writable ones, drawing from ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

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


async def choose_replacements(
    registry: WritableBookies,
    placement: BookiePlacement,
    effect: ChooseBookies,
    refusal: str,
) -> BookiesChosen | NoBookies:
    """The core's answer to ``effect`` (an ensemble change of a writer or a recovery):
    replacements for its slots from the writable bookies, or NoBookies when there are
    too few (its message starts with ``refusal``) or the registry cannot be read."""
    try:
        writable = await registry.writable_bookies()
        chosen = placement.replacements(writable, set(effect.excluded), len(effect.slots))
    except NotEnoughBookiesError as exc:
        return NoBookies(NotEnoughBookiesError(f"{refusal}: {exc.message}"))
    except Exception as exc:  # the registry could not be read: nothing was written
        return NoBookies(as_metadata_error(exc))
    return BookiesChosen(effect.slots, tuple(chosen))
