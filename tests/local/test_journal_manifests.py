"""R17 for the journal's last batch: a flipped bit in it (or a write torn before its sync)
never makes the bookie answer "absent" for what it may have acknowledged. Every batch
carries a MANIFEST record first and last; replay keeps what a whole one proves and
answers the entries it names as unknown until a recovery, a delete or a collection
settles them; the bytes it cuts are kept aside; the ranges outlive restarts."""

from __future__ import annotations

import asyncio
import os
import threading
from functools import partial
from pathlib import Path

import pytest
import support

from quorumlog.bookie import suspicion
from quorumlog.bookie.bookie import BookieStartError
from quorumlog.bookie.entry_log import format_records
from quorumlog.bookie.fileops import REAL_FILES
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import replay as journal_replay
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.errors import Status
from quorumlog.proto.codec import (
    AddFlag,
    AddRequest,
    DeleteLedgerRequest,
    FenceRequest,
    ReadFlag,
    ReadLacRequest,
    ReadRequest,
    WriteLacRequest,
)
from quorumlog.testing.raw_client import make_entry, master_key

KEY = master_key(b"password")
OTHER_KEY = master_key(b"another")

run = partial(support.run, timeout_s=30)


def blob(ledger_id: int, entry_id: int) -> bytes:
    return make_entry(ledger_id, entry_id, b"%d/%d" % (ledger_id, entry_id), lac=entry_id - 1)


def adds(ledger_id: int, entry_ids: range) -> journal_format.Record:
    blobs = [blob(ledger_id, e) for e in entry_ids]
    return journal_format.add_record(ledger_id, format_records(blobs, [len(b) for b in blobs]))


def write_batches(
    directory: Path, batches: list[list[journal_format.Record]], direct: bool
) -> None:
    """Each list of records as one batch, in order (the next is queued once the one before
    is synced)."""

    async def scenario() -> None:
        journal = journal_writer.Journal(
            directory,
            1,
            sync=True,
            max_group_wait_ms=0.0,
            max_batch_bytes=1 << 22,
            max_batch_records=100_000,
            file_max_bytes=1 << 24,
            direct_io=direct,
        )
        loop = asyncio.get_running_loop()
        synced = asyncio.Event()
        journal.start(loop, lambda dones, size, error: synced.set())
        for batch in batches:
            synced.clear()
            for record in batch[:-1]:
                journal.append(record, None)
            journal.append(batch[-1], (lambda _: None, None))
            await synced.wait()
        await journal.close()
        assert journal.batch_count == len(batches)

    run(scenario())


def the_file(directory: Path) -> Path:
    (file_id,) = journal_format.list_journal_ids(directory)
    return directory / journal_format.journal_file_name(file_id)


def record_bytes(record: journal_format.Record) -> bytes:
    return b"".join(record[0])


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x08
    path.write_bytes(bytes(data))


def scan(directory: Path) -> tuple[list[tuple[int, bytes]], journal_replay.ScanReport]:
    report = journal_replay.ScanReport()
    return [(k, bytes(p)) for k, p in journal_replay.scan(directory, None, False, report)], report


def manifests(
    records: list[tuple[int, bytes]], kind: int = journal_format.RECORD_MANIFEST
) -> list[list[journal_format.LedgerFacts]]:
    return [journal_format.decode_manifest(p) for k, p in records if k == kind]


LAST_BATCH = [
    journal_format.master_key_record(8, KEY),
    adds(8, range(0, 3)),
    adds(7, range(10, 12)),
    journal_format.fence_record(7),
    journal_format.lac_record(7, 9),
    adds(7, range(5, 7)),  # a recovery rewriting lower ids
    journal_format.lac_record(7, 8),
    journal_format.delete_record(9),
]
LAST_FACTS = [
    journal_format.LedgerFacts(8, 0, 2, master_key=KEY),
    journal_format.LedgerFacts(7, 5, 11, fenced=True, explicit_lac=9),
    journal_format.LedgerFacts(9, -1, -1, deleted=True),
]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
def test_r17_a_damaged_record_in_the_last_batch_yields_its_manifests_first_and_last(
    tmp_path: Path, direct: bool
) -> None:
    write_batches(tmp_path, [[adds(7, range(0, 5))], LAST_BATCH], direct)
    path = the_file(tmp_path)
    data = path.read_bytes()
    damaged_at = data.rfind(record_bytes(LAST_BATCH[3]))  # the fence
    flip(path, damaged_at + 7)
    records, report = scan(tmp_path)
    # What came before the damage replays; the manifest, both copies whole, describes
    # the whole batch; the file is cut at the damage, its tail kept beside it.
    kinds = [k for k, _ in records]
    assert kinds[:4] == [
        journal_format.RECORD_ADD,
        journal_format.RECORD_MASTER_KEY,
        journal_format.RECORD_ADD,
        journal_format.RECORD_ADD,
    ]
    assert manifests(records) == [LAST_FACTS, LAST_FACTS]
    assert report.manifests == [(path, damaged_at)] and report.truncated == [(path, damaged_at)]
    assert path.read_bytes() == data[:damaged_at]
    flipped = bytearray(data)
    flipped[damaged_at + 7] ^= 0x08
    assert journal_replay.torn_tail_path(path, damaged_at).read_bytes() == bytes(
        flipped[damaged_at:]
    )


