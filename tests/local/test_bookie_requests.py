"""The bookie's request logic through ``Bookie.submit``: adds, reads, fencing (R7),
passwords (R10), corruption (R9), LACs and long polls, deletes, bad input (R12),
read-only mode. Real files under tmp_path, no sockets."""

from __future__ import annotations

import asyncio
from functools import partial

import support

from quorumlog.errors import Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    BookieInfoRequest,
    DeleteLedgerRequest,
    FenceRequest,
    Op,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
)
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"password")
OTHER_KEY = master_key(b"not the password")


run = partial(support.run, timeout_s=20)


def blob(ledger_id: int, entry_id: int, size: int = 100, lac: int | None = None) -> bytes:
    payload = (b"%d/%d:" % (ledger_id, entry_id)).ljust(size, b".")
    return make_entry(ledger_id, entry_id, payload, lac=entry_id - 1 if lac is None else lac)


def add(ledger_id: int, blobs: list[bytes], key: bytes = KEY, recovery: bool = False) -> AddRequest:
    flags = AddFlag.RECOVERY if recovery else AddFlag.NONE
    return AddRequest(0, ledger_id, key, blobs, flags)


# ---------------------------------------------------------------- adds and reads


def test_r2_add_then_read_back(driver):
    async def scenario():
        await driver.start()
        blobs = [blob(1, i) for i in range(20)]
        single = await driver.call(add(1, blobs[:1]))
        batch = await driver.call(add(1, blobs[1:]))
        assert (single.status, single.entry_count) == (Status.OK, 1)
        assert (batch.status, batch.entry_count) == (Status.OK, 19)
        read = await driver.call(ReadRequest(0, 1, 0, 20))
        assert read.status == Status.OK
        assert read.entries == blobs
        assert read.lac == 18  # the largest LAC piggybacked on the entries
        one = await driver.call(ReadRequest(0, 1, 7))
        assert one.entries == [blobs[7]]
        lac = await driver.call(ReadLacRequest(0, 1))
        assert (lac.status, lac.lac, lac.last_entry_id) == (Status.OK, 18, 19)
        await driver.close()

    run(scenario())


def test_reads_of_unknown_ledger_and_missing_entry(driver):
    async def scenario():
        await driver.start()
        assert (await driver.call(ReadRequest(0, 5, 0))).status == Status.NO_SUCH_LEDGER
        assert (await driver.call(ReadLacRequest(0, 5))).status == Status.NO_SUCH_LEDGER
        await driver.call(add(5, [blob(5, 0)]))
        assert (await driver.call(ReadRequest(0, 5, 1))).status == Status.NO_SUCH_ENTRY
        await driver.close()

    run(scenario())


def test_batched_read_stops_at_the_first_gap(driver):
    async def scenario():
        await driver.start()
        blobs = {i: blob(2, i) for i in (0, 1, 2, 4, 5)}
        assert (await driver.call(add(2, list(blobs.values())))).status == Status.OK
        read = await driver.call(ReadRequest(0, 2, 0, 10))
        assert read.entries == [blobs[0], blobs[1], blobs[2]]
        after_gap = await driver.call(ReadRequest(0, 2, 4, 10))
        assert after_gap.entries == [blobs[4], blobs[5]]
        assert (await driver.call(ReadRequest(0, 2, 3, 10))).status == Status.NO_SUCH_ENTRY
        await driver.close()

    run(scenario())


def test_batched_read_stops_at_max_bytes_but_returns_at_least_one(driver):
    async def scenario():
        await driver.start()
        blobs = [blob(3, i, size=1000) for i in range(10)]
        await driver.call(add(3, blobs))
        size = len(blobs[0])
        read = await driver.call(ReadRequest(0, 3, 0, 10, max_bytes=3 * size + 10))
        assert read.entries == blobs[:3]
        tiny = await driver.call(ReadRequest(0, 3, 5, 10, max_bytes=1))
        assert tiny.entries == [blobs[5]]
        await driver.close()

    run(scenario())


def test_reads_from_disk_after_checkpoint_use_index_and_cache(driver):
    async def scenario():
        bookie = await driver.start()
        blobs = [blob(4, i) for i in range(50)]
        await driver.call(add(4, blobs))
        await bookie.checkpoint()
        assert bookie.state(4).recent == {} and bookie.state(4).flushing is None
        first = await driver.call(ReadRequest(0, 4, 0, 50))
        assert first.entries == blobs
        # The first entry of a read is kept in the read cache (the rest went to the
        # answer): a reader asking for the same batch again finds it there.
        hits = bookie.storage.read_cache.hits
        again = await driver.call(ReadRequest(0, 4, 0, 5))
        assert again.entries == blobs[:5]
        assert bookie.storage.read_cache.hits == hits + 1
        await driver.close()

    run(scenario())


