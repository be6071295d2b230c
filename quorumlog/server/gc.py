"""Garbage collection: drop the ledgers that no longer exist in the metadata store.

Order matters. The bookie's own ledger ids are snapshotted *before* the live
ledgers are listed: a ledger created while the listing runs has its metadata
written before any of its entries reach a bookie, so it is either in the
listing or absent from the snapshot, and is never dropped by mistake. Only
ledgers in the snapshot are candidates.

A round whose listing fails does nothing: an unreachable store must never look
like an empty one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from quorumlog.errors import BKError

log = logging.getLogger(__name__)

ListLiveLedgers = Callable[[], Awaitable[Iterable[int]]]


class Collectable(Protocol):
    def ledger_ids(self) -> set[int]: ...

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int: ...


async def collect_once(bookie: Collectable, list_live: ListLiveLedgers) -> int:
    """One round; returns how many ledgers the bookie dropped."""
    snapshot = set(bookie.ledger_ids())
    if not snapshot:
        return 0
    live = set(await list_live())
    dropped = bookie.garbage_collect(live, snapshot)
    if dropped:
        log.info("garbage collection dropped %d deleted ledgers", dropped)
    return dropped


async def gc_loop(bookie: Collectable, list_live: ListLiveLedgers, interval_ms: int) -> None:
    """Run :func:`collect_once` every ``interval_ms`` until cancelled."""
    interval_s = max(interval_ms, 1) / 1000
    while True:
        await asyncio.sleep(interval_s)
        try:
            await collect_once(bookie, list_live)
        except asyncio.CancelledError:
            raise
        except (BKError, OSError) as exc:
            log.warning("garbage collection skipped this round: %s", exc)
        except Exception:
            log.exception("garbage collection failed this round")
