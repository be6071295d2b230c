"""The single writer of a ledger as a pure state machine: adds and acknowledgements
(R3), bookie failures and ensemble changes (R5), close (R6), metadata outcomes that
are unknown (R13).

No I/O, no clock, no await. The ledger handle (``client/writing.py``) feeds it
events and carries out the effects it returns, in order::

    effects = writer.step(AddFailed(slot, generation, Status.IO_ERROR, "timed out"))
    # -> [ChooseBookies(slots=(1,), excluded=...)]
    effects = writer.step(BookiesChosen((1,), ("10.0.0.9:3181",)))
    # -> [UpdateMetadata(decide)]   the client runs LedgerManager.update(decide)
    effects = writer.step(MetadataStored(view))
    # -> [SendQueued(), Confirm([...])]

Two events are on the hot path and have methods of their own that return plain
values instead of effect lists, so that an add or an acknowledgement allocates
nothing beyond what :class:`~quorumlog.core.adds.AddTracker` does: :meth:`add`
(the entry is queued for each bookie of its write set) and :meth:`ack` (returns the
entries confirmed, in entry-id order). :meth:`take_sends` hands the queued entries
to the client once per event-loop turn.

The rules, where they bite:

- Slots and generations. A bookie is addressed by its index in the current ensemble
  (its *slot*). Each slot has a generation, raised when its bookie fails and again
  when a replacement takes the slot; an answer carries the generation it was sent
  with, and an answer from an older generation is dropped. A failed bookie is never
  trusted again in this ledger: its late acknowledgements could otherwise count for
  the bookie that replaced it.
- Confirmation is held while any slot failed and its replacement is not recorded in
  the metadata (R5): an entry confirmed then would leave the tracker, and the new
  bookie, which the new fragment says holds it, would never be sent it. Acks still
  count meanwhile.
- Never confirm from a stale write set (R13). Once the new fragment is recorded, the
  replaced bookie's acknowledgements for entries of that fragment stop counting. When
  the write of the fragment has an unknown outcome, the metadata is read again
  before anything is confirmed; when the handle fails (FENCED, no bookies left)
  while that write is unanswered or unknown, its outcome is waited for, then read
  again; if it stays unknown, only entries that Qa bookies hold under *both* the old
  and the new fragment are confirmed (under the new one the replacement holds nothing
  yet, so: the acks of the replaced slots no longer count).
- One metadata update at a time: a second failure during a change waits for it and
  starts the next change; a close waits for a change under way (so a change never
  writes to a ledger this writer closed: its decision refuses anything not OPEN).
- A close is decided at the LAC when its update starts, so confirmation is held from
  then on: an add its owner gave up on (a cancelled future) may still be acknowledged
  during the close, and would lie past the closed end. What is still tracked when the
  close is written, or fails, is failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quorumlog.core.adds import AddTracker, PendingAdd
from quorumlog.core.invariants import require
from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    CloseAt,
    Decision,
    LedgerView,
    MetadataEvent,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    MetadataUpdater,
    NewFragment,
    PendingUpdate,
    ReadMetadata,
    Refused,
    Retry,
    Settled,
    Unresolved,
    UpdateMetadata,
)
from quorumlog.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
)
from quorumlog.proto.entry import ENTRY_HEADER

# ------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class AddAcked:
    """The bookie in ``slot`` (as of ``generation``) acknowledged ``entry_ids``."""

    slot: int
    generation: int
    entry_ids: Sequence[int]


@dataclass(frozen=True, slots=True)
class AddFailed:
    """An add sent to ``slot`` failed: a non-OK status, or a timeout or lost connection
    (``Status.IO_ERROR``)."""

    slot: int
    generation: int
    status: int
    message: str


@dataclass(frozen=True, slots=True)
class BookiesChosen:
    """Replacements for the slots of :class:`ChooseBookies`, in the same order."""

    slots: tuple[int, ...]
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoBookies:
    """No replacement could be chosen (not enough writable bookies)."""

    error: BKError


@dataclass(frozen=True, slots=True)
class CloseRequested:
    """The owner closes the handle; it sends no more adds (it waited for those sent)."""


WriterEvent = AddAcked | AddFailed | BookiesChosen | NoBookies | MetadataEvent | CloseRequested

# ------------------------------------------------------------------ effects


@dataclass(frozen=True, slots=True)
class Confirm:
    """Complete these adds, in this order (entry-id order, R3)."""

    entries: list[PendingAdd]


@dataclass(frozen=True, slots=True)
class FailAdds:
    """Fail these adds with ``error`` (they may or may not be stored)."""

    entries: list[PendingAdd]
    error: BKError


@dataclass(frozen=True, slots=True)
class HandleFailed:
    """The handle takes no more adds; ``error`` says why."""

    error: BKError


@dataclass(frozen=True, slots=True)
class SendQueued:
    """Entries were queued (resends to a replacement): send :meth:`take_sends`."""


@dataclass(frozen=True, slots=True)
class ChooseBookies:
    """Pick a writable bookie for each slot, none of them in ``excluded``; answer with
    :class:`BookiesChosen` or :class:`NoBookies`."""

    slots: tuple[int, ...]
    excluded: frozenset[str]


@dataclass(frozen=True, slots=True)
class Closed:
    """The ledger is recorded CLOSED at this writer's LAC."""

    view: LedgerView


