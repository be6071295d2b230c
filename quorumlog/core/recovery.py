"""Recovery decisions (R7, R8), as pure functions of the answers bookies gave, and
the recovery itself as a state machine (:class:`LedgerRecoveryMachine`).

The recovering client (``client/recovery.py``) carries out the machine's effects
(fence requests, fencing recovery reads, recovery adds, metadata updates) and
feeds every answer back. The pieces below say when the ledger counts as fenced,
where reading starts, and whether an entry was found, is certainly missing, or is
unknown (which stops recovery with an error instead of truncating the ledger).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from functools import partial

from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    CloseAt,
    Decision,
    LedgerView,
    MarkInRecovery,
    MetadataEvent,
    MetadataRead,
    MetadataStored,
    PendingUpdate,
    ReadMetadata,
    Retry,
    Settled,
    UpdateMetadata,
)
from quorumlog.core.quorum import can_still_cover, covered_threshold, is_covered
from quorumlog.errors import BKError, LedgerRecoveryError, Status, UnauthorizedError


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


# ------------------------------------------------------------------ the state machine


@dataclass(frozen=True, slots=True)
class FenceAnswered:
    """A bookie of the last fragment answered the fence request (``Status.OK`` with the
    LAC it knew), or failed (any other status; a timeout or lost connection is
    ``Status.IO_ERROR``)."""

    slot: int
    status: int
    lac: int = -1
    message: str = ""


@dataclass(frozen=True, slots=True)
class EntryRead:
    """A bookie's answer to a fencing recovery read of ``entry_id``: ``Status.OK`` with
    the blob (its digest checked) and the ledger length it records;
    ``NO_SUCH_ENTRY`` or ``NO_SUCH_LEDGER``: explicitly absent; anything else (an I/O
    error, a timeout, a damaged copy) is unknown (R9)."""

    entry_id: int
    slot: int
    status: int
    blob: bytes = b""
    length_bytes: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class EntryRewritten:
    """A bookie's answer to the recovery add of ``entry_id`` (``Status.OK``: stored)."""

    entry_id: int
    slot: int
    status: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class LengthRead:
    """The ledger length recorded in the entry :class:`ReadLength` asked for, or None
    when no replica served it intact."""

    length_bytes: int | None


RecoveryEvent = FenceAnswered | EntryRead | EntryRewritten | LengthRead | MetadataEvent


@dataclass(frozen=True, slots=True)
class SendFence:
    """Send a fence request to each of these slots of the last fragment's ensemble."""

    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SendRecoveryRead:
    """Send a fencing read of ``entry_id`` to each of these slots (its write set)."""

    entry_id: int
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SendRewrite:
    """Send ``blob`` as a recovery add to each of these slots."""

    entry_id: int
    blob: bytes
    slots: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReadLength:
    """Read confirmed entry ``entry_id`` from these bookies, one after the other, for the
    ledger length its header records; answer with :class:`LengthRead`."""

    entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Recovered:
    """The ledger is closed (``view``): by this recovery, or by another one first.
    ``ran_to_close``: this recovery fenced, read and tried its own close."""

    view: LedgerView
    ran_to_close: bool


@dataclass(frozen=True, slots=True)
class RecoveryFailed:
    """The ledger stays unclosed (a later recovery starts over)."""

    error: BKError


RecoveryEffect = (
    UpdateMetadata
    | ReadMetadata
    | SendFence
    | SendRecoveryRead
    | SendRewrite
    | ReadLength
    | Recovered
    | RecoveryFailed
)


def decide_mark_in_recovery(current: LedgerView) -> Decision:
    """R7 step one: IN_RECOVERY, unless it already is, or is closed (nothing to do)."""
    if current.state in (CLOSED, IN_RECOVERY):
        return Settled()
    return MarkInRecovery()


