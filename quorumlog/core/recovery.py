"""Recovery decisions (R7, R8), as pure functions of the answers bookies gave.

The recovering client (``client/recovery.py``) sends fence requests and
fencing recovery reads and feeds every answer here; these classes say when
the ledger counts as fenced, where reading starts, and whether an entry was
found, is certainly missing, or is unknown (which stops recovery with an
error instead of truncating the ledger).
"""

from __future__ import annotations

import enum

from quorumlog.core.quorum import can_still_cover, covered_threshold, is_covered


class FenceProgress:
    """Answers to the fence requests sent to the last fragment's ensemble (R7).

    The ledger is fenced once (Qw - Qa) + 1 bookies of every write set answered:
    no write set then has Qa unfenced bookies left to confirm a new add. Waiting
    for every bookie is not needed, so one hung bookie cannot stall recovery
    (BookKeeper issue #1067).
    """

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.fenced: set[int] = set()
        self.failed: set[int] = set()
        self.max_lac = -1

    def on_fenced(self, bookie_index: int, lac: int) -> None:
        self.fenced.add(bookie_index)
        self.failed.discard(bookie_index)
        self.max_lac = max(self.max_lac, lac)

    def on_failed(self, bookie_index: int) -> None:
        if bookie_index not in self.fenced:
            self.failed.add(bookie_index)

    @property
    def is_fenced(self) -> bool:
        return is_covered(self.fenced, self.ensemble_size, self.write_quorum, self.ack_quorum)

    @property
    def is_hopeless(self) -> bool:
        """Too many bookies failed for the fence to ever cover every write set."""
        return not can_still_cover(
            self.failed, self.ensemble_size, self.write_quorum, self.ack_quorum
        )


def first_entry_to_recover(max_fenced_lac: int, last_fragment_first_entry: int) -> int:
    """Where recovery starts reading.

    Everything at or below a LAC is confirmed (R4), and everything before the last
    fragment was confirmed when that fragment began (R5), so recovery starts after
    the larger of the two and never reaches into an earlier fragment.
    """
    return max(max_fenced_lac + 1, last_fragment_first_entry)


class ReadOutcome(enum.Enum):
    WAIT = "WAIT"  # not enough answers yet
    FOUND = "FOUND"
    MISSING = "MISSING"  # enough bookies said explicitly "no such entry"
    UNKNOWN = "UNKNOWN"  # every bookie answered, but errors leave the entry undecided


class EntryRecoveryRead:
    """Answers for one entry from the bookies of its write set (R8, R9).

    Found wins at once. Missing needs (Qw - Qa) + 1 explicit "no such entry"
    answers: then fewer than Qa bookies can hold it, so it was never confirmed.
    A timeout, an I/O error or a digest mismatch is "unknown", never "missing".
    """

    def __init__(self, write_quorum: int, ack_quorum: int) -> None:
        self.write_quorum = write_quorum
        self.missing_needed = covered_threshold(write_quorum, ack_quorum)
        self.found: bytes | None = None
        self.missing: set[int] = set()
        self.unknown: set[int] = set()

    def on_found(self, blob: bytes) -> None:
        if self.found is None:
            self.found = blob

    def on_missing(self, bookie_index: int) -> None:
        self.missing.add(bookie_index)

    def on_unknown(self, bookie_index: int) -> None:
        self.unknown.add(bookie_index)

    @property
    def outcome(self) -> ReadOutcome:
        if self.found is not None:
            return ReadOutcome.FOUND
        if len(self.missing) >= self.missing_needed:
            return ReadOutcome.MISSING
        if len(self.missing) + len(self.unknown) >= self.write_quorum:
            return ReadOutcome.UNKNOWN
        return ReadOutcome.WAIT