@dataclass(frozen=True, slots=True)
class CloseFailed:
    error: BKError


WriterEffect = (
    Confirm
    | FailAdds
    | HandleFailed
    | SendQueued
    | ChooseBookies
    | UpdateMetadata
    | ReadMetadata
    | Closed
    | CloseFailed
)

_NOTHING: tuple[PendingAdd, ...] = ()


@dataclass(slots=True)
class _Change:
    """An ensemble change under way: ``slots`` get ``bookies`` from ``first_entry_id``."""

    slots: tuple[int, ...]
    first_entry_id: int
    bookies: tuple[str, ...] = ()


def decide_fragment(
    ledger_id: int, first_entry_id: int, bookies: tuple[str, ...], current: LedgerView
) -> Decision:
    """R5: the new fragment, unless the metadata already has it (an earlier attempt was
    applied) or the ledger is no longer OPEN (a recovery started, or it was closed).

    The fragment counts as the writer's own only while the ledger is OPEN: a recovery
    that replaced the same bookie may have recorded the very same fragment (both pick
    from the same writable bookies), and a writer taking it for its own would send to a
    bookie no one fenced and confirm past the recovered end. Not OPEN is a refusal,
    which after an unknown outcome leaves the writer's change unresolved (R13)."""
    if current.state == OPEN and (first_entry_id, bookies) in current.ensembles:
        return Settled()
    if current.state != OPEN:
        return Refused(
            LedgerFencedError(
                f"ledger {ledger_id}: metadata is {current.state} (another client is "
                "recovering or closed it); adds in flight are lost"
            )
        )
    return NewFragment(first_entry_id, bookies)


def decide_close(
    ledger_id: int, last_entry_id: int, length_bytes: int, current: LedgerView
) -> Decision:
    """R6 on what is stored: OPEN, close at the LAC; IN_RECOVERY, fail; CLOSED at this
    writer's LAC, done (an earlier attempt, or a recovery that found the same end);
    CLOSED elsewhere, fail."""
    if current.state == OPEN:
        return CloseAt(last_entry_id, length_bytes)
    if current.state == IN_RECOVERY:
        return Refused(
            LedgerFencedError(f"ledger {ledger_id}: another client is recovering it; cannot close")
        )
    if current.last_entry_id == last_entry_id:
        return Settled()
    return Refused(
        LedgerClosedError(
            f"ledger {ledger_id}: closed by another client at entry "
            f"{current.last_entry_id}, while this writer confirmed up to {last_entry_id}"
        )
    )


@dataclass(frozen=True, slots=True)
class FragmentDecision:
    """The decision an ensemble change runs on the metadata read (:func:`decide_fragment`),
    as data: effects compare by value and print what they decide."""

    ledger_id: int
    first_entry_id: int
    bookies: tuple[str, ...]

    def __call__(self, current: LedgerView) -> Decision:
        return decide_fragment(self.ledger_id, self.first_entry_id, self.bookies, current)


@dataclass(frozen=True, slots=True)
class CloseDecision:
    """The decision a writer's close runs on the metadata read (:func:`decide_close`)."""

    ledger_id: int
    last_entry_id: int
    length_bytes: int

    def __call__(self, current: LedgerView) -> Decision:
        return decide_close(self.ledger_id, self.last_entry_id, self.length_bytes, current)


