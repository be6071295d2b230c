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

from quorumlog.core.invariants import require
from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    CloseAt,
    Decision,
    Ensembles,
    LedgerView,
    MarkInRecovery,
    MetadataEvent,
    MetadataStored,
    MetadataUpdater,
    NewFragment,
    PendingUpdate,
    ReadMetadata,
    Refused,
    Retry,
    Settled,
    UpdateMetadata,
)
from quorumlog.core.quorum import can_still_cover, covered_threshold, is_covered
from quorumlog.core.writer import BookiesChosen, ChooseBookies, NoBookies
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


class RecoveryPhase(enum.Enum):
    """Where a recovery is. An answer to a request sent in a later phase than the
    current one cannot arrive: it is a bug, and fails loudly (:class:`CoreInvariantError`);
    an answer that arrives after its phase is a late one, and is ignored."""

    NEW = 0
    MARKING = 1  # IN_RECOVERY being written
    FENCING = 2
    READING = 3  # reading, rewriting, replacing bookies, learning the length
    CLOSING = 4  # the close being written
    DONE = 5


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
    """A bookie's answer to the recovery add of ``entry_id`` (``Status.OK``: stored).
    ``bookie``, when given, is who answered: an answer from a bookie the slot no longer
    names (replaced by an ensemble change) is ignored."""

    entry_id: int
    slot: int
    status: int
    message: str = ""
    bookie: str = ""


@dataclass(frozen=True, slots=True)
class LengthRead:
    """The ledger length recorded in the entry :class:`ReadLength` asked for, or None
    when no replica served it intact."""

    length_bytes: int | None


RecoveryEvent = (
    FenceAnswered
    | EntryRead
    | EntryRewritten
    | LengthRead
    | BookiesChosen
    | NoBookies
    | MetadataEvent
)


# The first phase in which an answer of each kind can arrive (its request is sent from
# there on); earlier, it is a bug.
_EARLIEST_PHASE: dict[type, RecoveryPhase] = {
    FenceAnswered: RecoveryPhase.FENCING,
    EntryRead: RecoveryPhase.READING,
    EntryRewritten: RecoveryPhase.READING,
    LengthRead: RecoveryPhase.READING,
    BookiesChosen: RecoveryPhase.READING,
    NoBookies: RecoveryPhase.READING,
}


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
    """Send ``blob`` as a recovery add to each of these slots of the ensemble rewrites
    go to (``LedgerRecoveryMachine.write_ensemble``)."""

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
    | ChooseBookies
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


def decide_recovery_close(
    ledger_id: int, last_entry_id: int, length_bytes: int, ensembles: Ensembles, current: LedgerView
) -> Decision:
    """R8's last step: close at the last entry recovered, unless another recovery closed
    it first (concurrent recoveries converge: all adopt the first close). The fragments
    must be those this recovery rewrote to: another recovery's ensemble change means
    its replacements, not this recovery's bookies, are recorded to hold the tail."""
    if current.state == CLOSED:
        return Settled()
    if current.ensembles != ensembles:
        return Refused(_ensemble_moved(ledger_id))
    return CloseAt(last_entry_id, length_bytes)


def decide_recovery_fragment(
    ledger_id: int,
    first_entry_id: int,
    bookies: tuple[str, ...],
    ensembles: Ensembles,
    current: LedgerView,
) -> Decision:
    """A recovery's ensemble change (R5 during recovery, as BookKeeper's recovery adds
    replace a failed bookie): the new fragment on the fragments this recovery knows.
    Already there: an earlier attempt was applied. Closed meanwhile: nothing to write
    (the recovery adopts the close). Other fragments: another recovery moved on."""
    if current.state == CLOSED:
        return Settled()
    if current.ensembles == with_fragment(ensembles, first_entry_id, bookies):
        return Settled()
    if current.ensembles != ensembles:
        return Refused(_ensemble_moved(ledger_id))
    return NewFragment(first_entry_id, bookies)