def test_recovery_add_overwrites_an_existing_entry(driver):
    async def scenario():
        bookie = await driver.start()
        await driver.call(add(6, [blob(6, 0, size=10)]))
        await bookie.checkpoint()
        await driver.call(ReadRequest(0, 6, 0))  # now in the read cache
        rewritten = blob(6, 0, size=20)
        assert (await driver.call(add(6, [rewritten], recovery=True))).status == Status.OK
        assert (await driver.call(ReadRequest(0, 6, 0))).entries == [rewritten]
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- R12: bad input


def test_r12_bad_adds_are_refused_and_change_nothing(driver):
    async def scenario():
        bookie = await driver.start()
        good = [blob(7, 0), blob(7, 1)]
        await driver.call(add(7, good))
        syncs = bookie.journal.sync_count
        bad_requests = [
            add(7, [blob(7, 2), blob(8, 3)]),  # an entry of another ledger
            add(7, [blob(7, 2), b"short"]),  # shorter than the header
            add(7, [b"x" * 10]),
            add(7, []),  # nothing to add
            add(7, [blob(7, 2)[:31]]),
            add(9, [blob(8, 0)]),  # a ledger the bookie does not know, with foreign entries
            add(7, [make_entry(7, -5, b"negative id")]),
        ]
        for request in bad_requests:
            answer = await driver.call(request)
            assert answer.status == Status.BAD_REQUEST, request
        assert bookie.journal.sync_count == syncs  # nothing was journaled
        assert bookie.state(9) is None and bookie.state(8) is None
        assert bookie.ledger_ids() == {7}
        read = await driver.call(ReadRequest(0, 7, 0, 10))
        assert read.entries == good
        lac = await driver.call(ReadLacRequest(0, 7))
        assert (lac.lac, lac.last_entry_id) == (0, 1)
        assert (await driver.call(ReadRequest(0, 7, -1))).status == Status.BAD_REQUEST
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- R10: passwords


def test_r10_wrong_master_key_is_refused_and_changes_nothing(driver):
    async def scenario():
        bookie = await driver.start()
        await driver.call(add(10, [blob(10, 0)]))
        wrong_add = await driver.call(add(10, [blob(10, 1)], key=OTHER_KEY))
        assert wrong_add.status == Status.UNAUTHORIZED
        wrong_fence = await driver.call(FenceRequest(0, 10, OTHER_KEY))
        assert wrong_fence.status == Status.UNAUTHORIZED
        wrong_read = await driver.call(ReadRequest(0, 10, 0, 1, ReadFlag.FENCE, OTHER_KEY))
        assert wrong_read.status == Status.UNAUTHORIZED
        wrong_lac = await driver.call(WriteLacRequest(0, 10, OTHER_KEY, 5))
        assert wrong_lac.status == Status.UNAUTHORIZED
        st = bookie.state(10)
        assert st.master_key == KEY and not st.fenced and st.lac == -1 and st.last_entry_id == 0
        assert (await driver.call(ReadRequest(0, 10, 1))).status == Status.NO_SUCH_ENTRY
        # The right key still works.
        assert (await driver.call(add(10, [blob(10, 1)]))).status == Status.OK
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- R7: fencing


def test_r7_fence_refuses_normal_adds_and_accepts_recovery_adds(driver):
    async def scenario():
        await driver.start()
        await driver.call(add(11, [blob(11, i) for i in range(3)]))
        fence = await driver.call(FenceRequest(0, 11, KEY))
        assert (fence.status, fence.lac, fence.last_entry_id) == (Status.OK, 1, 2)
        refused = await driver.call(add(11, [blob(11, 3)]))
        assert refused.status == Status.FENCED
        assert (await driver.call(ReadRequest(0, 11, 3))).status == Status.NO_SUCH_ENTRY
        recovery = await driver.call(add(11, [blob(11, 3)], recovery=True))
        assert recovery.status == Status.OK
        assert (await driver.call(ReadRequest(0, 11, 3))).status == Status.OK
        await driver.close()

    run(scenario())


