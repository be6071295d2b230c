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
  happened; a change to write means it did not happen and may be tried again. Nothing
  is confirmed, discarded or retried before that read (R13). Once an outcome was
  unknown, a refusal no longer proves anything (the write may have been applied and
  then superseded): the update is unresolved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic

from quorumlog.errors import BKError, MetadataError

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

# The policy below is the same for every metadata node with a compare-and-set: ledger
# metadata (LedgerView, Decision: the defaults) and a log's ledger list
# (core/log_metadata.py). Its events and outcomes carry the view they were made on.
if TYPE_CHECKING:
    from typing_extensions import TypeVar

    ViewT = TypeVar("ViewT", default=LedgerView)
    DecisionT = TypeVar("DecisionT", default=Decision)
else:  # typing's TypeVar takes a default from Python 3.13 on; at run time it is unused
    from typing import TypeVar

    ViewT = TypeVar("ViewT")
    DecisionT = TypeVar("DecisionT")


# ------------------------------------------------------------------ the conversation with
# the client about one update (shared by every state machine that writes metadata)


@dataclass(frozen=True, slots=True)
class UpdateMetadata(Generic[ViewT, DecisionT]):
    """Effect: run the read-decide-compare-and-set loop with ``decide`` on the ledger
    metadata last stored or read; answer with MetadataStored, MetadataRefused or
    MetadataUnknown."""

    decide: Callable[[ViewT], DecisionT]


@dataclass(frozen=True, slots=True)
class ReadMetadata:
    """Effect: read the ledger metadata after ``delay_ms``; answer with MetadataRead or
    MetadataReadFailed."""

    delay_ms: int


@dataclass(frozen=True, slots=True)
class MetadataStored(Generic[ViewT]):
    """The update ended: its decision was written, or it was Settled by the metadata as
    read. ``view`` is the metadata now stored."""

    view: ViewT


@dataclass(frozen=True, slots=True)
class MetadataRefused:
    """The update certainly wrote nothing: its decision Refused, every compare-and-set
    met a conflict, or the ledger is gone."""

    error: BKError


@dataclass(frozen=True, slots=True)
class MetadataUnknown:
    """The update's write may or may not have happened (a lost connection, a timeout)."""

    error: BKError


@dataclass(frozen=True, slots=True)
class MetadataRead(Generic[ViewT]):
    """The answer to :class:`ReadMetadata`."""

    view: ViewT


@dataclass(frozen=True, slots=True)
class MetadataReadFailed:
    error: BKError


MetadataEvent = (
    MetadataStored[ViewT]
    | MetadataRefused
    | MetadataUnknown
    | MetadataRead[ViewT]
    | MetadataReadFailed
)


@dataclass(frozen=True, slots=True)
class Retry(Generic[ViewT, DecisionT]):
    """What :class:`PendingUpdate` makes of a read: the write did not happen; ``effect``
    tries it again on the version read."""

    effect: UpdateMetadata[ViewT, DecisionT]


@dataclass(frozen=True, slots=True)
class Unresolved:
    """What :class:`PendingUpdate` makes of too many unknown outcomes or failed reads: the
    write may or may not have happened, and nothing more will tell. The owner must act
    as if either were true."""

    error: BKError


