"""The client against real bookie processes, on both metadata drivers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from support import poll_until

import quorumlog
from quorumlog import (
    BookKeeper,
    DigestType,
    InvalidArgumentError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from quorumlog.aio import BookKeeper as AsyncBookKeeper
from quorumlog.core.quorum import write_set
from quorumlog.errors import Status
from quorumlog.testing.raw_client import RawClient


@pytest.fixture
def bk(cluster3):
    with BookKeeper(cluster3.metadata_uri) as client:
        yield client


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_add_close_open_read_round_trip(bk, digest_type):
    lh = bk.create_ledger(3, 3, 2, digest_type=digest_type, password=b"pw")
    payloads = [b"entry-%d" % i * (i + 1) for i in range(50)]
    ids = [lh.add_entry(p) for p in payloads]
    assert ids == list(range(50))
    assert lh.last_add_confirmed == 49
    lh.close()
    assert bk.is_closed(lh.ledger_id)
    md = bk.ledger_metadata(lh.ledger_id)
    assert (md.last_entry_id, md.length) == (49, sum(map(len, payloads)))
    rh = bk.open_ledger(lh.ledger_id, b"pw")
    assert [e.data for e in rh.read_entries(0, 49)] == payloads
    assert [e.entry_id for e in rh.read_entries(10, 12)] == [10, 11, 12]
    with pytest.raises(NoSuchEntryError, match=f"ledger {lh.ledger_id}: entry 50"):
        rh.read_entries(0, 50)


def test_r3_async_adds_complete_in_entry_id_order(bk):
    lh = bk.create_ledger(3, 3, 2)
    order: list[int] = []
    lock = threading.Lock()

    def record(future):
        with lock:
            order.append(future.result())

    futures = [lh.add_entry_async(b"x" * 100) for _ in range(5000)]
    for f in futures:
        f.add_done_callback(record)
    assert [f.result(timeout=60) for f in futures] == list(range(5000))
    assert order == list(range(5000))
    lh.close()


def test_r1_bad_quorum_shapes_and_too_few_bookies_are_refused(bk):
    with pytest.raises(InvalidArgumentError, match="write_quorum=4"):
        bk.create_ledger(3, 4, 2)
    with pytest.raises(NotEnoughBookiesError, match="ensemble of 5"):
        bk.create_ledger(5, 3, 2)


def test_r1_striping_puts_each_entry_on_its_write_set_only(cluster4):
    with BookKeeper(cluster4.metadata_uri) as bk:
        lh = bk.create_ledger(4, 2, 2)
        for i in range(40):
            lh.add_entry(b"s%d" % i)
        lh.close()
        ensemble = bk.ledger_metadata(lh.ledger_id).ensembles[0][1]
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.data for e in rh.read_entries(0, 39)] == [b"s%d" % i for i in range(40)]
    for index, address in enumerate(ensemble):
        held = asyncio.run(_entries_held(address, lh.ledger_id, 40))
        expected = {e for e in range(40) if index in write_set(e, 4, 2)}
        assert held == expected, f"bookie {address} holds the wrong entries"


async def _entries_held(address: str, ledger_id: int, count: int) -> set[int]:
    """Which entries one bookie answers for, asked at the protocol level."""
    raw = await RawClient.connect(address)
    try:
        held = set()
        for entry_id in range(count):
            answer = await raw.read(ledger_id, entry_id)
            if answer.status == Status.OK and answer.entries:
                held.add(entry_id)
        return held
    finally:
        await raw.close()


def test_r10_wrong_password_is_refused_and_fences_nothing(bk):
    lh = bk.create_ledger(3, 3, 2, password=b"right")
    lh.add_entry(b"a")
    with pytest.raises(UnauthorizedError, match=f"ledger {lh.ledger_id}"):
        bk.open_ledger(lh.ledger_id, b"wrong")
    with pytest.raises(UnauthorizedError):
        bk.open_ledger_no_recovery(lh.ledger_id, b"wrong")
    # No password at all says so, rather than blaming one the user never gave.
    with pytest.raises(UnauthorizedError, match="none was given; the ledger has one"):
        bk.open_ledger(lh.ledger_id)
    assert lh.add_entry(b"b") == 1  # the writer was not fenced
    assert not bk.is_closed(lh.ledger_id)
    lh.close()


def test_r4_reader_without_recovery_stops_at_the_lac_and_long_polls(bk):
    lh = bk.create_ledger(3, 3, 2)
    for i in range(10):
        lh.add_entry(b"v%d" % i)
    reader = bk.open_ledger_no_recovery(lh.ledger_id)
    # The idle writer sent an explicit LAC, so the reader sees all ten, not nine.
    poll_until(
        lambda: reader.read_last_add_confirmed() >= 9,
        timeout_s=30,
        what="the reader learns LAC 9 from the idle writer's explicit LAC",
    )
    assert reader.last_add_confirmed == 9
    assert [e.data for e in reader.read_entries(0, 9)] == [b"v%d" % i for i in range(10)]
    with pytest.raises(NoSuchEntryError, match="last add confirmed"):
        reader.read_entries(10, 10)
    # Long poll: nothing new within the timeout.
    lac, entry = reader.read_last_add_confirmed_and_entry(10, timeout_ms=200)
    assert (lac, entry) == (9, None)
    # Long poll answered as soon as the writer adds.
    threading.Timer(0.2, lh.add_entry, args=(b"v10",)).start()
    started = time.monotonic()
    lac, entry = reader.read_last_add_confirmed_and_entry(10, timeout_ms=60_000)
    assert entry is not None and entry.data == b"v10" and lac >= 10
    # Answered on the add, not at the poll's 60 s timeout (a bound for a shared machine).
    assert time.monotonic() - started < 30
    assert not bk.is_closed(lh.ledger_id)  # reading never fenced the writer
    lh.add_entry(b"v11")
    lh.close()
    reader.refresh_metadata()
    assert reader.is_closed and reader.last_add_confirmed == 11


def test_r6_close_twice_and_add_after_close(bk):
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entry(b"a")
    lh.close()
    lh.close()
    with pytest.raises(LedgerClosedError, match=f"ledger {lh.ledger_id}"):
        lh.add_entry(b"b")
    assert [e.data for e in lh.read_entries(0, 0)] == [b"a"]  # still readable


def test_delete_ledger_and_add_after_delete_fails(bk):
    lh = bk.create_ledger(3, 3, 2)
    lh.add_entry(b"a")
    assert lh.ledger_id in bk.list_ledgers()
    bk.delete_ledger(lh.ledger_id)
    assert lh.ledger_id not in bk.list_ledgers()
    with pytest.raises(NoSuchLedgerError, match=str(lh.ledger_id)):
        bk.open_ledger(lh.ledger_id)
    with pytest.raises(quorumlog.BKError):  # BookKeeper #4462: no add after delete
        lh.add_entry(b"b")


def test_r10_delete_ledger_with_a_wrong_password_changes_nothing(bk):
    lh = bk.create_ledger(3, 3, 2, password=b"pw")
    lh.add_entry(b"a")
    with pytest.raises(UnauthorizedError, match=str(lh.ledger_id)):
        bk.delete_ledger(lh.ledger_id, b"wrong")
    assert lh.ledger_id in bk.list_ledgers()
    assert lh.add_entry(b"b") == 1  # every bookie still holds the ledger
    bk.delete_ledger(lh.ledger_id, b"pw")
    assert lh.ledger_id not in bk.list_ledgers()
    with pytest.raises(quorumlog.BKError):  # the bookies took the delete: no add after it
        lh.add_entry(b"c")


def test_custom_metadata_and_listing(bk):
    lh = bk.create_ledger(3, 3, 2, custom_metadata={"app": b"dice", "epoch": b"\x00\x01"})
    md = bk.ledger_metadata(lh.ledger_id)
    assert dict(md.custom_metadata) == {"app": b"dice", "epoch": b"\x00\x01"}
    assert md.creation_time_ms > 0 and md.ensemble_size == 3
    assert sorted(bk.list_bookies()) == sorted(md.ensembles[0][1])
    lh.close()


def test_zombie_writer_is_fenced_by_open_ledger(bk, cluster3):
    lh = bk.create_ledger(3, 3, 2, password=b"pw")
    for i in range(20):
        lh.add_entry(b"z%d" % i)
    with BookKeeper(cluster3.metadata_uri) as other:
        rh = other.open_ledger(lh.ledger_id, b"pw")
        assert rh.metadata.last_entry_id == 19
    with pytest.raises(LedgerFencedError, match=f"ledger {lh.ledger_id}"):
        lh.add_entry(b"late")
    with BookKeeper(cluster3.metadata_uri) as third:
        md = third.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 19


def test_asyncio_api_pipelines_and_reads(cluster3):
    async def main():
        async with await AsyncBookKeeper.connect(cluster3.metadata_uri) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            futures = [lh.append(b"%06d" % i) for i in range(2000)]
            assert await asyncio.gather(*futures) == list(range(2000))
            assert await lh.add_entry(b"last") == 2000
            await lh.close()
            rh = await bk.open_ledger(lh.ledger_id)
            entries = await rh.read_entries(0, 2000)
            assert entries[-1].data == b"last"
            assert [e.data for e in entries[:3]] == [b"000000", b"000001", b"000002"]

    asyncio.run(main())


def test_a_bug_in_a_metadata_update_fails_the_handle_with_the_original_error(cluster3, monkeypatch):
    """Only a store's failures (BKError, OSError, timeouts) are retried or read back; a
    bug's exception is neither, and the handle fails with it instead of guessing."""

    async def main():
        async with await AsyncBookKeeper.connect(cluster3.metadata_uri) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            assert await lh.add_entry(b"x") == 0

            async def broken_update(*args, **kwargs):
                raise TypeError("a bug in the update")

            monkeypatch.setattr(bk.ledgers, "update", broken_update)
            with pytest.raises(TypeError, match="a bug in the update"):
                await asyncio.wait_for(lh.close(), 30)
            with pytest.raises(quorumlog.BKError, match=r"internal error.*a bug in the update"):
                lh.append(b"y")

    asyncio.run(main())
