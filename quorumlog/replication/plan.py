"""Which entries a bookie holds, from the ledger metadata alone.

A fragment is a range of entries with one ensemble; a bookie at index i of an
ensemble of E holds the entries whose write set (R1) starts at one of
i-Qw+1 .. i (mod E): runs of Qw consecutive entries every E entries, or every
entry when E == Qw. The audit reads these runs from each bookie; re-replication
copies them to a replacement. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.replication.report import FragmentReplication, FragmentStatus


@dataclass(frozen=True, slots=True)
class Fragment:
    """One place a bookie holds in a ledger: ``ensemble[index]`` for ``first..last``."""

    first: int
    last: int | None  # None: open-ended (the last fragment of a ledger not closed)
    ensemble: tuple[str, ...]
    index: int  # where the bookie sits in ``ensemble``


def fragments_naming(md: LedgerMetadata, bookie: str) -> list[Fragment]:
    """Every (fragment, ensemble index) of ``md`` at which ``bookie`` sits, in order."""
    return [
        Fragment(first, last, ensemble, index)
        for first, last, ensemble in md.fragment_bounds()
        for index, address in enumerate(ensemble)
        if address == bookie
    ]


def slot_runs(index: int, size: int, quorum: int, lo: int, hi: int) -> Iterator[tuple[int, int]]:
    """(first, last) runs of consecutive entries of lo..hi whose write set holds
    ``index`` (R1): the whole range when E == Qw, else Qw entries every E."""
    if lo > hi:
        return
    if size == quorum:
        yield lo, hi
        return
    residue = (index - quorum + 1) % size  # where the runs start, modulo E
    start = lo - (lo - residue) % size  # the run that holds lo, or ends before it
    while start <= hi:
        first, last = max(start, lo), min(start + quorum - 1, hi)
        if first <= last:
            yield first, last
        start += size


def entries_held(md: LedgerMetadata, fragment: Fragment) -> int:
    """How many entries ``fragment``'s index holds (0 while it is open-ended)."""
    if fragment.last is None:
        return 0
    runs = slot_runs(
        fragment.index, md.ensemble_size, md.write_quorum, fragment.first, fragment.last
    )
    return sum(last - first + 1 for first, last in runs)


def left_to_writer(fragment: Fragment) -> FragmentReplication:
    """The result for the last fragment of a ledger that is not closed: its writer
    (whose ensemble change replaces a failed bookie, R5) or the client recovering it
    owns it."""
    return FragmentReplication(
        first_entry_id=fragment.first,
        last_entry_id=fragment.last,
        bookie_index=fragment.index,
        status=FragmentStatus.LEFT_TO_WRITER,
    )
