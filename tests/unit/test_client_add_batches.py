"""Batches of adds on the writer's handle (append_entries: one future for the batch, R3,
R16) and the synchronous facade's hand-off to the loop under a bound on adds in flight
(Handoff)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest
from held_pool import BOOKIES, HeldPool, run_client, turns
from support import holds_for, poll_until

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.client.sync import Handoff
from quorumlog.errors import (
    InvalidArgumentError,
    LedgerFencedError,
    Status,
    TooManyRequestsError,
)
from quorumlog.proto.codec import AddRequest, encode


def test_r3_a_batch_is_one_future_of_consecutive_ids_confirmed_with_its_last_entry() -> None:
    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        settled: list[int] = []
        lh.on_settled(settled.append)
        first = lh.append(b"alone")
        batch = lh.append_entries([b"a", b"b", b"c"])
        token: concurrent.futures.Future[int] = concurrent.futures.Future()
        lh.append_with_token(b"token", token)
        assert lh.outstanding_adds == 5
        await turns()
        assert pool.answer_adds(BOOKIES[0]) == 5
        await turns()
        assert not batch.done() and not token.done() and settled == []
        assert pool.answer_adds(BOOKIES[2]) == 5
        assert await first == 0
        assert await batch == [1, 2, 3]
        assert token.result(timeout=0) == 4  # completed on the loop, no second future
        assert settled == [5] and lh.outstanding_adds == 0
        assert await lh.append_entries([]) == []
        await lh.close()
        assert lh.metadata.length == len(b"alone" + b"abc" + b"token")

    run_client(main, ClientConfig())


def test_the_bookies_of_a_write_set_get_one_encoding_of_the_same_entries() -> None:
    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        small = lh.append_entries([b"entry-%d" % i for i in range(50)])
        await turns()
        requests = [r for _, r, _ in pool.held if isinstance(r, AddRequest)]
        assert len(requests) == 3 and requests[0].encoded_entries is not None
        assert all(r.encoded_entries is requests[0].encoded_entries for r in requests)
        for request in requests:  # the same bytes as encoding the entries one by one
            plain = AddRequest(
                request.request_id,
                request.ledger_id,
                request.master_key,
                list(request.entries),
                request.flags,
            )
            assert plain.encoded_entries is None and encode(request) == encode(plain)
        pool.held.clear()
        large = lh.append_entries([bytes(8192)] * 3)  # large entries are never joined
        await turns()
        assert [r.encoded_entries for _, r, _ in pool.held] == [None, None, None]
        small.cancel()
        large.cancel()

    run_client(main, ClientConfig())


def test_r16_a_batch_is_refused_whole_before_anything_is_queued() -> None:
    config = ClientConfig(max_outstanding_adds=5, max_entry_size_bytes=10)

    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        held = lh.append_entries([b"1", b"2", b"3"])
        with pytest.raises(TooManyRequestsError, match=r"3 adds.*3 more.*max_outstanding_adds"):
            lh.append_entries([b"4", b"5", b"6"])
        with pytest.raises(InvalidArgumentError, match="entry of 11 bytes"):
            lh.append_entries([b"7", b"x" * 11])
        with pytest.raises(InvalidArgumentError, match="batch of 6 entries"):
            await lh.add_entries([b"x"] * 6)
        assert lh.outstanding_adds == 3
        waiting = asyncio.ensure_future(lh.add_entries([b"4", b"5", b"6"]))
        await turns()
        assert not waiting.done() and lh.outstanding_adds == 3  # no room for 3 more yet
        assert pool.answer_adds(BOOKIES[0]) == 3 and pool.answer_adds(BOOKIES[1]) == 3
        assert await held == [0, 1, 2]
        await turns()
        pool.answer_adds(BOOKIES[0])
        pool.answer_adds(BOOKIES[1])
        assert await waiting == [3, 4, 5]

    run_client(main, config)


def test_r7_a_fenced_batch_fails_its_one_future() -> None:
    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        settled: list[int] = []
        lh.on_settled(settled.append)
        batch = lh.append_entries([b"a", b"b"])
        await turns()
        pool.answer_adds(BOOKIES[0], Status.FENCED)
        with pytest.raises(LedgerFencedError):
            await batch
        assert settled == [2] and lh.outstanding_adds == 0

    run_client(main, ClientConfig())


class _Loop:
    """The loop side of a Handoff, driven by the test: the burst runs when it drains."""

    def __init__(self) -> None:
        self.wakes = 0

    def call_soon_threadsafe(self, callback: object) -> None:
        self.wakes += 1


def test_r16_handoff_wakes_a_blocked_thread_once_a_quarter_of_the_bound_is_free() -> None:
    loop = _Loop()
    runs: list[list[str]] = []
    handoff = Handoff(loop, runs.append, 8)
    handoff.put("batch of 8", 8)
    taken = threading.Event()

    def put_one() -> None:
        handoff.put("one")
        taken.set()

    thread = threading.Thread(target=put_one, daemon=True)
    thread.start()
    poll_until(lambda: handoff._waiting == 1, timeout_s=10, what="the thread waits for room")
    handoff.give(1)  # 7 in flight: room, but not yet a quarter of the bound free
    holds_for(lambda: not taken.is_set(), duration_s=0.2, what="the thread stays blocked")
    handoff.give(1)  # 6 = 8 - 8 // 4: wake it
    poll_until(taken.is_set, timeout_s=10, what="the thread took room")
    thread.join(timeout=10)
    assert handoff.in_flight == 7
    assert loop.wakes == 1  # one wake-up of the loop for the burst, not one per item
    handoff.drain()
    assert runs == [["batch of 8", "one"]]


def test_a_thread_that_queued_a_full_burst_waits_for_the_loop_to_take_it() -> None:
    loop = _Loop()
    runs: list[list[int]] = []
    handoff = Handoff(loop, runs.append, 100, max_burst=4)
    for item in range(3):
        handoff.put(item)
    done = threading.Event()

    def put_fourth() -> None:
        handoff.put(3)
        done.set()

    thread = threading.Thread(target=put_fourth, daemon=True)
    thread.start()
    holds_for(lambda: not done.is_set(), duration_s=0.2, what="the fourth put waits")
    handoff.drain()
    poll_until(done.is_set, timeout_s=10, what="the put returned once the loop took the burst")
    thread.join(timeout=10)
    assert runs == [[0, 1, 2, 3]] and loop.wakes == 1
