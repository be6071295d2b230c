"""The one update path of a log's ledger list: read, decide, compare-and-set (R11, R13).

Every change of a log's node (``/logs/<name>``) goes through :func:`update_log`: a
writer appending its ledger (``log/writer.py``), ``Log.fence`` and ``Log.truncate``
(``log/log.py``), a Spark sink's commit (``spark/commit.py``). What to write is decided
by a pure function of the list as read (``core/log_metadata.py``); this module runs it
under the policy ledger metadata updates follow (``core.metadata.PendingUpdate``):

- a round: decide on the list as read; Settled ends the update, Refused ends it with
  its error, a change is written with a compare-and-set on the version read. A version
  conflict: read again and decide again (at most ``attempts`` writes a round);
- a write whose outcome is unknown (the store failed in a way that is not a known
  refusal, ``client.metadata_updates.outcome_is_known``: a lost connection, a timeout)
  is never taken as applied or as not applied: the list is read again and the *same*
  decision runs on it. Settled means it happened; a change means it did not, and a new
  round writes it on the version read (a compare-and-set that fails if the first one
  was applied after all); a refusal then proves nothing (the write may have been applied
  and superseded) and leaves the outcome unresolved, as does a list that cannot be read:
  :class:`~quorumlog.log.errors.LogOutcomeUnknownError`.

Any failure after an unknown outcome is that error, so a caller never deletes or
retries what may be in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from quorumlog.client.metadata_updates import as_metadata_error, outcome_is_known
from quorumlog.core.log_metadata import (
    AppendLedgers,
    ListChangedError,
    LogChange,
    LogDecision,
    LogView,
    SealList,
)
from quorumlog.core.metadata import (
    MetadataEvent,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    PendingUpdate,
    ReadMetadata,
    Refused,
    Retry,
    Settled,
    UpdateMetadata,
)
from quorumlog.errors import BKError, MetadataVersionError, NoNodeError
from quorumlog.log.errors import LogFencedError, LogOutcomeUnknownError, NoSuchLogError
from quorumlog.log.metadata import LogMetadata, log_path, read_log
from quorumlog.log.position import Position
from quorumlog.meta.ledgers import MetadataConflictsError
from quorumlog.meta.store import MetadataStore

log = logging.getLogger(__name__)

LogDecide = Callable[[LogView], LogDecision]


def log_view(metadata: LogMetadata) -> LogView:
    """What the decisions of ``core/log_metadata.py`` read of a log's metadata."""
    return LogView(
        metadata.name,
        metadata.ledgers,
        metadata.truncated_before,
        metadata.fences,
        metadata.closed_through,
        metadata.created_ms,
        metadata.sink_batches,
    )


def apply_log_change(metadata: LogMetadata, change: LogChange) -> LogMetadata:
    """The metadata ``change`` asks to write in place of ``metadata``."""
    if isinstance(change, AppendLedgers):
        updated = metadata.with_closed_through(change.closed_through)
        updated = updated.with_ledgers(change.ledger_ids)
        return updated if change.sink is None else updated.with_sink_batch(*change.sink)
    if isinstance(change, SealList):
        return metadata.fenced()
    end = None if change.removed_end is None else Position(*change.removed_end)
    return metadata.truncated(Position(*change.before), end)


@dataclass(frozen=True, slots=True)
class LogUpdated:
    """How an update ended: the list now stored (as written, or as read) and its version.

    ``applied_to``: the list this update's own compare-and-set changed, when its answer
    came (None: what was stored settled the update). ``in_doubt``: a compare-and-set of
    this update had no answer before what was read settled it, so the write that settled
    it may be that one, on a list that is not known."""

    metadata: LogMetadata
    version: int
    applied_to: LogMetadata | None
    in_doubt: bool


