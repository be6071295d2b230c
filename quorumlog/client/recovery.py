"""Ledger recovery: fence, find the last entry, re-replicate the tail, close (R7, R8).

Every decision is made by the pure state machine
:class:`~quorumlog.core.recovery.LedgerRecoveryMachine`: mark IN_RECOVERY, fence
the last fragment until enough bookies answered, read forward with fencing reads,
write each entry found back until Qa bookies have it (replacing a bookie that keeps
failing those recovery adds with an ensemble change), decide where the ledger
ends, close (and how to resolve metadata outcomes that are unknown, R13). This
class carries out its effects: it sends the requests, runs the metadata updates
and reads, and hands every answer back. Concurrent recoveries converge: the
compare-and-set lets one close, and the others adopt its result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from quorumlog.client.metadata_updates import (
    STORE_FAILURES,
    as_metadata_error,
    ledger_view,
    metadata_decider,
    outcome_is_known,
)
from quorumlog.client.placement import choose_replacements
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
from quorumlog.core.writer import BookiesChosen, ChooseBookies
from quorumlog.errors import BKError, Status
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    AddResponse,
    FenceRequest,
    FenceResponse,
    ReadFlag,
    ReadRequest,
    ReadResponse,
    Response,
)
from quorumlog.proto.entry import EntryCodec, master_key

if TYPE_CHECKING:
    from quorumlog.client.context import ClientContext

log = logging.getLogger(__name__)


class LedgerRecovery:
    def __init__(
        self,
        ctx: ClientContext,
        metadata: LedgerMetadata,
        version: int,
        password: bytes,
        *,
        key: bytes | None = None,
    ) -> None:
        """``key``: the ledger's master key, when its password is not known (a repair
        that got the key from a bookie): MAC digests are then not checked, the entries
        found are written back byte for byte all the same."""
        self._ctx = ctx
        self._pool = ctx.pool
        self._config = ctx.config
        self.metadata = metadata
        self.version = version
        if key is None:
            self._codec = EntryCodec(metadata.digest_type, password)
            self._master_key = master_key(password)
        else:
            self._codec = EntryCodec(metadata.digest_type, mac_unchecked=True)
            self._master_key = key
        self._machine = LedgerRecoveryMachine(
            metadata.ledger_id,
            metadata.ensemble_size,
            metadata.write_quorum,
            metadata.ack_quorum,
            ledger_view(metadata),
            reads_in_flight=self._config.recovery_reads_in_flight,
            rewrite_attempts=self._config.recovery_add_attempts,
            metadata_attempts=self._config.metadata_cas_retries,
        )
        self._result: asyncio.Future[Recovered] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    async def run(self) -> tuple[LedgerMetadata, int]:
        """Recover and close the ledger; returns its metadata (closed) and version.

        LedgerRecoveryError (the ledger stays unclosed) if an entry can be neither read
        nor declared missing, too few bookies can be fenced or rewritten to, or the
        metadata cannot be written.
        """
        if self.metadata.is_closed:
            return self.metadata, self.version
        metrics = self._ctx.metrics
        if metrics is not None:
            metrics.recoveries += 1
        self._result = asyncio.get_running_loop().create_future()
        self._carry_out(self._machine.start())
        try:
            recovered = await self._result
        finally:
            for task in self._tasks:
                task.cancel()
        if recovered.ran_to_close:
            if metrics is not None:
                metrics.recoveries_completed += 1
            last, found = recovered.view.last_entry_id, self._machine.last_entry_id
            if last == found:
                log.info("ledger %d: recovered and closed at entry %d", self.ledger_id, last)
            else:
                log.warning(
                    "ledger %d: closed by another recovery at %d; this one found %d",
                    self.ledger_id,
                    last,
                    found,
                )
        return self.metadata, self.version

    # ------------------------------------------------------------ effects

    def _step(self, event: RecoveryEvent) -> None:
        self._carry_out(self._machine.step(event))

    def _carry_out(self, effects: list[RecoveryEffect]) -> None:
        for effect in effects:
            if isinstance(effect, SendFence):
                for slot in effect.slots:
                    self._send(
                        slot,
                        FenceRequest(0, self.ledger_id, self._master_key),
                        partial(self._on_fenced, slot),
                        self._config.fence_timeout_ms,
                    )
            elif isinstance(effect, SendRecoveryRead):
                entry_id = effect.entry_id
                for slot in effect.slots:
                    request = ReadRequest(
                        0, self.ledger_id, entry_id, 1, ReadFlag.FENCE, master_key=self._master_key
                    )
                    self._send(
                        slot,
                        request,
                        partial(self._on_read, entry_id, slot),
                        self._config.read_timeout_ms,
                    )
            elif isinstance(effect, SendRewrite):
                entry_id = effect.entry_id
                for slot in effect.slots:
                    add = AddRequest(
                        0, self.ledger_id, self._master_key, [effect.blob], AddFlag.RECOVERY
                    )
                    address = self._machine.write_ensemble[slot]
                    self._pool.get(address).send(
                        add,
                        partial(self._on_rewritten, entry_id, slot, address),
                        self._config.add_timeout_ms,
                    )
            elif isinstance(effect, ChooseBookies):
                self._spawn(self._choose_bookies(effect))
            elif isinstance(effect, UpdateMetadata):
                self._spawn(self._update_metadata(effect.decide))
            elif isinstance(effect, ReadMetadata):
                self._spawn(self._read_metadata(effect.delay_ms))
            elif isinstance(effect, ReadLength):
                self._spawn(self._read_length(effect))
            elif self._result is not None and not self._result.done():
                if isinstance(effect, Recovered):
                    self._result.set_result(effect)
                else:
                    assert isinstance(effect, RecoveryFailed)
                    self._result.set_exception(effect.error)

    def _send(
        self,
        slot: int,
        request: FenceRequest | ReadRequest | AddRequest,
        callback: Callable[[Response | BKError], None],
        timeout_ms: float,
    ) -> None:
        self._pool.get(self._machine.ensemble[slot]).send(request, callback, timeout_ms)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """A step that raised is a bug of the recovery's own (store and bookie failures
        are events): the recovery fails with the original error, never hangs."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("ledger %d: internal error, the recovery fails", self.ledger_id, exc_info=error)
        if self._result is not None and not self._result.done():
            self._result.set_exception(error)  # type: ignore[arg-type]

    # ------------------------------------------------------------ answers

    def _on_fenced(self, slot: int, answer: Response | BKError) -> None:
        if isinstance(answer, FenceResponse):
            event = FenceAnswered(slot, answer.status, answer.lac, f"status {answer.status}")
        else:
            event = FenceAnswered(slot, *_failure(answer))
        self._step(event)

    def _on_read(self, entry_id: int, slot: int, answer: Response | BKError) -> None:
        if not isinstance(answer, ReadResponse):
            status, message = _failure(answer)[::2]
            self._step(EntryRead(entry_id, slot, status, message=message))
            return
        if answer.status != Status.OK or not answer.entries:
            self._step(EntryRead(entry_id, slot, answer.status or Status.IO_ERROR))
            return
        blob = answer.entries[0]
        try:
            decoded = self._codec.decode(blob, self.ledger_id, entry_id)
        except BKError as exc:  # a damaged copy is unknown, never absent (R9)
            self._step(EntryRead(entry_id, slot, Status.IO_ERROR, message=exc.message))
            return
        self._step(EntryRead(entry_id, slot, Status.OK, blob, decoded.length))

    def _on_rewritten(
        self, entry_id: int, slot: int, address: str, answer: Response | BKError
    ) -> None:
        if isinstance(answer, AddResponse):
            status, message = answer.status, f"status {answer.status}"
        else:
            status, message = _failure(answer)[::2]
        self._step(EntryRewritten(entry_id, slot, status, message, bookie=address))

    async def _choose_bookies(self, effect: ChooseBookies) -> None:
        """Replacements for bookies that keep failing recovery adds, from the writable
        bookies the registry lists (the placement policy's choice, as for a writer)."""
        ctx = self._ctx
        failed = ", ".join(self._machine.write_ensemble[i] for i in effect.slots)
        refusal = f"ledger {self.ledger_id}: recovery cannot replace bookie(s) {failed}"
        event = await choose_replacements(
            ctx.registry,
            ctx.placement,
            effect,
            refusal,
            ensemble=self._machine.write_ensemble,
            write_quorum=self.metadata.write_quorum,
        )
        if isinstance(event, BookiesChosen):
            log.warning(
                "ledger %d: recovery replaces bookie(s) %s with %s",
                self.ledger_id,
                failed,
                ", ".join(event.bookies),
            )
        self._step(event)

    # ------------------------------------------------------------ metadata and length

    async def _update_metadata(self, decide: Callable[[LedgerView], Decision]) -> None:
        try:
            result = await self._ctx.ledgers.update(
                self.ledger_id,
                metadata_decider(decide),
                attempts=self._config.metadata_cas_retries,
                known=(self.metadata, self.version),
            )
        except STORE_FAILURES as exc:
            error = as_metadata_error(exc)
            known = outcome_is_known(exc)
            if not known:
                log.warning(
                    "ledger %d: metadata update outcome unknown, reading it again: %s",
                    self.ledger_id,
                    error.message,
                )
            self._step(MetadataRefused(error) if known else MetadataUnknown(error))
            return
        self.metadata, self.version = result.metadata, result.version
        self._step(MetadataStored(ledger_view(result.metadata)))

    async def _read_metadata(self, delay_ms: int) -> None:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        try:
            metadata, version = await self._ctx.ledgers.read(self.ledger_id)
        except STORE_FAILURES as exc:
            self._step(MetadataReadFailed(as_metadata_error(exc)))
            return
        self.metadata, self.version = metadata, version
        self._step(MetadataRead(ledger_view(metadata)))

    async def _read_length(self, effect: ReadLength) -> None:
        """The ledger length a confirmed entry records, from whichever replica serves it
        intact (it sits on Qa bookies: R4)."""
        for address in effect.bookies:
            try:
                answer = await self._pool.request(
                    address,
                    ReadRequest(0, self.ledger_id, effect.entry_id, 1),
                    self._config.read_timeout_ms,
                )
            except BKError:
                continue
            if isinstance(answer, ReadResponse) and answer.status == Status.OK and answer.entries:
                try:
                    decoded = self._codec.decode(answer.entries[0], self.ledger_id, effect.entry_id)
                except BKError:
                    continue
                self._step(LengthRead(decoded.length))
                return
        self._step(LengthRead(None))


def _failure(answer: Response | BKError) -> tuple[int, int, str]:
    """(status, LAC, message) for an answer that is an error, or of the wrong kind."""
    if isinstance(answer, BKError):
        status = int(answer.status) if answer.status != Status.OK else int(Status.IO_ERROR)
        return status, -1, answer.message
    return int(Status.BAD_REQUEST), -1, f"a {type(answer).__name__} answer"
