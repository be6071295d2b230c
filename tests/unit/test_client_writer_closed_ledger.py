"""R5 against a closed ledger: an ensemble change decides on the metadata as read and
gives up unless the ledger is OPEN, so a bookie failing after the writer closed the
ledger never adds a fragment to it."""

from __future__ import annotations

import asyncio

from held_pool import BOOKIES, HeldPool, run_client, turns

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.errors import Status
from quorumlog.meta.ledger_metadata import LedgerState


def test_r5_a_late_bookie_failure_never_adds_a_fragment_to_a_closed_ledger() -> None:
    async def main(bk: BookKeeper, pool: HeldPool) -> None:
        lh = await bk.create_ledger(3, 3, 2, ensemble_bookies=BOOKIES)
        added = lh.append(b"only entry")
        await turns()
        pool.answer_adds(BOOKIES[0])
        pool.answer_adds(BOOKIES[1])
        assert await added == 0  # confirmed by two bookies (Qa = 2); the third is slow
        await lh.close()
        closed = await bk.ledger_metadata(lh.ledger_id)
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 0

        # The third bookie's add fails after the close: a replacement would find a
        # writable bookie (SPARE), but the ledger is closed, so nothing may change.
        pool.answer_adds(BOOKIES[2], Status.IO_ERROR)
        for _ in range(20):
            await asyncio.sleep(0.01)
        md = await bk.ledger_metadata(lh.ledger_id)
        assert md.ensembles == closed.ensembles, f"a closed ledger gained {md.ensembles}"
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 0

    run_client(main, ClientConfig())
