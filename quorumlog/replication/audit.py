"""Ledger audit: is every entry of a ledger stored, intact, on every bookie of its write set?

The first step of auto-recovery: find what is missing or damaged before
anything is re-replicated. The audit asks each bookie of each fragment directly
for the entries of that bookie's write sets (R1), in batched READ requests,
several in flight per bookie, and checks every copy it gets back against the
entry digest. It changes nothing: it never fences (no recovery open, no FENCE
flag), so a writer of an open ledger carries on undisturbed; an open ledger is
audited up to the last add confirmed the bookies know of (R4).

Every request has a timeout. A bookie that cannot be reached, or does not answer
in time, is listed as unreachable and every entry it should hold and was not
yet checked counts as a missing replica, so an audit always ends, in about one
request timeout past the time its reads take.

Example::

    from quorumlog.aio import BookKeeper
    from quorumlog.replication import audit_ledger

    async with await BookKeeper.connect() as bk:
        audit = await audit_ledger(bk, 42)
        if not audit.healthy:
            print(audit.summary())
        row = audit.to_dict()  # plain JSON values, lists cut to 100 items
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from quorumlog.client.bookkeeper import check_password, password_fits
from quorumlog.errors import (
    BKError,
    DigestMismatchError,
    InvalidArgumentError,
    MetadataError,
    Status,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import (
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
)
from quorumlog.proto.entry import EntryCodec
from quorumlog.replication.plan import slot_runs
from quorumlog.replication.report import LedgerAudit, digest_reason, status_name

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper


ENTRIES_PER_READ_DEFAULT = 1_000
# Per bookie. With batches of up to read_batch_max_bytes, this also bounds the bytes
# one audit holds in flight per bookie (8 x 1 MiB by default).
READS_IN_FLIGHT_DEFAULT = 8


async def audit_ledger(
    bk: BookKeeper,
    ledger_id: int,
    *,
    password: bytes = b"",
    any_password: bool = False,
    entries_per_read: int = ENTRIES_PER_READ_DEFAULT,
    reads_in_flight: int = READS_IN_FLIGHT_DEFAULT,
    request_timeout_ms: int | None = None,
) -> LedgerAudit:
    """Check every replica of ledger ``ledger_id``'s entries 0..last (closed) or
    0..LAC (open), reading each bookie directly; never fences.

    ``password`` is needed for MAC digests (and must match the ledger's, else
    UnauthorizedError); with ``any_password`` (the auditor's way: it audits every
    ledger), a ledger whose password is another is audited without checking MAC
    digests (other digests need no password). ``request_timeout_ms`` (default: the client's
    ``read_timeout_ms``) bounds each request; a bookie that does not answer in time
    is unreachable. Raises NoSuchLedgerError for an unknown ledger and
    MetadataError when its metadata cannot be read; bookie failures are results,
    never exceptions.
    """
    if entries_per_read < 1 or reads_in_flight < 1:
        raise InvalidArgumentError(
            f"ledger {ledger_id}: entries_per_read and reads_in_flight must be at least 1"
        )
    started = time.monotonic()
    timeout_ms = request_timeout_ms or bk.config.read_timeout_ms
    metadata = await _read_metadata(bk, ledger_id)
    if not any_password:
        check_password(metadata, password)
    codec = (
        EntryCodec(metadata.digest_type, password)
        if password_fits(metadata, password)
        else EntryCodec(metadata.digest_type, mac_unchecked=True)
    )
    run = _AuditRun(bk, metadata, codec, entries_per_read, reads_in_flight, timeout_ms)
    if metadata.is_closed:
        last = metadata.last_entry_id
    else:
        last = await run.learn_lac()
        # An ensemble change or a close between the two reads would put entries up to
        # that LAC in fragments the first read did not have. Metadata only moves
        # forward, so the second read describes every entry up to the LAC.
        metadata = await _read_metadata(bk, ledger_id)
        if metadata.is_closed:
            last = metadata.last_entry_id
        run.metadata = metadata
    await run.check_entries(last)
    entries = last + 1
    return LedgerAudit(
        ledger_id=ledger_id,
        closed=metadata.is_closed,
        state=metadata.state.value,
        last_entry_id=last,
        entries_checked=entries,
        replicas_checked=entries * metadata.write_quorum,
        missing=sorted(run.missing),
        damaged=sorted(run.damaged),
        unreachable_bookies=sorted(run.unreachable),
        unreachable_reasons=dict(sorted(run.unreachable.items())),
        ensemble_size=metadata.ensemble_size,
        write_quorum=metadata.write_quorum,
        ack_quorum=metadata.ack_quorum,
        fragments=len(metadata.ensembles),
        elapsed_ms=(time.monotonic() - started) * 1000,
    )


async def _read_metadata(bk: BookKeeper, ledger_id: int) -> LedgerMetadata:
    timeout_s = bk.config.metadata_session_timeout_ms / 1000
    try:
        metadata, _ = await asyncio.wait_for(bk.ledgers.read(ledger_id), timeout_s)
    except TimeoutError:
        raise MetadataError(
            f"ledger {ledger_id}: metadata not read within {timeout_s:.1f} s"
        ) from None
    return metadata


def _segments(
    metadata: LedgerMetadata, bookie: str, last: int, entries_per_read: int
) -> Iterator[tuple[int, int]]:
    """(first, last) ranges of consecutive entries ``bookie`` must hold, in order.

    A READ stops at the first entry a bookie lacks, so each request asks for one run
    of entries the bookie holds (see :func:`~quorumlog.replication.plan.slot_runs`),
    cut to ``entries_per_read``.
    """
    size, quorum = metadata.ensemble_size, metadata.write_quorum
    for frag_first, frag_last, ensemble in metadata.fragment_bounds():
        hi = last if frag_last is None else min(last, frag_last)
        for index in (i for i, address in enumerate(ensemble) if address == bookie):
            for run_first, run_last in slot_runs(index, size, quorum, frag_first, hi):
                for first in range(run_first, run_last + 1, entries_per_read):
                    yield first, min(run_last, first + entries_per_read - 1)


class _AuditRun:
    """The state of one audit: what each bookie holds, and who did not answer."""

    def __init__(
        self,
        bk: BookKeeper,
        metadata: LedgerMetadata,
        codec: EntryCodec,
        entries_per_read: int,
        reads_in_flight: int,
        timeout_ms: int,
    ) -> None:
        self._pool = bk.pool
        self._max_bytes = bk.config.read_batch_max_bytes
        self.metadata = metadata
        self._ledger_id = metadata.ledger_id
        self._codec = codec
        self._entries_per_read = entries_per_read
        self._reads_in_flight = reads_in_flight
        self._timeout_ms = timeout_ms
        self.missing: list[tuple[int, str]] = []
        self.damaged: list[tuple[int, str, str]] = []
        self.unreachable: dict[str, str] = {}

    def _mark_unreachable(self, bookie: str, reason: str) -> None:
        self.unreachable.setdefault(bookie, reason)

    # ------------------------------------------------------------ the LAC of an open ledger

    async def learn_lac(self) -> int:
        """The largest LAC the last fragment's bookies report (READ_LAC, which never
        fences). Entries before the last fragment are confirmed (R5), so the result is
        at least the entry before it, even if no bookie answers."""
        md = self.metadata
        floor = md.last_fragment_first_entry - 1
        ensemble = md.last_ensemble
        futures = [
            self._pool.request(address, ReadLacRequest(0, self._ledger_id), self._timeout_ms)
            for address in ensemble
        ]
        answers = await asyncio.gather(*futures, return_exceptions=True)
        lac = floor
        for address, answer in zip(ensemble, answers, strict=True):
            if isinstance(answer, BKError):
                self._mark_unreachable(address, answer.message)
            elif isinstance(answer, BaseException):
                raise answer
            elif not isinstance(answer, ReadLacResponse):
                self._mark_unreachable(address, f"answered READ_LAC with {type(answer).__name__}")
            elif answer.status == Status.OK:
                lac = max(lac, answer.lac)
            elif answer.status not in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY):
                self._mark_unreachable(
                    address, f"answered READ_LAC with {status_name(answer.status)}"
                )
        return lac

    # ------------------------------------------------------------ entries

    async def check_entries(self, last: int) -> None:
        if last < 0:
            return
        loop = asyncio.get_running_loop()
        checks = [
            _BookieCheck(
                self,
                bookie,
                _segments(self.metadata, bookie, last, self._entries_per_read),
                loop,
            )
            for bookie in sorted(self.metadata.all_bookies())
        ]
        for check in checks:
            check.start(self._reads_in_flight)
        await asyncio.gather(*(check.done for check in checks))

    def request_read(
        self, bookie: str, first: int, last: int, callback: Callable[[Response | BKError], None]
    ) -> None:
        request = ReadRequest(
            0, self._ledger_id, first, last - first + 1, max_bytes=self._max_bytes
        )
        self._pool.get(bookie).send(request, callback, self._timeout_ms)

    def settle(self, bookie: str, first: int, last: int, answer: Response | BKError) -> int:
        """Record what ``answer`` (to a READ of ``first..last``) says; returns the next
        entry id to ask for (at least ``first + 1`` unless the bookie turned unreachable)."""
        if isinstance(answer, BKError):
            self._mark_unreachable(bookie, answer.message)
            return first
        if not isinstance(answer, ReadResponse):
            self._mark_unreachable(bookie, f"answered READ with {type(answer).__name__}")
            return first
        status = answer.status
        if status == Status.OK and answer.entries:
            return self._verify(bookie, first, answer.entries[: last - first + 1])
        if status == Status.OK or status == Status.NO_SUCH_ENTRY:
            self.missing.append((first, bookie))
            return first + 1
        if status == Status.NO_SUCH_LEDGER:
            # The bookie knows nothing of the ledger: none of this range is there.
            self.missing_range(bookie, first, last)
            return last + 1
        if status == Status.IO_ERROR:
            # R9: a bookie that finds a damaged record answers an I/O error.
            self.damaged.append((first, bookie, "bookie could not read it (I/O error)"))
            return first + 1
        self._mark_unreachable(bookie, f"answered READ with {status_name(answer.status)}")
        return first

    def _verify(self, bookie: str, first: int, blobs: list[bytes]) -> int:
        """Check each copy against the entry digest; returns the next entry id to ask for."""
        decode = self._codec.decode
        ledger_id = self._ledger_id
        entry_id = first
        for blob in blobs:
            try:
                decode(blob, ledger_id, entry_id)
            except DigestMismatchError as exc:
                self.damaged.append((entry_id, bookie, digest_reason(exc, ledger_id, entry_id)))
            entry_id += 1
        return entry_id

    def missing_range(self, bookie: str, first: int, last: int) -> None:
        self.missing.extend((entry_id, bookie) for entry_id in range(first, last + 1))


class _BookieCheck:
    """Keeps up to ``limit`` READs in flight to one bookie until its ranges are settled.

    Driven by connection callbacks, with no task or future per request: a striped
    ledger needs one request per run of Qw entries, so per-request cost is what
    bounds the audit's speed.
    """

    def __init__(
        self,
        run: _AuditRun,
        bookie: str,
        segments: Iterator[tuple[int, int]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._run = run
        self._bookie = bookie
        self._segments = segments
        self._in_flight = 0
        self.done: asyncio.Future[None] = loop.create_future()

    def start(self, limit: int) -> None:
        if self._bookie in self._run.unreachable:  # it failed to answer READ_LAC already
            self._give_up()
        else:
            for _ in range(limit):
                if not self._send_next():
                    break
        self._finish_if_idle()

    def _give_up(self) -> None:
        # Whatever was not settled is a replica nobody could check: missing.
        for first, last in self._segments:
            self._run.missing_range(self._bookie, first, last)

    def _send_next(self) -> bool:
        segment = next(self._segments, None)
        if segment is None:
            return False
        self._send(*segment)
        return True

    def _send(self, first: int, last: int) -> None:
        self._in_flight += 1

        def on_answer(answer: Response | BKError) -> None:
            self._on_answer(first, last, answer)

        self._run.request_read(self._bookie, first, last, on_answer)

    def _on_answer(self, first: int, last: int, answer: Response | BKError) -> None:
        self._in_flight -= 1
        try:
            next_id = self._run.settle(self._bookie, first, last, answer)
            if self._bookie in self._run.unreachable:
                self._run.missing_range(self._bookie, next_id, last)
                self._give_up()
            elif next_id <= last:
                self._send(next_id, last)
            else:
                self._send_next()
        except Exception as exc:  # a bug here must end the audit, not leave it waiting
            if not self.done.done():
                self.done.set_exception(exc)
            return
        self._finish_if_idle()

    def _finish_if_idle(self) -> None:
        if self._in_flight == 0 and not self.done.done():
            self.done.set_result(None)