class PendingUpdate(Generic[ViewT, DecisionT]):
    """One metadata update under way, and the policy for its outcome (R13).

    Feed it the metadata events; it answers with what they mean for the update:
    :class:`MetadataStored` (it happened, or what it wanted is stored), a
    :class:`Refused` (it did not, and cannot: give up with this error), a
    :class:`ReadMetadata` (read again first), a :class:`Retry` (it did not happen: try
    again), or, after ``attempts`` unknown outcomes or ``attempts`` failed reads in a
    row, :class:`Unresolved`.

    Why the conclusions hold even if a read is older than the write whose reply was
    lost: "what it wanted is stored" can only be seen once it happened; and "did not
    happen" only leads to another compare-and-set, which itself fails if the first one
    was applied. A refusal is a conclusion only while no outcome was unknown: once one
    was, the write may have been applied and then superseded (recovery replaces a
    fragment that starts at the same entry; a close hides it), so a refusal read then,
    or a compare-and-set that conflicts then, is :class:`Unresolved`.

    It is generic over the view decided on and the decisions (ledger metadata by
    default; a log's ledger list in ``core/log_metadata.py``): only :class:`Settled`
    and :class:`Refused` mean something to it, any other decision is a change to write.
    """

    __slots__ = ("_failed_reads", "_unknown", "attempts", "decide", "last_error")

    def __init__(self, decide: Callable[[ViewT], DecisionT], attempts: int) -> None:
        self.decide = decide
        self.attempts = attempts
        self._unknown = 0
        self._failed_reads = 0
        self.last_error: BKError | None = None

    def start(self) -> UpdateMetadata[ViewT, DecisionT]:
        return UpdateMetadata(self.decide)

    def on_event(self, event: MetadataEvent[ViewT]) -> UpdateOutcome[ViewT, DecisionT]:
        if isinstance(event, MetadataStored):
            self.last_error = None
            return event
        if isinstance(event, MetadataRefused):
            if self._unknown:
                # A conflict after an unknown outcome: the earlier write may be the
                # version that conflicted, superseded since (P1).
                return Unresolved(event.error)
            self.last_error = None
            return Refused(event.error)
        if isinstance(event, MetadataUnknown):
            self._unknown += 1
            self._failed_reads = 0
            self.last_error = event.error
            return ReadMetadata(0)
        if isinstance(event, MetadataReadFailed):
            self._failed_reads += 1
            self.last_error = event.error
            if self._failed_reads >= self.attempts:
                return Unresolved(event.error)
            return ReadMetadata(min(1_000, 25 << min(self._failed_reads, 6)))
        # A read after an unknown outcome: the same decision, on what is stored now.
        decision = self.decide(event.view)
        if isinstance(decision, Settled):
            self.last_error = None
            return MetadataStored(event.view)  # it happened
        if isinstance(decision, Refused):
            # After an unknown outcome a refusal proves nothing: the write may have been
            # applied and then superseded (a recovery replacing the fragment, a close),
            # so what is stored no longer shows it. Only "it happened" (Settled) or "it
            # did not" (a change to retry, whose compare-and-set fails if it did) are
            # conclusions; a refusal leaves the outcome unresolved (R13).
            return Unresolved(decision.error)
        if self._unknown >= self.attempts:
            return Unresolved(self.last_error or MetadataError("metadata outcome unknown"))
        return Retry(UpdateMetadata(self.decide))  # it did not: try again on this version


UpdateOutcome = (
    MetadataStored[ViewT] | Refused | ReadMetadata | Retry[ViewT, DecisionT] | Unresolved
)


class MetadataUpdater:
    """What every state machine that writes ledger metadata shares (the writer and
    recovery): the metadata as last stored or read (``view``), at most one update under
    way, and the policy above for its events. The owner sets ``view``,
    ``metadata_attempts`` and ``_update = None`` and decides what each outcome means."""

    view: LedgerView
    metadata_attempts: int
    _update: PendingUpdate | None

    def _start_update(self, decide: Callable[[LedgerView], Decision]) -> UpdateMetadata:
        """Begin an update: the effect that runs its first compare-and-set."""
        self._update = PendingUpdate(decide, self.metadata_attempts)
        return self._update.start()

    def _update_outcome(self, event: MetadataEvent) -> UpdateOutcome | None:
        """What ``event`` means for the update under way (None: there is none). The
        metadata it carries becomes ``view``."""
        update = self._update
        if update is None:
            return None
        if isinstance(event, MetadataStored | MetadataRead):
            self.view = event.view
        return update.on_event(event)