def test_r7_fencing_read_fences_before_answering(driver):
    async def scenario():
        bookie = await driver.start()
        blobs = [blob(12, i) for i in range(2)]
        await driver.call(add(12, blobs))
        # Submit the fencing read and a normal add in the same loop turn: the add comes
        # after the fence (in memory at once), so it is refused even before the fence
        # is durable.
        read = driver.send(ReadRequest(0, 12, 0, 2, ReadFlag.FENCE, KEY))
        late = driver.send(add(12, [blob(12, 2)]))
        assert bookie.state(12).fenced
        assert (await late).status == Status.FENCED
        answer = await read
        assert (answer.status, answer.entries) == (Status.OK, blobs)
        # A second fencing read is answered without another journal sync.
        syncs = bookie.journal.sync_count
        again = await driver.call(ReadRequest(0, 12, 1, 1, ReadFlag.FENCE, KEY))
        assert again.entries == [blobs[1]]
        assert bookie.journal.sync_count == syncs
        await driver.close()

    run(scenario())


def test_r7_fence_of_an_unknown_ledger_records_key_and_fence(driver):
    async def scenario():
        await driver.start()
        fence = await driver.call(FenceRequest(0, 13, KEY))
        assert (fence.status, fence.lac, fence.last_entry_id) == (Status.OK, -1, -1)
        # The old writer's late add fails, with either key.
        assert (await driver.call(add(13, [blob(13, 0)]))).status == Status.FENCED
        assert (await driver.call(add(13, [blob(13, 0)], key=OTHER_KEY))).status == (
            Status.UNAUTHORIZED
        )
        read = await driver.call(ReadRequest(0, 14, 0, 1, ReadFlag.FENCE, KEY))
        assert read.status == Status.NO_SUCH_ENTRY  # fenced, knows the ledger, no entry
        assert (await driver.call(add(14, [blob(14, 0)]))).status == Status.FENCED
        await driver.close()

    run(scenario())


def test_r7_fence_and_master_key_survive_reopen(driver):
    async def scenario():
        await driver.start()
        await driver.call(add(15, [blob(15, 0)]))
        await driver.call(FenceRequest(0, 15, KEY))
        await driver.call(FenceRequest(0, 16, KEY))  # never saw an add
        await driver.restart()
        for ledger_id in (15, 16):
            refused = await driver.call(add(ledger_id, [blob(ledger_id, 1)]))
            assert refused.status == Status.FENCED
            wrong = await driver.call(add(ledger_id, [blob(ledger_id, 1)], key=OTHER_KEY))
            assert wrong.status == Status.UNAUTHORIZED
        ok = await driver.call(add(15, [blob(15, 1)], recovery=True))
        assert ok.status == Status.OK
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- R9: corruption


def test_r9_flipped_byte_in_entry_log_is_io_error_not_no_such_entry(driver):
    marker = b"precious-payload-0123456789"

    async def scenario():
        await driver.start()
        blobs = [make_entry(17, 0, b"first"), make_entry(17, 1, marker), make_entry(17, 2, b"3")]
        await driver.call(add(17, blobs))
        await driver.close()  # checkpoint: the entries are in an entry log file
        flipped = 0
        for path in (driver.config.data_dir / "entrylogs").iterdir():
            data = bytearray(path.read_bytes())
            at = data.find(marker)
            if at >= 0:
                data[at + 5] ^= 0x01
                path.write_bytes(bytes(data))
                flipped += 1
        assert flipped == 1
        await driver.start()
        damaged = await driver.call(ReadRequest(0, 17, 1))
        assert damaged.status == Status.IO_ERROR
        # A batch that reaches the damaged entry stops before it; the entries before it
        # are served, and the damaged one is never reported missing.
        batch = await driver.call(ReadRequest(0, 17, 0, 3))
        assert (batch.status, batch.entries) == (Status.OK, blobs[:1])
        assert (await driver.call(ReadRequest(0, 17, 2))).entries == blobs[2:]
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- LAC and long polls


def test_explicit_lac_is_stored_and_raises_known_lac(driver):
    async def scenario():
        await driver.start()
        await driver.call(add(20, [blob(20, i) for i in range(5)]))
        written = await driver.call(WriteLacRequest(0, 20, KEY, 4))
        assert (written.status, written.op) == (Status.OK, Op.WRITE_LAC)
        assert (await driver.call(ReadLacRequest(0, 20))).lac == 4
        lower = await driver.call(WriteLacRequest(0, 20, KEY, 1))  # LACs never go back
        assert lower.status == Status.OK
        assert (await driver.call(ReadLacRequest(0, 20))).lac == 4
        assert (await driver.call(ReadRequest(0, 20, 0))).lac == 4
        await driver.restart()
        assert (await driver.call(ReadLacRequest(0, 20))).lac == 4
        await driver.close()

    run(scenario())


