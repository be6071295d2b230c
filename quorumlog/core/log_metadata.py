"""What changes of a log's ledger list decide, as pure functions of the list as read.

A log stream keeps its ledgers in one node of the metadata store (``/logs/<name>``,
see ``log/metadata.py``), and every change of that node is a compare-and-set on its
version (R11). Four changes exist:

- a writer appends its new ledger (opening, R11 step 4, or rolling over):
  :func:`decide_append_ledger`;
- ``Log.fence`` seals the list (raises its ``fences`` count): :func:`decide_seal`;
- ``Log.truncate`` removes the ledgers before a position: :func:`decide_truncate`;
- a Spark sink's commit appends the ledgers its tasks staged, and a streaming batch's
  id: :func:`decide_commit_staged`.

Each decision is a function of the list as read (:class:`LogView`) and of what the
change was asked for, and answers one of the :mod:`quorumlog.core.metadata` decisions:
a change to write (:class:`AppendLedgers`, :class:`SealList`, :class:`TruncateBefore`),
:class:`~quorumlog.core.metadata.Settled` (what is stored already shows that the change
happened: this update's own write whose reply was lost, or the same outcome reached by
someone else) or :class:`~quorumlog.core.metadata.Refused`. The one driver in
``log/metadata_updates.py`` runs them under :class:`~quorumlog.core.metadata.PendingUpdate`,
the policy ledger metadata updates follow: a conflict is read again and decided again;
an unknown outcome is read again and decided again, Settled meaning it happened and a
change meaning it did not (try again), and a refusal then leaving it unresolved (R13).

So a decision must answer Settled for every list its own write can have led to, not
only the one it wrote: another change may land between the write and the read (a
truncation, a writer's append, a fence).

Positions are ``(ledger id, entry id)`` tuples, ordered as ``log.position.Position``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quorumlog.core.metadata import Refused, Settled
from quorumlog.errors import BKError, InvalidArgumentError, Status

# (ledger id, entry id): a record's place in a log.
LogPosition = tuple[int, int]


class ListChangedError(BKError):
    """The ledger list changed in a way that refuses the change: another writer holds
    the log (it appended a ledger, or sealed the list), or the log was created again.
    The log layer reports it as its ``LogFencedError``."""

    status = Status.FENCED


@dataclass(frozen=True, slots=True)
class LogView:
    """The fields of a log's metadata the decisions read (the log layer builds it from
    ``LogMetadata``)."""

    name: str
    ledgers: tuple[int, ...] = ()
    truncated_before: LogPosition | None = None
    fences: int = 0
    closed_through: int = -1
    created_ms: int = 0
    sink_batches: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AppendLedgers:
    """Append ``ledger_ids`` to the list, noting that every listed ledger up to
    ``closed_through`` is closed; with ``sink``, record ``(sink id, batch id)`` as that
    streaming sink's last batch, in the same write."""

    ledger_ids: tuple[int, ...]
    closed_through: int = -1
    sink: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class SealList:
    """Raise the list's ``fences`` count by one: a writer whose compare-and-set read the
    list before it now conflicts and stops (``Log.fence``)."""


@dataclass(frozen=True, slots=True)
class TruncateBefore:
    """Remove the ledgers wholly before ``before`` and record the truncation point;
    ``removed_end``: where the records before it end, when below it (None: unknown)."""

    before: LogPosition
    removed_end: LogPosition | None = None


LogChange = AppendLedgers | SealList | TruncateBefore
LogDecision = AppendLedgers | SealList | TruncateBefore | Settled | Refused


def only_truncated_since(view: LogView, base: LogView) -> bool:
    """Whether ``view``'s list is ``base``'s with some of its first ledgers removed (a
    truncation happened, no ledger was appended)."""
    drop = len(base.ledgers) - len(view.ledgers)
    return drop >= 0 and base.ledgers[drop:] == view.ledgers


# ---------------------------------------------------------------- a writer's append


def decide_append_ledger(
    view: LogView,
    *,
    base: LogView,
    ledger_id: int,
    opening: bool,
    closed_through: int = -1,
) -> LogDecision:
    """A writer appends its new ledger ``ledger_id`` to the list it read (``base``).

    Settled once the ledger is listed: the append happened, even if another writer
    appended after it since (the caller then lost the log: its ledger is not the last).
    Otherwise the append may go ahead only on ``base`` with ledgers removed at its front
    (a truncation): a ledger appended by anyone else means another writer owns the log.
    So does a ``Log.fence`` since ``base`` (its ``fences`` count), unless ``opening``: a
    writer being opened fenced the listed ledgers itself, while one rolling over must stop.
    """
    if ledger_id in view.ledgers:
        return Settled()
    where = f"log {view.name}: ledger {ledger_id} was not added"
    if not opening and view.fences != base.fences:
        return Refused(ListChangedError(f"{where}: the log was fenced since this writer read it"))
    if not only_truncated_since(view, base) or (view.ledgers and view.ledgers[-1] >= ledger_id):
        return Refused(
            ListChangedError(
                f"{where}: another writer changed the ledger list (now ending "
                f"{list(view.ledgers[-3:])}, this writer read one ending {list(base.ledgers[-3:])})"
            )
        )
    return AppendLedgers((ledger_id,), max(closed_through, view.closed_through))


