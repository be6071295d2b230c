"""R16 on a real bookie process: every queue and connection count has a limit in bytes or
numbers, and over it the sender gets back-pressure or a clear error while other clients,
and the same client's other requests, go on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from support import run

from quorumlog.errors import Status
from quorumlog.proto.codec import ReadFlag, ReadRequest, ReadResponse
from quorumlog.server.config import ServerConfig
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"bounds-test")


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One bookie on the embedded store (the metadata driver plays no part here)."""
    base = tmp_path_factory.mktemp("bounds")
    cluster = LocalCluster(f"sqlite://{base / 'metadata.db'}", base, 1)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def test_r16_parked_long_polls_never_stall_the_same_connections_adds(
    bookie: LocalCluster,
) -> None:
    """A tailing client parks many long polls (each may get up to 1 MiB back) on the
    connection its writer uses too: its adds are read and answered at once, and the polls
    are answered when the LAC moves."""
    polled, written = 5001, 5002
    polls_count = 200

    async def scenario() -> None:
        client = await RawClient.connect(bookie.addresses[0])
        try:
            polls = [
                client.send(ReadRequest(0, polled, 0, 1, ReadFlag.LONG_POLL, timeout_ms=60_000))
                for _ in range(polls_count)
            ]
            for entry_id in range(20):
                blob = make_entry(written, entry_id, b"w%d" % entry_id, lac=entry_id - 1)
                # Bounds well under the polls' 60 s: an add stuck behind them would
                # wait that long; a loaded machine's fdatasync can take seconds.
                answer = await client.add(written, KEY, [blob], timeout_s=20)
                assert answer.status == Status.OK
            assert not any(poll.done() for poll in polls), "a poll was answered early"
            first = make_entry(polled, 0, b"p0")
            second = make_entry(polled, 1, b"p1", lac=0)  # carries LAC 0: wakes the polls
            assert (await client.add(polled, KEY, [first, second])).status == Status.OK
            answers = await asyncio.wait_for(asyncio.gather(*polls), 30)
            for answer in answers:
                assert isinstance(answer, ReadResponse)
                assert (answer.status, answer.lac, answer.entries) == (Status.OK, 0, [first])
        finally:
            await client.close()

    run(scenario())
    assert bookie.bookies[0].alive()


def test_r16_connections_beyond_the_cap_are_closed_and_the_others_go_on(
    bookie: LocalCluster,
) -> None:
    """The bookie holds at most ``max_connections`` (512 by default): the ones beyond are
    closed at once, the ones it holds keep working, and a place freed is taken again."""
    cap = ServerConfig().max_connections
    ledger_id = 5101

    async def scenario() -> None:
        address = bookie.addresses[0]
        clients = [await RawClient.connect(address) for _ in range(cap + 8)]
        try:
            closed = [c for c in clients if await c.wait_closed(0.01)]
            deadline = asyncio.get_running_loop().time() + 10
            while len(closed) < 8 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                closed = [c for c in clients if c.is_closed]
            assert len(closed) >= 8, f"{len(closed)} of {len(clients)} connections closed"
            held = [c for c in clients if not c.is_closed]
            assert len(held) <= cap
            answers = await asyncio.gather(
                *(
                    c.add(ledger_id, KEY, [make_entry(ledger_id, i, b"c%d" % i)])
                    for i, c in enumerate(held)
                )
            )
            assert all(a.status == Status.OK for a in answers)
            await held[0].close()
            deadline = asyncio.get_running_loop().time() + 10
            while True:  # the bookie sees the close soon after: then the place is free
                again = await RawClient.connect(address)
                if not await again.wait_closed(0.2):
                    break
                assert asyncio.get_running_loop().time() < deadline, "no place freed"
            blob = make_entry(ledger_id, len(held), b"again")
            assert (await again.add(ledger_id, KEY, [blob])).status == Status.OK
            await again.close()
        finally:
            for client in clients:
                await client.close()

    run(scenario(), timeout_s=120)
    assert bookie.bookies[0].alive()