@dataclass(frozen=True, slots=True)
class MarkDecision:
    """The decision of recovery's first step (:func:`decide_mark_in_recovery`), as data."""

    def __call__(self, current: LedgerView) -> Decision:
        return decide_mark_in_recovery(current)


@dataclass(frozen=True, slots=True)
class RecoveryFragmentDecision:
    """The decision of a recovery's ensemble change (:func:`decide_recovery_fragment`)."""

    ledger_id: int
    first_entry_id: int
    bookies: tuple[str, ...]
    ensembles: Ensembles

    def __call__(self, current: LedgerView) -> Decision:
        return decide_recovery_fragment(
            self.ledger_id, self.first_entry_id, self.bookies, self.ensembles, current
        )


@dataclass(frozen=True, slots=True)
class RecoveryCloseDecision:
    """The decision of recovery's close (:func:`decide_recovery_close`)."""

    ledger_id: int
    last_entry_id: int
    length_bytes: int
    ensembles: Ensembles

    def __call__(self, current: LedgerView) -> Decision:
        return decide_recovery_close(
            self.ledger_id, self.last_entry_id, self.length_bytes, self.ensembles, current
        )


def with_fragment(ensembles: Ensembles, first_entry_id: int, bookies: tuple[str, ...]) -> Ensembles:
    """``ensembles`` after a new fragment from ``first_entry_id`` (one that starts there
    or later is replaced: it is the recovery's to rewrite)."""
    kept = tuple((first, ensemble) for first, ensemble in ensembles if first < first_entry_id)
    return (*kept, (first_entry_id, bookies))


def _ensemble_moved(ledger_id: int) -> LedgerRecoveryError:
    return LedgerRecoveryError(
        f"ledger {ledger_id}: another recovery changed the ensemble meanwhile; "
        "the ledger stays open for a later recovery"
    )


class _Rewrite:
    """One found entry on its way back to Qa bookies of its write set (R8)."""

    __slots__ = ("acked", "answered", "blob", "rounds", "sent")

    def __init__(self, blob: bytes, slots: tuple[int, ...]) -> None:
        self.blob = blob
        self.sent = set(slots)  # this round
        self.answered: set[int] = set()  # this round
        self.acked: set[int] = set()  # over every round, by the bookies the slots name now
        self.rounds = 1

    def restart(self, slots: tuple[int, ...], replaced: tuple[int, ...]) -> tuple[int, ...]:
        """After an ensemble change: the replaced slots' acks stop counting (their new
        bookies hold nothing yet); a new round goes to every slot not acked. Returns
        the slots to send to."""
        self.acked -= set(replaced)
        retry = tuple(slot for slot in slots if slot not in self.acked)
        self.sent, self.answered, self.rounds = set(retry), set(), 1
        return retry


