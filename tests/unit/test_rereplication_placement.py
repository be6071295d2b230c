"""The replication worker's own choice of target (replication/rereplicate.py), not only
the auditor's verdict: with a rack-aware policy it never takes a target that puts two
copies of a write set in one rack while a target in another rack is writable, even
when the other copies sit on bookies that are not writable (read-only: registered,
with a rack, but out of the writable list)."""

from __future__ import annotations

import asyncio
import json
import random

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.client.config import ClientConfig
from quorumlog.replication.plan import Fragment
from quorumlog.replication.rereplicate import _Run
from quorumlog.testing.memory_store import MemoryStore, MemoryTree

RACKS = {
    "a2:1": "/r/a",
    "b1:1": "/r/b",
    "b2:1": "/r/b",
    "c1:1": "/r/c",
    "c2:1": "/r/c",
}
READ_ONLY = {"b1:1"}


async def _register(bk: BookKeeper) -> None:
    for bookie, rack in RACKS.items():
        info = json.dumps({"rack": rack}).encode()
        await bk.registry.register(bookie, read_only=bookie in READ_ONLY, service_info=info)


def _target(seed: int, ensemble: tuple[str, ...], slot: int, write_quorum: int) -> str | None:
    async def main() -> str | None:
        config = ClientConfig(placement="rack-aware")
        bk = BookKeeper(MemoryStore(MemoryTree()), config, rng=random.Random(seed))
        try:
            await _register(bk)
            run = _Run(
                bk,
                ensemble[slot],
                copies_in_flight=1,
                entries_per_chunk=1,
                chunk_bytes=1,
                replacement_attempts=1,
                throttle=None,
            )
            fragment = Fragment(0, 9, ensemble, slot)
            return await run._choose_replacement(fragment, write_quorum, (), 10)
        finally:
            await bk.close()

    return asyncio.run(main())


def test_a_target_never_shares_a_rack_with_a_read_only_copy_of_its_write_set() -> None:
    # (a1, b1) with Qw 2: a1 is lost, b1 read-only in rack b. Rack c keeps the write set
    # across two racks; a2 (rack a) does too; b2 would put both copies in rack b.
    chosen = {_target(seed, ("a1:1", "b1:1"), 0, 2) for seed in range(30)}
    assert "b2:1" not in chosen, chosen
    assert chosen <= {"a2:1", "c1:1", "c2:1"}