class LogUpdate:
    """One change of a log's list under way (see the module docstring); :meth:`run` it
    once. ``in_doubt`` tells, when it was interrupted (cancelled), whether a write of it
    may have been applied.

    ``attempts``: compare-and-sets of one round (each conflict costs one);
    ``resolve_attempts`` (``attempts`` by default): unknown outcomes, or failed reads in
    a row, before the outcome is unresolved (``PendingUpdate``'s bound; its reads back
    off to one a second); ``timeout_s``: how long reads may go on resolving one."""

    def __init__(
        self,
        store: MetadataStore,
        name: str,
        decide: LogDecide,
        *,
        what: str,
        attempts: int,
        resolve_attempts: int | None = None,
        known: tuple[LogMetadata, int] | None = None,
        before_write: Callable[[LogMetadata], Awaitable[None]] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.path = log_path(name)
        self.decide = decide
        self.what = what
        self.attempts = attempts
        self.resolve_attempts = attempts if resolve_attempts is None else resolve_attempts
        self.before_write = before_write
        self.timeout_s = timeout_s
        self._known = known
        self._current: tuple[LogMetadata, int] | None = known
        self._applied_to: LogMetadata | None = None
        self._sending = False  # a compare-and-set is on its way
        self._unknown = False  # a compare-and-set had no answer

    @property
    def in_doubt(self) -> bool:
        """Whether a write of this update may have been applied without its answer."""
        return self._sending or self._unknown

    async def run(self) -> LogUpdated:
        """Settled or written: the list now stored. Raises the decision's refusal (a
        ListChangedError as LogFencedError), NoSuchLogError when the log is gone,
        MetadataConflictsError when every compare-and-set of a round met a change, and
        LogOutcomeUnknownError for any failure after a write with no answer."""
        if self._current is None:
            self._current = await read_log(self.store, self.name)
        pending: PendingUpdate[LogView, LogDecision] = PendingUpdate(
            self.decide, self.resolve_attempts
        )
        effect: UpdateMetadata[LogView, LogDecision] | ReadMetadata = pending.start()
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout_s is None else loop.time() + self.timeout_s
        try:
            while True:
                if isinstance(effect, ReadMetadata):
                    if deadline is not None and loop.time() + effect.delay_ms / 1000 > deadline:
                        raise self._unresolved(pending.last_error, f"after {self.timeout_s} s")
                    if effect.delay_ms:
                        await asyncio.sleep(effect.delay_ms / 1000)
                    event = await self._read()
                else:
                    event = await self._round()
                outcome = pending.on_event(event)
                if isinstance(outcome, MetadataStored):
                    metadata, version = self._current
                    self._sending = False
                    applied_to = self._applied_to
                    return LogUpdated(
                        metadata, version, applied_to, self._unknown and applied_to is None
                    )
                if isinstance(outcome, Refused):
                    raise _as_log_error(outcome.error)
                if isinstance(outcome, Retry):
                    effect = outcome.effect
                elif isinstance(outcome, ReadMetadata):
                    effect = outcome
                else:
                    raise self._unresolved(outcome.error)
        except LogOutcomeUnknownError:
            raise
        except Exception as exc:
            if self.in_doubt:
                raise self._unresolved(exc) from exc
            raise

    async def _round(self) -> MetadataEvent[LogView]:
        """Decide on the list last stored or read, write; on a conflict read and decide
        again. The event says how it ended."""
        assert self._current is not None
        metadata, version = self._current
        writes = 0
        while True:
            decision = self.decide(log_view(metadata))
            if isinstance(decision, Settled):
                return MetadataStored(log_view(metadata))
            if isinstance(decision, Refused):
                return MetadataRefused(decision.error)
            if writes >= self.attempts:
                return MetadataRefused(
                    MetadataConflictsError(
                        f"log {self.name}: the ledger list kept changing ({writes} "
                        f"compare-and-sets met a change); {self.what}: not done"
                    )
                )
            writes += 1
            if self.before_write is not None:
                await self.before_write(metadata)
            updated = apply_log_change(metadata, decision)
            self._sending = True
            try:
                new_version = await self.store.set(self.path, updated.to_bytes(), version)
            except MetadataVersionError:
                self._sending = False
                try:
                    metadata, version = self._current = await read_log(self.store, self.name)
                except Exception as exc:  # nothing of this round was written
                    return MetadataRefused(as_metadata_error(exc))
                continue
            except NoNodeError:
                self._sending = False
                return MetadataRefused(self._gone())
            except Exception as exc:
                error = as_metadata_error(exc)
                if outcome_is_known(exc):
                    self._sending = False
                    return MetadataRefused(error)
                self._unknown = True
                log.warning(
                    "log %s: %s: compare-and-set outcome unknown, reading the list again: %s",
                    self.name,
                    self.what,
                    error.message,
                )
                return MetadataUnknown(error)
            self._sending = False
            self._applied_to = metadata
            self._current = (updated, new_version)
            return MetadataStored(log_view(updated))

    async def _read(self) -> MetadataEvent[LogView]:
        """The list after a write with no answer."""
        try:
            self._current = await read_log(self.store, self.name)
        except NoSuchLogError as exc:
            return MetadataRefused(exc)  # gone: nothing more will tell
        except Exception as exc:
            return MetadataReadFailed(as_metadata_error(exc))
        return MetadataRead(log_view(self._current[0]))

    def _gone(self) -> NoSuchLogError:
        return NoSuchLogError(
            f"log {self.name} does not exist ({self.path}); {self.what}: not done"
        )

    def _unresolved(self, cause: BaseException | None, how: str = "") -> LogOutcomeUnknownError:
        why = "" if cause is None else f" ({cause})"
        return LogOutcomeUnknownError(
            f"log {self.name}: {self.what}: a compare-and-set of the ledger list had no "
            f"answer{why}, and reading the list again did not tell{' ' + how if how else ''} "
            "whether it was applied: the outcome is unknown"
        )


def _as_log_error(error: BKError) -> BKError:
    """The refusal of a decision as the log layer reports it."""
    if isinstance(error, ListChangedError):
        return LogFencedError(error.message)
    return error


async def update_log(
    store: MetadataStore,
    name: str,
    decide: LogDecide,
    *,
    what: str,
    attempts: int,
    resolve_attempts: int | None = None,
    known: tuple[LogMetadata, int] | None = None,
    before_write: Callable[[LogMetadata], Awaitable[None]] | None = None,
    timeout_s: float | None = None,
) -> LogUpdated:
    """Change the list of log ``name`` as ``decide`` says (see the module docstring and
    :class:`LogUpdate`). ``what`` names the change in errors; ``known``: the list and
    version the caller holds (the first decision is made on it without a read);
    ``before_write`` runs before each compare-and-set with the list it will change."""
    return await LogUpdate(
        store,
        name,
        decide,
        what=what,
        attempts=attempts,
        resolve_attempts=resolve_attempts,
        known=known,
        before_write=before_write,
        timeout_s=timeout_s,
    ).run()
