"""Copying one fragment's share of a lost bookie to its replacement.

Every entry of the fragment whose write set holds the lost bookie's index (R1) is
read from the other replicas of its write set, each copy checked against the entry
digest (a damaged copy is skipped for another one, R9), and the stored blob is
written unchanged, byte for byte, to the replacement with recovery adds (the
ledger's master key, R10; accepted even if the ledger is fenced, R7). Reads and
adds are pipelined, a bounded number of chunks in flight, and the replacement
acknowledges only what it has made durable (R2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from quorumlog.core.quorum import stores_entry, write_set
from quorumlog.errors import (
    BKError,
    DigestMismatchError,
    NoSuchLedgerError,
    Status,
    UnauthorizedError,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.codec import AddFlag, AddRequest, AddResponse, ReadRequest, ReadResponse
from quorumlog.proto.entry import ENTRY_HEADER_SIZE, EntryCodec
from quorumlog.replication.plan import Fragment, slot_runs
from quorumlog.replication.report import FragmentReplication, digest_reason, status_name
from quorumlog.replication.throttle import CopyThrottle

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig


# A chunk is the unit of the copy pipeline: read from the replicas, then one or a
# few ADD frames to the replacement. Its size is bounded in entries and, with the
# average entry size seen so far, in bytes; ``copies_in_flight`` chunks at most are
# held at once, which bounds the memory of a run (8 x 1 MiB by default).
ENTRIES_PER_CHUNK_DEFAULT = 1_000
CHUNK_BYTES_DEFAULT = 1 << 20
COPIES_IN_FLIGHT_DEFAULT = 8
# Before any entry size is known (an open ledger has no length yet).
_FIRST_CHUNK_ENTRIES_UNKNOWN_SIZE = 64


class RereplicationError(BKError):
    """A fragment could not be re-replicated (e.g. no intact copy of an entry is left)."""


class EntriesLostError(RereplicationError):
    """No copy of an entry is left anywhere: every other bookie of its write set said it
    has none, or is gone (registered neither writable nor read-only). Trying again
    cannot help; the ledger is reported lost (docs/OPERATIONS.md)."""


class ReplacementFailed(BKError):
    """The replacement bookie failed mid-copy: try another one."""


class CopyRun(Protocol):
    """What a copier needs of the run it belongs to: its client, its limits, and the
    bookies found down so far (shared by every copy of the run, and added to)."""

    bk: BookKeeper
    config: ClientConfig
    lost: str
    copies_in_flight: int
    entries_per_chunk: int
    chunk_bytes: int
    # Replicas that failed to answer: not asked again during the run.
    down: dict[str, str]
    # The copy rate's bound, shared by everything the worker copies.
    throttle: CopyThrottle


async def all_or_cancel(coroutines: Sequence[Any]) -> None:
    """Run coroutines together; if one raises, cancel the others and raise."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class FragmentCopier:
    """Copies the entries one fragment's lost index held to ``target``.

    ``copies_in_flight`` workers take chunks in turn; each reads its chunk from the
    surviving replicas (verifying every copy) and sends it to the target as recovery
    adds, then takes the next chunk. A failure of the target raises
    ReplacementFailed; an entry without any intact copy raises RereplicationError.
    """

    def __init__(
        self,
        run: CopyRun,
        md: LedgerMetadata,
        fragment: Fragment,
        codec: EntryCodec,
        key: bytes,
        target: str,
        out: FragmentReplication,
    ) -> None:
        assert fragment.last is not None
        self._run = run
        self._pool = run.bk.pool
        self._config = run.config
        self._md = md
        self._ledger_id = md.ledger_id
        self._fragment = fragment
        self._codec = codec
        self._key = key
        self._target = target
        self._out = out
        self._rotation = 0
        # Per entry, the replicas that said they hold none of it.
        self._absent: dict[int, set[str]] = {}
        # Average blob size for chunk sizing; the ledger length gives a first guess.
        overhead = ENTRY_HEADER_SIZE + md.digest_type.digest_size
        if md.is_closed and md.last_entry_id >= 0 and md.length > 0:
            self._seen_entries, self._seen_bytes = (
                md.last_entry_id + 1,
                md.length + (md.last_entry_id + 1) * overhead,
            )
        else:
            self._seen_entries, self._seen_bytes = 0, 0

    async def run(self) -> None:
        chunks = self._chunks()
        workers = [self._worker(chunks) for _ in range(self._run.copies_in_flight)]
        await all_or_cancel(workers)

    async def _worker(self, chunks: Iterator[list[tuple[int, int]]]) -> None:
        # The generator is shared: next() never awaits, so each chunk goes to one worker.
        for chunk in chunks:
            blobs = await self._read_chunk(chunk)
            size = sum(map(len, blobs))
            await self._run.throttle.take(size)
            await self._write(blobs)
            self._out.entries_copied += len(blobs)
            self._out.bytes_copied += size
            self._seen_entries += len(blobs)
            self._seen_bytes += size

    def _chunk_entries(self) -> int:
        if self._seen_entries == 0:
            return min(self._run.entries_per_chunk, _FIRST_CHUNK_ENTRIES_UNKNOWN_SIZE)
        average = max(1, self._seen_bytes // self._seen_entries)
        return max(1, min(self._run.entries_per_chunk, self._run.chunk_bytes // average))

    def _chunks(self) -> Iterator[list[tuple[int, int]]]:
        """Chunks of runs (first, last), in entry order, sized as entries are seen."""
        md, fragment = self._md, self._fragment
        assert fragment.last is not None
        chunk: list[tuple[int, int]] = []
        count = 0
        for first, last in slot_runs(
            fragment.index, md.ensemble_size, md.write_quorum, fragment.first, fragment.last
        ):
            while first <= last:
                limit = self._chunk_entries()
                take = max(1, min(last - first + 1, limit - count))
                chunk.append((first, first + take - 1))
                count += take
                first += take
                if count >= limit:
                    yield chunk
                    chunk, count = [], 0
        if chunk:
            yield chunk

    # ------------------------------------------------------------ reading

    def _replicas(self, entry_id: int) -> list[int]:
        """Ensemble indexes holding ``entry_id``, other than the lost one's."""
        md = self._md
        return [
            i
            for i in write_set(entry_id, md.ensemble_size, md.write_quorum)
            if i != self._fragment.index and self._fragment.ensemble[i] != self._run.lost
        ]

    def _choose_replica(self, first: int, last: int, failed: set[str]) -> str | None:
        """The replica of ``first`` to ask for ``first..last``: among those that did not
        fail it and are not down, the one holding the longest prefix of the run (with
        striping, fewer requests), rotating among equals to spread the load."""
        md, ensemble, down = self._md, self._fragment.ensemble, self._run.down
        options = [
            i
            for i in self._replicas(first)
            if ensemble[i] not in failed and ensemble[i] not in down
        ]
        if not options:
            return None
        size, quorum = md.ensemble_size, md.write_quorum

        def prefix(i: int) -> int:
            span = min(last - first + 1, size)  # the pattern repeats every E entries
            n = 0
            while n < span and stores_entry(i, first + n, size, quorum):
                n += 1
            return n if n < span else last - first + 1

        self._rotation += 1
        lengths = {i: prefix(i) for i in options}
        best = max(lengths.values())
        tied = [i for i in options if lengths[i] == best]
        return ensemble[tied[self._rotation % len(tied)]]

    async def _read_chunk(self, runs: list[tuple[int, int]]) -> list[bytes]:
        """The verified blobs of every entry of ``runs``, in entry order.

        Rounds: each run still to read goes to one replica; what comes back intact is
        kept, the rest is asked of another replica in the next round. Every round
        settles at least one entry, or one replica of one entry, or one bookie as down,
        so the rounds are bounded.
        """
        got: dict[int, bytes] = {}
        failed: dict[int, set[str]] = {}
        reasons: dict[int, list[str]] = {}
        todo = runs
        total = sum(last - first + 1 for first, last in runs)
        rounds_max = total * (self._md.write_quorum + 1) + len(self._fragment.ensemble) + 2
        for _ in range(rounds_max):
            if not todo:
                break
            sends: list[tuple[int, int, str, asyncio.Future[Any]]] = []
            for first, last in todo:
                replica = self._choose_replica(first, last, failed.get(first, set()))
                if replica is None:
                    raise await self._unreadable(first, reasons.get(first, []))
                request = ReadRequest(
                    0,
                    self._ledger_id,
                    first,
                    last - first + 1,
                    max_bytes=self._config.read_batch_max_bytes,
                )
                future = self._pool.request(replica, request, self._config.read_timeout_ms)
                sends.append((first, last, replica, future))
            answers = await asyncio.gather(*(s[3] for s in sends), return_exceptions=True)
            todo = []
            for (first, last, replica, _), answer in zip(sends, answers, strict=True):
                self._settle(first, last, replica, answer, got, failed, reasons)
                todo.extend(_missing_runs(first, last, got))
        if todo:
            raise RereplicationError(
                f"ledger {self._ledger_id}: entries from {todo[0][0]} still unread after "
                f"{rounds_max} rounds"
            )
        return [got[e] for first, last in runs for e in range(first, last + 1)]

    def _settle(
        self,
        first: int,
        last: int,
        replica: str,
        answer: object,
        got: dict[int, bytes],
        failed: dict[int, set[str]],
        reasons: dict[int, list[str]],
    ) -> None:
        def fail(entry_id: int, reason: str) -> None:
            failed.setdefault(entry_id, set()).add(replica)
            reasons.setdefault(entry_id, []).append(f"{replica}: {reason}")

        if isinstance(answer, BKError):
            self._run.down.setdefault(replica, answer.message)
            reasons.setdefault(first, []).append(answer.message)
            return
        if isinstance(answer, BaseException):
            raise answer
        if not isinstance(answer, ReadResponse):
            self._run.down.setdefault(replica, f"answered READ with {type(answer).__name__}")
            return
        status = answer.status
        if status == Status.OK and answer.entries:
            decode = self._codec.decode
            entry_id = first
            for blob in answer.entries[: last - first + 1]:
                try:
                    decode(blob, self._ledger_id, entry_id)
                except DigestMismatchError as exc:
                    reason = digest_reason(exc, self._ledger_id, entry_id)
                    fail(entry_id, reason)
                    self._out.damaged_copies_skipped.append((entry_id, replica, reason))
                else:
                    got.setdefault(entry_id, bytes(blob))
                entry_id += 1
        elif status in (Status.OK, Status.NO_SUCH_ENTRY):
            fail(first, "no such entry")
            self._absent.setdefault(first, set()).add(replica)
        elif status == Status.NO_SUCH_LEDGER:
            for entry_id in range(first, last + 1):
                fail(entry_id, "no such ledger")
                self._absent.setdefault(entry_id, set()).add(replica)
        elif status == Status.IO_ERROR:
            # R9: the bookie found its own record damaged.
            reason = "bookie could not read it (I/O error)"
            fail(first, reason)
            self._out.damaged_copies_skipped.append((first, replica, reason))
        else:
            self._run.down.setdefault(replica, f"answered READ with {status_name(status)}")

    async def _unreadable(self, entry_id: int, reasons: list[str]) -> RereplicationError:
        holders = [self._fragment.ensemble[i] for i in self._replicas(entry_id)]
        detail = "; ".join(reasons[-4:]) or "every other replica is down"
        down = [b for b in holders if b in self._run.down]
        if down and not reasons:
            detail = "; ".join(f"{b}: {self._run.down[b]}" for b in down)
        message = (
            f"ledger {self._ledger_id} entry {entry_id}: no intact copy on "
            f"{', '.join(holders) or 'any other bookie'} ({detail})"
        )
        # Lost for good only when no holder can still have it: each said it has none
        # (a bookie never calls absent what it may have acknowledged, R17), or is gone.
        # One unreachable but registered, or one that found its copy damaged, may yet
        # serve it: that is tried again later.
        absent = self._absent.get(entry_id, set())
        unsure = [b for b in holders if b not in absent]
        if unsure and not down:
            return RereplicationError(message)
        if unsure:
            bk = self._run.bk
            registered = set(await bk.registry.writable_bookies())
            registered |= set(await bk.registry.readonly_bookies())
            if any(b in registered or b not in down for b in unsure):
                return RereplicationError(message)
        return EntriesLostError(f"{message}: no copy is left")

    # ------------------------------------------------------------ writing

    async def _write(self, blobs: list[bytes]) -> None:
        """Recovery adds of ``blobs`` to the target, in frames of bounded size; returns
        once the target acknowledged every one (durably, R2)."""
        max_entries = self._config.add_batch_max_entries
        max_bytes = self._config.add_batch_max_bytes
        batches: list[list[bytes]] = []
        batch: list[bytes] = []
        size = 0
        for blob in blobs:
            if batch and (len(batch) >= max_entries or size + len(blob) > max_bytes):
                batches.append(batch)
                batch, size = [], 0
            batch.append(blob)
            size += len(blob)
        if batch:
            batches.append(batch)
        target = self._target
        futures = [
            self._pool.request(
                target,
                AddRequest(0, self._ledger_id, self._key, batch, AddFlag.RECOVERY),
                self._config.add_timeout_ms,
            )
            for batch in batches
        ]
        for answer in await asyncio.gather(*futures, return_exceptions=True):
            if isinstance(answer, BKError):
                raise ReplacementFailed(f"replacement {target}: {answer.message}")
            if isinstance(answer, BaseException):
                raise answer
            status = answer.status if isinstance(answer, AddResponse) else Status.BAD_REQUEST
            if status == Status.OK:
                continue
            if status == Status.NO_SUCH_LEDGER:
                raise NoSuchLedgerError(
                    f"ledger {self._ledger_id}: deleted (bookie {target} has dropped it)"
                )
            if status == Status.UNAUTHORIZED:
                raise UnauthorizedError(
                    f"ledger {self._ledger_id}: bookie {target} holds it with another master key"
                )
            raise ReplacementFailed(
                f"replacement {target}: recovery add answered {status_name(status)}"
            )


def _missing_runs(first: int, last: int, got: dict[int, bytes]) -> Iterator[tuple[int, int]]:
    """The runs of ``first..last`` not in ``got``."""
    start: int | None = None
    for entry_id in range(first, last + 1):
        if entry_id in got:
            if start is not None:
                yield start, entry_id - 1
                start = None
        elif start is None:
            start = entry_id
    if start is not None:
        yield start, last
