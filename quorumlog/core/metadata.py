"""What the protocol decisions read from ledger metadata, and what they decide to write.

The core never touches the metadata store. A compare-and-set on ledger metadata is a
read-decide-write loop run by the client (``LedgerManager.update``): the *decision*
is a pure function of the metadata as read, and lives here and in the state machines
that use it (``core/writer.py``, ``core/recovery.py``). A decision is one of:

- :class:`NewFragment`, :class:`MarkInRecovery`, :class:`CloseAt`: the change to write;
- :class:`Settled`: nothing to write, what is stored already says what was wanted (the
  writer's own change applied by an earlier attempt whose reply was lost, or the same
  outcome reached by someone else);
- :class:`Refused`: nothing to write, give up with this error.

One policy covers every such update (R5, R6, R13):

- a version conflict: read again and decide again (the client's update loop does it);
- a refusal: certainly not written;
- an unknown outcome (a lost connection, a timeout: the write may or may not have
  happened): read again and run the *same* decision on what was read. Settled means it
  happened; Refused means it cannot happen any more; a change to write means it did not
  happen and may be tried again. Nothing is confirmed, discarded or retried before that
  read (R13).
"""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.errors import BKError

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"

# First entry id of each fragment and its ensemble, sorted by first entry id, from 0.
Ensembles = tuple[tuple[int, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The fields of a ledger's metadata the protocol decides on (the client builds it
    from ``LedgerMetadata``: ``state`` is the state's name)."""

    state: str
    last_entry_id: int
    ensembles: Ensembles

    @property
    def last_fragment_first_entry(self) -> int:
        return self.ensembles[-1][0]

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1][1]

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the fragment that holds ``entry_id``."""
        chosen = self.ensembles[0][1]
        for first, bookies in self.ensembles:
            if first > entry_id:
                break
            chosen = bookies
        return chosen


@dataclass(frozen=True, slots=True)
class NewFragment:
    """Write a new fragment from ``first_entry_id`` on ``bookies`` (R5); a fragment that
    starts at the same entry is replaced (it never held an entry)."""

    first_entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MarkInRecovery:
    """Set the state IN_RECOVERY (R7): a writer's ensemble change or close now fails."""


@dataclass(frozen=True, slots=True)
class CloseAt:
    """Set the state CLOSED with this last entry and ledger length (R6, R8)."""

    last_entry_id: int
    length_bytes: int


@dataclass(frozen=True, slots=True)
class Settled:
    """Write nothing: the metadata as read already records the outcome wanted."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Write nothing, and fail with ``error``."""

    error: BKError


Decision = NewFragment | MarkInRecovery | CloseAt | Settled | Refused