def test_long_poll_answers_at_once_when_lac_is_already_past(driver):
    async def scenario():
        await driver.start()
        await driver.call(add(21, [blob(21, i) for i in range(3)]))
        poll = await driver.call(
            ReadRequest(0, 21, 2, 1, ReadFlag.LONG_POLL, previous_lac=0, timeout_ms=10_000)
        )
        assert (poll.status, poll.lac, poll.entries) == (Status.OK, 1, [blob(21, 2)])
        await driver.close()

    run(scenario())


def test_long_poll_answers_when_lac_moves(driver):
    async def scenario():
        bookie = await driver.start()
        await driver.call(add(22, [blob(22, 0), blob(22, 1)]))  # LAC 0

        def parked() -> bool:
            return bookie.stats()["parked_polls"] == 1

        # The polls ask for 60 s; answers come within 30 s, so they were woken, not timed
        # out (a timed-out poll also carries no entries).
        poll = driver.send(
            ReadRequest(0, 22, 1, 1, ReadFlag.LONG_POLL, previous_lac=0, timeout_ms=60_000)
        )
        await support.poll_until_async(parked, timeout_s=30, what="the poll parks")
        assert not poll.done()
        await driver.call(add(22, [blob(22, 2)]))  # carries LAC 1
        answer = await asyncio.wait_for(poll, 30)
        assert (answer.status, answer.lac, answer.entries) == (Status.OK, 1, [blob(22, 1)])
        # An explicit LAC wakes polls too, also on a ledger that has no entry yet.
        other = driver.send(
            ReadRequest(0, 23, 0, 1, ReadFlag.LONG_POLL, previous_lac=-1, timeout_ms=60_000)
        )
        await support.poll_until_async(parked, timeout_s=30, what="the second poll parks")
        assert not other.done()
        await driver.call(WriteLacRequest(0, 23, KEY, 0))
        woken = await asyncio.wait_for(other, 30)
        assert (woken.status, woken.lac, woken.entries) == (Status.OK, 0, [])
        assert bookie.stats()["parked_polls"] == 0
        await driver.close()

    run(scenario())


def test_long_poll_times_out_with_ok_and_no_entries(make_driver):
    driver = make_driver(long_poll_max_timeout_ms=100)

    async def scenario():
        bookie = await driver.start()
        await driver.call(add(24, [blob(24, 0)]))
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Asks for 10 minutes; the bookie caps it at 100 ms. The upper bound tells the two
        # apart with room for a shared machine.
        answer = await driver.call(
            ReadRequest(0, 24, 1, 1, ReadFlag.LONG_POLL, previous_lac=-1, timeout_ms=600_000),
            timeout_s=120,
        )
        waited = loop.time() - started
        assert (answer.status, answer.lac, answer.entries) == (Status.OK, -1, [])
        assert 0.08 <= waited < 60
        assert bookie.stats()["parked_polls"] == 0
        await driver.close()

    run(scenario())


def test_long_polls_are_bounded(make_driver):
    driver = make_driver(long_poll_max_per_ledger=3, long_poll_max_total=5)

    async def scenario():
        await driver.start()

        def poll(ledger_id):
            return driver.send(
                ReadRequest(0, ledger_id, 0, 1, ReadFlag.LONG_POLL, timeout_ms=10_000)
            )

        first = [poll(25) for _ in range(4)]
        assert (await first[3]).status == Status.TOO_MANY_REQUESTS
        second = [poll(26) for _ in range(3)]
        assert (await second[2]).status == Status.TOO_MANY_REQUESTS  # 5 in total
        # Closing answers the parked ones.
        await driver.close()
        for future in first[:3] + second[:2]:
            assert future.done() and future.result().status == Status.OK

    run(scenario())


# ---------------------------------------------------------------- delete


