"""Entry-log compaction in a real bookie process: most ledgers deleted, their logs
rewritten while readers read, a kill -9 in the middle of it, and the disk space
actually given back (bytes of entry-log files before and after)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from support import run, shell

from quorumlog.errors import Status
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.factory import open_store
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.proto.entry import DigestType
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"password")
LEDGERS = 8  # two of them live on
LIVE = 2
ROUNDS = 50
BATCH = 5
PAYLOAD = 1000
_COMPACTING = re.compile(rb"compacting entry log (\d+)")
_DONE = re.compile(rb"copied, (\d+) bytes freed in ([0-9.]+) s")


def payload(ledger_id: int, entry_id: int, size: int = PAYLOAD) -> bytes:
    return (b"%d/%d:" % (ledger_id, entry_id)).ljust(size, b"x")


def entry_log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "entrylogs").glob("*.log"))


async def write_ledgers(
    address: str, metadata_uri: str, rounds: int = ROUNDS, size: int = PAYLOAD
) -> tuple[list[int], list[int]]:
    """LEDGERS ledgers written interleaved (so every entry log holds all of them); the
    metadata of all but LIVE of them deleted afterwards. Returns (live, dead) ids."""
    store = await open_store(metadata_uri)
    client = await RawClient.connect(address)
    try:
        ledgers = LedgerManager(store)
        ids = []
        for _ in range(LEDGERS):
            ledger_id = await ledgers.new_ledger_id()
            await ledgers.create(
                new_ledger_metadata(ledger_id, (address,), 1, 1, DigestType.CRC32C, "")
            )
            ids.append(ledger_id)
        for r in range(rounds):
            for ledger_id in ids:
                first = r * BATCH
                blobs = [
                    make_entry(ledger_id, e, payload(ledger_id, e, size))
                    for e in range(first, first + BATCH)
                ]
                assert (await client.add(ledger_id, KEY, blobs)).status == Status.OK
        live, dead = ids[:LIVE], ids[LIVE:]
        for ledger_id in dead:
            await ledgers.delete(ledger_id)
        return live, dead
    finally:
        await client.close()
        await store.close()


async def read_all(
    address: str, live: list[int], rounds: int = ROUNDS, size: int = PAYLOAD
) -> None:
    client = await RawClient.connect(address)
    try:
        for ledger_id in live:
            for e in range(rounds * BATCH):
                answer = await client.read(ledger_id, e)
                assert answer.status == Status.OK, (ledger_id, e, answer.status)
                assert payload(ledger_id, e, size) in answer.entries[0]
    finally:
        await client.close()


async def read_while(address: str, live: list[int], until: float, stop: asyncio.Event) -> int:
    """Read live entries round and round until ``stop`` (or the deadline, or the bookie's
    death); every answer must be the entry. Returns how many reads were checked."""
    client = await RawClient.connect(address)
    checked = 0
    try:
        while not stop.is_set() and time.monotonic() < until:
            for ledger_id in live:
                e = checked % (ROUNDS * BATCH)
                try:
                    answer = await client.read(ledger_id, e)
                except (ConnectionError, OSError, TimeoutError):
                    return checked  # killed
                assert answer.status == Status.OK, (ledger_id, e, answer.status)
                assert payload(ledger_id, e) in answer.entries[0]
                checked += 1
            await asyncio.sleep(0)
    finally:
        await client.close()
    return checked


def wait_for(
    path: Path, pattern: re.Pattern[bytes], timeout_s: float, count: int = 1
) -> re.Match[bytes]:
    """The ``count``-th match of ``pattern`` in the file at ``path``, once it is there
    (polled, bounded by ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        matches = list(pattern.finditer(path.read_bytes()))
        if len(matches) >= count:
            return matches[count - 1]
        time.sleep(0.05)
    raise AssertionError(f"no {count} x {pattern.pattern!r} in {path} after {timeout_s} s")


def test_compaction_under_reads_survives_kill_9_and_gives_the_space_back(
    metadata_uri: str, tmp_path: Path
) -> None:
    args = [
        "--gc-interval-ms",
        "200",
        "--entry-log-max-bytes",
        str(256 * 1024),
        "--minor-compaction-threshold",
        "0.5",
        "--minor-compaction-interval-ms",
        "500",
        "--major-compaction-threshold",
        "0",
        # Slow enough that the kill lands in the middle of the copy.
        "--compaction-rate-bytes-per-s",
        "100000",
        "--log-level",
        "INFO",
    ]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 1, extra_args=args) as cluster:
        bookie = cluster.bookies[0]
        address = cluster.addresses[0]
        live, _ = run(write_ledgers(address, metadata_uri))
        before = entry_log_bytes(bookie.data_dir)

        async def reads_until_killed() -> int:
            stop = asyncio.Event()
            reading = asyncio.create_task(read_while(address, live, time.monotonic() + 60, stop))
            # The second log's turn: the first one's entries are copied, and the index
            # moves only once every log is (one checkpoint at the end).
            await asyncio.to_thread(wait_for, bookie.stderr_path, _COMPACTING, 30, 2)
            assert not _DONE.search(bookie.stderr_path.read_bytes())
            cluster.kill(0)
            return await reading

        assert run(reads_until_killed(), timeout_s=90) > 0

        cluster.restart(0)
        run(read_all(address, live))

        async def reads_until_compacted() -> int:
            stop = asyncio.Event()
            reading = asyncio.create_task(read_while(address, live, time.monotonic() + 90, stop))
            await asyncio.to_thread(wait_for, bookie.stderr_path, _DONE, 90)
            stop.set()
            return await reading

        assert run(reads_until_compacted(), timeout_s=120) > 0
        run(read_all(address, live))
        after = entry_log_bytes(bookie.data_dir)
        # About LIVE/LEDGERS of the data is live; its copies plus the current log's
        # slack stay.
        assert after < before * 0.5, (before, after)

        # Once more after a restart: the new locations are durable.
        cluster.restart(0)
        run(read_all(address, live))