def decide_recovery_close(last_entry_id: int, length_bytes: int, current: LedgerView) -> Decision:
    """R8's last step: close at the last entry recovered, unless another recovery closed
    it first (concurrent recoveries converge: all adopt the first close)."""
    if current.state == CLOSED:
        return Settled()
    return CloseAt(last_entry_id, length_bytes)


class _Rewrite:
    """One found entry on its way back to Qa bookies of its write set (R8)."""

    __slots__ = ("acked", "answered", "blob", "rounds", "sent")

    def __init__(self, blob: bytes, slots: tuple[int, ...]) -> None:
        self.blob = blob
        self.sent = set(slots)  # this round
        self.answered: set[int] = set()  # this round
        self.acked: set[int] = set()  # over every round
        self.rounds = 1


class LedgerRecoveryMachine:
    """Recovery of one ledger (R7, R8) as a pure state machine.

    1. Mark the ledger IN_RECOVERY with a compare-and-set (a writer's ensemble change
       or close now fails, R5/R6). Closed meanwhile: done.
    2. Fence the last fragment's bookies until (Qw - Qa) + 1 bookies of every write
       set answered (:class:`FenceProgress`), keeping the largest LAC they report.
    3. From after that LAC, never before the last fragment (first_entry_to_recover),
       read entry by entry with fencing reads, ``reads_in_flight`` entries ahead. Each
       entry found is written back to its whole write set with recovery adds until Qa
       bookies have it (up to ``rewrite_attempts`` rounds for the others). The first
       entry that enough bookies declare missing ends the ledger; an entry neither
       found nor known missing stops recovery unclosed (:class:`EntryRecoveryRead`).
    4. Once every rewrite reached Qa bookies, close at the last entry found, with the
       ledger length its header records (or, if none was found, the length recorded
       by the entry before, read from its own fragment).

    Metadata updates follow the one policy of ``core/metadata.py`` (R13).
    """

    def __init__(
        self,
        ledger_id: int,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        view: LedgerView,
        *,
        reads_in_flight: int = 16,
        rewrite_attempts: int = 3,
        metadata_attempts: int = 20,
    ) -> None:
        self.ledger_id = ledger_id
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.view = view
        self.reads_in_flight = max(1, reads_in_flight)
        self.rewrite_attempts = max(1, rewrite_attempts)
        self.metadata_attempts = metadata_attempts
        self.phase = "new"  # new, marking, fencing, reading, closing, done
        self.ensemble: tuple[str, ...] = view.last_ensemble
        self._update: PendingUpdate | None = None
        self._fence = FenceProgress(ensemble_size, write_quorum, ack_quorum)
        self._fence_errors: list[str] = []
        self.first_entry_id = -1  # where reading started
        self.last_entry_id = -1  # the last entry found so far
        self._length_bytes: int | None = None  # recorded by the last entry found
        self._next_read = 0
        self._reads: dict[int, EntryRecoveryRead] = {}
        self._lengths: dict[int, int] = {}  # the length each found entry records
        self._rewrites: dict[int, _Rewrite] = {}
        self._end_found = False  # an entry was declared missing: reading is over
        self._length_asked = False

    # -------------------------------------------------------------- events

    def start(self) -> list[RecoveryEffect]:
        if self.phase != "new":
            return []
        if self.view.state == CLOSED:
            self.phase = "done"
            return [Recovered(self.view, ran_to_close=False)]
        self.phase = "marking"
        self._update = PendingUpdate(decide_mark_in_recovery, self.metadata_attempts)
        return [self._update.start()]

    def step(self, event: RecoveryEvent) -> list[RecoveryEffect]:
        """Feed one event; returns the effects to carry out, in order."""
        if self.phase == "done":
            return []
        if isinstance(event, FenceAnswered):
            return self._on_fence(event)
        if isinstance(event, EntryRead):
            return self._on_read(event)
        if isinstance(event, EntryRewritten):
            return self._on_rewritten(event)
        if isinstance(event, LengthRead):
            return self._on_length(event)
        return self._on_metadata(event)

    # -------------------------------------------------------------- metadata

    def _on_metadata(self, event: MetadataEvent) -> list[RecoveryEffect]:
        update = self._update
        if update is None:
            return []
        if isinstance(event, MetadataStored | MetadataRead):
            self.view = event.view
        outcome = update.on_event(event)
        if isinstance(outcome, ReadMetadata):
            return [outcome]
        if isinstance(outcome, Retry):
            return [outcome.effect]
        self._update = None
        if not isinstance(outcome, MetadataStored):
            return self._failed(outcome.error)
        view = outcome.view
        if self.phase == "marking":
            if view.state == CLOSED:  # someone closed it meanwhile: nothing to recover
                self.phase = "done"
                return [Recovered(view, ran_to_close=False)]
            return self._start_fencing(view)
        self.phase = "done"
        return [Recovered(view, ran_to_close=True)]

    def _failed(self, error: BKError) -> list[RecoveryEffect]:
        self.phase = "done"
        return [RecoveryFailed(error)]

    # -------------------------------------------------------------- fencing

    def _start_fencing(self, view: LedgerView) -> list[RecoveryEffect]:
        self.phase = "fencing"
        self.ensemble = view.last_ensemble
        return [SendFence(tuple(range(len(self.ensemble))))]

    def _on_fence(self, event: FenceAnswered) -> list[RecoveryEffect]:
        if self.phase != "fencing":
            return []  # late answers once fenced: the fence is already enough
        progress = self._fence
        address = self.ensemble[event.slot]
        if event.status == Status.OK:
            progress.on_fenced(event.slot, event.lac)
        elif event.status == Status.UNAUTHORIZED:
            return self._failed(
                UnauthorizedError(f"ledger {self.ledger_id}: bookie {address} refused the password")
            )
        else:
            progress.on_failed(event.slot)
            self._fence_errors.append(f"bookie {address}: {event.message or event.status}")
        if progress.is_fenced:
            self.phase = "reading"
            start = first_entry_to_recover(progress.max_lac, self.view.last_fragment_first_entry)
            self.first_entry_id = self._next_read = start
            self.last_entry_id = start - 1
            return self._read_ahead()
        if progress.is_hopeless:
            return self._failed(
                LedgerRecoveryError(
                    f"ledger {self.ledger_id}: could not fence enough bookies of "
                    f"{', '.join(self.ensemble)}: {'; '.join(self._fence_errors) or 'no answer'}"
                )
            )
        return []

    # -------------------------------------------------------------- reading

    def _write_set(self, entry_id: int) -> tuple[int, ...]:
        start = entry_id % self.ensemble_size
        return tuple((start + i) % self.ensemble_size for i in range(self.write_quorum))

    def _read_ahead(self) -> list[RecoveryEffect]:
        effects: list[RecoveryEffect] = []
        while not self._end_found and self._next_read <= self.last_entry_id + self.reads_in_flight:
            entry_id = self._next_read
            self._next_read += 1
            self._reads[entry_id] = EntryRecoveryRead(self.write_quorum, self.ack_quorum)
            effects.append(SendRecoveryRead(entry_id, self._write_set(entry_id)))
        return effects

    def _on_read(self, event: EntryRead) -> list[RecoveryEffect]:
        decision = self._reads.get(event.entry_id)
        if self.phase != "reading" or decision is None:
            return []  # an entry already decided, or past the end
        status = event.status
        if status == Status.OK and event.blob:
            decision.on_found(event.blob)
            if decision.found is event.blob:
                self._lengths[event.entry_id] = event.length_bytes
        elif status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            decision.on_missing(event.slot)
        elif status == Status.UNAUTHORIZED:
            return self._failed(
                UnauthorizedError(
                    f"ledger {self.ledger_id}: bookie {self.ensemble[event.slot]} "
                    "refused the password"
                )
            )
        else:
            decision.on_unknown(event.slot)
        return self._advance()

    def _advance(self) -> list[RecoveryEffect]:
        """Decide entries in order from the first undecided one (R8)."""
        effects: list[RecoveryEffect] = []
        while not self._end_found:
            entry_id = self.last_entry_id + 1
            decision = self._reads.get(entry_id)
            if decision is None:
                break
            outcome = decision.outcome
            if outcome is ReadOutcome.WAIT:
                break
            del self._reads[entry_id]
            if outcome is ReadOutcome.MISSING:
                self._end_found = True
                self._reads.clear()
                self._lengths.clear()
                break
            if outcome is ReadOutcome.UNKNOWN or decision.found is None:
                return self._failed(
                    LedgerRecoveryError(
                        f"ledger {self.ledger_id}: entry {entry_id} is neither readable nor "
                        "known missing (bookies failed or returned damaged data); "
                        "the ledger stays open for a later recovery"
                    )
                )
            self.last_entry_id = entry_id
            self._length_bytes = self._lengths.pop(entry_id)
            slots = self._write_set(entry_id)
            self._rewrites[entry_id] = _Rewrite(decision.found, slots)
            effects.append(SendRewrite(entry_id, decision.found, slots))
        effects.extend(self._read_ahead())
        return effects + self._maybe_close()

    # -------------------------------------------------------------- rewriting

    def _on_rewritten(self, event: EntryRewritten) -> list[RecoveryEffect]:
        rewrite = self._rewrites.get(event.entry_id)
        if rewrite is None or event.slot not in rewrite.sent or event.slot in rewrite.answered:
            return []
        rewrite.answered.add(event.slot)
        if event.status == Status.OK:
            rewrite.acked.add(event.slot)
        if len(rewrite.acked) >= self.ack_quorum:
            del self._rewrites[event.entry_id]
            return self._maybe_close()
        if rewrite.answered != rewrite.sent:
            return []
        # The round is over without Qa acks: ask the bookies that failed again.
        if rewrite.rounds >= self.rewrite_attempts:
            return self._failed(
                LedgerRecoveryError(
                    f"ledger {self.ledger_id}: could not re-replicate entry {event.entry_id} "
                    f"to {self.ack_quorum} bookies ({event.message or event.status})"
                )
            )
        rewrite.rounds += 1
        retry = tuple(sorted(rewrite.sent - rewrite.acked))
        rewrite.sent, rewrite.answered = set(retry), set()
        return [SendRewrite(event.entry_id, rewrite.blob, retry)]

    # -------------------------------------------------------------- closing

    def _on_length(self, event: LengthRead) -> list[RecoveryEffect]:
        if self.phase != "reading" or not self._length_asked:
            return []
        if event.length_bytes is None:
            return self._failed(
                LedgerRecoveryError(
                    f"ledger {self.ledger_id}: cannot read confirmed entry "
                    f"{self.last_entry_id} to learn the length"
                )
            )
        self._length_bytes = event.length_bytes
        return self._maybe_close()

    def _maybe_close(self) -> list[RecoveryEffect]:
        """Close once the end is found, every rewrite reached Qa bookies and the length
        is known."""
        if self.phase != "reading" or not self._end_found or self._rewrites:
            return []
        if self._length_bytes is None:
            if self.last_entry_id < 0:
                self._length_bytes = 0
            elif self._length_asked:
                return []
            else:
                # Nothing was found: the entry before the first read is confirmed (at or
                # below a LAC, or before the last fragment) and records the length.
                self._length_asked = True
                entry_id = self.last_entry_id
                ensemble = self.view.ensemble_for(entry_id)
                bookies = tuple(ensemble[i] for i in self._write_set(entry_id))
                return [ReadLength(entry_id, bookies)]
        self.phase = "closing"
        decide = partial(decide_recovery_close, self.last_entry_id, self._length_bytes)
        self._update = PendingUpdate(decide, self.metadata_attempts)
        return [self._update.start()]
