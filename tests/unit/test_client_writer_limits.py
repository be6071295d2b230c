"""R16 on the writer's handle: at most max_outstanding_adds adds unconfirmed; append
refuses past it, add_entry waits for room."""

from __future__ import annotations

import asyncio

import pytest
from held_pool import BOOKIES, HeldPool, run_client, turns

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import TooManyRequestsError


def test_r16_append_refuses_past_max_outstanding_adds_and_add_entry_waits() -> None:
    config = ClientConfig(max_outstanding_adds=5)

    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        futures = [lh.append(b"p%d" % i) for i in range(5)]
        with pytest.raises(TooManyRequestsError, match=r"5 adds.*max_outstanding_adds"):
            lh.append(b"one too many")
        assert lh.outstanding_adds == 5
        waiting = asyncio.ensure_future(lh.add_entry(b"waits for room"))
        await turns()
        assert not waiting.done() and lh.outstanding_adds == 5
        await turns()
        assert pool.answer_adds(BOOKIES[0]) == 5 and pool.answer_adds(BOOKIES[1]) == 5
        assert await asyncio.gather(*futures) == [0, 1, 2, 3, 4]
        await turns()
        assert lh.outstanding_adds == 1  # the waiting add went out once there was room
        pool.answer_adds(BOOKIES[0])
        pool.answer_adds(BOOKIES[1])
        assert await waiting == 5

    run_client(main, config)
