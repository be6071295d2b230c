"""The journal written around the page cache (O_DIRECT): whole blocks only, each batch
from a block of its own with a PAD record after it; every record replays, whether the
journal was closed, rolled over or crashed, and where the filesystem has no direct I/O
the journal falls back with a warning."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
from pathlib import Path

import pytest
from support import DirectRecordingFiles

from quorumlog.bookie.entry_log import format_records, parse_records
from quorumlog.bookie.fileops import FileOps
from quorumlog.bookie.journal import format as journal_format
from quorumlog.bookie.journal import replay as journal_replay
from quorumlog.bookie.journal import writer as journal_writer
from quorumlog.testing.raw_client import make_entry

BLOCK_BYTES = 4096


def _records(count: int) -> tuple[list[journal_format.Record], list[bytes]]:
    """Adds of sizes from a few bytes to 64 KiB, and a fence between them."""
    sizes = [1, 100, 4000, 65_536, 37, 9000]
    blobs = [make_entry(3, n, bytes([n % 251]) * sizes[n % len(sizes)]) for n in range(count)]
    records = [journal_format.add_record(3, format_records([b], [len(b)])) for b in blobs]
    records.insert(count // 2, journal_format.fence_record(3))
    return records, blobs


def _journal(
    directory: Path, ops: FileOps, file_max_bytes: int, prealloc_bytes: int = 0
) -> journal_writer.Journal:
    return journal_writer.Journal(
        directory,
        1,
        sync=True,
        max_group_wait_ms=0.0,
        max_batch_bytes=256 * 1024,
        max_batch_records=7,  # many batches, each ending inside a block
        file_max_bytes=file_max_bytes,
        direct_io=True,
        prealloc_bytes=prealloc_bytes,
        ops=ops,
    )


def _write(
    directory: Path,
    ops: FileOps,
    records: list[journal_format.Record],
    file_max_bytes: int,
    crash_copy: Path | None = None,
    prealloc_bytes: int = 0,
) -> journal_writer.Journal:
    """Write ``records`` through the writer thread and close; with ``crash_copy``, the
    journal directory is copied first, once everything is synced (a crash's leftovers)."""

    async def scenario() -> journal_writer.Journal:
        journal = _journal(directory, ops, file_max_bytes, prealloc_bytes)
        done: list[int] = []
        journal.start(
            asyncio.get_running_loop(), lambda dones, size, error: done.append(len(dones))
        )
        for n, record in enumerate(records):
            journal.append(record, (lambda _: None, n))
        while sum(done) < len(records):
            await asyncio.sleep(0.01)
        if crash_copy is not None:
            shutil.copytree(directory, crash_copy)
        await journal.close()
        return journal

    return asyncio.run(asyncio.wait_for(scenario(), 30))


def _replay(directory: Path) -> tuple[list[bytes], journal_replay.ScanReport]:
    report = journal_replay.ScanReport()
    blobs = []
    for kind, payload in journal_replay.scan(directory, None, False, report):
        if kind == journal_format.RECORD_ADD:
            blobs += parse_records(payload[8:], "test")[0]
    return blobs, report


def test_direct_batches_are_whole_blocks_and_every_record_replays(tmp_path: Path) -> None:
    ops = DirectRecordingFiles()
    records, blobs = _records(60)
    journal = _write(tmp_path, ops, records, file_max_bytes=1 << 30)
    assert journal.direct_io
    assert ops.direct_writes, "nothing was written through a direct descriptor"
    for offset, length in ops.direct_writes:
        assert offset % BLOCK_BYTES == 0 and length % BLOCK_BYTES == 0
    replayed, report = _replay(tmp_path)
    assert replayed == blobs
    assert report.truncated is None  # the file ends in a whole PAD record
    (path,) = tmp_path.glob("*.jnl")
    size = path.stat().st_size
    assert size % BLOCK_BYTES == 0 and journal.mark[1] == size  # the next batch's block


def test_no_direct_write_covers_a_block_of_an_earlier_batch(tmp_path: Path) -> None:
    """On a device whose sector writes are not atomic, a write cut by a power loss may
    damage every block it covers: a batch must never write over a synced one (nor over
    the file's header), so each starts on a block of its own."""
    ops = DirectRecordingFiles()
    records, blobs = _records(60)
    _write(tmp_path, ops, records, file_max_bytes=1 << 30)
    assert len(ops.direct_writes) > 8
    assert ops.direct_writes[0][0] == BLOCK_BYTES  # the header's block is its own
    for (offset, length), (next_offset, _) in itertools.pairwise(ops.direct_writes):
        assert next_offset == offset + length
    assert _replay(tmp_path)[0] == blobs


def test_rolled_over_files_end_in_whole_records_so_replay_reads_them_all(
    tmp_path: Path,
) -> None:
    records, blobs = _records(80)
    journal = _write(tmp_path, DirectRecordingFiles(), records, file_max_bytes=200_000)
    files = sorted(tmp_path.glob("*.jnl"))
    assert len(files) > 2
    # Zeros at the end of a file followed by another would be damage to synced data:
    # replay would refuse to go on (JournalCorruptionError).
    assert all(path.stat().st_size % BLOCK_BYTES == 0 for path in files)
    assert journal.mark[0] == int(files[-1].stem, 16)
    replayed, report = _replay(tmp_path)
    assert replayed == blobs
    assert report.truncated is None


def test_a_crash_leaves_whole_records_and_replay_finds_every_synced_one(
    tmp_path: Path,
) -> None:
    records, blobs = _records(40)
    crashed = tmp_path / "crashed"
    (tmp_path / "journal").mkdir()
    _write(tmp_path / "journal", DirectRecordingFiles(), records, 1 << 30, crash_copy=crashed)
    (path,) = crashed.glob("*.jnl")
    assert path.stat().st_size % BLOCK_BYTES == 0  # a PAD record up to the block's end
    replayed, report = _replay(crashed)
    assert replayed == blobs
    assert report.truncated is None  # nothing torn, nothing cut


def test_pad_records_fill_to_the_block_boundary_whatever_the_gap() -> None:
    for total in (
        journal_format.RECORD_OVERHEAD,
        100,
        4095,
        4096 + journal_format.RECORD_OVERHEAD - 1,
    ):
        record = journal_format.pad_record(total)
        assert len(record) == total
        assert journal_format.record_at(record, memoryview(record), 0, total) == (total, "")
        assert record[4] == journal_format.RECORD_PAD


def test_without_direct_io_the_journal_warns_and_writes_through_the_page_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    ops = DirectRecordingFiles(direct=False)
    records, blobs = _records(30)
    journal = _write(tmp_path, ops, records, 1 << 30)
    assert not journal.direct_io
    assert "direct I/O is not available" in caplog.text
    assert _replay(tmp_path)[0] == blobs


def test_the_staging_buffer_grows_for_a_batch_larger_than_it(tmp_path: Path) -> None:
    big = make_entry(4, 0, os.urandom(5 * 1024 * 1024))  # above the 4 MiB staging buffer
    records = [journal_format.add_record(4, format_records([big], [len(big)]))]
    _write(tmp_path, DirectRecordingFiles(), records, 1 << 30)
    assert _replay(tmp_path)[0] == [big]


def test_a_checkpoint_mark_inside_a_pad_record_replays_from_the_pad_s_end(
    tmp_path: Path,
) -> None:
    """A checkpoint may record the mark after a batch whose sync then failed or never
    came; after a power loss the file holds the PAD written before that batch, which
    covers the mark. Replay starts after the PAD, even with a later file behind it."""
    records, _ = _records(10)
    journal = _write(tmp_path, DirectRecordingFiles(), records, 1 << 30)
    pad_at = journal.mark[1]  # the PAD after the last batch starts here
    os.close(journal_format.create_journal_file(tmp_path, 2))  # the next start's file
    report = journal_replay.ScanReport()
    assert list(journal_replay.scan(tmp_path, (1, pad_at + 100), False, report)) == []
    assert report.truncated is None


def test_a_bad_header_with_only_its_block_s_pad_after_it_is_a_creation_cut_short(
    tmp_path: Path,
) -> None:
    """A direct journal file's header block holds the header and a PAD record; a creation
    cut short may leave the PAD and not the header. No batch was ever in it: replay removes
    the last file, as it removes a bare incomplete header."""
    os.close(
        journal_format.create_journal_file(
            tmp_path, 1, ops=DirectRecordingFiles(), block_bytes=4096
        )
    )
    path = tmp_path / journal_format.journal_file_name(1)
    data = bytearray(path.read_bytes())
    assert len(data) == BLOCK_BYTES
    data[:8] = bytes(8)  # the magic never reached the disk
    path.write_bytes(bytes(data))
    blobs, report = _replay(tmp_path)
    assert blobs == [] and report.truncated == [(path, 0)]
    assert not path.exists()


PREALLOC_BYTES = 64 * 1024


def _small_records(
    count: int, sizes: tuple[int, ...] = (100,)
) -> tuple[list[journal_format.Record], list[bytes]]:
    blobs = [make_entry(5, n, bytes([n % 251]) * sizes[n % len(sizes)]) for n in range(count)]
    return [journal_format.add_record(5, format_records([b], [len(b)])) for b in blobs], blobs


def _batches(ops: DirectRecordingFiles, journal_size: int) -> list[tuple[int, int]]:
    """(offset, length) of each batch's own blocks (its records and PAD), from the
    direct writes, whose zeros written ahead run past them."""
    writes = ops.direct_writes
    ends = [offset for offset, _ in writes[1:]] + [journal_size]
    return [(offset, end - offset) for (offset, _), end in zip(writes, ends, strict=True)]


def test_small_batches_overwrite_zeros_written_ahead_and_replay_ends_at_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Pre-allocation: a batch past the zeros writes the next ``prealloc_bytes`` of
    zeros after itself, so the batches after it write over blocks the file already
    has (their syncs commit no new file size). Replay reads every record and takes the
    zeros after the last batch for the end of the file, no damage: it cuts them off
    quietly, so the file ends in whole records when the next start writes another.
    A journal closed cleanly cuts them off itself."""
    ops = DirectRecordingFiles()
    records, blobs = _small_records(200)
    (tmp_path / "journal").mkdir()
    crashed = tmp_path / "crashed"  # what a crash once everything was synced leaves
    journal = _write(
        tmp_path / "journal", ops, records, 1 << 30, crashed, prealloc_bytes=PREALLOC_BYTES
    )
    mark = journal.mark[1]
    (closed,) = (tmp_path / "journal").glob("*.jnl")
    assert closed.stat().st_size == mark
    (path,) = crashed.glob("*.jnl")
    size = path.stat().st_size
    assert size > mark and size % BLOCK_BYTES == 0
    assert path.read_bytes()[mark:] == bytes(size - mark)  # zeros after the last batch
    # The file grew in a few steps, not at every batch.
    grown, furthest = 0, BLOCK_BYTES
    for offset, length in ops.direct_writes:
        grown += offset + length > furthest
        furthest = max(furthest, offset + length)
    assert len(ops.direct_writes) > 20 and grown <= mark // PREALLOC_BYTES + 1
    # No batch writes over the blocks of the batch before it, zeros aside.
    for (offset, length), (next_offset, _) in itertools.pairwise(_batches(ops, mark)):
        assert next_offset == offset + length
    caplog.set_level(logging.INFO)
    replayed, report = _replay(crashed)
    assert replayed == blobs
    assert report.truncated == [(path, mark)] and path.stat().st_size == mark
    assert "ERROR" not in caplog.text and not list(crashed.glob("*.torn-*"))
    assert _replay(crashed)[0] == blobs


def test_rolled_over_files_lose_their_zeros_before_the_next_file_exists(
    tmp_path: Path,
) -> None:
    """Zeros at the end of a file followed by another are damage to replay: the writer
    cuts them off (durably) before it creates the next file."""
    # A 30 kB record that does not fit in a file goes to the next one while zeros
    # written ahead remain in the file it leaves.
    records, blobs = _small_records(300, sizes=(100, 100, 100, 30_000))
    journal = _write(
        tmp_path, DirectRecordingFiles(), records, 200_000, prealloc_bytes=PREALLOC_BYTES
    )
    files = sorted(tmp_path.glob("*.jnl"))
    assert len(files) > 2
    for path in files[:-1]:
        data = path.read_bytes()
        assert data[-BLOCK_BYTES:] != bytes(BLOCK_BYTES)  # ends in its last batch's PAD
        assert len(data) <= 200_000 + BLOCK_BYTES  # no zeros past the file's limit
    assert journal.mark[0] == int(files[-1].stem, 16)
    replayed, report = _replay(tmp_path)
    assert replayed == blobs
    assert report.truncated is None


def test_zeros_after_a_whole_batch_end_a_file_even_with_a_later_file(tmp_path: Path) -> None:
    """The writer cuts its zeros off before it creates the next file, but a cut whose
    sync failed can come back at a power loss. The zeros hold nothing acknowledged (a
    file is left only after its last batch synced), so they end any file."""
    records, blobs = _small_records(20)
    (tmp_path / "journal").mkdir()
    crashed = tmp_path / "crashed"
    _write(tmp_path / "journal", DirectRecordingFiles(), records, 1 << 30, crashed, PREALLOC_BYTES)
    os.close(journal_format.create_journal_file(crashed, 2))  # as if the cut was lost
    replayed, report = _replay(crashed)
    assert replayed == blobs and report.truncated


def test_zeros_then_data_before_a_later_file_are_still_damage(tmp_path: Path) -> None:
    records, _ = _small_records(20)
    (tmp_path / "journal").mkdir()
    crashed = tmp_path / "crashed"
    _write(tmp_path / "journal", DirectRecordingFiles(), records, 1 << 30, crashed, PREALLOC_BYTES)
    (path,) = crashed.glob("*.jnl")
    with open(path, "r+b") as f:  # a stray byte after the zeros: not the file's end
        f.seek(path.stat().st_size - 1)
        f.write(b"x")
    os.close(journal_format.create_journal_file(crashed, 2))
    with pytest.raises(journal_replay.JournalCorruptionError, match="later file"):
        _replay(crashed)


def test_a_batch_torn_inside_the_zeros_is_judged_by_its_manifests_as_before(
    tmp_path: Path,
) -> None:
    """Zeros inside a batch (its marker read, its closing manifest not) are not its
    end: a batch torn by a power loss, judged by its manifests (here the leading one
    only is whole: torn before its sync, nothing in it acknowledged)."""
    ops = DirectRecordingFiles()
    records, _ = _small_records(30)
    (tmp_path / "journal").mkdir()
    crashed = tmp_path / "crashed"
    journal = _write(tmp_path / "journal", ops, records, 1 << 30, crashed, PREALLOC_BYTES)
    (path,) = crashed.glob("*.jnl")
    last_batch_at = _batches(ops, journal.mark[1])[-1][0]
    data = bytearray(path.read_bytes())
    tear_at = last_batch_at + 200  # past its marker and leading manifest
    data[tear_at:] = bytes(len(data) - tear_at)
    path.write_bytes(data)
    report = journal_replay.ScanReport()
    kinds = [kind for kind, _ in journal_replay.scan(crashed, None, False, report)]
    assert journal_format.RECORD_UNCLOSED_MANIFEST in kinds
    assert report.truncated and report.truncated[0][1] > last_batch_at