def test_reclaim_rate_of_an_unpaced_compaction(metadata_uri: str, tmp_path: Path) -> None:
    """Compaction's reclaim in processes: 8 ledgers written interleaved into 1 MiB entry
    logs, 6 deleted; one minor compaction (threshold 0.5, unpaced). Prints the entry-log
    bytes before and after and the compaction's own duration (copy, sync, index commit,
    deletes)."""
    rounds, size = 200, 4000  # 8 ledgers x 1000 entries x 4 kB = 32 MB
    args = [
        "--gc-interval-ms",
        "200",
        "--entry-log-max-bytes",
        str(1024 * 1024),
        "--minor-compaction-threshold",
        "0.5",
        "--minor-compaction-interval-ms",
        "500",
        "--major-compaction-threshold",
        "0",
        "--compaction-rate-bytes-per-s",
        "0",
        "--log-level",
        "INFO",
    ]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 1, extra_args=args) as cluster:
        bookie = cluster.bookies[0]
        address = cluster.addresses[0]
        live, _ = run(write_ledgers(address, metadata_uri, rounds, size), timeout_s=300)
        before = entry_log_bytes(bookie.data_dir)
        done = wait_for(bookie.stderr_path, _DONE, 120)
        after = entry_log_bytes(bookie.data_dir)
        freed, duration = int(done.group(1)), float(done.group(2))
        run(read_all(address, live, rounds, size), timeout_s=300)
        print(
            f"\nentry logs {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB; "
            f"compaction freed {freed / 1e6:.1f} MB in {duration:.2f} s "
            f"({freed / 1e6 / duration:.1f} MB/s of old logs deleted, "
            f"{(before - after) / 1e6 / duration:.1f} MB/s net)"
        )
        assert after < before * 0.4, (before, after)


_ADMIN = re.compile(rb"admin (http://127\.0\.0\.1:\d+)")


async def published_service_info(metadata_uri: str, bookies: list[str]) -> list[object]:
    store = await open_store(metadata_uri)
    try:
        registry = BookieRegistry(store)
        return [await registry.read_service_info(bookie) for bookie in bookies]
    finally:
        await store.close()


def test_shell_gc_collects_and_compacts_on_every_bookie_named(
    metadata_uri: str, tmp_path: Path
) -> None:
    """Nothing periodic runs (hour-long intervals): the deleted ledgers' space comes
    back only through ``quorumlog shell gc``, which reaches each bookie's admin API at
    the address the bookie published in its registration; with ``--http``, a
    registered bookie left out is named and fails the command."""
    pytest.importorskip("quorumlog.server.admin_http")
    args = ["--gc-interval-ms", "3600000", "--entry-log-max-bytes", str(256 * 1024)]
    args += ["--http-port", "0", "--log-level", "INFO"]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 2, extra_args=args) as cluster:
        admins = [wait_for(b.stdout_path, _ADMIN, 30).group(1).decode() for b in cluster.bookies]
        bookie = cluster.bookies[0]
        address = cluster.addresses[0]
        live, _ = run(write_ledgers(address, metadata_uri))
        before = entry_log_bytes(bookie.data_dir)

        partial = shell(metadata_uri, "gc", "--http", admins[1])
        assert partial.returncode == 1, partial
        assert f"{address}: registered, but no --http reached it" in partial.stderr
        # Bookie 0 was not asked: no forced round ever ran there (its entry logs' size
        # is no witness: a checkpoint may write buffered entries out meanwhile).
        with urllib.request.urlopen(f"{admins[0]}/api/v1/bookie/gc", timeout=10) as r:
            assert json.load(r) == {"is_in_force_gc": False, "last": None}

        published = run(published_service_info(metadata_uri, cluster.addresses))
        # Each registration publishes its admin API beside its place (--rack).
        assert published == [
            {"http": admin, "rack": "/default-region/default-rack"} for admin in admins
        ]

        done = shell(metadata_uri, "gc")  # every bookie found through its registration
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert f"{cluster.addresses[1]}: major compaction rewrote" in done.stdout
        assert f"{address}: major compaction rewrote" in done.stdout
        after = entry_log_bytes(bookie.data_dir)
        assert after < before * 0.5, (before, after, done.stdout)
        run(read_all(address, live))
