"""The migration from the flat to the hierarchical layout on both metadata drivers:
a compare-and-set on a copy read before the move fails, the migration stopped after
each step and run again while writers change the ledgers, and flat ledgers created by
a client that had not seen the marker yet (docs/METADATA.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from support import run

from quorumlog.errors import MetadataVersionError
from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import LAYOUT_PATH, LEDGERS_PATH, Layout, flat_ledger_id, flat_path
from quorumlog.meta.ledger_metadata import LedgerMetadata, new_ledger_metadata
from quorumlog.meta.ledgers import FLAT_VERSION_BASE, LedgerManager
from quorumlog.meta.migrate import migrate_to_hierarchical
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.entry import DigestType

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
SMALL = Layout.hierarchical(2)


def metadata(ledger_id: int) -> LedgerMetadata:
    return new_ledger_metadata(ledger_id, BOOKIES, 3, 2, DigestType.CRC32C, "digest-of-key")


async def make_flat(store: MetadataStore, ledger_ids: list[int]) -> None:
    """A cluster from before layouts: /ledgers/<id> nodes and no marker."""
    for ledger_id in ledger_ids:
        await store.create(flat_path(ledger_id), metadata(ledger_id).to_bytes())


async def flat_ids(store: MetadataStore) -> list[int]:
    names = await store.children(LEDGERS_PATH)
    return sorted(i for i in map(flat_ledger_id, names) if i is not None)


async def max_children(store: MetadataStore, path: str = LEDGERS_PATH) -> int:
    names = await store.children(path)
    most = len(names)
    for name in names:
        most = max(most, await max_children(store, f"{path}/{name}"))
    return most


def test_a_compare_and_set_on_a_copy_read_before_the_move_fails(metadata_uri):
    """The move's own hazard: a writer holds the flat node's version; once the ledger
    moved, its version numbers start again at 0 and would soon match that old number.
    Flat versions are offset, so the stale write fails and the writer reads again."""

    async def body():
        async with await open_store(metadata_uri) as store:
            await make_flat(store, [4])
            writer = LedgerManager(store)
            md, stale = await writer.read(4)
            await writer.write(md.with_new_fragment(1, ("a:1", *BOOKIES[1:])), stale)
            md, stale = await writer.read(4)  # the flat node's version 1
            assert stale == FLAT_VERSION_BASE + 1
            await migrate_to_hierarchical(store, level_digits=2)
            mover = LedgerManager(store)
            moved, version = await mover.read(4)
            assert version == 0 and moved == md
            await mover.write(moved.with_new_fragment(2, ("b:1", *BOOKIES[1:])), 0)  # now 1
            with pytest.raises(MetadataVersionError, match="ledger 4"):
                await writer.write(md.with_new_fragment(3, ("c:1", *BOOKIES[1:])), stale)
            with pytest.raises(MetadataVersionError, match="ledger 4"):
                await writer.delete(4, stale)
            fresh, version = await writer.read(4)  # found at its new place
            assert version == 1 and fresh.ensembles[-1][0] == 2
            assert await store.exists(flat_path(4)) is None

    run(body())


def test_migration_stopped_after_each_step_and_rerun_under_concurrent_writers(metadata_uri):
    """Flat ledgers, writers that read a ledger, hold their copy a moment and
    compare-and-set one more fragment (as ensemble changes and closes do), and a
    migration stopped after every step (the marker, then each single move) and run
    again: in the end every ledger is at its hierarchical place only, listed once, with
    exactly the fragments its writers confirmed."""
    ids = list(range(1, 13))

    async def body():
        async with (
            await open_store(metadata_uri) as store,
            await open_store(metadata_uri) as writer_store,
        ):
            await make_flat(store, ids)
            writers = LedgerManager(writer_store)
            confirmed: dict[int, int] = dict.fromkeys(ids, 0)  # last fragment confirmed
            stop = asyncio.Event()
            conflicts = 0

            async def writer(ledger_id: int) -> None:
                nonlocal conflicts
                while not stop.is_set():
                    md, version = await writers.read(ledger_id)
                    start = confirmed[ledger_id] + 1
                    assert [s for s, _ in md.ensembles] == list(range(start))
                    await asyncio.sleep(0.002)  # holding its copy while moves go on
                    grown = md.with_new_fragment(start, (f"w{start}:1", *BOOKIES[1:]))
                    try:
                        await writers.write(grown, version)
                    except MetadataVersionError:
                        conflicts += 1
                        continue
                    confirmed[ledger_id] = start

            tasks = [asyncio.create_task(writer(i)) for i in ids[::3]]
            # Stopped right after the marker: new ledgers go to the new place, old ones
            # are still read at the old one.
            report = await migrate_to_hierarchical(store, level_digits=2, max_moves=0)
            assert (report.moved, report.left) == (0, len(ids))
            assert await LedgerManager(store).create(metadata(100)) == 0
            await LedgerManager(store).delete(100)
            runs = 0
            while True:
                report = await migrate_to_hierarchical(store, level_digits=2, max_moves=1)
                runs += 1
                assert await store.exists(LAYOUT_PATH) is not None
                if report.left == 0 and report.moved == 0:
                    break
                assert runs <= len(ids) + 1
            await asyncio.sleep(0.05)  # writers go on after the last move
            stop.set()
            await asyncio.gather(*tasks)
            assert runs == len(ids) + 1  # one move a run, then one that found none
            assert min(confirmed[i] for i in ids[::3]) > 0
            assert conflicts > 0  # writers met the moves and read again
            assert await flat_ids(store) == []
            reader = LedgerManager(store)
            assert await reader.list_ledger_ids() == ids
            for ledger_id in ids:
                assert await reader.path_of(ledger_id) == SMALL.path(ledger_id)
                md, _ = await reader.read(ledger_id)
                starts = [start for start, _ in md.ensembles]
                assert starts == list(range(confirmed[ledger_id] + 1)), ledger_id
            assert await max_children(store) <= SMALL.fan_out

    run(body())


def test_migration_moves_ledgers_created_flat_by_a_client_that_had_not_seen_the_marker(
    metadata_uri,
):
    async def body():
        async with await open_store(metadata_uri) as store:
            await make_flat(store, [1, 2])
            report = await migrate_to_hierarchical(store, level_digits=2)
            assert (report.moved, report.left) == (2, 0)
            await make_flat(store, [3])  # a stale client's create
            ledgers = LedgerManager(store)
            assert await ledgers.list_ledger_ids() == [1, 2, 3]  # served meanwhile
            assert (await ledgers.read(3))[1] == FLAT_VERSION_BASE
            report = await migrate_to_hierarchical(store)  # the cluster's digits: kept
            assert (report.moved, report.left, report.layout) == (1, 0, SMALL)
            assert await ledgers.create(metadata(4)) == 0
            assert await ledgers.list_ledger_ids() == [1, 2, 3, 4]
            assert await flat_ids(store) == []

    run(body())


def test_a_watch_follows_its_ledger_to_the_new_place(metadata_uri):
    """A watch set on a flat ledger reports the move's re-read (same metadata, a new
    version) and then the changes made at the hierarchical place."""

    async def body():
        async with (
            await open_store(metadata_uri) as store,
            await open_store(metadata_uri) as watcher_store,
        ):
            await make_flat(store, [9])
            watcher = LedgerManager(watcher_store)
            original, _ = await watcher.read(9)  # the watcher knows the cluster as flat
            seen: asyncio.Queue[LedgerMetadata | None] = asyncio.Queue()
            watch = watcher.watch(9, seen.put_nowait)
            await watcher_store.exists(LEDGERS_PATH)  # a round trip: the watch is in force
            await migrate_to_hierarchical(store, level_digits=2)
            writer = LedgerManager(store)
            md, version = await writer.read(9)
            grown = md.with_new_fragment(3, ("x:1", *BOOKIES[1:]))
            await writer.write(grown, version)
            # The move's re-read may come before the write or be folded into it (a
            # watch skips versions already superseded): the original, then the write.
            reported = await asyncio.wait_for(seen.get(), 10)
            if reported == original:
                reported = await asyncio.wait_for(seen.get(), 10)
            assert reported == grown
            await writer.delete(9)
            assert await asyncio.wait_for(seen.get(), 10) is None
            watch.cancel()

    run(body())


def start_migration_of_flat(
    metadata_uri: str, ids: list[int], *, reads_per_s: int
) -> tuple[list[str], subprocess.Popen[str]]:
    """A store holding ``ids`` in the flat layout, and ``shell migratelayout`` started
    on it at ``reads_per_s``: the shell's command line and the process."""

    async def prepare() -> None:
        async with await open_store(metadata_uri) as store:
            await make_flat(store, ids)

    run(prepare())
    command = [sys.executable, "-m", "quorumlog", "shell", "--metadata", metadata_uri]
    process = subprocess.Popen(
        [*command, "migratelayout", "--reads-per-s", str(reads_per_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return command, process


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_migratelayout_killed_mid_way_and_run_again_loses_nothing(metadata_uri):
    """The command killed (SIGKILL) part way through its moves, then run again: every
    ledger is at one place at every moment, and the second run finishes the job."""
    ids = list(range(1, 41))

    async def where() -> tuple[list[int], list[int]]:
        async with await open_store(metadata_uri) as store:
            ledgers = LedgerManager(store)
            listed = await ledgers.list_ledger_ids()
            for ledger_id in ids:
                await ledgers.read(ledger_id)  # readable, wherever it is
            return listed, await flat_ids(store)

    command, process = start_migration_of_flat(metadata_uri, ids, reads_per_s=40)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed, flat = run(where())
            assert listed == ids
            if len(flat) < len(ids) - 3:
                break
            time.sleep(0.05)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    listed, flat = run(where())
    assert listed == ids and 0 < len(flat) < len(ids)  # stopped part way
    again = subprocess.run([*command, "migratelayout"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert f"{len(flat)} ledger(s) moved" in again.stdout
    assert run(where()) == (ids, [])


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_migratelayout_stopped_by_ctrl_c_says_nothing_more_and_a_rerun_finishes(metadata_uri):
    """Ctrl-C (SIGINT) part way: exit status 130 and no traceback (once, the loop was
    closed under the store's tasks: 'coroutine ... was never awaited', 'no running event
    loop'); what moved stays moved, and a second run moves the rest."""
    ids = list(range(1, 41))

    async def flat_left() -> list[int]:
        async with await open_store(metadata_uri) as store:
            return await flat_ids(store)

    command, process = start_migration_of_flat(metadata_uri, ids, reads_per_s=20)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(run(flat_left())) >= len(ids) - 3:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert process.returncode == 130, stderr
    assert stderr.strip() == "", stderr
    left = run(flat_left())
    assert 0 < len(left) < len(ids)  # stopped part way
    again = subprocess.run([*command, "migratelayout"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert run(flat_left()) == []
