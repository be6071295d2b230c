"""Ensemble changes that go wrong half-way, with real bookie processes (R5, R13).

The writer's traffic to each bookie goes through a pool that can hold a bookie's
requests back (as a slow bookie would) or fail them (as a dead one would), so the
order of acknowledgements, failures and metadata replies is fixed by the test.
Each runs on both metadata drivers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from support import run

from quorumlog.aio import BookKeeper, LedgerHandle
from quorumlog.client.config import ClientConfig
from quorumlog.client.connection import ConnectionPool, ResponseCallback
from quorumlog.errors import BKError, BookieUnavailableError, MetadataError, TimeoutError_
from quorumlog.meta.factory import open_store
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.codec import AddRequest, ReadRequest, Request, Response

# The writer waits long for answers (the test decides who answers when); the recovering
# client gives up on a held-back bookie quickly.
CONFIG = ClientConfig(add_timeout_ms=30_000)
RECOVERY_CONFIG = ClientConfig(read_timeout_ms=1_000, fence_timeout_ms=1_000)


def _payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}-".encode() * 3


class _Steered:
    """A connection whose requests can be held back, failed, or watched."""

    def __init__(self, pool: SteeredPool, address: str) -> None:
        self.pool = pool
        self.address = address

    def send(self, request: Request, callback: ResponseCallback, timeout_ms: float | None) -> None:
        pool = self.pool
        if self.address in pool.failing:
            error = BookieUnavailableError(f"bookie {self.address}: failed by the test")
            asyncio.get_running_loop().call_soon(callback, error)
            return
        watched = callback
        if isinstance(request, AddRequest):

            def watched(answer: Response | BKError) -> None:
                callback(answer)
                pool.answered.setdefault(self.address, asyncio.Event()).set()

        if self.address in pool.holding or (
            self.address in pool.holding_reads and isinstance(request, ReadRequest)
        ):
            # Held back, not lost: it times out as a request to a hung bookie would.
            timer = (
                asyncio.get_running_loop().call_later(
                    timeout_ms / 1000, pool.time_out, request, watched
                )
                if timeout_ms
                else None
            )
            pool.held.append((self.address, request, watched, timeout_ms, timer))
            return
        ConnectionPool.get(pool, self.address).send(request, watched, timeout_ms)


class SteeredPool(ConnectionPool):
    def __init__(self) -> None:
        super().__init__(asyncio.get_running_loop(), connect_timeout_ms=3_000)
        self.holding: set[str] = set()
        self.holding_reads: set[str] = set()
        self.failing: set[str] = set()
        self.held: list[
            tuple[str, Request, ResponseCallback, float | None, asyncio.TimerHandle | None]
        ] = []
        self.answered: dict[str, asyncio.Event] = {}

    def get(self, address: str) -> _Steered:  # type: ignore[override]
        return _Steered(self, address)

    def release(self, address: str) -> None:
        self.holding.discard(address)
        self.holding_reads.discard(address)
        kept = []
        for held in self.held:
            held_address, request, callback, timeout_ms, timer = held
            if held_address != address:
                kept.append(held)
                continue
            if timer is not None:
                timer.cancel()
            ConnectionPool.get(self, address).send(request, callback, timeout_ms)
        self.held = kept

    def time_out(self, request: Request, callback: ResponseCallback) -> None:
        self.held = [held for held in self.held if held[1] is not request]
        callback(TimeoutError_("held back by the test until it timed out"))

    async def add_answer_from(self, address: str) -> None:
        event = self.answered.setdefault(address, asyncio.Event())
        event.clear()
        await asyncio.wait_for(event.wait(), 20)


def _on_fragment_cas(
    store: MetadataStore,
    before: Callable[[], Awaitable[None]],
    after: Callable[[], Awaitable[None]],
    *,
    lose_reply: bool,
) -> None:
    """Steer the next compare-and-set that adds a fragment: ``before()`` runs before it
    is applied, ``after()`` once it is applied but before its reply. With
    ``lose_reply`` the reply is a plain MetadataError, as a ZooKeeper connection loss
    or operation timeout gives: the outcome is unknown to the writer (R13)."""
    real_set = store.set
    armed = [True]

    async def steered_set(path: str, data: bytes, version: int = -1) -> int:
        if not (armed[0] and len(LedgerMetadata.from_bytes(data).ensembles) > 1):
            return await real_set(path, data, version)
        armed[0] = False
        await before()
        new_version = await real_set(path, data, version)
        await after()
        if lose_reply:
            raise MetadataError(f"{path}: connection lost (the write was applied)")
        return new_version

    store.set = steered_set  # type: ignore[method-assign]


async def _nothing() -> None:
    return


async def _start_change_with_entry_10_acked_by_both(
    writer: BookKeeper, pool: SteeredPool
) -> tuple[LedgerHandle, str, str, asyncio.Future[int], asyncio.Future[int]]:
    """E=Qw=Qa=2 on A, B; entries 0-9 confirmed; entry 10 acknowledged by B only, then
    B fails on entry 11, so the writer replaces B from entry 10 on. Returns the handle,
    A, B and the futures of entries 10 and 11; the steered compare-and-set must be
    armed by then, and its ``before`` should release A (``pool.release(a)``)."""
    lh = await writer.create_ledger(2, 2, 2, password=b"pw")
    a, b = lh.ensemble
    for i in range(10):
        assert await lh.add_entry(_payload(i)) == i
    pool.holding.add(a)  # A is slow: entry 10 reaches B only
    b_answered = asyncio.ensure_future(pool.add_answer_from(b))
    confirmed_10 = lh.append(_payload(10))
    await b_answered
    pool.failing.add(b)  # B dies: the add of 11 to it fails, B is replaced
    confirmed_11 = lh.append(_payload(11))
    return lh, a, b, confirmed_10, confirmed_11


async def _check_recovery_keeps_confirmed(
    metadata_uri: str, ledger_id: int, confirmed: list[int], slow: str
) -> None:
    """A recovery whose reads of ``slow`` are held back (fences pass) keeps every entry
    confirmed to the writer, and every entry up to its last reads back."""
    recovery_pool = SteeredPool()
    recovery_pool.holding_reads.add(slow)
    reader = BookKeeper(await open_store(metadata_uri), RECOVERY_CONFIG, pool=recovery_pool)
    try:
        rh = await reader.open_ledger(ledger_id, b"pw")
        last = rh.metadata.last_entry_id
        recovery_pool.release(slow)
        for entry_id in confirmed:
            assert entry_id <= last, (
                f"entry {entry_id} was confirmed to the writer, but recovery closed "
                f"the ledger at {last}"
            )
        entries = await rh.read_entries(0, last)
        assert [e.data for e in entries] == [_payload(i) for i in range(last + 1)]
    finally:
        await reader.close()


def test_c1_r13_an_entry_is_never_confirmed_from_a_write_set_the_metadata_no_longer_records(
    cluster3,
):
    """A acknowledges entry 10 while the change is under way; the change's
    compare-and-set is applied but its reply is lost. The metadata now says entry 10
    lives on A and C, so B's acknowledgement proves nothing: 10 may be confirmed only
    once C has it. A recovery that reads only from C must find every entry the writer
    confirmed."""

    async def scenario() -> None:
        pool = SteeredPool()
        writer = BookKeeper(await open_store(cluster3.metadata_uri), CONFIG, pool=pool)
        try:

            async def a_catches_up() -> None:
                a_answered = asyncio.ensure_future(pool.add_answer_from(a))
                pool.release(a)
                await a_answered

            a = ""
            _on_fragment_cas(writer.store, a_catches_up, _nothing, lose_reply=True)
            lh, a, _, confirmed_10, confirmed_11 = await _start_change_with_entry_10_acked_by_both(
                writer, pool
            )
            outcomes = await asyncio.wait_for(
                asyncio.gather(confirmed_10, confirmed_11, return_exceptions=True), 30
            )
            confirmed = [o for o in outcomes if isinstance(o, int)]
            await _check_recovery_keeps_confirmed(
                cluster3.metadata_uri, lh.ledger_id, confirmed, slow=a
            )
        finally:
            await writer.close()

    run(scenario(), timeout_s=120)


def test_c1_r5_a_fenced_answer_that_overtakes_the_fragment_reply_confirms_nothing_stale(
    cluster3,
):
    """As above, but the compare-and-set succeeds, and before its reply reaches the
    writer a recovery marks the ledger IN_RECOVERY, fences A and C, finds entry 10
    missing on C and closes the ledger at 9; the writer's next add to A is answered
    FENCED. Whatever the writer then confirms must lie within the closed ledger."""

    async def scenario() -> None:
        pool = SteeredPool()
        writer = BookKeeper(await open_store(cluster3.metadata_uri), CONFIG, pool=pool)
        lh: LedgerHandle | None = None
        fenced_add: list[asyncio.Future[int]] = []
        try:

            async def a_catches_up() -> None:
                a_answered = asyncio.ensure_future(pool.add_answer_from(a))
                pool.release(a)
                await a_answered

            async def recovery_then_fenced_answer() -> None:
                assert lh is not None
                await _check_recovery_keeps_confirmed(
                    cluster3.metadata_uri, lh.ledger_id, [], slow=a
                )
                a_answered = asyncio.ensure_future(pool.add_answer_from(a))
                fenced_add.append(lh.append(_payload(12)))
                await a_answered  # FENCED, while the writer still waits for this reply

            a = ""
            _on_fragment_cas(
                writer.store, a_catches_up, recovery_then_fenced_answer, lose_reply=False
            )
            lh, a, _, confirmed_10, confirmed_11 = await _start_change_with_entry_10_acked_by_both(
                writer, pool
            )
            outcomes = await asyncio.wait_for(
                asyncio.gather(confirmed_10, confirmed_11, *fenced_add, return_exceptions=True),
                30,
            )
            assert fenced_add, "the steered compare-and-set did not run"
            confirmed = [o for o in outcomes if isinstance(o, int)]
            metadata = await writer.ledger_metadata(lh.ledger_id)
            assert metadata.is_closed
            for entry_id in confirmed:
                assert entry_id <= metadata.last_entry_id, (
                    f"entry {entry_id} was confirmed to the writer, but recovery closed "
                    f"the ledger at {metadata.last_entry_id}"
                )
        finally:
            await writer.close()

    run(scenario(), timeout_s=120)