# ---------------------------------------------------------------- Log.fence


def decide_seal(view: LogView, *, base: LogView) -> LogDecision:
    """``Log.fence`` seals the list it read (``base``) once: Settled once the list was
    sealed after that read (by this fence, or by another one at the same time: either
    way a writer that read the list before it now fails its compare-and-set)."""
    if view.fences > base.fences:
        return Settled()
    return SealList()


# ---------------------------------------------------------------- Log.truncate


def decide_truncate(
    view: LogView,
    *,
    before: LogPosition,
    removed_end: LogPosition | None = None,
    written_end: int | None = None,
) -> LogDecision:
    """``Log.truncate(before)``: Settled once the list is truncated at or after
    ``before`` (it removed every ledger wholly before it: truncating again would write
    the same list). Refused when ``before``'s ledger is not in the list, or when
    ``before`` lies past ``written_end``, the entry after the last one its ledger was
    seen to hold (closed: its last entry; open: its last add confirmed): records
    appended there later, confirmed to their writer, would read as truncated (as
    Kafka refuses to delete records past the high watermark). ``removed_end`` comes
    from the ledgers just before ``before``'s, closed ledgers that never change."""
    done = view.truncated_before
    if done is not None and tuple(before) <= tuple(done):
        return Settled()
    if before[0] not in view.ledgers:
        return Refused(
            InvalidArgumentError(
                f"log {view.name}: cannot truncate before {before[0]}:{before[1]}: ledger "
                f"{before[0]} is not in the log {list(view.ledgers)}"
            )
        )
    if written_end is not None and before[1] > written_end:
        return Refused(
            InvalidArgumentError(
                f"log {view.name}: cannot truncate before {before[0]}:{before[1]}: ledger "
                f"{before[0]} holds records up to {before[0]}:{written_end - 1} only, and "
                f"records appended past that end later would read as truncated; truncate "
                f"at most before {before[0]}:{written_end}"
            )
        )
    return TruncateBefore(before, removed_end)


# ---------------------------------------------------------------- a Spark sink's commit


def decide_commit_staged(
    view: LogView,
    *,
    base: LogView,
    ledger_ids: tuple[int, ...],
    sink: tuple[str, int] | None = None,
) -> LogDecision:
    """A Spark sink's commit appends the ledgers its tasks staged (``ledger_ids``, in
    order) to the list it read (``base``), taking the log over as a new writer does (the
    caller fences the listed ledgers before each compare-and-set); with ``sink``
    ``(sink id, batch id)``, at most once per batch.

    Settled when the batch is recorded (this commit's write, or an earlier run of the
    same batch: the caller tells which by whether its ledgers are listed), or, for a
    batch write, when its ledgers are listed. Refused when the sink already recorded a
    later batch (another query on the same sink id), when the log was created again,
    when a ledger at or above the first staged one is listed (another writer began after
    this write), or when any ledger was appended since ``base`` (another writer appended
    while this one committed); a truncation or a fence since then is no obstacle.
    """
    if sink is not None:
        sink_id, batch_id = sink
        last = view.sink_batches.get(sink_id)
        if last == batch_id:
            return Settled()
        if last is not None and last > batch_id:
            return Refused(
                InvalidArgumentError(
                    f"log {view.name}: sinkId {sink_id!r} already committed batch {last}, "
                    f"and now batch {batch_id} arrives; a restarted query only repeats its "
                    "last batch, so this looks like a new query (new checkpoint) using the "
                    "same sinkId: give it another sinkId"
                )
            )
    elif ledger_ids and all(x in view.ledgers for x in ledger_ids):
        return Settled()
    where = f"log {view.name}: ledgers {list(ledger_ids)} were not added"
    if view.created_ms != base.created_ms:
        return Refused(ListChangedError(f"{where}: the log was deleted and created again"))
    if ledger_ids and view.ledgers and view.ledgers[-1] >= ledger_ids[0]:
        return Refused(
            ListChangedError(
                f"log {view.name}: ledger {view.ledgers[-1]} was added by another writer "
                f"after this write began; its ledgers {list(ledger_ids)} were not added"
            )
        )
    if not only_truncated_since(view, base):
        return Refused(
            ListChangedError(
                f"{where}: another writer appended to the log while the write was being committed"
            )
        )
    return AppendLedgers(
        ledger_ids, view.ledgers[-1] if view.ledgers else view.closed_through, sink
    )
