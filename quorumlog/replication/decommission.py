"""Decommissioning a bookie: move everything it holds elsewhere, then forget it.

:func:`decommission_bookie` re-replicates every ledger that names the bookie (the
bookie may still be running: its copies are read from the other replicas), fencing
and closing the open ledgers whose last fragment names it, as BookKeeper's
``decommissionbookie`` does through its replication workers. It repeats until no
ledger names the bookie (a ledger created on it meanwhile is picked up by the next
pass), then deletes the bookie's cookie and its registration. A bookie that keeps
running registers itself again: stop it once this returns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quorumlog.meta.ledgers import LEDGERS_PATH
from quorumlog.replication.report import RecoveryReport
from quorumlog.replication.rereplicate import recover_bookie

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper

PASSES_DEFAULT = 5


@dataclass
class Decommission:
    bookie: str
    complete: bool
    reports: list[RecoveryReport] = field(default_factory=list)
    still_naming: list[int] = field(default_factory=list)
    cookie_deleted: bool = False
    elapsed_ms: float = 0.0

    @property
    def entries_copied(self) -> int:
        return sum(r.entries_copied for r in self.reports)

    def summary(self) -> str:
        if self.complete:
            return (
                f"bookie {self.bookie} decommissioned: no ledger names it, "
                f"{self.entries_copied} entries copied in {len(self.reports)} pass(es), "
                f"cookie {'deleted' if self.cookie_deleted else 'absent'}, registration "
                f"removed ({self.elapsed_ms / 1000:.1f} s); stop its process now"
            )
        ids = ", ".join(str(i) for i in self.still_naming[:20])
        return (
            f"bookie {self.bookie} NOT decommissioned: ledgers still name it ({ids}); "
            "its cookie and registration are kept; see the errors above and run again"
        )


async def ledgers_naming(bk: BookKeeper, bookie: str) -> list[int]:
    """Ids of the ledgers whose metadata names ``bookie``, as the store holds them now:
    none lets the bookie's cookie and registration go, so a sync comes first (R18; a
    lagging server may not have a ledger created on the bookie moments ago)."""
    await bk.store.sync(LEDGERS_PATH)
    return [
        ledger_id async for ledger_id, md, _ in bk.ledgers.ledgers() if bookie in md.all_bookies()
    ]


async def decommission_bookie(
    bk: BookKeeper, bookie: str, *, password: bytes = b"", passes: int = PASSES_DEFAULT
) -> Decommission:
    started = time.monotonic()
    result = Decommission(bookie=bookie, complete=False)
    for _ in range(passes):
        naming = await ledgers_naming(bk, bookie)
        if not naming:
            break
        result.reports.append(
            await recover_bookie(
                bk, bookie, ledger_ids=naming, password=password, close_open_ledgers=True
            )
        )
    result.still_naming = await ledgers_naming(bk, bookie)
    if not result.still_naming:
        result.cookie_deleted = await bk.registry.read_cookie(bookie) is not None
        if result.cookie_deleted:
            await bk.registry.delete_cookie(bookie)
        await bk.registry.unregister(bookie)
        result.complete = True
    result.elapsed_ms = (time.monotonic() - started) * 1000
    return result
