"""The writer's ledger handle: pipelined adds, ordered confirmations, ensemble change, close.

Hot path: ``append`` encodes the entry (header + digest + payload), registers
it with the pure :class:`~quorumlog.core.adds.AddTracker`, and queues it for
each bookie of its write set. Once per event-loop turn the queues leave as
one multi-entry ADD frame per bookie. Each bookie answers per frame, the
tracker counts acknowledgements, and confirmed entries complete in entry-id
order (R3).

Every decision beyond the hot path is made by the pure state machine
:class:`~quorumlog.core.writer.LedgerWriter`: which answers count, when a bookie
is replaced (R5) and what the new fragment is, what an unknown metadata outcome
means (R13), which adds are confirmed or failed when the handle fails, and the
close (R6). This handle carries out its effects: it sends frames, picks
replacement bookies, runs metadata updates and reads, and completes futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from quorumlog.client.config import entry_size_limit
from quorumlog.client.metadata_updates import (
    STORE_FAILURES,
    as_metadata_error,
    ledger_view,
    metadata_decider,
    outcome_is_known,
)
from quorumlog.client.placement import choose_replacements
from quorumlog.client.reading import ReadHandle
from quorumlog.core.adds import PendingAdd
from quorumlog.core.metadata import (
    Decision,
    LedgerView,
    MetadataRead,
    MetadataReadFailed,
    MetadataRefused,
    MetadataStored,
    MetadataUnknown,
    ReadMetadata,
    UpdateMetadata,
)
from quorumlog.core.writer import (
    AddFailed,
    ChooseBookies,
    Closed,
    CloseFailed,
    CloseRequested,
    Confirm,
    FailAdds,
    HandleFailed,
    LedgerWriter,
    SendQueued,
    WriterEffect,
    WriterEvent,
)
from quorumlog.errors import (
    BKError,
    InvalidArgumentError,
    LedgerClosedError,
    Status,
    TooManyRequestsError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import (
    ADD_ENTRY_OVERHEAD_BYTES,
    ADD_FRAME_OVERHEAD_BYTES,
    AddRequest,
    AddResponse,
    Response,
    WriteLacRequest,
    encode_entries,
)

if TYPE_CHECKING:
    from quorumlog.client.context import ClientContext

log = logging.getLogger(__name__)

# Entries averaging less are joined once per frame for all its bookies; larger ones are
# never copied on their way out (the connection hands them to the kernel as they are).
_JOIN_MAX_AVERAGE_BYTES = 4096

# A confirmation or failure raced by the owner cancelling its future: nothing to deliver.
_ALREADY_SETTLED = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


class AddToken(Protocol):
    """What an add's completion goes to: an asyncio future, a ``concurrent.futures``
    future (the synchronous facade's, completed on the loop without a second future),
    or a batch's :class:`BatchToken`."""

    def done(self) -> bool: ...

    def set_result(self, result: Any, /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


AnyFuture = asyncio.Future[Any] | concurrent.futures.Future[Any]


class BatchToken:
    """The completion of a batch of adds, carried by its last entry only: entries are
    confirmed in entry-id order (R3), so the last one confirmed means all are, and the
    others carry no token at all (no future, no call per entry)."""

    __slots__ = ("first_entry_id", "future")

    def __init__(self, first_entry_id: int, future: AnyFuture) -> None:
        self.first_entry_id = first_entry_id
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, last_entry_id: int) -> None:
        self.future.set_result(list(range(self.first_entry_id, last_entry_id + 1)))

    def set_exception(self, exception: BaseException) -> None:
        self.future.set_exception(exception)


class LedgerHandle(ReadHandle):
    """A ledger this client created and writes to (the ledger's single writer)."""

    def __init__(
        self, ctx: ClientContext, metadata: LedgerMetadata, version: int, password: bytes
    ) -> None:
        super().__init__(ctx, metadata, version, password)
        self._writer = LedgerWriter(
            metadata.ledger_id,
            metadata.ensemble_size,
            metadata.write_quorum,
            metadata.ack_quorum,
            ledger_view(metadata),
            metadata_attempts=self._config.metadata_cas_retries,
        )
        self._tracker = self._writer.tracker  # the pending adds (the simulator reads it)
        self._flush_scheduled = False
        self._length_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()  # effects under way (kept referenced)
        self._close_result: asyncio.Future[None] | None = None
        self._lac_sent = -1  # largest LAC the bookies were told (piggybacked or explicit)
        self._lac_timer: asyncio.Handle | None = None  # the explicit LAC to come
        self._lac_soon = False  # whether that is on the next loop turn (not delayed)
        self._capacity_waiters: deque[asyncio.Future[None]] = deque()
        # R16: an entry must fit one ADD frame alone (a bigger frame makes the bookie drop
        # the connection, and every request on it); a batch stops before passing a frame.
        config = self._config
        self._max_entry_bytes = min(
            config.max_entry_size_bytes, entry_size_limit(config.max_frame_size_bytes)
        )
        self._max_batch_bytes = min(
            config.add_batch_max_bytes, config.max_frame_size_bytes - ADD_FRAME_OVERHEAD_BYTES
        )
        # Set by the handle's single owner (a log writer), see deliver_results().
        self._result_of: Callable[[int], Any] | None = None
        self._error_of: Callable[[BKError], BaseException] | None = None
        # Told how many adds were settled (confirmed or failed), once per batch of them:
        # the synchronous facade's bound on adds in flight (see on_settled()).
        self._on_settled: Callable[[int], None] | None = None

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
        return tuple(self._writer.ensemble)

    @property
    def _failure(self) -> BKError | None:
        """Why the handle takes no more adds, if it does not."""
        return self._writer.failure

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

    def on_settled(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(count)`` on the loop each time ``count`` adds were confirmed or
        failed (once per batch of them, not per add). For the synchronous facade, which
        bounds the adds its threads have in flight without a callback per add."""
        self._on_settled = callback

    # ------------------------------------------------------------ adding

    def append(self, data: bytes) -> asyncio.Future[int]:
        """Send an entry without waiting; the future gives its entry id once confirmed.

        Raises at once if the handle is closed or lost the ledger, InvalidArgumentError
        for an entry over ``max_entry_size_bytes``, and TooManyRequestsError when
        ``max_outstanding_adds`` adds are unconfirmed: nothing is queued past that bound
        (R16). Pipelined callers wait first (:meth:`wait_for_capacity`); add_entry does.
        """
        future: asyncio.Future[int] = self._loop.create_future()
        self.append_with_token(data, future)
        return future

    def append_with_token(self, data: bytes, token: AddToken) -> None:
        """:meth:`append` completing ``token`` (``set_result(entry id)`` or
        ``set_exception``) instead of a future of its own; the synchronous facade hands
        its ``concurrent.futures.Future`` here, saving an asyncio future and a callback
        per add. Raises as :meth:`append` does, and then ``token`` is left untouched."""
        writer = self._writer
        if writer.failure is not None or writer.closing:  # two attribute reads per add
            raise writer.failure or LedgerClosedError(
                f"ledger {self.ledger_id}: closed, cannot add"
            )
        if not isinstance(data, bytes):
            data = bytes(data)
        if len(data) > self._max_entry_bytes:
            raise self._too_large(len(data))
        tracker = self._tracker
        if len(tracker) >= self._config.max_outstanding_adds:
            raise self._too_many(1)
        self._length_bytes += len(data)
        lac = tracker.lac
        blob = self._codec.encode(
            self.ledger_id, tracker.next_entry_id, lac, self._length_bytes, data
        )
        writer.add(blob, token)
        self._lac_sent = lac
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def append_entries(self, entries: Sequence[bytes]) -> asyncio.Future[list[int]]:
        """Send several entries at once without waiting; the one future gives their entry
        ids (consecutive, in order) once the last is confirmed.

        The batch is taken whole or not at all: it raises as :meth:`append` does (an
        entry too large, or fewer than ``len(entries)`` adds of room under
        ``max_outstanding_adds``) before anything is queued. Cheaper per entry than
        :meth:`append`: one future and one completion for the batch. If the future
        fails, the entries before the failure may have been confirmed
        (:attr:`last_add_confirmed` says up to where), as with one future per entry.

        Example::

            ids = await handle.append_entries([b"a", b"b", b"c"])   # [0, 1, 2]
        """
        future: asyncio.Future[list[int]] = self._loop.create_future()
        self.append_entries_with_token(entries, future)
        return future

    def append_entries_with_token(self, entries: Sequence[bytes], future: AnyFuture) -> None:
        """:meth:`append_entries` completing ``future`` (an asyncio or a
        ``concurrent.futures`` future) with the list of entry ids."""
        writer = self._writer
        if writer.failure is not None or writer.closing:
            raise writer.failure or LedgerClosedError(
                f"ledger {self.ledger_id}: closed, cannot add"
            )
        if self._result_of is not None:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: its owner delivers results per entry "
                "(deliver_results); add entries one by one"
            )
        blobs = [data if isinstance(data, bytes) else bytes(data) for data in entries]
        if not blobs:
            future.set_result([])
            return
        largest = max(map(len, blobs))
        if largest > self._max_entry_bytes:
            raise self._too_large(largest)
        tracker = self._tracker
        if len(tracker) + len(blobs) > self._config.max_outstanding_adds:
            raise self._too_many(len(blobs))
        encode = self._codec.encode
        ledger_id = self.ledger_id
        length_bytes = self._length_bytes
        lac = tracker.lac
        first_entry_id = tracker.next_entry_id
        last = len(blobs) - 1
        add = writer.add
        for index, data in enumerate(blobs):
            length_bytes += len(data)
            blob = encode(ledger_id, tracker.next_entry_id, lac, length_bytes, data)
            add(blob, BatchToken(first_entry_id, future) if index == last else None)
        self._length_bytes = length_bytes
        self._lac_sent = lac
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    async def add_entries(self, entries: Sequence[bytes]) -> list[int]:
        """Add several entries and wait until all are confirmed; returns their entry ids.
        Waits for room under ``max_outstanding_adds`` first (a batch larger than that
        bound is refused with InvalidArgumentError)."""
        if len(entries) > self._config.max_outstanding_adds:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: a batch of {len(entries)} entries is over "
                f"max_outstanding_adds ({self._config.max_outstanding_adds})"
            )
        while len(self._tracker) + len(entries) > self._config.max_outstanding_adds:
            await self._wait_for_room()
        return await self.append_entries(entries)

    def _too_large(self, size_bytes: int) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"ledger {self.ledger_id}: entry of {size_bytes} bytes is over the limit of "
            f"{self._max_entry_bytes} bytes (max_entry_size_bytes: one ADD frame holds it)"
        )

    def _too_many(self, count: int) -> TooManyRequestsError:
        return TooManyRequestsError(
            f"ledger {self.ledger_id}: {len(self._tracker)} adds unconfirmed, {count} more "
            f"would pass max_outstanding_adds ({self._config.max_outstanding_adds}); "
            "wait_for_capacity() or add_entry() waits for room"
        )

    async def add_entry(self, data: bytes) -> int:
        """Add one entry and wait until it is confirmed; returns its entry id."""
        if len(self._tracker) >= self._config.max_outstanding_adds:
            await self.wait_for_capacity()
        return await self.append(data)

    async def wait_for_capacity(self) -> None:
        """Wait until fewer than ``max_outstanding_adds`` adds are unconfirmed."""
        while len(self._tracker) >= self._config.max_outstanding_adds:
            await self._wait_for_room()

    async def _wait_for_room(self) -> None:
        """Wait for the next confirmations (raises if the handle failed)."""
        if self._failure is not None:
            raise self._failure
        waiter: asyncio.Future[None] = self._loop.create_future()
        self._capacity_waiters.append(waiter)
        await waiter

    def _flush(self) -> None:
        self._flush_scheduled = False
        max_entries = self._config.add_batch_max_entries
        max_bytes = self._max_batch_bytes
        # Bookies of one write set usually get the same entries (always when E = Qw):
        # the frame's entries are then encoded once, and their ids listed once, for all.
        shared: tuple[list[PendingAdd], list[bytes], list[int], bytes | None] | None = None
        for index, generation, queue in self._writer.take_sends():
            if len(queue) <= max_entries:
                # The common case, one frame for the whole queue: sized without a Python
                # step per entry.
                if shared is not None and queue == shared[0]:
                    self._send_frame(index, generation, *shared[1:])
                    continue
                blobs = [p.blob for p in queue]
                total_bytes = sum(map(len, blobs))
                if total_bytes + ADD_ENTRY_OVERHEAD_BYTES * len(blobs) < max_bytes:
                    # Small entries are joined once here; large ones are not copied at
                    # all (the connection hands them to the kernel as they are).
                    small = total_bytes < _JOIN_MAX_AVERAGE_BYTES * len(blobs)
                    shared = (
                        queue,
                        blobs,
                        [p.entry_id for p in queue],
                        encode_entries(blobs) if small else None,
                    )
                    self._send_frame(index, generation, *shared[1:])
                    continue
            batch: list[PendingAdd] = []
            size = 0
            for pending in queue:
                entry_bytes = len(pending.blob) + ADD_ENTRY_OVERHEAD_BYTES
                if batch and size + entry_bytes > max_bytes:
                    # The frame closes before this entry would push it past the limit.
                    self._send_batch(index, generation, batch)
                    batch, size = [], 0
                batch.append(pending)
                size += entry_bytes
                if len(batch) >= max_entries or size >= max_bytes:
                    self._send_batch(index, generation, batch)
                    batch, size = [], 0
            if batch:
                self._send_batch(index, generation, batch)

    def _send_batch(self, index: int, generation: int, batch: list[PendingAdd]) -> None:
        self._send_frame(
            index, generation, [p.blob for p in batch], [p.entry_id for p in batch], None
        )

    def _send_frame(
        self,
        index: int,
        generation: int,
        blobs: list[bytes],
        entry_ids: list[int],
        encoded: bytes | None,
    ) -> None:
        request = AddRequest(0, self.ledger_id, self._master_key, blobs, encoded_entries=encoded)
        callback: Callable[[Any], None] = partial(
            self._on_add_response, index, generation, entry_ids
        )
        if self._ctx.metrics is not None:
            callback = self._ctx.metrics.timed_add(callback, len(blobs))
        self._pool.get(self._writer.ensemble[index]).send(
            request, callback, self._config.add_timeout_ms
        )

    def _on_add_response(
        self, index: int, generation: int, entry_ids: list[int], response: Response | BKError
    ) -> None:
        writer = self._writer
        if isinstance(response, AddResponse) and response.status == Status.OK:
            confirmed = writer.ack(index, generation, entry_ids)
            if confirmed:
                self._complete(confirmed)
            return
        if generation != writer.generation[index] or writer.failure is not None:
            return  # a late answer from a bookie that was already replaced
        address = writer.ensemble[index]
        if isinstance(response, BKError):
            status, message = int(response.status), response.message
        else:
            status = int(getattr(response, "status", Status.IO_ERROR))
            message = f"answered status {status}"
        if status not in (Status.FENCED, Status.UNAUTHORIZED, Status.NO_SUCH_LEDGER):
            log.warning("ledger %d: bookie %s failed: %s", self.ledger_id, address, message)
        self._step(AddFailed(index, generation, status, message))

    def _complete(self, confirmed: Sequence[PendingAdd]) -> None:
        result_of = self._result_of
        for pending in confirmed:
            token = pending.token
            if token is None:
                continue  # within a batch (BatchToken)
            entry_id = pending.entry_id
            # No done() first: a concurrent future's takes its lock, as set_result does
            # again; one given up by its owner (cancelled) refuses the result instead.
            try:  # noqa: SIM105 - a try costs nothing here, contextlib.suppress a call
                token.set_result(entry_id if result_of is None else result_of(entry_id))
            except _ALREADY_SETTLED:
                pass  # cancelled by its owner
        self._lac = confirmed[-1].entry_id
        if self._on_settled is not None:
            self._on_settled(len(confirmed))
        if self._ctx.metrics is not None:
            self._ctx.metrics.confirmed_entries += len(confirmed)
        waiters = self._capacity_waiters
        while waiters and len(self._tracker) < self._config.max_outstanding_adds:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        timer = self._lac_timer
        if self._tracker.lac > self._lac_sent and (timer is None or not self._lac_soon):
            if self._idle_after(confirmed[-1]):
                # No add is left to carry this LAC: a tailing reader would wait the whole
                # delay (uvloop rounds it up to whole ms). Send it on the next loop turn,
                # after the callbacks this confirmation woke: an add one of them makes
                # carries the LAC instead (_lac_sent), and nothing extra goes out. A
                # delayed send already set (the writer was busy then) is brought forward.
                if timer is not None:
                    timer.cancel()
                self._lac_timer = self._loop.call_soon(self._send_explicit_lac)
                self._lac_soon = True
            elif timer is None:
                self._lac_timer = self._loop.call_later(
                    self._config.explicit_lac_delay_ms / 1000, self._send_explicit_lac
                )
                self._lac_soon = False

    def _idle_after(self, last: PendingAdd) -> bool:
        """Whether every add made so far is confirmed (queued ones have entry ids too),
        and no caller on another thread waits on the last confirmation (a synchronous
        ``add_entry`` loop adds again right after waking, but after this loop turn: an
        explicit LAC then would cost the bookies a request per entry and delay that next
        add). Confirmed adds may still wait for their last bookie (Qa < Qw): not counted."""
        tracker = self._tracker
        if tracker.lac != tracker.next_entry_id - 1:
            return False
        if not self._config.explicit_lac_at_once_when_idle:
            return False
        token = last.token
        if isinstance(token, BatchToken):
            token = token.future
        return not isinstance(token, concurrent.futures.Future)

    def _send_explicit_lac(self) -> None:
        """R4: tell the bookies the LAC when no add carried it, so tailing readers see it."""
        self._lac_timer = None
        lac = self._tracker.lac
        if self._failure is not None or lac <= self._lac_sent or self._close_result is not None:
            return  # once the close is written, its last entry is what readers learn
        self._lac_sent = lac
        for index, address in enumerate(self._writer.ensemble):
            if index in self._writer.failed_slots:
                continue
            request = WriteLacRequest(0, self.ledger_id, self._master_key, lac)
            self._pool.get(address).send(request, _ignore, self._config.add_timeout_ms)

    # ------------------------------------------------------------ effects

    def _step(self, event: WriterEvent) -> None:
        self._carry_out(self._writer.step(event))

    def _carry_out(self, effects: list[WriterEffect]) -> None:
        for effect in effects:
            if isinstance(effect, Confirm):
                self._complete(effect.entries)
            elif isinstance(effect, FailAdds):
                self._fail_adds(effect.entries, effect.error)
            elif isinstance(effect, HandleFailed):
                self._on_handle_failed()
            elif isinstance(effect, SendQueued):
                self._flush()
            elif isinstance(effect, ChooseBookies):
                self._spawn(self._choose_bookies(effect))
            elif isinstance(effect, UpdateMetadata):
                self._spawn(self._update_metadata(effect.decide))
            elif isinstance(effect, ReadMetadata):
                self._spawn(self._read_metadata(effect.delay_ms))
            elif isinstance(effect, Closed | CloseFailed):
                result = self._close_result
                if result is not None and not result.done():
                    if isinstance(effect, Closed):
                        result.set_result(None)
                    else:
                        result.set_exception(effect.error)

    def _fail_adds(self, entries: list[PendingAdd], error: BKError) -> None:
        delivered: BaseException = error if self._error_of is None else self._error_of(error)
        for pending in entries:
            token = pending.token
            if token is not None and not token.done():
                try:  # noqa: SIM105 - as in _complete
                    token.set_exception(delivered)
                except _ALREADY_SETTLED:
                    pass
        if self._on_settled is not None and entries:
            self._on_settled(len(entries))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail_on_bug(task.exception())  # type: ignore[arg-type]

    def _fail_on_bug(self, error: BaseException) -> None:
        """An error of the handle's own (an AssertionError, a TypeError: a bug, not a
        store's or a bookie's failure) is never retried or taken for a metadata outcome:
        the handle fails with it. Adds waiting and the close get the original error;
        later adds are refused with an error that names it."""
        log.error("ledger %d: internal error, the handle fails", self.ledger_id, exc_info=error)
        writer = self._writer
        if writer.failure is None:
            failure = BKError(f"ledger {self.ledger_id}: internal error: {error!r}")
            failure.__cause__ = error
            writer.failure = failure
        for pending in self._tracker.fail_all():
            token = pending.token
            if token is not None and not token.done():
                with contextlib.suppress(*_ALREADY_SETTLED):
                    token.set_exception(error)
        self._on_handle_failed()
        result = self._close_result
        if result is not None and not result.done():
            result.set_exception(error)

    def _on_handle_failed(self) -> None:
        for waiter in self._capacity_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._capacity_waiters.clear()
        if self._lac_timer is not None:
            self._lac_timer.cancel()
            self._lac_timer = None

    async def _choose_bookies(self, effect: ChooseBookies) -> None:
        failed = ", ".join(self._writer.ensemble[i] for i in effect.slots)
        refusal = f"ledger {self.ledger_id}: cannot replace bookie(s) {failed}"
        ctx = self._ctx
        self._step(
            await choose_replacements(
                ctx.registry,
                ctx.placement,
                effect,
                refusal,
                ensemble=self._writer.ensemble,
                write_quorum=self.metadata.write_quorum,
            )
        )

    async def _update_metadata(self, decide: Callable[[LedgerView], Decision]) -> None:
        """One read-decide-compare-and-set with the core's decision (R5, R6, R13)."""
        event: WriterEvent
        try:
            result = await self._ctx.ledgers.update(
                self.ledger_id,
                metadata_decider(decide),
                attempts=self._config.metadata_cas_retries,
                known=(self.metadata, self._metadata_version),
            )
        except STORE_FAILURES as exc:
            error = as_metadata_error(exc)
            event = MetadataRefused(error) if outcome_is_known(exc) else MetadataUnknown(error)
            if isinstance(event, MetadataUnknown):
                log.warning(
                    "ledger %d: metadata update outcome unknown, reading it again: %s",
                    self.ledger_id,
                    error.message,
                )
        else:
            self._adopt(result.metadata, result.version)
            event = MetadataStored(ledger_view(result.metadata))
        self._step(event)

    async def _read_metadata(self, delay_ms: int) -> None:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        event: WriterEvent
        try:
            metadata, version = await self._ctx.ledgers.read(self.ledger_id)
        except STORE_FAILURES as exc:
            event = MetadataReadFailed(as_metadata_error(exc))
        else:
            self._adopt(metadata, version)
            event = MetadataRead(ledger_view(metadata))
        self._step(event)

    def _adopt(self, metadata: LedgerMetadata, version: int) -> None:
        if metadata.ensembles != self.metadata.ensembles:
            if self._ctx.metrics is not None:
                self._ctx.metrics.ensemble_changes += 1
            log.info(
                "ledger %d: fragments now %s",
                self.ledger_id,
                "; ".join(f"{first}: {','.join(b)}" for first, b in metadata.ensembles),
            )
        self.metadata, self._metadata_version = metadata, version

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """R6: wait for outstanding adds, then record the ledger CLOSED at the LAC."""
        if self.metadata.is_closed:
            return
        if self._close_result is None:
            self._writer.begin_close()  # no more adds from here on
            outstanding = [
                _awaitable(p.token) for p in self._tracker.outstanding() if p.token is not None
            ]
            if outstanding:
                # asyncio.wait, not gather: a caller that gives up on the close (cancels
                # it) must leave the adds' futures alone; they belong to their owners.
                await asyncio.wait(outstanding)
            if self._lac_timer is not None:
                self._lac_timer.cancel()
                self._lac_timer = None
            if self._close_result is None:
                self._close_result = self._loop.create_future()
                self._step(CloseRequested())
        # The handle stays readable (up to the last entry) once closed.
        await asyncio.shield(self._close_result)


def _ignore(_: object) -> None:
    return


def _awaitable(token: AddToken) -> asyncio.Future[Any]:
    """What close() waits for: an add's token as an asyncio future."""
    future = token.future if isinstance(token, BatchToken) else token
    if isinstance(future, concurrent.futures.Future):
        return asyncio.wrap_future(future)
    return future  # type: ignore[return-value]