def test_r17_one_damaged_manifest_leaves_the_other(tmp_path: Path) -> None:
    write_batches(tmp_path, [[adds(7, range(0, 5))], LAST_BATCH], direct=False)
    path = the_file(tmp_path)
    data = path.read_bytes()
    salt = data[16:24]
    manifest = journal_format.manifest_record(salt, journal_format.summarize(LAST_BATCH))
    lead, close = data.find(manifest), data.rfind(manifest)
    assert lead < close
    for damaged in (lead, close):
        (tmp_path / str(damaged)).mkdir()
        copy = tmp_path / str(damaged) / path.name
        copy.write_bytes(data)
        flip(copy, damaged + 9)
        records, report = scan(tmp_path / str(damaged))
        # Damage in the closing manifest: every record before it was read back, and
        # the leading one still proves the batch's facts.
        kind = (
            journal_format.RECORD_MANIFEST
            if damaged == lead
            else journal_format.RECORD_UNCLOSED_MANIFEST
        )
        assert manifests(records, kind) == [LAST_FACTS]
        assert len([k for k, _ in records if k in (journal_format.RECORD_MANIFEST, kind)]) == 1
        assert report.truncated == [(copy, damaged)]


def test_r17_a_damaged_batch_marker_leaves_the_manifest_after_it(tmp_path: Path) -> None:
    write_batches(tmp_path, [[adds(7, range(0, 5))], LAST_BATCH], direct=False)
    path = the_file(tmp_path)
    data = path.read_bytes()
    marker = data.rfind(journal_format.batch_marker(data[16:24]))
    flip(path, marker + 6)
    records, report = scan(tmp_path)
    assert [k for k, _ in records] == [
        journal_format.RECORD_ADD,
        journal_format.RECORD_MANIFEST,
        journal_format.RECORD_MANIFEST,
    ]
    assert manifests(records) == [LAST_FACTS, LAST_FACTS]
    assert report.truncated == [(path, marker)]