def test_delete_leaves_a_tombstone_add_after_delete_fails(driver):
    async def scenario():
        bookie = await driver.start()
        await driver.call(add(30, [blob(30, 0), blob(30, 1)]))
        poll = driver.send(
            ReadRequest(0, 30, 5, 1, ReadFlag.LONG_POLL, previous_lac=5, timeout_ms=10_000)
        )
        deleted = await driver.call(DeleteLedgerRequest(0, 30, KEY))
        assert (deleted.status, deleted.op) == (Status.OK, Op.DELETE_LEDGER)
        assert (await poll).status == Status.NO_SUCH_LEDGER
        # BookKeeper #4462: a late add of the old writer must not revive the ledger.
        assert (await driver.call(add(30, [blob(30, 2)]))).status == Status.NO_SUCH_LEDGER
        assert (await driver.call(add(30, [blob(30, 2)], recovery=True))).status == (
            Status.NO_SUCH_LEDGER
        )
        assert (await driver.call(ReadRequest(0, 30, 0))).status == Status.NO_SUCH_LEDGER
        assert (await driver.call(FenceRequest(0, 30, KEY))).status == Status.NO_SUCH_LEDGER
        assert 30 not in bookie.ledger_ids()
        # A delete of a ledger this bookie never saw leaves a tombstone too.
        await driver.call(DeleteLedgerRequest(0, 31, KEY))
        assert (await driver.call(add(31, [blob(31, 0)]))).status == Status.NO_SUCH_LEDGER
        await bookie.checkpoint()
        assert bookie.storage.index.count_entries(30) == 0
        await driver.restart()
        assert (await driver.call(add(30, [blob(30, 2)]))).status == Status.NO_SUCH_LEDGER
        assert (await driver.call(ReadRequest(0, 30, 0))).status == Status.NO_SUCH_LEDGER
        await driver.close()

    run(scenario())


def test_r10_delete_with_another_master_key_is_refused_and_changes_nothing(driver):
    async def scenario():
        bookie = await driver.start()
        blobs = [blob(32, 0), blob(32, 1)]
        await driver.call(add(32, blobs))
        poll = driver.send(
            ReadRequest(0, 32, 2, 1, ReadFlag.LONG_POLL, previous_lac=0, timeout_ms=10_000)
        )
        refused = await driver.call(DeleteLedgerRequest(0, 32, OTHER_KEY))
        assert (refused.status, refused.op) == (Status.UNAUTHORIZED, Op.DELETE_LEDGER)
        assert not poll.done(), "a refused delete answered the ledger's parked poll"
        assert 32 in bookie.ledger_ids() and not bookie.state(32).deleted
        assert (await driver.call(ReadRequest(0, 32, 0, 2))).entries == blobs
        assert (await driver.call(add(32, [blob(32, 2)]))).status == Status.OK
        assert (await poll).status == Status.OK
        # Nothing of the refused delete was journaled: it is still refused after a restart.
        await driver.restart()
        assert (await driver.call(ReadRequest(0, 32, 0, 3))).status == Status.OK
        deleted = await driver.call(DeleteLedgerRequest(0, 32, KEY))
        assert deleted.status == Status.OK
        assert (await driver.call(ReadRequest(0, 32, 0))).status == Status.NO_SUCH_LEDGER
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- bookie info, read-only


def test_bookie_info_reports_disk(driver):
    async def scenario():
        await driver.start()
        info = await driver.call(BookieInfoRequest(0))
        assert info.status == Status.OK and not info.read_only
        assert 0 < info.free_bytes <= info.total_bytes
        await driver.close()

    run(scenario())


def test_read_only_at_threshold_zero_refuses_adds_serves_reads(make_driver):
    async def scenario():
        writable = make_driver()
        await writable.start()
        await writable.call(add(40, [blob(40, 0)]))
        await writable.close()
        driver = make_driver(disk_usage_threshold=0.0, disk_usage_lwm_threshold=0.0)
        bookie = await driver.start()
        assert bookie.read_only
        assert (await driver.call(add(40, [blob(40, 1)]))).status == Status.READ_ONLY
        assert (await driver.call(ReadRequest(0, 40, 0))).entries == [blob(40, 0)]
        assert (await driver.call(FenceRequest(0, 40, KEY))).status == Status.OK
        assert (await driver.call(BookieInfoRequest(0))).read_only
        await driver.close()

    run(scenario())


