"""Ledger recovery: fence, find the last entry, re-replicate the tail, close (R7, R8).

1. Mark the ledger IN_RECOVERY with a compare-and-set (a writer's ensemble
   change or close now fails, R5/R6).
2. Fence the bookies of the last fragment until (Qw - Qa) + 1 bookies of every
   write set answered, keeping the largest LAC they report.
3. From after that LAC (and never before the last fragment), read entry by
   entry with fencing reads; write each entry found to its whole write set
   with recovery adds. An entry is missing only when enough bookies say so
   explicitly; an error or timeout stops recovery without closing.
4. Close at the last entry recovered. Concurrent recoveries converge: the
   compare-and-set lets one win and the others adopt its result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from quorumlog.core.quorum import write_set
from quorumlog.core.recovery import (
    EntryRecoveryRead,
    FenceProgress,
    ReadOutcome,
    first_entry_to_recover,
)
from quorumlog.errors import (
    BKError,
    DigestMismatchError,
    LedgerRecoveryError,
    Status,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.meta.ledgers import Done
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    FenceRequest,
    FenceResponse,
    ReadFlag,
    ReadRequest,
    ReadResponse,
)
from quorumlog.proto.entry import EntryCodec

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper

log = logging.getLogger(__name__)


class LedgerRecovery:
    def __init__(
        self, client: BookKeeper, metadata: LedgerMetadata, version: int, password: bytes
    ) -> None:
        from quorumlog.proto.entry import master_key

        self._client = client
        self._pool = client.pool
        self._config = client.config
        self.metadata = metadata
        self.version = version
        self._codec = EntryCodec(metadata.digest_type, password)
        self._master_key = master_key(password)

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    async def run(self) -> tuple[LedgerMetadata, int]:
        if self.metadata.is_closed:
            return self.metadata, self.version
        metrics = self._client.metrics
        if metrics is not None:
            metrics.recoveries += 1
        if not await self._mark_in_recovery():
            return self.metadata, self.version  # someone closed it meanwhile
        max_lac = await self._fence()
        md = self.metadata
        start = first_entry_to_recover(max_lac, md.last_fragment_first_entry)
        last_entry_id, length = await self._recover_from(start)
        closed = await self._close(last_entry_id, length)
        if metrics is not None:
            metrics.recoveries_completed += 1
        return closed

    # ------------------------------------------------------------ step 1

    async def _mark_in_recovery(self) -> bool:
        """False if the ledger is closed (nothing to recover), else True once IN_RECOVERY."""

        def decide(md: LedgerMetadata) -> LedgerMetadata | Done[None]:
            if md.is_closed or md.state is LedgerState.IN_RECOVERY:
                return Done(None)
            return dataclasses.replace(md, state=LedgerState.IN_RECOVERY)

        result = await self._client.ledgers.update(
            self.ledger_id,
            decide,
            attempts=self._config.metadata_cas_retries,
            known=(self.metadata, self.version),
        )
        self.metadata, self.version = result.metadata, result.version
        return not result.metadata.is_closed

    # ------------------------------------------------------------ step 2

    async def _fence(self) -> int:
        md = self.metadata
        ensemble = md.last_ensemble
        progress = FenceProgress(md.ensemble_size, md.write_quorum, md.ack_quorum)
        futures = {
            self._pool.request(
                address,
                FenceRequest(0, self.ledger_id, self._master_key),
                self._config.fence_timeout_ms,
            ): index
            for index, address in enumerate(ensemble)
        }
        pending = set(futures)
        errors: list[str] = []
        while pending and not progress.is_fenced:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in [f for f in futures if f in done]:  # in send order
                index = futures[future]
                try:
                    response = future.result()
                except BKError as exc:
                    progress.on_failed(index)
                    errors.append(exc.message)
                    continue
                if not isinstance(response, FenceResponse):  # a stand-in pool's (R12)
                    progress.on_failed(index)
                    errors.append(f"bookie {ensemble[index]}: a {type(response).__name__}")
                    continue
                if response.status == Status.OK:
                    progress.on_fenced(index, response.lac)
                elif response.status == Status.UNAUTHORIZED:
                    raise UnauthorizedError(
                        f"ledger {self.ledger_id}: bookie {ensemble[index]} refused the password"
                    )
                else:
                    progress.on_failed(index)
                    errors.append(f"bookie {ensemble[index]}: status {response.status}")
            if progress.is_hopeless:
                break
        if not progress.is_fenced:
            raise LedgerRecoveryError(
                f"ledger {self.ledger_id}: could not fence enough bookies of "
                f"{', '.join(ensemble)}: {'; '.join(errors) or 'no answer'}"
            )
        return progress.max_lac

    # ------------------------------------------------------------ step 3

    async def _recover_from(self, start: int) -> tuple[int, int]:
        """Read forward from ``start``; returns (last entry id, ledger length)."""
        window = max(1, self._config.recovery_reads_in_flight)
        last_entry_id = start - 1
        length = await self._length_at(last_entry_id)
        next_to_read = start
        reads: dict[int, asyncio.Task[tuple[ReadOutcome, bytes | None]]] = {}
        rewrites: list[asyncio.Future[None]] = []
        try:
            while True:
                while len(reads) < window:
                    reads[next_to_read] = asyncio.ensure_future(self._recovery_read(next_to_read))
                    next_to_read += 1
                entry_id = last_entry_id + 1
                outcome, blob = await reads.pop(entry_id)
                if outcome is ReadOutcome.MISSING:
                    break
                if outcome is not ReadOutcome.FOUND or blob is None:
                    raise LedgerRecoveryError(
                        f"ledger {self.ledger_id}: entry {entry_id} is neither readable nor "
                        "known missing (bookies failed or returned damaged data); "
                        "the ledger stays open for a later recovery"
                    )
                decoded = self._codec.decode(blob, self.ledger_id, entry_id)
                rewrites.append(asyncio.ensure_future(self._rewrite(entry_id, blob)))
                last_entry_id, length = entry_id, decoded.length
        finally:
            for task in reads.values():
                task.cancel()
            # Every rewrite must have finished (or failed) before the ledger may close.
            rewritten = await asyncio.gather(*rewrites, return_exceptions=True)
        for result in rewritten:
            if isinstance(result, BaseException):
                raise result
        return last_entry_id, length

    async def _length_at(self, entry_id: int) -> int:
        if entry_id < 0:
            return 0
        # A confirmed entry (at or below a LAC) sits on Qa bookies: read its header for
        # the ledger length from whichever replica serves it intact.
        md = self.metadata
        ensemble = md.ensemble_for(entry_id)
        for index in write_set(entry_id, md.ensemble_size, md.write_quorum):
            try:
                response = await self._pool.request(
                    ensemble[index],
                    ReadRequest(0, self.ledger_id, entry_id, 1),
                    self._config.read_timeout_ms,
                )
            except BKError:
                continue
            if isinstance(response, ReadResponse) and response.status == Status.OK:
                try:
                    return self._codec.decode(response.entries[0], self.ledger_id, entry_id).length
                except (DigestMismatchError, IndexError):
                    continue
        raise LedgerRecoveryError(
            f"ledger {self.ledger_id}: cannot read confirmed entry {entry_id} to learn the length"
        )

    async def _recovery_read(self, entry_id: int) -> tuple[ReadOutcome, bytes | None]:
        md = self.metadata
        ensemble = md.last_ensemble
        decision = EntryRecoveryRead(md.write_quorum, md.ack_quorum)
        futures = {
            self._pool.request(
                ensemble[index],
                ReadRequest(
                    0, self.ledger_id, entry_id, 1, ReadFlag.FENCE, master_key=self._master_key
                ),
                self._config.read_timeout_ms,
            ): index
            for index in write_set(entry_id, md.ensemble_size, md.write_quorum)
        }
        pending = set(futures)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in [f for f in futures if f in done]:  # in send order
                index = futures[future]
                try:
                    response = future.result()
                except BKError:
                    decision.on_unknown(index)
                    continue
                if not isinstance(response, ReadResponse):  # a stand-in pool's (R12)
                    decision.on_unknown(index)
                    continue
                if response.status == Status.OK and response.entries:
                    blob = response.entries[0]
                    try:
                        self._codec.decode(blob, self.ledger_id, entry_id)
                    except DigestMismatchError:
                        decision.on_unknown(index)  # R9: damaged is not absent
                        continue
                    decision.on_found(blob)
                elif response.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
                    decision.on_missing(index)
                elif response.status == Status.UNAUTHORIZED:
                    raise UnauthorizedError(
                        f"ledger {self.ledger_id}: bookie {ensemble[index]} refused the password"
                    )
                else:
                    decision.on_unknown(index)
            outcome = decision.outcome
            if outcome is not ReadOutcome.WAIT:
                return outcome, decision.found
        return decision.outcome, decision.found

    async def _rewrite(self, entry_id: int, blob: bytes) -> None:
        """Write a recovered entry to its whole write set; Qa acknowledgements suffice.

        A bookie that fails to answer is asked again (a few times): the entry must
        reach Qa bookies before the ledger may close at or beyond it.
        """
        md = self.metadata
        ensemble = md.last_ensemble
        waiting = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]
        acked = 0
        errors: list[str] = []
        for _ in range(self._config.recovery_add_attempts):
            futures = {
                self._pool.request(
                    address,
                    AddRequest(0, self.ledger_id, self._master_key, [blob], AddFlag.RECOVERY),
                    self._config.add_timeout_ms,
                ): address
                for address in waiting
            }
            results = await asyncio.gather(*futures, return_exceptions=True)
            waiting = []
            for (_, address), result in zip(futures.items(), results, strict=True):
                if isinstance(result, BKError):
                    errors.append(result.message)
                    waiting.append(address)
                elif isinstance(result, BaseException):
                    raise result
                elif result.status == Status.OK:
                    acked += 1
                else:
                    errors.append(f"bookie {address}: status {result.status}")
                    waiting.append(address)
            if acked >= md.ack_quorum:
                return
        raise LedgerRecoveryError(
            f"ledger {self.ledger_id}: could not re-replicate entry {entry_id} to "
            f"{md.ack_quorum} bookies: {'; '.join(errors[-3:])}"
        )

    # ------------------------------------------------------------ step 4

    async def _close(self, last_entry_id: int, length: int) -> tuple[LedgerMetadata, int]:
        def decide(md: LedgerMetadata) -> LedgerMetadata | Done[None]:
            if md.is_closed:  # another recovery closed it: concurrent recoveries converge
                return Done(None)
            return dataclasses.replace(
                md, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
            )

        result = await self._client.ledgers.update(
            self.ledger_id,
            decide,
            attempts=self._config.metadata_cas_retries,
            known=(self.metadata, self.version),
        )
        md = self.metadata = result.metadata
        self.version = result.version
        if result.written:
            log.info("ledger %d: recovered and closed at entry %d", self.ledger_id, last_entry_id)
        elif md.last_entry_id != last_entry_id:
            log.warning(
                "ledger %d: closed by another recovery at %d; this one found %d",
                self.ledger_id,
                md.last_entry_id,
                last_entry_id,
            )
        return md, self.version