class LedgerWriter(MetadataUpdater):
    """The decisions of one ledger's writer. See the module docstring for the rules."""

    def __init__(
        self,
        ledger_id: int,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        view: LedgerView,
        *,
        metadata_attempts: int = 20,
    ) -> None:
        self.ledger_id = ledger_id
        self.tracker = AddTracker(ensemble_size, write_quorum, ack_quorum)
        self.view = view  # the metadata as last stored or read
        self.ensemble = list(view.last_ensemble)
        self.generation = [0] * ensemble_size
        self.failed_slots: set[int] = set()  # failed, replacement not recorded yet
        self.replaced_bookies: set[str] = set()
        self.failure: BKError | None = None
        self.closing = view.state == CLOSED
        self.closed = view.state == CLOSED
        self.confirmed_length_bytes = 0
        self._outbox: list[list[PendingAdd]] = [[] for _ in range(ensemble_size)]
        self._change: _Change | None = None
        self._close_requested = False
        # The one metadata update under way (a change's fragment or the close), if any.
        self._update: PendingUpdate | None = None
        self._updating_close = False
        self._settled = False  # outstanding adds were confirmed or failed after a failure
        self._holding = False  # failed slots, a change or a failure: confirm nothing now
        self.metadata_attempts = metadata_attempts
        self._lac_floor = self.tracker.lac  # the LAC at the end of the last step

    # -------------------------------------------------------------- hot path

    @property
    def lac(self) -> int:
        return self.tracker.lac

    @property
    def confirmations_held(self) -> bool:
        """Acks count but nothing is confirmed now: a bookie failed and its replacement is
        not recorded yet, or the handle failed or closed."""
        return self._holding

    def begin_close(self) -> None:
        """The owner is closing: refuse adds from now on (the close itself is written on
        :class:`CloseRequested`, once the adds already sent are settled)."""
        self.closing = True

    def refusal(self) -> BKError | None:
        """Why a new add must be refused now, if it must."""
        if self.failure is not None:
            return self.failure
        if self.closing:
            return LedgerClosedError(f"ledger {self.ledger_id}: closed, cannot add")
        return None

    def add(self, blob: bytes, token: object) -> PendingAdd:
        """Register the next entry (id ``tracker.next_entry_id``) and queue it for each
        bookie of its write set. Check :meth:`refusal` first."""
        return self.tracker.add(blob, token, self._outbox)

    def take_sends(self) -> list[tuple[int, int, list[PendingAdd]]]:
        """(slot, generation, entries) for every slot with entries queued; a failed slot
        keeps its queue until its replacement is recorded."""
        if self.failure is not None:
            return []
        sends = []
        outbox = self._outbox
        failed = self.failed_slots
        for slot, queue in enumerate(outbox):
            if queue and slot not in failed:
                outbox[slot] = []
                sends.append((slot, self.generation[slot], queue))
        return sends

    def ack(self, slot: int, generation: int, entry_ids: Sequence[int]) -> Sequence[PendingAdd]:
        """The bookie in ``slot`` acknowledged ``entry_ids``: the entries now confirmed,
        in entry-id order (often none)."""
        if generation != self.generation[slot]:
            return _NOTHING  # a late answer from a bookie that failed or was replaced
        tracker = self.tracker
        if tracker.ack(entry_ids, slot) and not self._holding:
            return self._confirm()
        return _NOTHING

    def _confirm(self) -> list[PendingAdd]:
        done = self.tracker.confirm()
        if done:
            self.confirmed_length_bytes = ENTRY_HEADER.unpack_from(done[-1].blob)[3]
        return done

    # -------------------------------------------------------------- events

    def step(self, event: WriterEvent) -> list[WriterEffect]:
        """Feed one event; returns the effects to carry out, in order."""
        effects = self._dispatch(event)
        self._check_invariants()
        return effects

    def _check_invariants(self) -> None:
        """What holds after every step: the LAC only rises and stays below the next
        entry id; nothing is confirmed while a failure, a change or a close holds
        confirmations; a closed writer tracks nothing; outboxes hold entries added, in
        order, each once (bounded by the adds)."""
        tracker = self.tracker
        lac = tracker.lac
        require(lac >= self._lac_floor, f"ledger {self.ledger_id}: LAC fell to {lac}")
        self._lac_floor = lac
        require(
            lac < tracker.next_entry_id,
            f"ledger {self.ledger_id}: LAC {lac} at or past the next entry",
        )
        held = self.failure is not None or self._updating_close or bool(self.failed_slots)
        require(
            self._holding or not held,
            f"ledger {self.ledger_id}: confirmations not held during a failure or close",
        )
        require(
            not self.closed or len(tracker) == 0,
            f"ledger {self.ledger_id}: closed with adds still tracked",
        )
        require(
            all(
                not queue
                or (
                    len(queue) <= tracker.next_entry_id - queue[0].entry_id
                    and queue[-1].entry_id < tracker.next_entry_id
                )
                for queue in self._outbox
            ),
            f"ledger {self.ledger_id}: an outbox holds entries out of order or not added",
        )
        require(
            not self._updating_close or self._update is not None,
            f"ledger {self.ledger_id}: closing without a close update",
        )

    def _dispatch(self, event: WriterEvent) -> list[WriterEffect]:
        if isinstance(event, AddAcked):
            confirmed = self.ack(event.slot, event.generation, event.entry_ids)
            return [Confirm(list(confirmed))] if confirmed else []
        if isinstance(event, AddFailed):
            return self._on_add_failed(event)
        if isinstance(event, BookiesChosen):
            return self._on_bookies_chosen(event)
        if isinstance(event, NoBookies):
            return self._on_no_bookies(event.error)
        if isinstance(
            event,
            MetadataStored | MetadataRefused | MetadataUnknown | MetadataRead | MetadataReadFailed,
        ):
            return self._on_metadata(event)
        if isinstance(event, CloseRequested):
            return self._on_close_requested()
        raise TypeError(f"not a writer event: {event!r}")

    # -------------------------------------------------------------- failures

    def _on_add_failed(self, event: AddFailed) -> list[WriterEffect]:
        slot = event.slot
        if event.generation != self.generation[slot] or self.failure is not None:
            return []
        address = self.ensemble[slot]
        status = event.status
        if status == Status.FENCED:
            return self._fail(
                LedgerFencedError(
                    f"ledger {self.ledger_id}: fenced by a recovery (bookie {address}); "
                    "unconfirmed adds may or may not be stored and must be treated as lost"
                )
            )
        if status == Status.UNAUTHORIZED:
            # A wire answer refuses the master key (R10); a connection's own error says
            # why it was refused (a token: docs/SECURITY.md) and names the bookie itself.
            refused = event.message if event.message.startswith("bookie ") else None
            return self._fail(
                UnauthorizedError(
                    f"ledger {self.ledger_id}: {refused or f'bookie {address} refused key'}"
                )
            )
        if status == Status.NO_SUCH_LEDGER:
            return self._fail(
                NoSuchLedgerError(f"ledger {self.ledger_id}: deleted (bookie {address})")
            )
        # Anything else (an error, a timeout, a lost connection): replace the bookie.
        self.failed_slots.add(slot)
        self.generation[slot] += 1  # drop whatever the failed bookie still sends
        self._holding = True
        return self._next_change()

    def _next_change(self) -> list[WriterEffect]:
        """Start a change for the failed slots, unless one is under way (it goes first)."""
        if self._change is not None or self.failure is not None or not self.failed_slots:
            return []
        if self._updating_close or self.closed:
            return []  # a change now would be refused anyway: the ledger is (being) closed
        # Confirmation is held since the first of these failures, so the LAC stands
        # still until the change is recorded: the new fragment starts right after it.
        slots = tuple(sorted(self.failed_slots))
        self._change = _Change(slots, self.tracker.lac + 1)
        excluded = frozenset(self.ensemble) | self.replaced_bookies
        return [ChooseBookies(slots, excluded)]

    def _on_bookies_chosen(self, event: BookiesChosen) -> list[WriterEffect]:
        change = self._change
        if change is None or self._update is not None or event.slots != change.slots:
            return []
        bookies = list(self.ensemble)
        for slot, bookie in zip(event.slots, event.bookies, strict=True):
            bookies[slot] = bookie
        change.bookies = tuple(bookies)
        decide = FragmentDecision(self.ledger_id, change.first_entry_id, change.bookies)
        return [self._start_update(decide)]

    def _on_no_bookies(self, error: BKError) -> list[WriterEffect]:
        if self._change is None or self._update is not None:
            return []
        self._change = None
        return self._fail(error)

    def _fail(self, error: BKError) -> list[WriterEffect]:
        """The handle takes no more adds. Its outstanding adds are settled now, or, when
        a fragment write is unanswered or its outcome unknown, once that is known."""
        if self.failure is None:
            self.failure = error
            self._holding = True
        if self._change is not None and self._update is not None:
            return []  # settled once the fragment write's outcome is known (_on_metadata)
        self._change = None
        return self._settle()

    def _settle(self) -> list[WriterEffect]:
        """Confirm what an ack quorum of the recorded write sets holds (recovery keeps it,
        R8), fail the rest."""
        if self._settled or self.failure is None:
            return []
        self._settled = True
        effects: list[WriterEffect] = []
        # A close under way was decided at the LAC: nothing past it is confirmed.
        confirmed = [] if self._updating_close else self._confirm()
        if confirmed:
            effects.append(Confirm(confirmed))
        failed = self.tracker.fail_all()
        if failed:
            effects.append(FailAdds(failed, self.failure))
        effects.append(HandleFailed(self.failure))
        for queue in self._outbox:
            queue.clear()
        return effects + self._next_close()

    # -------------------------------------------------------------- metadata outcomes

    def _on_metadata(self, event: MetadataEvent) -> list[WriterEffect]:
        """The one policy (core/metadata.py) decides what the event means for the update
        under way; this decides what that means for the writer."""
        outcome = self._update_outcome(event)
        if outcome is None:
            return []
        if isinstance(outcome, ReadMetadata):
            return [outcome]
        closing = self._updating_close
        if isinstance(outcome, Retry):
            if closing or self.failure is None:
                return [outcome.effect]
            # A failed handle writes no fragment. It settles as if the write had happened,
            # which is safe whichever it was (see _settle_unresolved).
            self._update = None
            return self._settle_unresolved()
        self._update = None
        self._updating_close = False
        if isinstance(outcome, MetadataStored):
            return self._closed(outcome.view) if closing else self._change_recorded()
        if closing:
            if self.failure is None:
                self.failure = outcome.error
                self._holding = True
            # Adds still tracked were given up by their owner: nothing confirms them now.
            effects: list[WriterEffect] = []
            leftover = self.tracker.fail_all()
            if leftover:
                effects.append(FailAdds(leftover, outcome.error))
            return [*effects, CloseFailed(outcome.error)]
        if self.failure is None:
            self.failure = outcome.error
            self._holding = True
        if isinstance(outcome, Unresolved):
            return self._settle_unresolved()
        # Refused, so not written: the recorded write sets are the old ones, and the
        # tracker's acks were counted against them.
        self._change = None
        return self._settle()

    def _change_recorded(self) -> list[WriterEffect]:
        change = self._change
        self._change = None
        if change is None:
            return []
        self._record_replacements(change)
        if self.failure is not None:
            return self._settle()
        effects: list[WriterEffect] = [SendQueued()]
        if self.failed_slots:
            return effects + self._next_change()  # another bookie failed meanwhile
        self._holding = False
        confirmed = self._confirm()
        if confirmed:
            effects.append(Confirm(confirmed))
        return effects + self._next_close()

    def _record_replacements(self, change: _Change) -> None:
        """The new fragment is recorded: the replacements take their slots, and every
        entry of the fragment that their slot stores is resent to them."""
        for slot in change.slots:
            self.replaced_bookies.add(self.ensemble[slot])
            self.ensemble[slot] = change.bookies[slot]
            self.generation[slot] += 1
            self.failed_slots.discard(slot)
            # The replaced bookie's acks for these entries stop counting: the metadata
            # now says the replacement holds them.
            self._outbox[slot] = self.tracker.replace_bookie(slot, change.first_entry_id)

    def _settle_unresolved(self) -> list[WriterEffect]:
        """The fragment write's outcome stays unknown: count only what is safe under the
        old and the new fragment alike. Under the new one the replacements hold nothing
        yet, so the replaced slots' acks no longer count, as if it had been written."""
        change = self._change
        self._change = None
        if change is not None:
            for slot in change.slots:
                self.tracker.replace_bookie(slot, change.first_entry_id)
        return self._settle()

    # -------------------------------------------------------------- close

    def _on_close_requested(self) -> list[WriterEffect]:
        if self.closed:
            return [Closed(self.view)]
        self.closing = self._close_requested = True
        return self._next_close()

    def _next_close(self) -> list[WriterEffect]:
        """Write the close once no change is under way (R6)."""
        if not self._close_requested or self.closed or self._update is not None:
            return []
        if self._change is not None:
            return []  # after the change: _change_recorded or _settle come back here
        if self.failure is not None and not self._settled:
            return []
        decide = CloseDecision(self.ledger_id, self.tracker.lac, self.confirmed_length_bytes)
        self._updating_close = True
        # The close is decided at this LAC: from here on nothing more is confirmed (an
        # add its owner gave up on may still be acknowledged during the close's
        # compare-and-set, and would lie past the closed end, R4, R6).
        self._holding = True
        return [self._start_update(decide)]

    def _closed(self, view: LedgerView) -> list[WriterEffect]:
        self.closed = True
        self._holding = True
        effects: list[WriterEffect] = []
        # Adds still tracked were given up by their owner (a cancelled future): they
        # lie past the last entry now, so they can never be confirmed.
        leftover = self.tracker.fail_all()
        for queue in self._outbox:
            queue.clear()
        if leftover:
            effects.append(
                FailAdds(leftover, LedgerClosedError(f"ledger {self.ledger_id}: closed"))
            )
        effects.append(Closed(view))
        return effects