def test_read_only_follows_disk_usage_with_hysteresis(make_driver):
    driver = make_driver(
        disk_usage_threshold=0.9, disk_usage_lwm_threshold=0.8, disk_check_interval_ms=10
    )

    async def scenario():
        from quorumlog.bookie.disk_checker import DiskUsage

        bookie = await driver.start()
        usage = {"fraction": 0.5}
        measured: list[float] = []  # what disk checks measured; each decides at once

        def usage_fn(path):
            measured.append(usage["fraction"])
            total = 1 << 40  # free bytes far above the reserved space's size
            return DiskUsage(path, usage["fraction"], int(total * (1 - usage["fraction"])), total)

        bookie._disk_checker._usage_fn = usage_fn
        changes = []
        bookie.add_read_only_listener(changes.append)

        async def settle(fraction):
            """The disk is ``fraction`` used; return once a disk check has measured it."""
            usage["fraction"] = fraction
            measured.clear()
            await support.poll_until_async(
                lambda: fraction in measured, timeout_s=30, what=f"a disk check of {fraction}"
            )

        await settle(0.95)
        assert bookie.read_only and changes == [True]
        assert (await driver.call(add(41, [blob(41, 0)]))).status == Status.READ_ONLY
        await settle(0.85)  # below the high mark, above the low one: still read-only
        assert bookie.read_only
        await settle(0.7)
        assert not bookie.read_only and changes == [True, False]
        assert (await driver.call(add(41, [blob(41, 0)]))).status == Status.OK
        await driver.close()

    run(scenario())


# ---------------------------------------------------------------- failures of one request


def test_r12_a_failing_disk_answers_that_request_only(driver, monkeypatch):
    async def scenario():
        bookie = await driver.start()
        await driver.call(add(50, [blob(50, 0)]))

        def failing_disk(*args, **kwargs):
            raise OSError(5, "Input/output error")

        with monkeypatch.context() as patch:
            patch.setattr(bookie.storage, "read_entries", failing_disk)
            assert (await driver.call(ReadRequest(0, 50, 0))).status == Status.IO_ERROR
            # Other requests are unaffected.
            assert (await driver.call(ReadLacRequest(0, 50))).status == Status.OK
            assert (await driver.call(add(50, [blob(50, 1)]))).status == Status.OK
        assert (await driver.call(ReadRequest(0, 50, 0, 2))).entries == [
            blob(50, 0),
            blob(50, 1),
        ]
        assert driver.broken == []
        await driver.close()

    run(scenario())


def test_broken_invariant_in_request_handling_stops_the_bookie(driver, monkeypatch):
    """A state that cannot be is not an IO_ERROR answer: the bookie stops (in a bookie
    process, the process ends; here the test's hook hears of it) and serves nothing more,
    and no checkpoint writes what it had in memory."""

    async def scenario():
        bookie = await driver.start()
        await driver.call(add(53, [blob(53, 0)]))
        checkpoints = bookie.checkpoints_done

        def impossible(*args, **kwargs):
            raise AssertionError("an entry both present and absent")

        monkeypatch.setattr(bookie.storage, "read_entries", impossible)
        answer = await driver.call(ReadRequest(0, 53, 0))
        assert answer.status != Status.IO_ERROR
        assert len(driver.broken) == 1
        assert "broken invariant in handling ReadRequest" in driver.broken[0]
        assert "an entry both present and absent" in driver.broken[0]
        assert bookie.halt.message == driver.broken[0]
        assert (await driver.call(ReadLacRequest(0, 53))).status == Status.SHUTTING_DOWN
        assert (await driver.call(add(53, [blob(53, 1)]))).status == Status.SHUTTING_DOWN
        assert bookie._timers.stopped and bookie.checkpoints_done == checkpoints
        await driver.close()
        # The journal had it all: a restart serves what was acknowledged.
        driver.broken.clear()
        await driver.start()
        assert (await driver.call(ReadRequest(0, 53, 0))).entries == [blob(53, 0)]
        await driver.close()

    run(scenario())


def test_requests_outside_start_and_close_are_refused(driver):
    async def scenario():
        await driver.start()
        bookie = driver.bookie
        await driver.close()
        answers = []
        bookie.submit(add(51, [blob(51, 0)]), answers.append)
        bookie.submit(ReadRequest(0, 51, 0), answers.append)
        assert [a.status for a in answers] == [Status.SHUTTING_DOWN] * 2

    run(scenario())


def test_read_answers_are_capped_whatever_max_bytes_asks(make_driver):
    driver = make_driver(read_response_max_bytes=5_000)

    async def scenario():
        await driver.start()
        blobs = [blob(52, i, size=1000) for i in range(20)]
        await driver.call(add(52, blobs))
        read = await driver.call(ReadRequest(0, 52, 0, 20, max_bytes=1 << 30))
        assert read.entries == blobs[: 5_000 // len(blobs[0])]
        await driver.close()

    run(scenario())
