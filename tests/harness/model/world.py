"""The small world the model checker drives the real core through.

One ledger, one writer (``core/writer.py``'s :class:`LedgerWriter` and the part of
the ledger handle that carries out its effects), at most one recovery
(``core/recovery.py``'s :class:`LedgerRecoveryMachine`, started at any point), a few
bookies, a network that holds every message in flight, and a metadata store that is
one linearizable versioned value. A :class:`World` is one state of all that; its
:meth:`World.actions` are every step the world can take next, each a label (what
happened, in words) and a function that makes the next world. The explorer
(``explore.py``) runs through them all; :func:`replay` plays one list of labels.

What the world does, step by step:

- Bookies store entries per entry id (one ledger), keep a fenced flag, and may crash
  (a crashed bookie keeps what it stored and its fence, and answers nothing: every
  request to it times out). A normal add to a fenced bookie answers FENCED; a
  recovery add is stored fenced or not; a fence answers OK with the largest LAC
  piggybacked on the entries the bookie holds; a fencing recovery read fences and
  answers the entry or NO_SUCH_ENTRY.
- The network holds every request not yet delivered and every answer held back. A
  bookie acts when a request is delivered, and its answer comes back at once, is held
  back (a later step delivers it; ``delays`` budget), or is lost (its sender times
  out, ``Status.IO_ERROR``; ``drops``). A request may be dropped before it arrives
  (``drops``). With ``reorders=None`` any message may be delivered next; with a
  number, the oldest goes first unless a reorder is spent. A crash happens the moment
  a request reaches a bookie about to crash (the request then times out): crashing at
  any other time is the same, as long as no message reaches the bookie meanwhile.
- The metadata store runs an update as the client's read-decide-compare-and-set loop
  does (``LedgerManager.update`` with ``known=`` the metadata the client holds): the
  decision is made on what the client holds; Settled or Refused end it there; a
  change is written by a compare-and-set, and on a version conflict the store is read
  and the decision made again. The whole loop happens in one step, and its reply
  comes at once, is held back, or is lost (MetadataUnknown) after the write or before
  it (``metadata_losses``). A read is made in one step, and its answer may be held
  back too, so a read may be older than a write made before it is answered.
- The owner of the writer adds entries, may give up one add (a cancelled future: the
  core still tracks it), and closes the handle at any point: it stops adding, waits
  for the adds not given up to be confirmed or failed, then asks the core to close.
- Replacement bookies are chosen among the spares the chooser is not told to avoid;
  spares no one has chosen yet are interchangeable, so only the first of them is
  offered (symmetry reduction).

Everything the state machines see goes through their public events and effects, as
``client/writing.py`` and ``client/recovery.py`` carry them out.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from functools import cache
from itertools import permutations
from typing import Any, NamedTuple

from quorumlog.core.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    CloseAt,
    Decision,
    LedgerView,
    MarkInRecovery,
    MetadataEvent,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    NewFragment,
    ReadMetadata,
    Refused,
    Settled,
    UpdateMetadata,
)
from quorumlog.core.recovery import (
    EntryRead,
    EntryRewritten,
    FenceAnswered,
    LedgerRecoveryMachine,
    LengthRead,
    ReadLength,
    Recovered,
    RecoveryEffect,
    RecoveryEvent,
    RecoveryFailed,
    SendFence,
    SendRecoveryRead,
    SendRewrite,
)
from quorumlog.core.writer import (
    AddFailed,
    BookiesChosen,
    ChooseBookies,
    Closed,
    CloseFailed,
    CloseRequested,
    Confirm,
    FailAdds,
    HandleFailed,
    LedgerWriter,
    NoBookies,
    SendQueued,
    WriterEffect,
    WriterEvent,
)
from quorumlog.errors import MetadataError, NotEnoughBookiesError, Status
from quorumlog.proto.entry import ENTRY_HEADER
from tests.harness.model.encoding import freeze, restore, snapshot

LEDGER = 1
WRITER = "writer"
RECOVERY = "recovery"
ENSEMBLE_NAMES = ("A", "B", "C")


@dataclass(frozen=True)
class WorldConfig:
    """The size of the world, and what may go wrong in it (each fault a budget)."""

    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    entries: int = 2  # adds the owner makes, at most
    spares: int = 1  # bookies outside the ensemble, for replacements
    bookie_failures: int = 1  # bookies that may crash
    drops: int = 1  # messages that may be lost (a timeout to their sender)
    metadata_losses: int = 1  # metadata updates whose outcome is lost (unknown)
    read_failures: int = 0  # metadata reads that fail
    recovery: bool = True  # a recovery may start, at any point
    close: bool = True  # the owner may close the handle, at any point
    cancels: int = 0  # adds the owner may give up (still tracked by the core)
    delays: int = 0  # replies (bookies' and the store's) that may be held back
    # Messages delivered before an older one still in flight; None: any order at all.
    reorders: int | None = 1
    # Whether the writer and the recovery may choose the same spare (False narrows the
    # world: a placement that never hands one bookie to two clients).
    shared_spares: bool = True
    dead_at_start: tuple[str, ...] = ()  # bookies crashed before anything happens
    # Settings of the state machines (the client's config names them).
    rewrite_attempts: int = 1  # recovery_add_attempts
    reads_in_flight: int = 1  # recovery_reads_in_flight
    metadata_attempts: int = 3  # metadata_cas_retries
    recovery_changes: int | None = None  # the recovery's ensemble changes (None: E)

    def __post_init__(self) -> None:
        if not 1 <= self.ensemble_size <= len(ENSEMBLE_NAMES):
            raise ValueError(f"ensemble_size must be 1..{len(ENSEMBLE_NAMES)}")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise ValueError("need ensemble_size >= write_quorum >= ack_quorum >= 1 (R1)")
        unknown = set(self.dead_at_start) - set(self.bookie_names)
        if unknown:
            raise ValueError(f"dead_at_start names no bookie of the world: {sorted(unknown)}")

    @property
    def ensemble(self) -> tuple[str, ...]:
        return ENSEMBLE_NAMES[: self.ensemble_size]

    @property
    def spare_names(self) -> tuple[str, ...]:
        return _spare_names(self.spares)

    @property
    def bookie_names(self) -> tuple[str, ...]:
        return self.ensemble + self.spare_names

    def describe(self) -> str:
        """The parameters that differ from the defaults, as ``name=value``."""
        default = WorldConfig()
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        shape = f"E={self.ensemble_size} Qw={self.write_quorum} Qa={self.ack_quorum}"
        rest = [c for c in changed if c.split("=")[0] not in _SHAPE_FIELDS]
        return " ".join([shape, *rest])


_SHAPE_FIELDS = {"ensemble_size", "write_quorum", "ack_quorum"}


@cache
def _spare_names(count: int) -> tuple[str, ...]:
    return tuple(f"X{i + 1}" for i in range(count))


class ModelError(Exception):
    """The world was asked for something it does not model (a bad trace label)."""


# ------------------------------------------------------------------ entries


def entry_blob(entry_id: int, lac: int) -> bytes:
    """Entry ``entry_id`` as the writer encodes it: the header carries the LAC when it
    was added (piggybacked, R4) and the ledger length up to it (4 bytes an entry)."""
    return ENTRY_HEADER.pack(LEDGER, entry_id, lac, 4 * (entry_id + 1)) + b"e%03d" % entry_id


def blob_lac(blob: bytes) -> int:
    return int(ENTRY_HEADER.unpack_from(blob)[2])


def blob_length(blob: bytes) -> int:
    return int(ENTRY_HEADER.unpack_from(blob)[3])


# ------------------------------------------------------------------ bookies and messages


class Bookie(NamedTuple):
    """What one bookie holds for the ledger."""

    entries: tuple[tuple[int, bytes], ...] = ()  # (entry id, blob), by entry id
    fenced: bool = False
    alive: bool = True
    conflicts: tuple[int, ...] = ()  # entry ids it was sent two different values for

    def blob(self, entry_id: int) -> bytes | None:
        for stored_id, blob in self.entries:
            if stored_id == entry_id:
                return blob
        return None

    def store(self, items: Iterable[tuple[int, bytes]]) -> Bookie:
        entries = dict(self.entries)
        conflicts = set(self.conflicts)
        for entry_id, blob in items:
            held = entries.get(entry_id)
            if held is not None and held != blob:
                conflicts.add(entry_id)
            entries[entry_id] = blob
        return self._replace(
            entries=tuple(sorted(entries.items())), conflicts=tuple(sorted(conflicts))
        )

    @property
    def lac(self) -> int:
        """The largest LAC piggybacked on the entries it holds (-1: none)."""
        return max((blob_lac(blob) for _, blob in self.entries), default=-1)


class Kind(enum.IntEnum):
    """Message kinds: a request, then its answer."""

    ADD = 0
    ADD_ANSWER = 1
    FENCE = 2
    FENCE_ANSWER = 3
    READ = 4
    READ_ANSWER = 5
    REWRITE = 6
    REWRITE_ANSWER = 7


_REQUESTS = (Kind.ADD, Kind.FENCE, Kind.READ, Kind.REWRITE)


class Message(NamedTuple):
    """A request to a bookie or its answer. Adds are the writer's (``generation`` is the
    slot's generation when it was sent); the others are the recovery's."""

    kind: Kind
    bookie: str
    slot: int
    entry_ids: tuple[int, ...] = ()
    generation: int = 0
    status: int = Status.OK
    lac: int = -1
    blob: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.kind in _REQUESTS

    def label(self) -> str:
        ids = ",".join(map(str, self.entry_ids))
        where = f"slot {self.slot}" + (f" gen {self.generation}" if self.kind <= 1 else "")
        status = "" if self.is_request else Status(self.status).name + " "
        if self.kind == Kind.ADD:
            return f"add [{ids}] -> {self.bookie} ({where})"
        if self.kind == Kind.ADD_ANSWER:
            return f"add {status}[{ids}] <- {self.bookie} ({where})"
        if self.kind == Kind.FENCE:
            return f"fence -> {self.bookie} ({where})"
        if self.kind == Kind.FENCE_ANSWER:
            return f"fence {status}lac {self.lac} <- {self.bookie} ({where})"
        if self.kind == Kind.READ:
            return f"read {ids} -> {self.bookie} ({where})"
        if self.kind == Kind.READ_ANSWER:
            return f"read {status}{ids} <- {self.bookie} ({where})"
        if self.kind == Kind.REWRITE:
            return f"rewrite {ids} -> {self.bookie} ({where})"
        return f"rewrite {status}{ids} <- {self.bookie} ({where})"


# ------------------------------------------------------------------ metadata


def apply_decision(
    view: LedgerView, decision: NewFragment | MarkInRecovery | CloseAt
) -> LedgerView:
    """The metadata a change writes, as ``client/metadata_updates.apply_decision`` and
    ``LedgerMetadata.with_new_fragment`` make it (a fragment that starts at the same
    entry is replaced)."""
    if isinstance(decision, NewFragment):
        first = decision.first_entry_id
        kept = tuple((f, b) for f, b in view.ensembles if f < first)
        return LedgerView(view.state, view.last_entry_id, (*kept, (first, decision.bookies)))
    if isinstance(decision, CloseAt):
        return LedgerView(CLOSED, decision.last_entry_id, view.ensembles)
    return LedgerView(IN_RECOVERY, view.last_entry_id, view.ensembles)


class UpdateOutcome(NamedTuple):
    """One way a metadata update can end: the store after it, the reply to its caller,
    the metadata the caller then holds (None: unchanged), and whether it lost a reply."""

    label: str
    store: LedgerView
    version: int
    reply: MetadataEvent
    adopt: tuple[LedgerView, int] | None
    lost: bool


def update_outcomes(
    decide: Callable[[LedgerView], Decision],
    known: tuple[LedgerView, int],
    store: tuple[LedgerView, int],
) -> list[UpdateOutcome]:
    """Every way ``LedgerManager.update(decide, known=known)`` can end on ``store``."""
    view, version = store
    base, base_version = known
    decision = decide(base)
    conflict = False
    if not isinstance(decision, Settled | Refused) and base_version != version:
        conflict = True  # the compare-and-set fails: read, and decide again
        base, base_version = view, version
        decision = decide(base)
    lost = MetadataUnknown(MetadataError("connection lost"))
    outcomes: list[UpdateOutcome] = []
    if conflict:
        outcomes.append(
            UpdateOutcome("conflict, then the read is lost", view, version, lost, None, True)
        )
    if isinstance(decision, Settled):
        outcomes.append(
            UpdateOutcome(
                "settled", view, version, MetadataStored(base), (base, base_version), False
            )
        )
        return outcomes
    if isinstance(decision, Refused):
        outcomes.append(
            UpdateOutcome("refused", view, version, MetadataRefused(decision.error), None, False)
        )
        return outcomes
    written = apply_decision(base, decision)
    what = _decision_text(decision)
    outcomes += [
        UpdateOutcome(
            f"writes {what}",
            written,
            version + 1,
            MetadataStored(written),
            (written, version + 1),
            False,
        ),
        UpdateOutcome(f"writes {what}, reply lost", written, version + 1, lost, None, True),
        UpdateOutcome(f"would write {what}, lost before it", view, version, lost, None, True),
    ]
    return outcomes


def _decision_text(decision: Decision) -> str:
    if isinstance(decision, NewFragment):
        return f"fragment {decision.first_entry_id}: {','.join(decision.bookies)}"
    if isinstance(decision, CloseAt):
        return f"CLOSED at {decision.last_entry_id}"
    return type(decision).__name__


def view_text(view: LedgerView) -> str:
    fragments = " ".join(f"{first}:{','.join(b)}" for first, b in view.ensembles)
    last = f" last {view.last_entry_id}" if view.state == CLOSED else ""
    return f"{view.state}{last} [{fragments}]"


def event_text(event: object) -> str:
    if isinstance(event, MetadataStored | MetadataRead):
        return f"{type(event).__name__}({view_text(event.view)})"
    if isinstance(event, MetadataRefused | MetadataUnknown | MetadataReadFailed):
        return f"{type(event).__name__}({type(event.error).__name__})"
    return type(event).__name__


# ------------------------------------------------------------------ the world


class Budget(NamedTuple):
    """What may still go wrong, or be held back."""

    drops: int
    crashes: int
    losses: int
    read_failures: int
    cancels: int
    delays: int
    reorders: int

    def spend(self, name: str) -> Budget:
        return self._replace(**{name: getattr(self, name) - 1})


class Pending(NamedTuple):
    """The metadata operation an actor's client has under way: an update to run, a
    read to make, or the reply of either, held back on its way."""

    what: str  # "update", "read", "reply"
    update: UpdateMetadata | None = None
    reply: MetadataEvent | None = None
    adopt: tuple[LedgerView, int] | None = None


Action = tuple[str, Callable[["World"], "World"]]


class World:
    """One state of the whole world. A world is not changed once built: a step copies
    what it changes (the state machines through :func:`snapshot` and :func:`restore`;
    everything else is immutable and shared)."""

    __slots__ = (
        "_index",
        "_key",
        "_own_recovery",
        "_own_writer",
        "_recovery_state",
        "_writer_state",
        "bag",
        "blobs",
        "bookies",
        "budget",
        "cancelled",
        "cfg",
        "claims",
        "close_outcome",
        "close_phase",
        "confirmed",
        "errors",
        "failed",
        "finished_at",
        "lac_max",
        "r_choose",
        "r_known",
        "r_length",
        "r_md",
        "r_outcome",
        "recovery",
        "store",
        "touched",
        "w_choose",
        "w_known",
        "w_md",
        "writer",
    )

    cfg: WorldConfig
    bookies: tuple[Bookie, ...]
    bag: tuple[Message, ...]  # requests not delivered yet, answers held back
    store: tuple[LedgerView, int]  # the metadata and its version
    blobs: tuple[bytes, ...]  # by entry id: what the writer added
    writer: LedgerWriter
    w_known: tuple[LedgerView, int]  # the metadata the writer's client holds
    w_md: Pending | None
    w_choose: ChooseBookies | None
    confirmed: tuple[int, ...]  # Confirm effects, in the order they came
    failed: frozenset[int]  # FailAdds
    cancelled: frozenset[int]  # adds the owner gave up
    close_phase: int  # 0: open, 1: closing (no more adds), 2: the core was asked to close
    close_outcome: str  # "", "closed", "failed"
    finished_at: int  # confirmations when the handle failed or closed (-1: not yet)
    lac_max: int  # the largest LAC the writer had
    recovery: LedgerRecoveryMachine | None
    r_known: tuple[LedgerView, int] | None
    r_md: Pending | None
    r_choose: ChooseBookies | None
    r_length: ReadLength | None
    r_outcome: str  # "", "recovered", "failed"
    budget: Budget
    touched: frozenset[str]  # spares chosen or crashed (no longer interchangeable)
    claims: frozenset[tuple[str, str]]  # (actor, spare): who chose which spare
    errors: tuple[str, ...]  # effects the world could not carry out as the client would
    _index: dict[str, int]  # where each bookie is in ``bookies``
    _key: tuple[Any, ...] | None
    _writer_state: bytes | None  # snapshot of ``writer`` (None: not taken yet)
    _recovery_state: bytes | None
    _own_writer: bool
    _own_recovery: bool

    @classmethod
    def initial(cls, cfg: WorldConfig) -> World:
        w = cls.__new__(cls)
        w.cfg = cfg
        dead = set(cfg.dead_at_start)
        w.bookies = tuple(Bookie(alive=name not in dead) for name in cfg.bookie_names)
        w._index = {name: i for i, name in enumerate(cfg.bookie_names)}
        w.bag = ()
        view = LedgerView(OPEN, -1, ((0, cfg.ensemble),))
        w.store = (view, 0)
        w.blobs = ()
        w.writer = LedgerWriter(
            LEDGER,
            cfg.ensemble_size,
            cfg.write_quorum,
            cfg.ack_quorum,
            view,
            metadata_attempts=cfg.metadata_attempts,
        )
        w.w_known = (view, 0)
        w.w_md = None
        w.w_choose = None
        w.confirmed = ()
        w.failed = frozenset()
        w.cancelled = frozenset()
        w.close_phase = 0
        w.close_outcome = ""
        w.finished_at = -1
        w.lac_max = -1
        w.recovery = None
        w.r_known = None
        w.r_md = None
        w.r_choose = None
        w.r_length = None
        w.r_outcome = ""
        w.budget = Budget(
            cfg.drops,
            cfg.bookie_failures,
            cfg.metadata_losses,
            cfg.read_failures,
            cfg.cancels,
            cfg.delays,
            cfg.reorders or 0,
        )
        w.touched = frozenset(n for n in cfg.spare_names if n in dead)
        w.claims = frozenset()
        w.errors = ()
        w._key = w._writer_state = w._recovery_state = None
        w._own_writer = w._own_recovery = True
        return w

    # -------------------------------------------------------------- copies and keys

    def _clone(self) -> World:
        w = World.__new__(World)
        for name in World.__slots__:
            setattr(w, name, getattr(self, name))
        w._key = None
        w._own_writer = w._own_recovery = False
        return w

    def _writer(self) -> LedgerWriter:
        """The writer, to change: copied first if another world shares it."""
        if not self._own_writer:
            self.writer = restore(self._writer_state or snapshot(self.writer))
            self._own_writer = True
        self._writer_state = None
        return self.writer

    def _recovery(self) -> LedgerRecoveryMachine:
        assert self.recovery is not None
        if not self._own_recovery:
            self.recovery = restore(self._recovery_state or snapshot(self.recovery))
            self._own_recovery = True
        self._recovery_state = None
        return self.recovery

    def key(self) -> tuple[Any, ...]:
        """A canonical, hashable encoding of the whole state, the state machines' fields
        included (read generically: a field added to them is part of the state too).
        Where worlds share a state machine they share its encoding."""
        if self._key is None:
            if self._writer_state is None:
                self._writer_state = snapshot(self.writer)
            if self._recovery_state is None and self.recovery is not None:
                self._recovery_state = snapshot(self.recovery)
            self._key = (
                self.bookies,
                self.bag,
                self.store,
                self.blobs,
                self._writer_state,
                self.w_known,
                freeze(self.w_md),
                freeze(self.w_choose),
                self.confirmed,
                self.failed,
                self.cancelled,
                self.close_phase,
                self.close_outcome,
                self.finished_at,
                self.lac_max,
                self._recovery_state,
                self.r_known,
                freeze(self.r_md),
                freeze(self.r_choose),
                freeze(self.r_length),
                self.r_outcome,
                self.budget,
                self.touched,
                self.claims,
                self.errors,
            )
        return self._key

    # -------------------------------------------------------------- looking

    def bookie(self, name: str) -> Bookie:
        return self.bookies[self._index[name]]

    def _set_bookie(self, name: str, bookie: Bookie) -> None:
        index = self._index[name]
        self.bookies = (*self.bookies[:index], bookie, *self.bookies[index + 1 :])

    @property
    def view(self) -> LedgerView:
        """The ledger metadata the store holds now."""
        return self.store[0]

    @property
    def recovery_started(self) -> bool:
        return self.recovery is not None

    def summary(self) -> str:
        """A few lines on the state: metadata, bookies, writer, recovery, in flight."""
        lines = [f"metadata v{self.store[1]}: {view_text(self.view)}"]
        for name, b in zip(self.cfg.bookie_names, self.bookies, strict=True):
            flags = ("" if b.alive else " crashed") + (" fenced" if b.fenced else "")
            held = ",".join(str(e) for e, _ in b.entries) or "-"
            lines.append(f"bookie {name}: entries {held}{flags}")
        writer = self.writer
        lines.append(
            f"writer: lac {writer.lac}, confirmed {list(self.confirmed)}, failed "
            f"{sorted(self.failed)}, ensemble {','.join(writer.ensemble)}"
            + (f", failure {type(writer.failure).__name__}" if writer.failure else "")
            + (f", close {self.close_outcome}" if self.close_outcome else "")
        )
        if self.recovery is not None:
            phase = getattr(self.recovery.phase, "value", self.recovery.phase)
            lines.append(
                f"recovery: phase {phase}, last entry found {self.recovery.last_entry_id}"
                + (f", {self.r_outcome}" if self.r_outcome else "")
            )
        if self.bag:
            lines.append("in flight: " + "; ".join(m.label() for m in self.bag))
        return "\n".join(lines)

    # -------------------------------------------------------------- what can happen next

    def actions(self) -> list[Action]:
        """Every step the world can take from here: (label, make the next world)."""
        cfg = self.cfg
        budget = self.budget
        acts: list[Action] = []
        writer = self.writer
        # The writer's owner.
        if self.close_phase == 0 and len(self.blobs) < cfg.entries and writer.refusal() is None:
            acts.append((f"writer adds entry {len(self.blobs)}", World._add))
        # The network: deliveries (in any order, or the oldest message first unless a
        # reorder is spent), drops and crashes (at any time).
        seen: set[Message] = set()
        oldest = self.bag[0] if self.bag else None
        for message in self.bag:
            if message in seen:
                continue
            seen.add(message)
            label = message.label()
            late = cfg.reorders is not None and message != oldest
            arrives = f"deliver {label}" + (", out of order" if late else "")
            deliver = not late or budget.reorders > 0
            if deliver:
                acts.append((arrives, _bind(World._deliver, message, "", late)))
            if not message.is_request:
                if budget.drops:
                    acts.append((f"drop {label}", _bind(World._drop, message)))
                continue
            if not self.bookie(message.bookie).alive:
                continue  # it times out: nothing else can become of it
            if deliver and budget.delays:
                held = _bind(World._deliver, message, "held", late)
                acts.append((f"{arrives}, answer held back", held))
            if deliver and budget.drops:
                lost = _bind(World._deliver, message, "lost", late)
                acts.append((f"{arrives}, answer lost", lost))
            if budget.drops:
                acts.append((f"drop {label}", _bind(World._drop, message)))
            if budget.crashes:
                acts.append(
                    (f"crash {message.bookie}: {label} times out", _bind(World._crash, message))
                )
        # The metadata store and the chooser, for each actor.
        for actor in (WRITER, RECOVERY):
            pending = self.w_md if actor == WRITER else self.r_md
            if pending is not None:
                acts += self._metadata_actions(actor, pending)
            choose = self.w_choose if actor == WRITER else self.r_choose
            if choose is not None:
                acts += self._choose_actions(actor, choose)
        if self.r_length is not None:
            label = f"recovery reads the length of entry {self.r_length.entry_id}"
            acts.append((label, World._length))
        # The owner's other choices, and the recovery's start. (The order of the steps
        # is the order the search tries them in: the writer's progress first.)
        if budget.cancels and cfg.close and self.close_phase < 2:
            for p in writer.tracker.outstanding():
                if p.entry_id not in self.cancelled:
                    acts.append(
                        (f"owner gives up entry {p.entry_id}", _bind(World._cancel, p.entry_id))
                    )
        if cfg.close and self.close_phase == 0:
            acts.append(("writer closes", World._begin_close))
        if self.close_phase == 1 and self._close_may_go():
            acts.append(("writer asks the core to close", World._close_requested))
        if cfg.recovery and self.recovery is None:
            acts.append(("recovery starts", World._start_recovery))
        return acts

    def _close_may_go(self) -> bool:
        """close() waits for every add it did not give up on."""
        return all(p.entry_id in self.cancelled for p in self.writer.tracker.outstanding())

    def _metadata_actions(self, actor: str, pending: Pending) -> list[Action]:
        budget = self.budget
        acts: list[Action] = []
        if pending.what == "update":
            assert pending.update is not None
            known = self.w_known if actor == WRITER else self.r_known
            assert known is not None
            for outcome in update_outcomes(pending.update.decide, known, self.store):
                if outcome.lost and not budget.losses:
                    continue
                label = f"metadata: {actor}'s update {outcome.label}"
                acts.append((label, _bind(World._updated, actor, outcome, False)))
                if budget.delays:
                    acts.append(
                        (f"{label}, reply held back", _bind(World._updated, actor, outcome, True))
                    )
        elif pending.what == "read":
            label = f"metadata: {actor} reads"
            acts.append((label, _bind(World._read, actor, False, False)))
            if budget.delays:
                acts.append((f"{label}, reply held back", _bind(World._read, actor, False, True)))
            if budget.read_failures:
                label = f"metadata: {actor}'s read fails"
                acts.append((label, _bind(World._read, actor, True, False)))
        else:
            assert pending.reply is not None
            label = f"metadata: reply to {actor}: {event_text(pending.reply)}"
            acts.append((label, _bind(World._metadata_reply, actor)))
        return acts

    def _choose_actions(self, actor: str, choose: ChooseBookies) -> list[Action]:
        other = RECOVERY if actor == WRITER else WRITER
        usable = [
            n
            for n in self.cfg.spare_names
            if n not in choose.excluded
            and self.bookie(n).alive
            and (self.cfg.shared_spares or (other, n) not in self.claims)
        ]
        fresh = [n for n in usable if n not in self.touched]
        need = len(choose.slots)
        # Spares no one chose are interchangeable: offer them in one order only.
        candidates = [n for n in usable if n in self.touched] + fresh[:need]
        acts: list[Action] = []
        slots = ",".join(map(str, choose.slots))
        for chosen in permutations(candidates, need):
            order = [c for c in chosen if c in fresh]
            if order != sorted(order, key=fresh.index):
                continue
            acts.append(
                (
                    f"choose {','.join(chosen)} for {actor}'s slot {slots}",
                    _bind(World._chosen, actor, tuple(chosen)),
                )
            )
        if not acts:
            acts.append((f"no bookies for {actor}", _bind(World._chosen, actor, ())))
        return acts

    # -------------------------------------------------------------- the writer's owner

    def _add(self) -> World:
        w = self._clone()
        writer = w._writer()
        entry_id = writer.tracker.next_entry_id
        blob = entry_blob(entry_id, writer.lac)
        w.blobs = (*w.blobs, blob)
        writer.add(blob, None)
        w._flush()
        return w

    def _cancel(self, entry_id: int) -> World:
        w = self._clone()
        w.budget = w.budget.spend("cancels")
        w.cancelled = w.cancelled | {entry_id}
        return w

    def _begin_close(self) -> World:
        w = self._clone()
        if w.w_known[0].state == CLOSED:
            # LedgerHandle.close() returns at once when the metadata it holds is closed
            # (the core is not asked: what it still confirms is checked as before).
            w.close_phase = 2
            w.close_outcome = "closed"
            return w
        w._writer().begin_close()
        w.close_phase = 1
        if w._close_may_go():  # nothing to wait for: the close goes at once
            w._close_requested_now()
        return w

    def _close_requested(self) -> World:
        w = self._clone()
        w._close_requested_now()
        return w

    def _close_requested_now(self) -> None:
        self.close_phase = 2
        self._writer_step(CloseRequested())

    # -------------------------------------------------------------- the recovery

    def _start_recovery(self) -> World:
        """The recovering client reads the metadata and starts the machine on it."""
        w = self._clone()
        cfg = w.cfg
        view, version = w.store
        w.recovery = LedgerRecoveryMachine(
            LEDGER,
            cfg.ensemble_size,
            cfg.write_quorum,
            cfg.ack_quorum,
            view,
            reads_in_flight=cfg.reads_in_flight,
            rewrite_attempts=cfg.rewrite_attempts,
            metadata_attempts=cfg.metadata_attempts,
            ensemble_changes=cfg.recovery_changes,
        )
        w._own_recovery = True
        w._recovery_state = None
        w.r_known = (view, version)
        w._recovery_effects(w.recovery.start())
        return w

    def _length(self) -> World:
        """ReadLength: the first bookie named that is up and holds the entry answers."""
        w = self._clone()
        effect = w.r_length
        assert effect is not None
        w.r_length = None
        length: int | None = None
        for name in effect.bookies:
            bookie = w.bookie(name)
            blob = bookie.blob(effect.entry_id) if bookie.alive else None
            if blob is not None:
                length = blob_length(blob)
                break
        w._recovery_step(LengthRead(length))
        return w

    # -------------------------------------------------------------- the network

    def _send(self, messages: Iterable[Message]) -> None:
        if self.cfg.reorders is None:
            self.bag = tuple(sorted((*self.bag, *messages)))  # any order: a set, really
        else:
            self.bag = (*self.bag, *messages)  # in the order sent

    def _take(self, message: Message) -> None:
        bag = list(self.bag)
        bag.remove(message)
        self.bag = tuple(bag)

    def _deliver(self, message: Message, answer: str, late: bool) -> World:
        """A message arrives (``late``: before an older one). A request's answer comes
        back at once, is ``held`` back in the bag, or is ``lost`` (its sender times
        out)."""
        w = self._clone()
        if late:
            w.budget = w.budget.spend("reorders")
        w._take(message)
        if not message.is_request:
            w._answer(message)
            return w
        reply = w._at_bookie(message)
        if answer == "held" and reply.status != Status.IO_ERROR:
            w.budget = w.budget.spend("delays")
            w._send([reply])
        elif answer == "lost":
            w.budget = w.budget.spend("drops")
            w._timed_out(message)
        else:
            w._answer(reply)
        return w

    def _drop(self, message: Message) -> World:
        w = self._clone()
        w.budget = w.budget.spend("drops")
        w._take(message)
        w._timed_out(message)
        return w

    def _crash(self, message: Message) -> World:
        w = self._clone()
        w.budget = w.budget.spend("crashes")
        w._set_bookie(message.bookie, w.bookie(message.bookie)._replace(alive=False))
        if message.bookie in w.cfg.spare_names:
            w.touched = w.touched | {message.bookie}
        w._take(message)
        w._timed_out(message)
        return w

    def _at_bookie(self, message: Message) -> Message:
        """The bookie acts on a request; returns its answer (a timeout if it crashed)."""
        bookie = self.bookie(message.bookie)
        answer = message._replace(kind=Kind(message.kind + 1), blob=b"")
        if not bookie.alive:
            return answer._replace(status=Status.IO_ERROR)
        if message.kind == Kind.ADD:
            if bookie.fenced:
                answer = answer._replace(status=Status.FENCED)
            else:
                bookie = bookie.store((e, self.blobs[e]) for e in message.entry_ids)
        elif message.kind == Kind.FENCE:
            bookie = bookie._replace(fenced=True)
            answer = answer._replace(lac=bookie.lac)
        elif message.kind == Kind.READ:
            bookie = bookie._replace(fenced=True)  # recovery reads fence too (R8)
            blob = bookie.blob(message.entry_ids[0])
            if blob is None:
                answer = answer._replace(status=Status.NO_SUCH_ENTRY)
            else:
                answer = answer._replace(blob=blob)
        else:  # a recovery add: stored whether fenced or not
            bookie = bookie.store([(message.entry_ids[0], message.blob)])
        self._set_bookie(message.bookie, bookie)
        return answer

    def _timed_out(self, message: Message) -> None:
        """The sender of ``message`` (or of the request it answers) sees a timeout."""
        kind = Kind(message.kind | 1)
        self._answer(message._replace(kind=kind, status=Status.IO_ERROR, blob=b""))

    def _answer(self, answer: Message) -> None:
        """An answer reaches its client, which feeds it to its state machine as
        ``client/writing.py`` and ``client/recovery.py`` do."""
        kind, slot = answer.kind, answer.slot
        if kind == Kind.ADD_ANSWER:
            if answer.status == Status.OK:
                writer = self._writer()
                confirmed = writer.ack(slot, answer.generation, answer.entry_ids)
                if confirmed:
                    self._writer_effects([Confirm(list(confirmed))])
                self._note_lac()
                return
            writer = self.writer
            if answer.generation != writer.generation[slot] or writer.failure is not None:
                return  # the handle drops it: a late answer from a replaced bookie
            self._writer_step(AddFailed(slot, answer.generation, answer.status, "model"))
            return
        event: RecoveryEvent
        if kind == Kind.FENCE_ANSWER:
            event = FenceAnswered(slot, answer.status, answer.lac)
        elif kind == Kind.READ_ANSWER:
            entry_id = answer.entry_ids[0]
            length = blob_length(answer.blob) if answer.blob else 0
            event = EntryRead(entry_id, slot, answer.status, answer.blob, length)
        else:
            event = EntryRewritten(answer.entry_ids[0], slot, answer.status, bookie=answer.bookie)
        self._recovery_step(event)

    # -------------------------------------------------------------- metadata and chooser

    def _updated(self, actor: str, outcome: UpdateOutcome, held: bool) -> World:
        w = self._clone()
        if outcome.lost:
            w.budget = w.budget.spend("losses")
        w.store = (outcome.store, outcome.version)
        w._reply(actor, Pending("reply", reply=outcome.reply, adopt=outcome.adopt), held)
        return w

    def _read(self, actor: str, fails: bool, held: bool) -> World:
        w = self._clone()
        if fails:
            w.budget = w.budget.spend("read_failures")
            reply = Pending("reply", reply=MetadataReadFailed(MetadataError("down")))
        else:
            reply = Pending("reply", reply=MetadataRead(w.store[0]), adopt=w.store)
        w._reply(actor, reply, held)
        return w

    def _metadata_reply(self, actor: str) -> World:
        w = self._clone()
        pending = w.w_md if actor == WRITER else w.r_md
        assert pending is not None
        w._reply(actor, pending, False)
        return w

    def _reply(self, actor: str, reply: Pending, held: bool) -> None:
        """The client gets ``reply`` (adopting the metadata it carries), or it is held."""
        if held:
            self.budget = self.budget.spend("delays")
            self._set_pending(actor, reply)
            return
        self._set_pending(actor, None)
        assert reply.reply is not None
        if actor == WRITER:
            if reply.adopt is not None:
                self.w_known = reply.adopt
            self._writer_step(reply.reply)
        else:
            if reply.adopt is not None:
                self.r_known = reply.adopt
            self._recovery_step(reply.reply)

    def _set_pending(self, actor: str, pending: Pending | None) -> None:
        if actor == WRITER:
            self.w_md = pending
        else:
            self.r_md = pending

    def _chosen(self, actor: str, bookies: tuple[str, ...]) -> World:
        w = self._clone()
        choose = w.w_choose if actor == WRITER else w.r_choose
        assert choose is not None
        event: BookiesChosen | NoBookies
        if bookies:
            event = BookiesChosen(choose.slots, bookies)
            w.touched = w.touched | set(bookies)
            w.claims = w.claims | {(actor, b) for b in bookies}
        else:
            event = NoBookies(NotEnoughBookiesError("no spare bookie left"))
        if actor == WRITER:
            w.w_choose = None
            w._writer_step(event)
        else:
            w.r_choose = None
            w._recovery_step(event)
        return w

    # -------------------------------------------------------------- effects

    def _writer_step(self, event: WriterEvent) -> None:
        self._writer_effects(self._writer().step(event))
        self._note_lac()

    def _note_lac(self) -> None:
        self.lac_max = max(self.lac_max, self.writer.lac)

    def _flush(self) -> None:
        writer = self._writer()
        self._send(
            Message(
                Kind.ADD, writer.ensemble[slot], slot, tuple(p.entry_id for p in queue), generation
            )
            for slot, generation, queue in writer.take_sends()
        )

    def _writer_effects(self, effects: list[WriterEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Confirm):
                self.confirmed = (*self.confirmed, *(p.entry_id for p in effect.entries))
            elif isinstance(effect, FailAdds):
                self.failed = self.failed | {p.entry_id for p in effect.entries}
            elif isinstance(effect, HandleFailed):
                self._finish()
            elif isinstance(effect, SendQueued):
                self._flush()
            elif isinstance(effect, ChooseBookies):
                if self.w_choose is not None:
                    self._error("the writer chose bookies twice at once")
                self.w_choose = effect
            elif isinstance(effect, UpdateMetadata):
                if self.w_md is not None:
                    self._error("the writer ran two metadata operations at once")
                self.w_md = Pending("update", effect)
            elif isinstance(effect, ReadMetadata):
                if self.w_md is not None:
                    self._error("the writer ran two metadata operations at once")
                self.w_md = Pending("read")
            elif isinstance(effect, Closed | CloseFailed):
                if self.close_outcome:
                    self._error("the writer reported its close twice")
                self.close_outcome = "closed" if isinstance(effect, Closed) else "failed"
                self._finish()

    def _finish(self) -> None:
        if self.finished_at < 0:
            self.finished_at = len(self.confirmed)

    def _recovery_step(self, event: RecoveryEvent) -> None:
        self._recovery_effects(self._recovery().step(event))

    def _recovery_effects(self, effects: list[RecoveryEffect]) -> None:
        machine = self.recovery
        assert machine is not None
        for effect in effects:
            if isinstance(effect, SendFence):
                self._send(Message(Kind.FENCE, machine.ensemble[s], s) for s in effect.slots)
            elif isinstance(effect, SendRecoveryRead):
                entry = (effect.entry_id,)
                self._send(Message(Kind.READ, machine.ensemble[s], s, entry) for s in effect.slots)
            elif isinstance(effect, SendRewrite):
                entry = (effect.entry_id,)
                self._send(
                    Message(Kind.REWRITE, machine.write_ensemble[s], s, entry, blob=effect.blob)
                    for s in effect.slots
                )
            elif isinstance(effect, ChooseBookies):
                if self.r_choose is not None:
                    self._error("the recovery chose bookies twice at once")
                self.r_choose = effect
            elif isinstance(effect, UpdateMetadata):
                if self.r_md is not None:
                    self._error("the recovery ran two metadata operations at once")
                self.r_md = Pending("update", effect)
            elif isinstance(effect, ReadMetadata):
                if self.r_md is not None:
                    self._error("the recovery ran two metadata operations at once")
                self.r_md = Pending("read")
            elif isinstance(effect, ReadLength):
                self.r_length = effect
            elif isinstance(effect, Recovered | RecoveryFailed):
                if self.r_outcome:
                    self._error("the recovery ended twice")
                self.r_outcome = "recovered" if isinstance(effect, Recovered) else "failed"

    def _error(self, text: str) -> None:
        self.errors = (*self.errors, text)


def _bind(method: Callable[..., World], *args: Any) -> Callable[[World], World]:
    """``method`` with ``args`` after the world it is called on."""

    def step(world: World) -> World:
        return method(world, *args)

    return step


# ------------------------------------------------------------------ replay


@dataclass
class ReplayStep:
    """One step of a replayed trace and the world after it."""

    label: str
    world: World


def replay(cfg: WorldConfig, labels: Iterable[str]) -> list[ReplayStep]:
    """Play ``labels`` (a trace the explorer printed, one step a label) from the initial
    world; each must name a step the world can take at that point (ModelError
    otherwise)."""
    world = World.initial(cfg)
    steps = [ReplayStep("(start)", world)]
    for number, label in enumerate(labels, 1):
        label = label.strip()
        if not label:
            continue
        for name, make in world.actions():
            if name == label:
                world = make(world)
                break
        else:
            possible = "\n  ".join(name for name, _ in world.actions())
            raise ModelError(
                f"step {number}: {label!r} cannot happen here; it could:\n  {possible}"
            )
        steps.append(ReplayStep(label, world))
    return steps
