"""Storage faults in real bookie processes (issue 21, section 4): real processes over
real sockets, killed with kill -9 by pid and started again on the same directories.
Each test asserts that every acknowledged entry and fence is served after the restart,
or refused with an I/O error, and never called absent (R2, R7, R9, R17):

- the open-files limit (``RLIMIT_NOFILE``) exhausted by entry-log rotations (B3);
- an index (LMDB map) that fills (B5);
- a flipped bit in each kind of stored record of a stopped bookie: the journal's last
  synced batch (B1), an entry-log record, an index value: an entry's location, a
  fenced ledger's state (B2); and a ledger recovery by a client that needs the
  damaged bookie's answer never closes the ledger short (R8), on both metadata
  drivers.

Where the metadata store takes part while the fault lasts (a bookie out of descriptors
keeps its session, a bookie turning read-only moves its registration, a recovery) the
test runs on both drivers; the bit flips in a stopped bookie's files on SQLite only.
The full disk on a real small filesystem is tests/faults/test_bookie_full_filesystem.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support import poll_until, run

from quorumlog import BookKeeper, ClientConfig
from quorumlog.bookie.journal import format as journal_format
from quorumlog.errors import BKError, Status
from quorumlog.proto.codec import (
    AddRequest,
    AddResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FenceRequest,
    ReadLacRequest,
    ReadLacResponse,
    ReadResponse,
)
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"storage-faults")
# Checkpoints often, so that each scenario sees several in a second or two.
FAST_CHECKPOINTS = ["--checkpoint-interval-ms", "100"]
# None but the one of a clean stop: the journal a test damages is the one replayed.
NO_CHECKPOINTS = ["--checkpoint-interval-ms", "3600000"]


def _blob(ledger_id: int, entry_id: int, size: int = 100) -> bytes:
    payload = bytes([entry_id % 251]) * size
    return make_entry(ledger_id, entry_id, payload, lac=entry_id - 1)


async def _add_all(
    address: str, ledger_id: int, blobs: Sequence[bytes], key: bytes = KEY
) -> list[int]:
    """Every blob as its own add, pipelined on one connection; the statuses, in order."""
    client = await RawClient.connect(address)
    try:
        answers = await asyncio.gather(
            *(client.send(AddRequest(0, ledger_id, key, [blob])) for blob in blobs)
        )
    finally:
        await client.close()
    assert all(isinstance(a, AddResponse) for a in answers)
    return [a.status for a in answers]


async def _read_statuses(
    address: str, ledger_id: int, blobs: dict[int, bytes]
) -> dict[int, Status]:
    """Each entry read alone (pipelined); a read answered OK must hold exactly the blob
    acknowledged. Returns each entry's status."""
    client = await RawClient.connect(address)
    try:
        ids = sorted(blobs)
        answers = await asyncio.gather(*(client.read(ledger_id, e) for e in ids))
    finally:
        await client.close()
    out = {}
    for entry_id, answer in zip(ids, answers, strict=True):
        assert isinstance(answer, ReadResponse)
        if answer.status == Status.OK:
            assert answer.entries == [blobs[entry_id]], entry_id
        out[entry_id] = Status(answer.status)
    return out


async def _bookie_info(address: str) -> BookieInfoResponse:
    client = await RawClient.connect(address)
    try:
        info = await client.request(BookieInfoRequest(0))
    finally:
        await client.close()
    assert isinstance(info, BookieInfoResponse) and info.status == Status.OK
    return info


def _never_absent(statuses: dict[int, Status], what: str) -> None:
    absence = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)
    absent = {e: s for e, s in statuses.items() if s in absence}
    assert not absent, f"{what}: acknowledged entries answered absent: {absent}"
    others = {e: s for e, s in statuses.items() if s not in (Status.OK, Status.IO_ERROR)}
    assert not others, f"{what}: {others}"


