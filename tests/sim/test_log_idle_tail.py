"""A tailing reader of an idle writer, on the simulator: each record must reach the reader
with no later append to carry its LAC (R4: the explicit LAC wakes the parked long polls),
whatever the order in which the explicit LAC, the long polls, the rollovers' ledger-list
and ledger events and slow metadata replies arrive. Seeded links of different speeds
reorder them; virtual time makes each seed cost milliseconds.

The integration test of the same behaviour (tests/integration/test_log_streams.py) runs
one schedule per run on real processes; this one runs many schedules on purpose.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from support import run_virtual

from quorumlog.aio import LogNamespace
from quorumlog.log import LogConfig
from quorumlog.testing.memory_store import MetadataFaults
from quorumlog.testing.sim import Cluster, NetworkFaults

# Some links much slower than others (one-way up to 150 ms, under the simulator's 500 ms
# add timeout): the explicit LAC reaches the bookies at different times, and a reader's
# long poll may arrive before or after it.
LINKS = NetworkFaults(delay_ms_min=0.05, delay_ms_max=5.0, slow_link_probability=0.4,
                      slow_link_ms=(2.0, 150.0))  # fmt: skip
# Small ledgers: the writer rolls over every few records, so the reader also follows
# closes and new ledgers (list and ledger watch events) while it waits.
SMALL_LEDGERS = LogConfig(rollover_size_bytes=60)
RECORDS = 25
# A bound for a record to arrive at all (virtual time), many long polls (1 s) long; a
# reader that missed the explicit LAC would wait for an append that never comes.
ARRIVAL_BOUND_MS = 10_000


async def _idle_writer_tail(loop: asyncio.AbstractEventLoop, seed: int) -> list[float]:
    rng = random.Random(seed)
    cluster = Cluster(loop, random.Random(rng.random()), bookies=4, network_faults=LINKS)
    await cluster.start()
    slow_metadata = MetadataFaults(random.Random(rng.random()), slow_probability=0.3,
                                   slow_ms_max=200.0)  # fmt: skip
    writer_bk = cluster.client("writer")
    reader_bk = cluster.client("reader", metadata_faults=slow_metadata)
    try:
        writer = await (await LogNamespace(writer_bk).open_log("tail", SMALL_LEDGERS)).open_writer()
        reader = await (await LogNamespace(reader_bk).open_log("tail", SMALL_LEDGERS)).open_reader()
        waits_ms: list[float] = []
        for i in range(RECORDS):
            pending = asyncio.ensure_future(reader.read_next(timeout_ms=ARRIVAL_BOUND_MS))
            # The append lands anywhere in the reader's cycle: before its first look,
            # during a long poll, or just as a poll times out (1 s).
            await asyncio.sleep(rng.choice((0.0, rng.uniform(0, 0.05), rng.uniform(0.9, 1.1))))
            position = await writer.append(b"record-%02d" % i)
            confirmed_at = loop.time()
            record = await pending
            assert record[:2] == (position, b"record-%02d" % i), (seed, i, record, position)
            waits_ms.append((loop.time() - confirmed_at) * 1000)
        await reader.close()
        await writer.close()
        return waits_ms
    finally:
        await writer_bk.close()
        await reader_bk.close()
        await cluster.close()


@pytest.mark.parametrize("seed", range(12))
def test_r4_each_record_of_an_idle_writer_reaches_a_tailing_reader(seed: int) -> None:
    waits_ms = run_virtual(lambda loop: _idle_writer_tail(loop, seed))
    assert len(waits_ms) == RECORDS
