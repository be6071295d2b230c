"""Quorum arithmetic: write sets, striping and coverage. Pure functions, no state.

R1: the write set of entry e is the Qw bookies of its fragment's ensemble
starting at index ``e mod E``, wrapping around. With E > Qw consecutive
entries land on different bookies (striping).

Coverage answers "have enough bookies answered to be sure of X?" for fencing
and for recovery's "no such entry" decision (R7, R8): a property holds once
(Qw - Qa) + 1 bookies of *every* write set said so, because then no write set
has Qa bookies left that could still acknowledge an add.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from quorumlog.errors import InvalidArgumentError


def check_quorum_shape(ensemble: int, write_quorum: int, ack_quorum: int) -> None:
    """R1: E >= Qw >= Qa >= 1, else InvalidArgumentError."""
    if not (ensemble >= write_quorum >= ack_quorum >= 1):
        raise InvalidArgumentError(
            f"invalid quorum shape ensemble={ensemble} write_quorum={write_quorum} "
            f"ack_quorum={ack_quorum}: need ensemble >= write_quorum >= ack_quorum >= 1"
        )


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Indexes into the ensemble of the bookies that store ``entry_id``."""
    start = entry_id % ensemble_size
    return tuple((start + i) % ensemble_size for i in range(write_quorum))


def all_write_sets(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The E distinct write sets of an ensemble (one per starting index)."""
    return [write_set(i, ensemble_size, write_quorum) for i in range(ensemble_size)]


def stores_entry(bookie_index: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether the bookie at ``bookie_index`` is in the write set of ``entry_id``."""
    return (bookie_index - entry_id) % ensemble_size < write_quorum


def covered_threshold(write_quorum: int, ack_quorum: int) -> int:
    """How many bookies of a write set must answer for the answer to cover it."""
    return write_quorum - ack_quorum + 1


def is_covered(
    answered: Collection[int], ensemble_size: int, write_quorum: int, ack_quorum: int
) -> bool:
    """R7: every write set has at least (Qw - Qa) + 1 of its bookies in ``answered``."""
    need = covered_threshold(write_quorum, ack_quorum)
    answered_set = set(answered)
    for ws in all_write_sets(ensemble_size, write_quorum):
        if sum(1 for i in ws if i in answered_set) < need:
            return False
    return True


def can_still_cover(
    failed: Iterable[int], ensemble_size: int, write_quorum: int, ack_quorum: int
) -> bool:
    """Whether coverage is still reachable when the bookies in ``failed`` will never answer."""
    failed_set = set(failed)
    everyone_else = [i for i in range(ensemble_size) if i not in failed_set]
    return is_covered(everyone_else, ensemble_size, write_quorum, ack_quorum)
