"""kill -9 of a bookie process, then a restart on the same directories, at the protocol level.

R2: every add the bookie acknowledged (journal sync on) is durable: it reads back
byte-identical after the crash. R7: the fence survives the restart: a normal add
is refused with FENCED, a recovery add is still accepted.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import AddRequest, AddResponse, ReadLacRequest, ReadLacResponse
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"restart-test")


@pytest.fixture
def cluster1(metadata_uri: str, tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(metadata_uri, tmp_path / "cluster", 1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def test_r2_r7_acknowledged_entries_and_fence_survive_kill_9(cluster1: LocalCluster) -> None:
    fenced_ledger, open_ledger = 41, 42
    fenced_blobs = [make_entry(fenced_ledger, i, os.urandom(100 + i)) for i in range(300)]
    open_blobs = [make_entry(open_ledger, i, os.urandom(50)) for i in range(300)]
    address = cluster1.addresses[0]

    async def before_crash() -> None:
        client = await RawClient.connect(address)
        try:
            # Pipelined: many adds in flight, grouped into few journal syncs.
            futures = [
                client.send(AddRequest(0, ledger_id, KEY, [blob]))
                for ledger_id, blobs in ((fenced_ledger, fenced_blobs), (open_ledger, open_blobs))
                for blob in blobs
            ]
            for answer in await asyncio.gather(*futures):
                assert isinstance(answer, AddResponse)
                assert answer.status == Status.OK
            fence = await client.fence(fenced_ledger, KEY)
            assert (fence.status, fence.last_entry_id) == (Status.OK, 299)
            refused = await client.add(fenced_ledger, KEY, [make_entry(fenced_ledger, 300, b"x")])
            assert refused.status == Status.FENCED
        finally:
            await client.close()

    run(before_crash())
    cluster1.kill(0)
    assert cluster1.restart(0) == address

    async def after_restart() -> None:
        client = await RawClient.connect(address)
        try:
            for ledger_id, blobs in ((fenced_ledger, fenced_blobs), (open_ledger, open_blobs)):
                read = await client.read(ledger_id, 0, count=len(blobs))
                assert read.status == Status.OK
                assert read.entries == blobs
                lac = await client.request(ReadLacRequest(0, ledger_id))
                assert isinstance(lac, ReadLacResponse)
                assert lac.last_entry_id == len(blobs) - 1
            refused = await client.add(fenced_ledger, KEY, [make_entry(fenced_ledger, 300, b"y")])
            assert refused.status == Status.FENCED
            recovery = await client.add(fenced_ledger, KEY, [fenced_blobs[-1]], recovery=True)
            assert recovery.status == Status.OK
            # The ledger that was never fenced still takes normal adds.
            more = await client.add(open_ledger, KEY, [make_entry(open_ledger, 300, b"z")])
            assert more.status == Status.OK
        finally:
            await client.close()

    run(after_restart())