class LedgerRecoveryMachine(MetadataUpdater):
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
    4. A bookie that still fails rewrites after ``rewrite_attempts`` rounds is
       replaced, as BookKeeper's recovery adds do (with Qa = Qw, one bookie gone for
       good would otherwise keep the ledger open forever): once the end is found,
       choose a bookie, send it every entry from the first stuck one whose write set
       it is in and that lacks Qa acks without the bookie it replaces, and only when
       all of them are on Qa bookies write the fragment (from that entry, replacing a
       fragment that starts there). At most ``ensemble_changes`` changes (default E).
    5. Once every rewrite reached Qa bookies, close at the last entry found, with the
       ledger length its header records (or, if none was found, the length recorded
       by the entry before, read from its own fragment), provided the fragments are
       still the ones this recovery knows (another recovery's change means it failed).

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
        ensemble_changes: int | None = None,
    ) -> None:
        self.ledger_id = ledger_id
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.view = view
        self.reads_in_flight = max(1, reads_in_flight)
        self.rewrite_attempts = max(1, rewrite_attempts)
        self.metadata_attempts = metadata_attempts
        self.phase = RecoveryPhase.NEW
        self.ensemble: tuple[str, ...] = view.last_ensemble  # fenced and read
        self.write_ensemble: tuple[str, ...] = view.last_ensemble  # rewritten to
        self.ensemble_changes = ensemble_size if ensemble_changes is None else ensemble_changes
        self._changes_made = 0
        self._known_ensembles: Ensembles = view.ensembles  # as recorded
        self._stuck: set[int] = set()  # rewrites out of rounds: their bookies get replaced
        self._choosing: tuple[int, ...] | None = None  # slots whose replacement is chosen
        self._fragment_first: int | None = None  # a change's fragment, not recorded yet
        self._replaced_bookies: set[str] = set()
        self._update: PendingUpdate | None = None
        self._fence = FenceProgress(ensemble_size, write_quorum, ack_quorum)
        self._fence_errors: list[str] = []
        self.first_entry_id = -1  # where reading started
        self.last_entry_id = -1  # the last entry found so far
        self._length_bytes: int | None = None  # recorded by the last entry found
        self._next_read = 0
        self._reads: dict[int, EntryRecoveryRead] = {}
        self._lengths: dict[int, int] = {}  # the length each found entry records
        self._rewrites: dict[int, _Rewrite] = {}  # on their way to Qa bookies
        self._rewritten: dict[int, _Rewrite] = {}  # on Qa bookies (kept for a change)
        self._end_found = False  # an entry was declared missing: reading is over
        self._length_asked = False

    # -------------------------------------------------------------- events

    def start(self) -> list[RecoveryEffect]:
        if self.phase is not RecoveryPhase.NEW:
            return []
        if self.view.state == CLOSED:
            self.phase = RecoveryPhase.DONE
            return [Recovered(self.view, ran_to_close=False)]
        self.phase = RecoveryPhase.MARKING
        return [self._start_update(MarkDecision())]

    def step(self, event: RecoveryEvent) -> list[RecoveryEffect]:
        """Feed one event; returns the effects to carry out, in order."""
        if self.phase is RecoveryPhase.DONE:
            return []
        earliest = _EARLIEST_PHASE.get(type(event))
        require(
            earliest is None or self.phase.value >= earliest.value,
            f"ledger {self.ledger_id}: {type(event).__name__} in phase {self.phase.name}, "
            "before any such request was sent",
        )
        effects = self._dispatch(event)
        self._check_invariants()
        return effects

    def _dispatch(self, event: RecoveryEvent) -> list[RecoveryEffect]:
        if isinstance(event, FenceAnswered):
            return self._on_fence(event)
        if isinstance(event, EntryRead):
            return self._on_read(event)
        if isinstance(event, EntryRewritten):
            return self._on_rewritten(event)
        if isinstance(event, LengthRead):
            return self._on_length(event)
        if isinstance(event, BookiesChosen):
            return self._on_bookies_chosen(event)
        if isinstance(event, NoBookies):
            return self._on_no_bookies(event)
        require(
            self._update is not None,
            f"ledger {self.ledger_id}: a metadata answer with no update under way",
        )
        return self._on_metadata(event)

    def _check_invariants(self) -> None:
        """What holds after every step (R8): reading never passes the end it found,
        rewrites and reads lie on their side of the last entry found, and a close is
        written only once every rewrite reached Qa bookies."""
        if self.phase.value < RecoveryPhase.READING.value or self.phase is RecoveryPhase.DONE:
            return
        last = self.last_entry_id
        require(
            last >= self.first_entry_id - 1,
            f"ledger {self.ledger_id}: last entry found {last} before where reading "
            f"started ({self.first_entry_id})",
        )
        require(
            all(self.first_entry_id <= e <= last for e in self._rewrites),
            f"ledger {self.ledger_id}: a rewrite outside {self.first_entry_id}..{last}",
        )
        require(
            all(e > last for e in self._reads),
            f"ledger {self.ledger_id}: a read at or below the last entry decided ({last})",
        )
        require(
            not (self._end_found and self._reads),
            f"ledger {self.ledger_id}: reads left after the end was found",
        )
        require(
            self._fragment_first is None or self._fragment_first >= self.first_entry_id,
            f"ledger {self.ledger_id}: a fragment before the first entry recovered",
        )
        if self.phase is RecoveryPhase.CLOSING:
            require(
                self._end_found and not self._rewrites and self._update is not None,
                f"ledger {self.ledger_id}: closing before every rewrite reached Qa bookies",
            )

    # -------------------------------------------------------------- metadata

    def _on_metadata(self, event: MetadataEvent) -> list[RecoveryEffect]:
        outcome = self._update_outcome(event)
        if outcome is None:
            return []
        if isinstance(outcome, ReadMetadata):
            return [outcome]
        if isinstance(outcome, Retry):
            return [outcome.effect]
        self._update = None
        if not isinstance(outcome, MetadataStored):
            return self._failed(outcome.error)
        view = outcome.view
        if self.phase is RecoveryPhase.MARKING:
            if view.state == CLOSED:  # someone closed it meanwhile: nothing to recover
                self.phase = RecoveryPhase.DONE
                return [Recovered(view, ran_to_close=False)]
            return self._start_fencing(view)
        if self.phase is RecoveryPhase.READING:  # the ensemble change's fragment
            if view.state == CLOSED:  # another recovery closed it meanwhile
                self.phase = RecoveryPhase.DONE
                return [Recovered(view, ran_to_close=False)]
            return self._fragment_recorded()
        self.phase = RecoveryPhase.DONE
        return [Recovered(view, ran_to_close=True)]

    def _failed(self, error: BKError) -> list[RecoveryEffect]:
        self.phase = RecoveryPhase.DONE
        return [RecoveryFailed(error)]

    # -------------------------------------------------------------- fencing

    def _start_fencing(self, view: LedgerView) -> list[RecoveryEffect]:
        self.phase = RecoveryPhase.FENCING
        self.ensemble = self.write_ensemble = view.last_ensemble
        self._known_ensembles = view.ensembles
        return [SendFence(tuple(range(len(self.ensemble))))]

    def _on_fence(self, event: FenceAnswered) -> list[RecoveryEffect]:
        if self.phase is not RecoveryPhase.FENCING:
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
            self.phase = RecoveryPhase.READING
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
        if self.phase is not RecoveryPhase.READING or decision is None:
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
        if event.bookie and event.bookie != self.write_ensemble[event.slot]:
            return []  # from the bookie the slot named before an ensemble change
        rewrite.answered.add(event.slot)
        if event.status == Status.OK:
            rewrite.acked.add(event.slot)
        if len(rewrite.acked) >= self.ack_quorum:
            self._rewritten[event.entry_id] = self._rewrites.pop(event.entry_id)
            return self._maybe_close()
        if rewrite.answered != rewrite.sent:
            return []
        failed = tuple(sorted(rewrite.sent - rewrite.acked))
        if rewrite.rounds < self.rewrite_attempts:
            # The round is over without Qa acks: ask the bookies that failed again.
            rewrite.rounds += 1
            rewrite.sent, rewrite.answered = set(failed), set()
            return [SendRewrite(event.entry_id, rewrite.blob, failed)]
        if self._changes_made >= self.ensemble_changes:
            return self._failed(
                LedgerRecoveryError(
                    f"ledger {self.ledger_id}: could not re-replicate entry {event.entry_id} "
                    f"to {self.ack_quorum} bookies ({event.message or event.status})"
                )
            )
        self._stuck.add(event.entry_id)
        return self._maybe_replace()

    # -------------------------------------------------------------- ensemble change
    #
    # The replacement first gets every entry it is to hold, and only then is the fragment
    # recorded, once the end is known: a recovery that stops before the record leaves the
    # metadata as it was, and one that stops after it leaves every entry of the new
    # fragment on Qa of its bookies, even those a later recovery takes as confirmed
    # because a LAC reached the bookies after this one fenced.

    def _maybe_replace(self) -> list[RecoveryEffect]:
        """Once the end is found and every rewrite left is out of rounds, choose bookies
        for the slots that failed them."""
        if not self._end_found or self._choosing is not None or not self._stuck:
            return []
        if set(self._rewrites) != self._stuck:
            return []  # rounds still under way: they may succeed
        slots: set[int] = set()
        for entry_id in self._stuck:
            rewrite = self._rewrites[entry_id]
            slots |= rewrite.sent - rewrite.acked
        self._changes_made += 1
        self._choosing = tuple(sorted(slots))
        excluded = frozenset(self.write_ensemble) | self._replaced_bookies
        return [ChooseBookies(self._choosing, excluded)]

    def _on_bookies_chosen(self, event: BookiesChosen) -> list[RecoveryEffect]:
        """The replacements take their slots for the rewrites (not yet in the metadata):
        every entry from the first stuck one on that lost Qa acks with the replaced
        bookies goes again to the slots of its write set that have not acked."""
        replaced = self._choosing
        if replaced is None or event.slots != replaced or self.phase is not RecoveryPhase.READING:
            return []
        self._choosing = None
        first = min(self._stuck)
        self._stuck.clear()
        if self._fragment_first is None or first < self._fragment_first:
            self._fragment_first = first
        # The fragment to record starts at the first change's entry: the new bookies are
        # named for every entry from there, so every one of them is checked again, not
        # only those from this change's first stuck entry (P3).
        first = self._fragment_first
        bookies = list(self.write_ensemble)
        for slot, bookie in zip(event.slots, event.bookies, strict=True):
            self._replaced_bookies.add(bookies[slot])
            bookies[slot] = bookie
        self.write_ensemble = tuple(bookies)
        gone = set(replaced)
        for entry_id in [e for e in self._rewritten if e >= first]:
            if len(self._rewritten[entry_id].acked - gone) < self.ack_quorum:
                self._rewrites[entry_id] = self._rewritten.pop(entry_id)
            else:
                self._rewritten[entry_id].acked -= gone
        effects: list[RecoveryEffect] = []
        for entry_id in sorted(self._rewrites):
            rewrite = self._rewrites[entry_id]
            slots = rewrite.restart(self._write_set(entry_id), replaced)
            effects.append(SendRewrite(entry_id, rewrite.blob, slots))
        return effects + self._maybe_close()

    def _on_no_bookies(self, event: NoBookies) -> list[RecoveryEffect]:
        if self._choosing is None or self.phase is not RecoveryPhase.READING:
            return []
        return self._failed(event.error)

    def _record_fragment(self) -> list[RecoveryEffect]:
        assert self._fragment_first is not None
        decide = RecoveryFragmentDecision(
            self.ledger_id, self._fragment_first, self.write_ensemble, self._known_ensembles
        )
        return [self._start_update(decide)]

    def _fragment_recorded(self) -> list[RecoveryEffect]:
        assert self._fragment_first is not None
        first, self._fragment_first = self._fragment_first, None
        self._known_ensembles = with_fragment(self._known_ensembles, first, self.write_ensemble)
        return self._maybe_close()

    # -------------------------------------------------------------- closing

    def _on_length(self, event: LengthRead) -> list[RecoveryEffect]:
        if self.phase is not RecoveryPhase.READING or not self._length_asked:
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
        if self.phase is not RecoveryPhase.READING or not self._end_found:
            return []
        if self._rewrites:
            return self._maybe_replace()
        if self._update is not None:
            return []  # the fragment is being recorded
        if self._fragment_first is not None:
            return self._record_fragment()
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
        self.phase = RecoveryPhase.CLOSING
        decide = RecoveryCloseDecision(
            self.ledger_id, self.last_entry_id, self._length_bytes, self._known_ensembles
        )
        return [self._start_update(decide)]