def test_a_batch_torn_with_neither_manifest_is_cut_and_proves_nothing(tmp_path: Path) -> None:
    big = [adds(7, range(n, n + 10)) for n in range(0, 600, 10)]  # over several pages
    write_batches(tmp_path, [[adds(7, range(1000, 1005))], big], direct=False)
    path = the_file(tmp_path)
    data = bytearray(path.read_bytes())
    marker = data.rfind(journal_format.batch_marker(bytes(data[16:24])))
    page = 4096
    # A crash before the batch's sync: the page it starts in (from its marker on) and
    # its last page never reached the disk; the pages between did.
    data[marker : (marker // page + 1) * page] = bytes((marker // page + 1) * page - marker)
    last_page = (len(data) - 1) // page * page
    data[last_page:] = bytes(len(data) - last_page)
    path.write_bytes(bytes(data))
    records, report = scan(tmp_path)
    assert manifests(records) == [] and report.manifests is None
    assert report.truncated and path.stat().st_size == report.truncated[0][1]


def test_a_batch_torn_after_its_leading_manifest_proves_facts_and_no_suspects(
    tmp_path: Path,
) -> None:
    """A crash before the batch's sync: only its first page (its marker and leading
    manifest) reached the disk. One fault per batch: a flipped bit in a record would
    have left the closing manifest whole, so the batch was torn and its entries were
    never acknowledged; the leading manifest's facts (a fence) still hold."""
    big = [journal_format.fence_record(7), *(adds(7, range(n, n + 10)) for n in range(0, 600, 10))]
    write_batches(tmp_path, [[adds(7, range(1000, 1005))], big], direct=False)
    path = the_file(tmp_path)
    data = bytearray(path.read_bytes())
    marker = data.rfind(journal_format.batch_marker(bytes(data[16:24])))
    page = 4096
    kept_to = (marker // page + 2) * page  # the batch's first page (or two) reached it
    assert (
        data.find(journal_format.manifest_record(bytes(data[16:24]), journal_format.summarize(big)))
        < kept_to
    )
    data[kept_to:] = bytes(len(data) - kept_to)
    path.write_bytes(bytes(data))
    records, report = scan(tmp_path)
    assert manifests(records) == []
    (facts,) = manifests(records, journal_format.RECORD_UNCLOSED_MANIFEST)
    assert facts == [journal_format.LedgerFacts(7, 0, 599, fenced=True)]
    assert report.truncated and path.stat().st_size == report.truncated[0][1]


# ---------------------------------------------------------------- a real bookie


def last_file(driver) -> Path:
    return the_file(driver.config.journal_path)


def test_r17_r10_r7_a_fence_of_a_new_ledger_keeps_its_key_and_fence(driver) -> None:
    """The fence of a ledger the bookie never saw journals the key and the fence in one
    batch; a bit of the fence flips: both must survive the restart."""

    async def scenario():
        await driver.start()
        assert (await driver.call(FenceRequest(0, 40, KEY))).status == Status.OK
        await driver.crash()
        path = last_file(driver)
        flip(path, path.read_bytes().rfind(record_bytes(journal_format.fence_record(40))) + 6)
        await driver.start()
        other = AddRequest(0, 40, OTHER_KEY, [blob(40, 0)])
        assert (await driver.call(other)).status == Status.UNAUTHORIZED  # R10
        assert (await driver.call(AddRequest(0, 40, KEY, [blob(40, 0)]))).status == Status.FENCED
        await driver.close()

    run(scenario())


def test_r17_an_explicit_lac_survives_a_flip_in_its_record(driver) -> None:
    async def scenario():
        await driver.start()
        assert (await driver.call(AddRequest(0, 41, KEY, [blob(41, 0)]))).status == Status.OK
        assert (await driver.call(WriteLacRequest(0, 41, KEY, 6))).status == Status.OK
        await driver.crash()
        path = last_file(driver)
        flip(path, path.read_bytes().rfind(record_bytes(journal_format.lac_record(41, 6))) + 14)
        await driver.start()
        answer = await driver.call(ReadLacRequest(0, 41))
        assert (answer.status, answer.lac) == (Status.OK, 6)
        await driver.close()

    run(scenario())


def _damage_last_add(driver, ledger_id: int, count: int) -> list[bytes]:
    """``count`` acknowledged adds of one entry each, then a bit of the last one flips
    (after a crash); returns the blobs."""

    async def scenario():
        await driver.start()
        blobs = [blob(ledger_id, e) for e in range(count)]
        for b in blobs:
            assert (await driver.call(AddRequest(0, ledger_id, KEY, [b]))).status == Status.OK
        await driver.crash()
        return blobs

    blobs = run(scenario())
    path = last_file(driver)
    flip(path, path.read_bytes().rfind(blobs[-1]) + 20)
    return blobs


def test_r17_a_delete_settles_the_suspect_entries(driver) -> None:
    _damage_last_add(driver, 42, 3)

    async def scenario():
        bookie = await driver.start()
        assert bookie.replay_report.suspect == [(42, 2, 2)]
        assert (await driver.call(ReadRequest(0, 42, 2))).status == Status.IO_ERROR
        assert list(driver.config.data_dir.glob("suspect-*"))
        assert (await driver.call(DeleteLedgerRequest(0, 42, KEY))).status == Status.OK
        await driver.restart()
        assert (await driver.call(ReadRequest(0, 42, 2))).status == Status.NO_SUCH_LEDGER
        assert not list(driver.config.data_dir.glob("suspect-*"))  # nothing left to keep
        await driver.close()

    run(scenario())


def test_r17_a_batch_torn_after_its_leading_manifest_leaves_no_unknown_entries(
    driver,
) -> None:
    """Entries 1-40 of ledger 47 go in one batch; only the page (or two) holding its
    marker and leading manifest reach the disk (what a crash before the batch's sync
    leaves). Nothing of the batch was acknowledged, so its entries are absent, not
    unknown: a recovery with Qa = 1 must be able to close the ledger."""
    page = 4096

    async def scenario():
        await driver.start()
        assert (await driver.call(AddRequest(0, 47, KEY, [blob(47, 0)]))).status == Status.OK
        blobs = [blob(47, e) + bytes(1000) for e in range(1, 41)]
        assert (await driver.call(AddRequest(0, 47, KEY, blobs))).status == Status.OK
        await driver.crash()

    run(scenario())
    path = last_file(driver)
    data = bytearray(path.read_bytes())
    marker = data.rfind(journal_format.batch_marker(bytes(data[16:24])))
    lead = marker + journal_format.BATCH_MARKER_SIZE
    lead_end = lead + 8 + int.from_bytes(data[lead : lead + 4], "big")
    kept_to = -(-lead_end // page) * page
    assert kept_to + page < len(data)  # the batch goes on past the pages kept
    data[kept_to:] = bytes(len(data) - kept_to)
    path.write_bytes(bytes(data))

    async def after():
        bookie = await driver.start()
        assert bookie.replay_report.suspect is None
        assert (await driver.call(ReadRequest(0, 47, 0))).status == Status.OK
        for entry_id in (1, 20, 40):
            answer = await driver.call(ReadRequest(0, 47, entry_id))
            assert answer.status == Status.NO_SUCH_ENTRY, entry_id
        assert not list(driver.config.data_dir.glob("suspect-*"))
        await driver.close()

    run(after())


@pytest.mark.parametrize("copy", ["a", "b"])
def test_r17_a_flipped_bit_in_one_copy_of_the_suspect_entries_reads_the_other(
    driver, copy: str
) -> None:
    _damage_last_add(driver, 43, 3)

    async def scenario():
        await driver.start()
        await driver.crash()
        (path,) = driver.config.data_dir.glob(f"suspect-*.{copy}")
        flip(path, 20)
        await driver.start()
        assert (await driver.call(ReadRequest(0, 43, 2))).status == Status.IO_ERROR
        await driver.close()

    run(scenario())


def test_suspect_entries_fall_back_to_the_previous_generation_when_the_newest_is_cut(
    tmp_path: Path,
) -> None:
    first = suspicion.save(tmp_path, {5: [(3, 9)]}, 0, REAL_FILES)
    assert suspicion.load(tmp_path, REAL_FILES) == ({5: [(3, 9)]}, first)
    # A crash while the next generation's first copy was written: nothing of it is whole
    # (and the journal tail it was to stand for is not cut yet).
    (tmp_path / f"suspect-{first + 1:016x}.a").write_bytes(b"QLSUSP01\x00\x00")
    assert suspicion.load(tmp_path, REAL_FILES) == ({5: [(3, 9)]}, first)
    second = suspicion.save(tmp_path, {5: [(3, 9)], 6: [(0, 0)]}, first, REAL_FILES)
    assert second == first + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"suspect-{second:016x}.a",
        f"suspect-{second:016x}.b",
    ]
    assert suspicion.load(tmp_path, REAL_FILES) == ({5: [(3, 9)], 6: [(0, 0)]}, second)


class _Stop(OSError):
    pass


@pytest.mark.parametrize("where", ["before the cut", "after the cut"])
def test_r17_a_crash_around_the_cut_keeps_what_the_manifest_proved(
    driver, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The start that finds the damage stops (a crash) just before it cuts the journal
    tail, or just after (before its own checkpoint): the next start must still know the
    fence and the unknown entries, from the tail or from what was made durable first."""

    gate = threading.Event()
    entered = threading.Event()

    def held_sync(fd: int) -> None:
        entered.set()
        assert gate.wait(10)
        os.fdatasync(fd)

    monkeypatch.setattr(journal_writer, "fdatasync", held_sync)

    async def first():
        await driver.start()
        answers = [driver.send(AddRequest(0, 44, KEY, [blob(44, 0)]))]
        assert await asyncio.to_thread(entered.wait, 10)  # its batch is being synced
        # Queued meanwhile, so written together as the last batch.
        answers.append(driver.send(AddRequest(0, 44, KEY, [blob(44, 1)])))
        answers.append(driver.send(FenceRequest(0, 44, KEY)))
        gate.set()
        assert [(await a).status for a in answers] == [Status.OK] * 3
        await driver.crash()

    run(first())
    monkeypatch.undo()
    path = last_file(driver)
    flip(path, path.read_bytes().rfind(blob(44, 1)) + 20)
    cut = journal_replay.cut_torn_tails

    def crash_at_the_cut(report: journal_replay.ScanReport, ops=REAL_FILES) -> None:
        if where == "after the cut":
            cut(report, ops)
        raise _Stop("the power went")

    monkeypatch.setattr(journal_replay, "cut_torn_tails", crash_at_the_cut)
    size = path.stat().st_size
    with pytest.raises(BookieStartError):
        run(driver.start())
    assert (path.stat().st_size < size) == (where == "after the cut")
    monkeypatch.undo()

    async def second():
        await driver.start()
        assert (await driver.call(AddRequest(0, 44, KEY, [blob(44, 2)]))).status == Status.FENCED
        assert (await driver.call(ReadRequest(0, 44, 0))).entries == [blob(44, 0)]
        assert (await driver.call(ReadRequest(0, 44, 1))).status == Status.IO_ERROR
        fencing = ReadRequest(0, 44, 1, flags=ReadFlag.FENCE, master_key=KEY)
        assert (await driver.call(fencing)).status == Status.IO_ERROR
        rewrite = AddRequest(0, 44, KEY, [blob(44, 1)], flags=AddFlag.RECOVERY)
        assert (await driver.call(rewrite)).status == Status.OK
        assert (await driver.call(ReadRequest(0, 44, 1))).entries == [blob(44, 1)]
        await driver.close()

    run(second())
