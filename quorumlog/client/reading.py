"""Read handles: reading entries up to the LAC, learning the LAC, long polling.

Reads go to one replica at a time and fall back to the next replica of the
entry's write set on an error, a timeout or a digest mismatch (R9). A replica
that has not answered after ``speculative_read_timeout_ms`` gets company: the
same request goes to the next replica and the first good answer wins. When
every bookie of a fragment holds every entry (ensemble == write quorum),
entries are read in batches of consecutive ids, several batches in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from itertools import count, repeat
from typing import TYPE_CHECKING, TypeVar

from quorumlog.core.quorum import is_covered, write_set
from quorumlog.errors import (
    BKError,
    BookieUnavailableError,
    ClientClosedError,
    DigestMismatchError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ProtocolError,
    Status,
    error_for_status,
)
from quorumlog.meta.ledger_metadata import LedgerMetadata, LedgerState
from quorumlog.proto.codec import (
    ReadFlag,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
)
from quorumlog.proto.entry import Entry, EntryCodec, master_key

if TYPE_CHECKING:
    from quorumlog.client.context import ClientContext
    from quorumlog.meta.store import Watch

T = TypeVar("T")

# Entry from an (ledger id, entry id, data) tuple without a Python-level call per entry.
_make_entry = partial(tuple.__new__, Entry)


async def gather_in_order(factories: Sequence[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run coroutine factories with at most ``limit`` in flight; results in input order."""
    results: list[T | None] = [None] * len(factories)
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(factories):
            index = next_index
            next_index += 1
            results[index] = await factories[index]()

    workers = [asyncio.ensure_future(worker()) for _ in range(min(limit, len(factories)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for w in workers:
            w.cancel()
        raise
    return results  # type: ignore[return-value]


class ReadHandle:
    """A ledger opened for reading (with or without recovery)."""

    def __init__(
        self, ctx: ClientContext, metadata: LedgerMetadata, version: int, password: bytes
    ) -> None:
        self._ctx = ctx
        self._loop = ctx.loop
        self._pool = ctx.pool
        self._config = ctx.config
        self.metadata = metadata
        self._metadata_version = version
        self._codec = EntryCodec(metadata.digest_type, password)
        self._master_key = master_key(password)
        self._lac = metadata.last_entry_id if metadata.is_closed else -1
        self._rotation = 0
        self._watch: Watch | None = None
        self._handle_closed = False

    # ------------------------------------------------------------ properties

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        """The largest LAC this handle has learnt (cached; no request is sent)."""
        return self._lac

    def learn_last_add_confirmed(self, lac: int) -> None:
        """Take ``lac`` as confirmed because another reader saw it so (R4: what is at or
        below a LAC stays readable), so that reads may go up to it; never past a
        closed ledger's last entry, and never lowers what this handle knows."""
        self._learn_lac(lac)

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is closed in the metadata this handle knows."""
        return self.metadata.is_closed

    @property
    def length(self) -> int:
        return self.metadata.length

    def _learn_lac(self, lac: int) -> None:
        if lac > self._lac:
            if self.metadata.is_closed:
                lac = min(lac, self.metadata.last_entry_id)
            self._lac = lac

    def _watch_metadata(self) -> None:
        """Follow closes and ensemble changes made by the writer or a recovery."""

        def changed(md: LedgerMetadata | None) -> None:
            if md is None or md.ledger_id != self.ledger_id:
                return
            # Metadata only moves forward: a closed ledger never reopens, fragments only grow.
            if self.metadata.is_closed and not md.is_closed:
                return
            self.metadata = md
            if md.is_closed:
                self._lac = md.last_entry_id

        self._watch = self._ctx.ledgers.watch(self.ledger_id, changed)

    async def refresh_metadata(self) -> LedgerMetadata:
        md, version = await self._ctx.ledgers.read(self.ledger_id)
        if not (self.metadata.is_closed and not md.is_closed):
            self.metadata, self._metadata_version = md, version
            if md.is_closed:
                self._lac = md.last_entry_id
        return self.metadata

    def _check_open(self) -> None:
        if self._handle_closed:
            raise ClientClosedError(f"ledger {self.ledger_id}: handle is closed")

    # ------------------------------------------------------------ reading entries

    def _read_limit(self) -> int:
        md = self.metadata
        return md.last_entry_id if md.is_closed else self._lac

    async def read_entries(self, first_entry_id: int, last_entry_id: int) -> list[Entry]:
        """Entries ``first..last`` inclusive, never past the LAC (or the last entry if closed)."""
        payloads = await self.read_payloads(first_entry_id, last_entry_id)
        return self._entries(first_entry_id, payloads)

    async def read_payloads(self, first_entry_id: int, last_entry_id: int) -> list[bytes]:
        """The data of entries ``first..last`` inclusive, in entry-id order, as
        :meth:`read_entries` reads them (the same checks and limits), without an
        :class:`Entry` per entry: for readers that know the ids from the range, such as
        the Spark data source building columns.

        Example::

            payloads = await handle.read_payloads(0, 99)   # payloads[i] is entry i
        """
        self._check_open()
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise InvalidArgumentError(
                f"ledger {self.ledger_id}: bad entry range {first_entry_id}..{last_entry_id}"
            )
        limit = self._read_limit()
        if last_entry_id > limit:
            what = "last entry" if self.metadata.is_closed else "last add confirmed"
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last_entry_id} is past the {what} ({limit})"
            )
        return await self._read_range(first_entry_id, last_entry_id)

    async def _read_one(self, entry_id: int) -> Entry:
        payloads = await self._read_range(entry_id, entry_id)
        return Entry(self.ledger_id, entry_id, payloads[0])

    def _entries(self, first: int, payloads: list[bytes]) -> list[Entry]:
        # A range is read whole and in order: payload i is entry first + i.
        return list(map(_make_entry, zip(repeat(self.ledger_id), count(first), payloads)))

    async def _read_range(self, first: int, last: int) -> list[bytes]:
        """The payloads of ``first..last``, every one of them, in entry-id order."""
        md = self.metadata
        factories: list[Callable[[], Awaitable[list[bytes]]]] = []
        batch = self._config.read_batch_entries
        for frag_first, frag_last, ensemble in md.fragment_bounds():
            lo = max(first, frag_first)
            hi = last if frag_last is None else min(last, frag_last)
            if lo > hi:
                continue
            # Batches of consecutive ids only work when every bookie holds every entry.
            step = batch if md.ensemble_size == md.write_quorum else 1
            for start in range(lo, hi + 1, step):
                end = min(hi, start + step - 1)
                factories.append(
                    lambda s=start, e=end, ens=ensemble: self._read_chunk(s, e, ens)  # type: ignore[misc]
                )
        limit = self._config.reads_in_flight if md.ensemble_size == md.write_quorum else 64
        chunks = await gather_in_order(factories, limit)
        if len(chunks) == 1:
            return chunks[0]
        return [payload for chunk in chunks for payload in chunk]

    def _replicas(self, entry_id: int, ensemble: Sequence[str]) -> list[str]:
        md = self.metadata
        ws = write_set(entry_id, md.ensemble_size, md.write_quorum)
        # Rotate the starting replica so consecutive reads spread over the write set.
        k = self._rotation % len(ws)
        self._rotation += 1
        return [ensemble[i] for i in ws[k:] + ws[:k]]

    async def _read_chunk(self, first: int, last: int, ensemble: Sequence[str]) -> list[bytes]:
        out: list[bytes] = []
        next_id = first
        replicas = self._replicas(first, ensemble)
        while next_id <= last:
            got = await self._read_with_fallback(next_id, last, replicas)
            out.extend(got)
            next_id += len(got)
        return out

    async def _read_with_fallback(self, first: int, last: int, replicas: list[str]) -> list[bytes]:
        """Payloads of entries from ``first`` (at least one) from the first replica that
        has them."""
        config = self._config
        request_count = last - first + 1
        in_flight: dict[asyncio.Future, str] = {}  # type: ignore[type-arg]
        errors: list[BKError] = []
        tried = 0

        def launch() -> None:
            nonlocal tried
            address = replicas[tried]
            tried += 1
            request = ReadRequest(
                0,
                self.ledger_id,
                first,
                request_count,
                max_bytes=config.read_batch_max_bytes,
            )
            in_flight[self._pool.request(address, request, config.read_timeout_ms)] = address

        launch()
        while in_flight:
            wait_s = config.speculative_read_timeout_ms / 1000 if tried < len(replicas) else None
            done, _ = await asyncio.wait(
                in_flight.keys(), timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                launch()  # speculative read: ask the next replica too
                if self._ctx.metrics is not None:
                    self._ctx.metrics.speculative_reads += 1
                continue
            for future in [f for f in in_flight if f in done]:  # in send order
                address = in_flight.pop(future)
                try:
                    payloads = self._decode_read(future.result(), first, address)
                except BKError as exc:
                    errors.append(exc)
                    continue
                if payloads:
                    return payloads
            if not in_flight and tried < len(replicas):
                launch()
        raise self._read_failure(first, replicas, errors)

    def _decode_read(self, response: object, first: int, address: str) -> list[bytes]:
        if not isinstance(response, ReadResponse):
            # The connection checks answers (R12); a stand-in pool may not.
            raise ProtocolError(f"bookie {address}: a {type(response).__name__} answers a READ")
        status = response.status
        if status != Status.OK:
            raise error_for_status(
                status, f"ledger {self.ledger_id} entry {first} on bookie {address}"
            )
        self._learn_lac(response.lac)
        ledger_id = self.ledger_id
        payloads, largest_lac, error = self._codec.decode_payloads(
            response.entries, ledger_id, first
        )
        if not payloads:
            if error is not None:
                raise DigestMismatchError(f"{error.message} (bookie {address})")
            raise NoSuchEntryError(f"ledger {ledger_id} entry {first}: bookie {address} sent none")
        # A bad blob after a sound prefix ends the answer there: the rest is read
        # again, from this replica or another.
        if largest_lac > self._lac:
            self._learn_lac(largest_lac)
        return payloads

    def _read_failure(self, entry_id: int, replicas: list[str], errors: list[BKError]) -> BKError:
        where = f"ledger {self.ledger_id} entry {entry_id} (bookies {', '.join(replicas)})"
        if errors and all(isinstance(e, NoSuchEntryError | NoSuchLedgerError) for e in errors):
            return NoSuchEntryError(f"{where}: no replica has it")
        for exc in errors:
            if isinstance(exc, DigestMismatchError):
                return DigestMismatchError(f"{where}: every replica failed; {exc.message}")
        detail = "; ".join(e.message for e in errors) or "no answer"
        return BookieUnavailableError(f"{where}: no replica could serve it: {detail}")

    # ------------------------------------------------------------ learning the LAC

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last fragment for the LAC; returns the largest known."""
        self._check_open()
        md = self.metadata
        if md.is_closed:
            return md.last_entry_id
        ensemble = md.last_ensemble
        futures = {
            self._pool.request(
                address, ReadLacRequest(0, self.ledger_id), self._config.read_timeout_ms
            ): index
            for index, address in enumerate(ensemble)
        }
        answered: set[int] = set()
        pending = set(futures)
        errors: list[str] = []
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in [f for f in futures if f in done]:  # in send order
                index = futures[future]
                try:
                    response = future.result()
                except BKError as exc:
                    errors.append(exc.message)
                    continue
                if not isinstance(response, ReadLacResponse):
                    # The connection checks answers (R12); a stand-in pool may not.
                    errors.append(f"bookie {ensemble[index]}: a {type(response).__name__}")
                    continue
                if response.status == Status.OK:
                    self._learn_lac(max(response.lac, -1))
                    answered.add(index)
                elif response.status in (Status.NO_SUCH_LEDGER, Status.NO_SUCH_ENTRY):
                    answered.add(index)  # knows nothing yet: an answer, with LAC -1
                else:
                    errors.append(f"bookie {ensemble[index]}: status {response.status}")
            if is_covered(answered, md.ensemble_size, md.write_quorum, md.ack_quorum):
                break
        if not answered:
            raise BookieUnavailableError(
                f"ledger {self.ledger_id}: no bookie answered for the LAC: {'; '.join(errors)}"
            )
        return self._lac

    async def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout_ms: int
    ) -> tuple[int, Entry | None]:
        """Long poll: wait up to ``timeout_ms`` for ``entry_id`` to be confirmed.

        Returns the LAC learnt and the entry if it is now confirmed, else None.
        """
        self._check_open()
        if entry_id <= self._lac:
            return self._lac, await self._read_one(entry_id)
        md = self.metadata
        if md.is_closed:
            return self._lac, None
        ensemble = md.ensemble_for(entry_id)
        ws = write_set(entry_id, md.ensemble_size, md.write_quorum)
        request_timeout_ms = timeout_ms + self._config.read_timeout_ms
        futures = {
            self._pool.request(
                ensemble[i],
                ReadRequest(
                    0,
                    self.ledger_id,
                    entry_id,
                    1,
                    ReadFlag.LONG_POLL,
                    previous_lac=entry_id - 1,
                    timeout_ms=timeout_ms,
                ),
                request_timeout_ms,
            ): ensemble[i]
            for i in ws
        }
        pending = set(futures)
        deadline = self._loop.time() + timeout_ms / 1000
        while pending:
            remaining = deadline - self._loop.time() + self._config.read_timeout_ms / 1000
            done, pending = await asyncio.wait(
                pending, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                break
            for future in [f for f in futures if f in done]:  # in send order
                try:
                    response = future.result()
                except BKError:
                    continue
                if not isinstance(response, ReadResponse) or response.status != Status.OK:
                    continue
                self._learn_lac(response.lac)
                if self._lac >= entry_id:
                    entries = response.entries
                    if entries:
                        try:
                            decoded = self._codec.decode(entries[0], self.ledger_id, entry_id)
                            return self._lac, Entry(self.ledger_id, entry_id, decoded.data)
                        except DigestMismatchError:
                            pass
                    return self._lac, await self._read_one(entry_id)
        if self._lac >= entry_id:
            return self._lac, await self._read_one(entry_id)
        if self._loop.time() < deadline and not pending:
            # Every bookie answered at once without news (e.g. it does not know the
            # ledger yet): wait out the rest of the poll rather than spin.
            await asyncio.sleep(min(deadline - self._loop.time(), 0.05))
        return self._lac, None

    # ------------------------------------------------------------ closing

    async def close(self) -> None:
        """Release the handle (a read handle changes nothing in the ledger)."""
        self._handle_closed = True
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def __repr__(self) -> str:
        state = self.metadata.state.value if self.metadata.state is not LedgerState.OPEN else "OPEN"
        return f"<{type(self).__name__} ledger={self.ledger_id} state={state} lac={self._lac}>"
