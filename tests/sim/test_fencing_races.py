"""Fencing races on exact message schedules (real client, real bookies, virtual time).

BookKeeper #2614/#2616: a recovery whose fence request to one bookie is lost reads an
entry that the old writer has on Qa - 1 bookies, hears "no such entry" from the bookie
that never got it and from the unfenced one, and closes the ledger before it; the old
writer's add then reaches the unfenced bookie, which acknowledges it, and the writer
confirms an entry the closed ledger does not hold. Recovery reads that fence (R7, R8)
close that hole: the unfenced bookie is fenced by the read itself.
"""

from __future__ import annotations

import asyncio
import random

from support import run_virtual

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.errors import BKError
from quorumlog.proto.codec import AddRequest, FenceRequest
from quorumlog.testing.checkers import LedgerHistory, check_ledger_history
from quorumlog.testing.sim import Cluster, NetworkFaults

FAST = (0.05, 0.1)


def lost_fence_race(seed: int = 1) -> LedgerHistory:
    """The schedule of #2614 on a 3-bookie ledger (E = Qw = 3, Qa = 2); returns the history
    as the writer and the recovery saw it, with the checker's final recovery."""

    async def main(loop: asyncio.AbstractEventLoop) -> LedgerHistory:
        cluster = Cluster(
            loop, random.Random(seed), bookies=3, network_faults=NetworkFaults(0.0, *FAST)
        )
        await cluster.start()
        writer = cluster.client("w1", kind=BookKeeper)
        handle = await writer.create_ledger(3, 3, 2, password=b"pw")
        b0, b1, b2 = handle.ensemble
        net = cluster.network
        net.drop_next("w1", b0, AddRequest)  # e0 never reaches b0
        net.set_link("w1", b2, delay_ms=(40, 40))  # ... and reaches b2 late
        net.drop_next("w2", b2, FenceRequest)  # the recovery's fence of b2 is lost
        net.set_link("w2", b1, delay_ms=(10, 10))  # b1's answers to the recovery are slow
        history = LedgerHistory(handle.ledger_id, (3, 3, 2))
        history.written[0] = b"e0"
        confirmed = handle.append(b"e0")
        confirmed.add_done_callback(
            lambda f: (
                f.exception()
                or history.confirmed.append((f.result(), loop.time(), int(loop.time() * 1e9)))
            )
        )
        await asyncio.sleep(0.002)  # e0 is on b1, on its way to b2, lost to b0
        recoverer = cluster.client("w2", kind=BookKeeper)
        rh = await recoverer.open_ledger(handle.ledger_id, b"pw")
        last = rh.metadata.last_entry_id
        history.closes.append(("w2", last, loop.time(), int(loop.time() * 1e9)))
        await asyncio.gather(confirmed, return_exceptions=True)
        await asyncio.sleep(0.6)
        checker = cluster.client("checker", kind=BookKeeper)
        final = await checker.open_ledger(handle.ledger_id, b"pw")
        history.final_last = final.metadata.last_entry_id
        if history.final_last >= 0:
            try:
                for entry in await final.read_entries(0, history.final_last):
                    history.final_entries[entry.entry_id] = entry.data
            except BKError as exc:
                history.final_error = str(exc)
        await cluster.close()
        return history

    return run_virtual(main)


def test_r7_2614_a_lost_fence_request_does_not_let_an_add_be_confirmed_after_close() -> None:
    history = lost_fence_race()
    assert check_ledger_history(history) == []
    assert not history.confirmed or history.final_last >= 0
