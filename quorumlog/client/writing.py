"""The writer's ledger handle: pipelined adds, ordered confirmations, ensemble change, close.

Hot path: ``append`` encodes the entry (header + digest + payload), registers
it with the pure :class:`~quorumlog.core.adds.AddTracker`, and queues it for
each bookie of its write set. Once per event-loop turn the queues leave as
one multi-entry ADD frame per bookie. Each bookie answers per frame, the
tracker counts acknowledgements, and confirmed entries complete in entry-id
order (R3).

When a bookie fails (error, timeout, lost connection) the writer replaces it
(R5): it picks a writable bookie outside the ensemble, compare-and-sets the
ledger metadata with a new fragment starting at the first unconfirmed entry,
and resends that bookie's unconfirmed entries to the replacement. If the
metadata is no longer OPEN (a recovery started), every outstanding add fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from quorumlog.client.reading import ReadHandle
from quorumlog.core.adds import AddTracker, PendingAdd
from quorumlog.errors import (
    BKError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    Status,
    UnauthorizedError,
    error_for_status,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.ledgers import Done, GiveUp, MetadataUpdate
from quorumlog.proto.codec import AddRequest, AddResponse, Response, WriteLacRequest
from quorumlog.proto.entry import ENTRY_HEADER_SIZE

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper

log = logging.getLogger(__name__)


class LedgerHandle(ReadHandle):
    """A ledger this client created and writes to (the ledger's single writer)."""

    def __init__(
        self, client: BookKeeper, metadata: LedgerMetadata, version: int, password: bytes
    ) -> None:
        super().__init__(client, metadata, version, password)
        self._tracker = AddTracker(
            metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
        )
        self._ensemble = list(metadata.last_ensemble)
        self._outbox: list[list[PendingAdd]] = [[] for _ in self._ensemble]
        self._slot_generation = [0] * len(self._ensemble)
        self._replacing: set[int] = set()
        self._replaced_bookies: set[str] = set()
        self._change_lock = asyncio.Lock()
        self._flush_scheduled = False
        self._length_bytes = 0
        self._confirmed_length_bytes = 0
        self._payload_offset = ENTRY_HEADER_SIZE + metadata.digest_type.digest_size
        self._failure: BKError | None = None
        self._closing = False
        self._lac_sent = -1  # largest LAC the bookies were told (piggybacked or explicit)
        self._lac_timer: asyncio.TimerHandle | None = None
        self._capacity_waiters: deque[asyncio.Future[None]] = deque()
        # Set by the handle's single owner (a log writer), see deliver_results().
        self._result_of: Callable[[int], Any] | None = None
        self._error_of: Callable[[BKError], BaseException] | None = None

    # ------------------------------------------------------------ state

    @property
    def last_add_confirmed(self) -> int:
        return self._tracker.lac

    @property
    def outstanding_adds(self) -> int:
        return len(self._tracker)

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The bookies of the current (last) fragment."""
        return tuple(self._ensemble)

    def _read_limit(self) -> int:
        return self.metadata.last_entry_id if self.metadata.is_closed else self._tracker.lac

    def _learn_lac(self, lac: int) -> None:
        # The writer is the source of the LAC; reads never move it.
        return

    def deliver_results(
        self, result_of: Callable[[int], Any], error_of: Callable[[BKError], BaseException]
    ) -> None:
        """Complete the futures :meth:`append` returns with ``result_of(entry_id)``, and
        fail them with ``error_of(error)``. For a handle's single owner that hands the
        futures on as its own (a log writer giving positions): it saves a second future
        and a callback hop per add on the hot path."""
        self._result_of = result_of
        self._error_of = error_of

    # ------------------------------------------------------------ adding

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Send an entry without waiting; the future gives its entry id once confirmed.

        Raises at once if the handle is closed or lost the ledger. Pipelined callers
        should bound what they have in flight (see :meth:`wait_for_capacity`).
        """
        if self._failure is not None:
            raise self._failure
        if self._closing or self.metadata.is_closed:
            raise LedgerClosedError(f"ledger {self.ledger_id}: closed, cannot add")
        if not isinstance(data, bytes):
            data = bytes(data)
        future: asyncio.Future[int] = self._loop.create_future()
        tracker = self._tracker
        self._length_bytes += len(data)
        lac = tracker.lac
        blob = self._codec.encode(
            self.ledger_id, tracker.next_entry_id, lac, self._length_bytes, data
        )
        pending = tracker.add(blob, future)
        self._lac_sent = lac
        outbox = self._outbox
        for index in pending.write_set:
            outbox[index].append(pending)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    async def add_entry(self, data: bytes) -> int:
        """Add one entry and wait until it is confirmed; returns its entry id."""
        if len(self._tracker) >= self._config.max_outstanding_adds:
            await self.wait_for_capacity()
        return await self.append(data)

    async def wait_for_capacity(self) -> None:
        """Wait until fewer than ``max_outstanding_adds`` adds are unconfirmed."""
        while len(self._tracker) >= self._config.max_outstanding_adds:
            if self._failure is not None:
                raise self._failure
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._capacity_waiters.append(waiter)
            await waiter

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._failure is not None:
            return
        max_entries = self._config.add_batch_max_entries
        max_bytes = self._config.add_batch_max_bytes
        for index, queue in enumerate(self._outbox):
            if not queue or index in self._replacing:
                continue
            self._outbox[index] = []
            batch: list[PendingAdd] = []
            size = 0
            for pending in queue:
                batch.append(pending)
                size += len(pending.blob)
                if len(batch) >= max_entries or size >= max_bytes:
                    self._send_batch(index, batch)
                    batch, size = [], 0
            if batch:
                self._send_batch(index, batch)

    def _send_batch(self, index: int, batch: list[PendingAdd]) -> None:
        request = AddRequest(0, self.ledger_id, self._master_key, [p.blob for p in batch])
        callback = partial(
            self._on_add_response, index, self._slot_generation[index], [p.entry_id for p in batch]
        )
        self._pool.get(self._ensemble[index]).send(request, callback, self._config.add_timeout_ms)

    def _on_add_response(
        self, index: int, generation: int, entry_ids: list[int], response: Response | BKError
    ) -> None:
        if generation != self._slot_generation[index] or self._failure is not None:
            return  # a late answer from a bookie that was already replaced
        if isinstance(response, AddResponse) and response.status == Status.OK:
            # While an ensemble change is under way, acks count but nothing is confirmed:
            # an entry confirmed now would leave the tracker before the change, and the
            # new bookie, which the new fragment says holds it, would never get it (R5).
            if self._tracker.ack(entry_ids, index) and not self._replacing:
                self._confirm_ready()
            return
        address = self._ensemble[index]
        if isinstance(response, BKError):
            error = response
        else:
            status = getattr(response, "status", Status.IO_ERROR)
            error = error_for_status(status, f"ledger {self.ledger_id} on bookie {address}")
        if error.status == Status.FENCED:
            self._fail(
                LedgerFencedError(
                    f"ledger {self.ledger_id}: fenced by a recovery (bookie {address}); "
                    "unconfirmed adds may or may not be stored and must be treated as lost"
                )
            )
        elif error.status == Status.UNAUTHORIZED:
            self._fail(UnauthorizedError(f"ledger {self.ledger_id}: bookie {address} refused key"))
        elif error.status == Status.NO_SUCH_LEDGER:
            self._fail(NoSuchLedgerError(f"ledger {self.ledger_id}: deleted (bookie {address})"))
        else:
            log.warning("ledger %d: bookie %s failed: %s", self.ledger_id, address, error.message)
            self._start_replacement(index)

    def _confirm_ready(self) -> None:
        confirmed = self._tracker.confirm()
        if confirmed:
            self._complete(confirmed)

    def _complete(self, confirmed: list[PendingAdd]) -> None:
        offset = self._payload_offset
        result_of = self._result_of
        for pending in confirmed:
            future = pending.token
            if not future.done():
                entry_id = pending.entry_id
                future.set_result(entry_id if result_of is None else result_of(entry_id))
        last = confirmed[-1]
        self._confirmed_length_bytes += sum(len(p.blob) - offset for p in confirmed)
        self._lac = last.entry_id
        waiters = self._capacity_waiters
        while waiters and len(self._tracker) < self._config.max_outstanding_adds:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        if self._lac_timer is None and self._tracker.lac > self._lac_sent:
            self._lac_timer = self._loop.call_later(
                self._config.explicit_lac_delay_ms / 1000, self._send_explicit_lac
            )

    def _send_explicit_lac(self) -> None:
        """R4: tell the bookies the LAC when no add carried it, so tailing readers see it."""
        self._lac_timer = None
        lac = self._tracker.lac
        if self._failure is not None or lac <= self._lac_sent:
            return
        self._lac_sent = lac
        for index, address in enumerate(self._ensemble):
            if index in self._replacing:
                continue
            request = WriteLacRequest(0, self.ledger_id, self._master_key, lac)
            self._pool.get(address).send(request, _ignore, self._config.add_timeout_ms)

    # ------------------------------------------------------------ failures

    def _fail(self, error: BKError) -> None:
        if self._failure is None:
            # Entries an ack quorum already holds are confirmed (recovery keeps them, R8),
            # held back only by an ensemble change that will not happen now.
            self._confirm_ready()
            self._failure = error
        delivered: BaseException = error if self._error_of is None else self._error_of(error)
        for pending in self._tracker.fail_all():
            if not pending.token.done():
                pending.token.set_exception(delivered)
        for waiter in self._capacity_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._capacity_waiters.clear()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    def _start_replacement(self, index: int) -> None:
        if index in self._replacing:
            return
        self._replacing.add(index)
        self._slot_generation[index] += 1  # drop whatever the failed bookie still sends
        task = self._loop.create_task(self._replace_bookies())
        task.add_done_callback(_log_task_error)

    async def _replace_bookies(self) -> None:
        async with self._change_lock:
            slots = sorted(self._replacing)
            if not slots or self._failure is not None:
                return
            try:
                first_entry_id, new_ensemble = await self._write_new_fragment(slots)
            except BKError as exc:
                self._fail(exc)
                return
            for index in slots:
                self._replaced_bookies.add(self._ensemble[index])
                self._ensemble[index] = new_ensemble[index]
                # Every tracked entry of the new fragment, acked by others or not: none
                # was confirmed during the change, so none is missed.
                self._outbox[index] = self._tracker.replace_bookie(index, first_entry_id)
                self._replacing.discard(index)
                self._slot_generation[index] += 1
            log.info(
                "ledger %d: ensemble changed from entry %d: %s",
                self.ledger_id,
                first_entry_id,
                ",".join(new_ensemble),
            )
            self._flush()
            if not self._replacing:
                self._confirm_ready()  # what an ack quorum held during the change

    async def _write_new_fragment(self, slots: list[int]) -> tuple[int, list[str]]:
        client = self._client
        writable = await client.registry.writable_bookies()
        excluded = set(self._ensemble) | self._replaced_bookies
        try:
            chosen = client.placement.replacements(writable, excluded, len(slots))
        except NotEnoughBookiesError as exc:
            failed = ", ".join(self._ensemble[i] for i in slots)
            raise NotEnoughBookiesError(
                f"ledger {self.ledger_id}: cannot replace bookie(s) {failed}: {exc.message}"
            ) from None
        new_ensemble = list(self._ensemble)
        for index, bookie in zip(slots, chosen, strict=True):
            new_ensemble[index] = bookie

        def decide(current: LedgerMetadata) -> LedgerMetadata | GiveUp:
            if current.state is not LedgerState.OPEN:
                return GiveUp(
                    LedgerFencedError(
                        f"ledger {self.ledger_id}: metadata is {current.state.value} "
                        "(another client is recovering or closed it); adds in flight are lost"
                    )
                )
            # The new fragment starts at the first unconfirmed entry, as of this attempt.
            return current.with_new_fragment(self._tracker.lac + 1, tuple(new_ensemble))

        result: MetadataUpdate[None] = await client.ledgers.update(
            self.ledger_id,
            decide,
            attempts=self._config.metadata_cas_retries,
            known=(self.metadata, self._metadata_version),
        )
        self.metadata, self._metadata_version = result.metadata, result.version
        return result.metadata.last_fragment_first_entry, new_ensemble

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """R6: wait for outstanding adds, then record the ledger CLOSED at the LAC."""
        if self.metadata.is_closed:
            return
        self._closing = True
        outstanding = [p.token for p in self._tracker.outstanding()]
        if outstanding:
            await asyncio.gather(*outstanding, return_exceptions=True)
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None
        lac = self._tracker.lac

        def decide(current: LedgerMetadata) -> LedgerMetadata | Done[None] | GiveUp:
            # R6 on a conflict: OPEN, try again; IN_RECOVERY, fail; CLOSED at this
            # writer's LAC, success; CLOSED elsewhere, fail.
            if current.state is LedgerState.OPEN:
                return dataclasses.replace(
                    current,
                    state=LedgerState.CLOSED,
                    last_entry_id=lac,
                    length=self._confirmed_length_bytes,
                )
            if current.state is LedgerState.IN_RECOVERY:
                return GiveUp(
                    LedgerFencedError(
                        f"ledger {self.ledger_id}: another client is recovering it; cannot close"
                    )
                )
            if current.last_entry_id == lac:
                return Done(None)
            return GiveUp(
                LedgerClosedError(
                    f"ledger {self.ledger_id}: closed by another client at entry "
                    f"{current.last_entry_id}, while this writer confirmed up to {lac}"
                )
            )

        try:
            result = await self._client.ledgers.update(
                self.ledger_id,
                decide,
                attempts=self._config.metadata_cas_retries,
                known=(self.metadata, self._metadata_version),
            )
            self.metadata, self._metadata_version = result.metadata, result.version
        finally:
            # The handle stays readable (up to the last entry) once closed.
            if self._failure is None and not self.metadata.is_closed:
                self._failure = LedgerClosedError(f"ledger {self.ledger_id}: close failed")


def _ignore(_: object) -> None:
    return


def _log_task_error(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("ensemble change failed", exc_info=task.exception())