@contextlib.contextmanager
def _cluster(
    metadata_uri: str,
    base: Path,
    size: int,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> Iterator[LocalCluster]:
    cluster = LocalCluster(metadata_uri, base, size, extra_args=extra_args, python=python)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


# ---------------------------------------------------------------- RLIMIT_NOFILE

OPEN_FILES_LIMIT = 64  # a bookie holds about 30 at rest (the store, the index, the journal)
LOG_BYTES = 64 * 1024  # an entry log of 16 entries of 4 KiB
JOURNAL_FILE_BYTES = 1024 * 1024  # a new journal file every 250 entries of 4 KiB
BIG_ENTRY = 4000


def _python_with_open_files_limit(directory: Path, limit: int) -> str:
    """An interpreter whose process starts with soft and hard RLIMIT_NOFILE ``limit``: the
    bookie's own start raises the soft limit only up to the hard one."""
    launcher = directory / "python-nofile"
    launcher.write_text(
        f"#!{sys.executable}\n"
        "import os, resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
        f"os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])\n"
    )
    launcher.chmod(0o755)
    return str(launcher)


def _pid(cluster: LocalCluster, i: int) -> int:
    process = cluster.bookies[i].process
    assert process is not None
    return process.pid


def _open_files(cluster: LocalCluster, i: int) -> int:
    return len(os.listdir(f"/proc/{_pid(cluster, i)}/fd"))


def test_b3_a_bookie_out_of_descriptors_keeps_taking_adds_and_serves_them_after_kill_9(
    metadata_uri: str, tmp_path: Path
) -> None:
    python = _python_with_open_files_limit(tmp_path, OPEN_FILES_LIMIT)
    args = [
        *("--entry-log-max-bytes", str(LOG_BYTES)),
        *("--journal-file-max-bytes", str(JOURNAL_FILE_BYTES)),
        *FAST_CHECKPOINTS,
    ]
    ledger_id, rounds, per_round = 5, 4, 1000
    blobs = {e: _blob(ledger_id, e, BIG_ENTRY) for e in range(rounds * per_round)}
    with _cluster(metadata_uri, tmp_path / "cluster", 1, args, python=python) as cluster:
        address = cluster.addresses[0]
        limit = resource.prlimit(_pid(cluster, 0), resource.RLIMIT_NOFILE)
        assert limit == (OPEN_FILES_LIMIT, OPEN_FILES_LIMIT)
        acknowledged: dict[int, bytes] = {}
        for r in range(rounds):
            # A round would roll over about 60 logs in a fraction of a second, faster
            # than the checkpoints that release their descriptors: the process runs out.
            ids = range(r * per_round, (r + 1) * per_round)
            statuses = run(_add_all(address, ledger_id, [blobs[e] for e in ids]), 30)
            assert Counter(statuses) == {Status.OK: per_round}, Counter(statuses)
            acknowledged.update((e, blobs[e]) for e in ids)
            poll_until(
                lambda: _open_files(cluster, 0) < OPEN_FILES_LIMIT - 8,
                timeout_s=10,
                what="descriptors released by a checkpoint",
            )
        stderr = cluster.bookies[0].stderr_text()
        assert "Too many open files" in stderr  # the limit was reached on the way
        logs = list((cluster.bookies[0].data_dir / "entrylogs").iterdir())
        assert not run(_bookie_info(address)).read_only
        statuses = run(_read_statuses(address, ledger_id, acknowledged), 30)
        assert set(statuses.values()) == {Status.OK}, Counter(statuses.values())

        cluster.kill(0)
        assert cluster.restart(0) == address
        # More logs than descriptors to spare: reading them all closes readers on the way.
        assert len(logs) > OPEN_FILES_LIMIT - _open_files(cluster, 0)
        statuses = run(_read_statuses(address, ledger_id, acknowledged), 30)
        assert set(statuses.values()) == {Status.OK}, Counter(statuses.values())
        more = _blob(ledger_id, len(blobs), BIG_ENTRY)
        assert run(_add_all(address, ledger_id, [more])) == [Status.OK]


# ---------------------------------------------------------------- a full index

INDEX_MAP_BYTES = 256 * 1024  # a few thousand entries' index


def _ready_or_refused(cluster: LocalCluster, i: int, timeout_s: float = 30) -> str | None:
    """The restarted bookie's address once ready, or None if it refused to start: then
    with the usage exit status and a BookieStartError's one line, never a traceback."""
    bookie = cluster.bookies[i]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if b" ready" in bookie.stdout_path.read_bytes():
            return cluster.wait_ready(i)
        if not bookie.alive():
            assert cluster.wait_exit(i) == 2, bookie.stderr_text()
            stderr = bookie.stderr_text()
            assert "refusing to start" in stderr and "Traceback" not in stderr, stderr
            return None
        time.sleep(0.05)
    raise AssertionError(f"bookie {i} neither ready nor stopped within {timeout_s} s")


def test_b5_a_full_index_turns_the_bookie_read_only_and_a_restart_serves_everything(
    metadata_uri: str, tmp_path: Path
) -> None:
    args = ["--index-map-size-bytes", str(INDEX_MAP_BYTES), *FAST_CHECKPOINTS]
    ledger_id, fenced_ledger, per_round = 6, 7, 2000
    fenced_blobs = {e: _blob(fenced_ledger, e) for e in range(3)}
    with _cluster(metadata_uri, tmp_path / "cluster", 1, args) as cluster:
        address = cluster.addresses[0]
        assert run(_add_all(address, fenced_ledger, list(fenced_blobs.values()))) == [0] * 3
        acknowledged: dict[int, bytes] = {}
        refused: Counter[int] = Counter()
        deadline = time.monotonic() + 30
        for r in range(20):  # 40,000 entries at most: far more than the map holds
            blobs = {e: _blob(ledger_id, e) for e in range(r * per_round, (r + 1) * per_round)}
            statuses = run(_add_all(address, ledger_id, list(blobs.values())), 30)
            answered = zip(blobs, statuses, strict=True)
            acknowledged.update((e, blobs[e]) for e, s in answered if s == Status.OK)
            refused.update(s for s in statuses if s != Status.OK)
            if refused or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # a few checkpoints, each failing on the full map
        # Adds stop cleanly: refused as read-only, never a failed I/O.
        assert set(refused) == {Status.READ_ONLY}, refused
        assert acknowledged and run(_bookie_info(address)).read_only
        assert "is full" in cluster.bookies[0].stderr_text()
        # Reads go on, and so do fences (journaled, not indexed).
        statuses = run(_read_statuses(address, ledger_id, acknowledged), 30)
        assert set(statuses.values()) == {Status.OK}, Counter(statuses.values())

        async def fence() -> None:
            client = await RawClient.connect(address)
            try:
                answer = await client.fence(fenced_ledger, KEY)
                assert (answer.status, answer.last_entry_id) == (Status.OK, 2)
            finally:
                await client.close()

        run(fence())

        cluster.kill(0)
        cluster.restart(0, wait=False)
        if _ready_or_refused(cluster, 0) is None:
            cluster.restart(0, extra_args=["--index-map-size-bytes", str(64 << 20)])
        assert cluster.addresses == [address]
        statuses = run(_read_statuses(address, ledger_id, acknowledged), 30)
        assert set(statuses.values()) == {Status.OK}, Counter(statuses.values())
        statuses = run(_read_statuses(address, fenced_ledger, fenced_blobs), 30)
        assert set(statuses.values()) == {Status.OK}, Counter(statuses.values())
        late = _blob(fenced_ledger, 3)
        assert run(_add_all(address, fenced_ledger, [late])) == [Status.FENCED]


# ---------------------------------------------------------------- flipped bits

_RECORD_HEAD = struct.Struct(">IB")  # length (type and payload), type


def _journal_batches(path: Path) -> list[list[tuple[int, int, int]]]:
    """The batches of a journal file: each a list of (offset, size, type) of its records,
    from its BATCH record on (read up to the first record that is not whole)."""
    data = path.read_bytes()
    batches: list[list[tuple[int, int, int]]] = []
    position = journal_format.FILE_HEADER_SIZE
    while position + journal_format.RECORD_OVERHEAD <= len(data):
        length, kind = _RECORD_HEAD.unpack_from(data, position)
        size = length + 8
        if length < 1 or position + size > len(data) or kind not in journal_format.RECORD_TYPES:
            break
        if kind == journal_format.RECORD_BATCH:
            batches.append([])
        if batches:
            batches[-1].append((position, size, kind))
        position += size
    return batches


def _last_journal_file(bookie_journal: Path) -> Path:
    return bookie_journal / journal_format.journal_file_name(
        max(journal_format.list_journal_ids(bookie_journal))
    )


def _flip_bit(path: Path, offset: int, bit: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
        f.flush()
        os.fsync(f.fileno())


async def _adds_then_fence(address: str, ledger_id: int, blobs: dict[int, bytes]) -> None:
    """Every add and then a fence, sent in one go: the bookie takes them in one loop turn,
    so its journal's last batch holds the fence and adds before it."""
    client = await RawClient.connect(address)
    try:
        futures = [client.send(AddRequest(0, ledger_id, KEY, [blobs[e]])) for e in sorted(blobs)]
        futures.append(client.send(FenceRequest(0, ledger_id, KEY)))
        answers = await asyncio.gather(*futures)
    finally:
        await client.close()
    assert [a.status for a in answers] == [Status.OK] * len(answers), answers


def _journal_last_batch_with_fence_and_adds(
    cluster: LocalCluster, i: int, first_ledger_id: int, entries: int
) -> tuple[int, dict[int, bytes], list[tuple[int, int, int]]]:
    """Adds and a fence of a ledger until the journal's last batch holds the fence and
    some of those adds (a few tries at most); (ledger id, its blobs, that batch)."""
    bookie, address = cluster.bookies[i], cluster.bookies[i].address
    for attempt in range(5):
        ledger_id = first_ledger_id + attempt
        blobs = {e: _blob(ledger_id, e) for e in range(entries)}
        run(_adds_then_fence(address, ledger_id, blobs))
        batch = _journal_batches(_last_journal_file(bookie.journal_dir))[-1]
        kinds = {kind for _, _, kind in batch}
        if {journal_format.RECORD_FENCE, journal_format.RECORD_ADD} <= kinds:
            return ledger_id, blobs, batch
    raise AssertionError("the journal never put a fence and adds in one batch")


async def _ledger_answers(
    address: str, ledger_id: int, blobs: dict[int, bytes]
) -> tuple[dict[int, Status], int, Status]:
    """What a restarted bookie says of a ledger: each entry's read status, the read-LAC
    answer's status, a late normal add's status (of the entry after the last)."""
    statuses = await _read_statuses(address, ledger_id, blobs)
    client = await RawClient.connect(address)
    try:
        lac = await client.request(ReadLacRequest(0, ledger_id))
        assert isinstance(lac, ReadLacResponse)
        late = _blob(ledger_id, max(blobs) + 1)
        add = await client.add(ledger_id, KEY, [late])
    finally:
        await client.close()
    return statuses, lac.status, add.status


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize("damaged", ["fence", "add"])
def test_b1_a_flipped_bit_in_the_journals_last_synced_batch_keeps_the_fence_and_entries(
    metadata_uri: str, tmp_path: Path, damaged: str
) -> None:
    with _cluster(metadata_uri, tmp_path / "cluster", 1, NO_CHECKPOINTS) as cluster:
        address = cluster.addresses[0]
        ledger_id, blobs, batch = _journal_last_batch_with_fence_and_adds(cluster, 0, 11, 20)
        cluster.kill(0)
        kind = journal_format.RECORD_FENCE if damaged == "fence" else journal_format.RECORD_ADD
        # The fence is the batch's last record; the first add leaves more after it.
        offset, size, _ = [r for r in batch if r[2] == kind][-1 if damaged == "fence" else 0]
        journal_file = _last_journal_file(cluster.bookies[0].journal_dir)
        _flip_bit(journal_file, offset + size // 2)  # in the payload: the checksum fails
        assert cluster.restart(0) == address
        # Replay met the damage in the last batch: the bytes it cut are kept aside.
        assert list(journal_file.parent.glob(journal_file.name + ".torn-*"))
        statuses, lac_status, late_add = run(_ledger_answers(address, ledger_id, blobs))
        _never_absent(statuses, "after the flip")
        assert lac_status in (Status.OK, Status.IO_ERROR), lac_status
        assert late_add == Status.FENCED  # R7: the acknowledged fence held
        if damaged == "add":  # the entries after the damage were suspect: unknown
            assert Status.IO_ERROR in statuses.values(), statuses

        # A recovery writing the entries again settles them.
        async def recover() -> None:
            client = await RawClient.connect(address)
            try:
                for e in sorted(blobs):
                    answer = await client.add(ledger_id, KEY, [blobs[e]], recovery=True)
                    assert answer.status == Status.OK, (e, answer.status)
            finally:
                await client.close()

        run(recover())
        statuses = run(_read_statuses(address, ledger_id, blobs))
        assert set(statuses.values()) == {Status.OK}, statuses


def _entry_log_offset(data_dir: Path, blob: bytes) -> tuple[Path, int]:
    """The entry log holding ``blob`` and the offset of its payload's middle byte."""
    found = []
    for path in sorted((data_dir / "entrylogs").glob("*.log")):
        data = path.read_bytes()
        at = data.find(blob)
        while at >= 0:
            found.append((path, at + len(blob) - 4))  # in the payload, not the header
            at = data.find(blob, at + 1)
    assert len(found) == 1, found
    return found[0]


def _index_value_offsets(data_dir: Path, ledger_id: int, entry_id: int) -> list[int]:
    """Where the index's file holds the value of (ledger, entry): an LMDB leaf node keeps
    a value right after its key; every copy (older pages) counts."""
    data = (data_dir / "index" / "data.mdb").read_bytes()
    key = struct.pack(">QQ", ledger_id, entry_id)
    offsets, at = [], data.find(key)
    while at >= 0:
        offsets.append(at + len(key) + 6)  # inside the entry's offset in its log
        at = data.find(key, at + 1)
    assert offsets
    return offsets


def _damage_stopped_bookie(
    cluster: LocalCluster, i: int, kind: str, ledger_id: int, entry_id: int, blob: bytes
) -> None:
    """Flip one bit of the stored record ``kind`` ("entrylog" or "index") of the entry in
    a bookie stopped cleanly (its last checkpoint put everything there)."""
    data_dir = cluster.bookies[i].data_dir
    if kind == "entrylog":
        path, offset = _entry_log_offset(data_dir, blob)
        _flip_bit(path, offset)
    else:
        for offset in _index_value_offsets(data_dir, ledger_id, entry_id):
            _flip_bit(data_dir / "index" / "data.mdb", offset)


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
@pytest.mark.parametrize("kind", ["entrylog", "index"])
def test_r9_a_flipped_bit_in_an_entry_log_or_the_index_is_an_io_error_never_absence(
    metadata_uri: str, tmp_path: Path, kind: str
) -> None:
    ledger_id, damaged_entry = 12, 10
    blobs = {e: _blob(ledger_id, e) for e in range(20)}
    with _cluster(metadata_uri, tmp_path / "cluster", 1) as cluster:
        address = cluster.addresses[0]
        assert run(_add_all(address, ledger_id, list(blobs.values()))) == [Status.OK] * 20
        assert cluster.stop(0) == 0  # its close checkpoints: the journal holds nothing
        _damage_stopped_bookie(cluster, 0, kind, ledger_id, damaged_entry, blobs[damaged_entry])
        assert cluster.restart(0) == address
        statuses, lac_status, late_add = run(_ledger_answers(address, ledger_id, blobs))
        _never_absent(statuses, f"after a flip in the {kind}")
        assert statuses[damaged_entry] == Status.IO_ERROR
        assert {s for e, s in statuses.items() if e != damaged_entry} == {Status.OK}
        assert lac_status == Status.OK and late_add == Status.OK


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_r7_r17_a_flipped_bit_in_a_fenced_ledgers_state_in_the_index_never_unfences_it(
    metadata_uri: str, tmp_path: Path
) -> None:
    ledger_id, other_ledger = 13, 14
    blobs = {e: _blob(ledger_id, e) for e in range(5)}
    others = {e: _blob(other_ledger, e) for e in range(5)}
    with _cluster(metadata_uri, tmp_path / "cluster", 1) as cluster:
        address = cluster.addresses[0]
        run(_adds_then_fence(address, ledger_id, blobs))
        other_key = master_key(b"another ledger")
        added = run(_add_all(address, other_ledger, list(others.values()), other_key))
        assert added == [Status.OK] * 5
        assert cluster.stop(0) == 0  # its close checkpoints the states into the index
        # The ledger state's value holds the master key: one bit of it flips, in every
        # copy of the page the file still has.
        index_file = cluster.bookies[0].data_dir / "index" / "data.mdb"
        data = index_file.read_bytes()
        copies, at = [], data.find(KEY)
        while at >= 0:
            copies.append(at)
            at = data.find(KEY, at + 1)
        assert copies
        for at in copies:
            _flip_bit(index_file, at + 7)
        assert cluster.restart(0) == address
        # The state is unknown, not gone: every request of the ledger is an I/O error,
        # so its fence is never lost and nothing of it is answered absent.
        statuses, lac_status, late_add = run(_ledger_answers(address, ledger_id, blobs))
        _never_absent(statuses, "after a flip in the ledger's state")
        assert late_add == Status.IO_ERROR  # never OK: the writer stays fenced out
        assert lac_status == Status.IO_ERROR

        async def fence_again() -> Status:
            client = await RawClient.connect(address)
            try:
                return Status((await client.fence(ledger_id, KEY)).status)
            finally:
                await client.close()

        assert run(fence_again()) == Status.IO_ERROR
        # The rest of the bookie serves on.
        statuses = run(_read_statuses(address, other_ledger, others))
        assert set(statuses.values()) == {Status.OK}, statuses


# ---------------------------------------------------------------- recovery (R8)

PASSWORD = b"recover-me"
QUICK = ClientConfig(
    connect_timeout_ms=1_000,
    read_timeout_ms=1_500,
    add_timeout_ms=1_500,
    fence_timeout_ms=1_500,
    explicit_lac_delay_ms=600_000,
)


def _payload(entry_id: int) -> bytes:
    return b"entry %d " % entry_id + bytes([entry_id]) * 50


def _writer_entries(ledger_id: int, count: int) -> dict[int, bytes]:
    """Entries as the writer builds them (digest with the ledger's password, LAC e - 1,
    the ledger's length so far)."""
    blobs, length = {}, 0
    for e in range(count):
        payload = _payload(e)
        length += len(payload)
        blobs[e] = make_entry(ledger_id, e, payload, lac=e - 1, length=length, password=PASSWORD)
    return blobs


async def _store(address: str, ledger_id: int, blobs: list[bytes]) -> None:
    client = await RawClient.connect(address)
    try:
        answers = await asyncio.gather(
            *(client.send(AddRequest(0, ledger_id, master_key(PASSWORD), [b])) for b in blobs)
        )
    finally:
        await client.close()
    assert [a.status for a in answers] == [Status.OK] * len(blobs)


@pytest.mark.parametrize("kind", ["journal", "entrylog", "index"])
def test_r8_a_recovery_never_closes_short_a_ledger_whose_last_copy_is_damaged(
    metadata_uri: str, tmp_path: Path, kind: str
) -> None:
    """Qw 3, Qa 2: entries 10..19 were acknowledged by bookies A and B only (C missed
    them). A is down, B holds them with one damaged. A recovery then has for that entry
    B's I/O error, C's "no such entry" and no answer from A: unknown, so it must stop
    with an error (R8), never close the ledger short at what C and B can prove; the
    fourth bookie is a spare it could write to, so nothing else stops it. Once A is back
    the ledger is closed at its last acknowledged entry and every entry reads back."""
    with _cluster(metadata_uri, tmp_path / "cluster", 4, NO_CHECKPOINTS) as cluster:
        _recover_after_damage(cluster, kind)


def _recover_after_damage(cluster: LocalCluster, kind: str) -> None:
    uri = cluster.metadata_uri
    with BookKeeper(uri, config=QUICK) as bk:
        ledger_id = bk.create_ledger(3, 3, 2, password=PASSWORD).ledger_id  # left open
        ((_, ensemble),) = bk.ledger_metadata(ledger_id).ensembles
    index = {b.address: b.index for b in cluster.bookies}
    a, b, c = (index[address] for address in ensemble)
    blobs = _writer_entries(ledger_id, 20)
    for i in (a, b, c):
        run(_store(cluster.bookies[i].address, ledger_id, [blobs[e] for e in range(10)]))
    for i in (a, b):  # acknowledged by Qa = 2 bookies: confirmed
        run(_store(cluster.bookies[i].address, ledger_id, [blobs[e] for e in range(10, 20)]))
    cluster.kill(a)
    if kind == "journal":  # entries 10..19 in B's last journal batches; one flipped
        cluster.kill(b)
        journal_file = _last_journal_file(cluster.bookies[b].journal_dir)
        batch = _journal_batches(journal_file)[-1]
        adds = [r for r in batch if r[2] == journal_format.RECORD_ADD]  # one entry each, up to 19
        offset, size, _ = adds[0]
        damaged_entry = 20 - len(adds)  # it and the entries after it are unknown
        _flip_bit(journal_file, offset + size // 2)
    else:  # the last entry's record in B's entry log or index
        damaged_entry = 19
        assert cluster.stop(b) == 0
        _damage_stopped_bookie(cluster, b, kind, ledger_id, damaged_entry, blobs[damaged_entry])
    cluster.restart(b)
    statuses = run(_read_statuses(cluster.bookies[b].address, ledger_id, blobs))
    _never_absent(statuses, f"bookie B after a flip in its {kind}")
    assert statuses[damaged_entry] == Status.IO_ERROR

    with BookKeeper(uri, config=QUICK) as bk:
        started = time.monotonic()
        with pytest.raises(BKError) as refused:
            bk.open_ledger(ledger_id, PASSWORD)  # recovers: must not close it short
        assert "stays open" in str(refused.value), refused.value
        assert time.monotonic() - started < 30
        md = bk.ledger_metadata(ledger_id)
        assert not md.is_closed or md.last_entry_id == 19, md

    cluster.restart(a)
    with BookKeeper(uri, config=QUICK) as bk:
        handle = bk.open_ledger(ledger_id, PASSWORD)
        md = bk.ledger_metadata(ledger_id)
        assert md.is_closed and md.last_entry_id == 19, md
        read = [entry.data for entry in handle.read_entries(0, 19)]
        assert read == [_payload(e) for e in range(20)]
