"""Deletion that leaves nothing behind (apache/pulsar #13238: a managed ledger deleted in
two steps that are not atomic leaves orphans). Each deletion path is crashed at each of
its steps, against real bookie processes on both metadata drivers: a log deleted, a log
truncated, a database's snapshot recorded and the old one dropped, a Spark write's
staging cleaned up, a ledger deleted between its metadata and its bookies. Then
``quorumlog shell orphans`` lists what each crash left, ``--delete`` and ``shell gc``
remove it, and ``orphans`` reports zero. A user's own ledger and a live log's open
ledger are never touched."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import run, shell

from quorumlog import BookKeeper as SyncBookKeeper
from quorumlog import LogNamespace as SyncLogNamespace
from quorumlog.aio import BookKeeper, LogNamespace
from quorumlog.db.snapshot import list_snapshots, take_snapshot
from quorumlog.errors import NoSuchLedgerError
from quorumlog.log import LogConfig, Position
from quorumlog.log.log import Log
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.spark import commit as sink

pytest.importorskip("quorumlog.server.admin_http")

SMALL_LEDGERS = LogConfig(rollover_size_bytes=1_000, ensemble=3, write_quorum=2, ack_quorum=2)


class Crash(Exception):
    """The process stops here (not a BKError: no deletion path catches it)."""


@contextmanager
def crash_at_ledger_delete(bk: BookKeeper, step: int, *, mid: bool = False) -> Iterator[None]:
    """Crash a deletion path before its ``step``-th ledger deletion (0: the first): the
    path's own metadata change before it is done. ``mid``: that deletion is half done,
    the ledger's metadata deleted and its bookies never told."""
    real = bk.delete_ledger
    done = 0

    async def delete_ledger(ledger_id: int, password: bytes = b"") -> None:
        nonlocal done
        if done == step:
            if mid:
                await bk.ledgers.delete(ledger_id)
            raise Crash(f"crashed deleting ledger {ledger_id}")
        done += 1
        await real(ledger_id, password)

    bk.delete_ledger = delete_ledger  # type: ignore[method-assign]
    try:
        yield
    finally:
        bk.delete_ledger = real  # type: ignore[method-assign]


@contextmanager
def crash_at_write(bk: BookKeeper, prefix: str) -> Iterator[None]:
    """Crash before any create or set of a node under ``prefix``."""
    store = bk.store
    real_create, real_set = store.create, store.set

    async def create(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith(prefix):
            raise Crash(f"crashed creating {path}")
        return await real_create(path, *args, **kwargs)

    async def set_(path: str, *args: Any, **kwargs: Any) -> Any:
        if path.startswith(prefix):
            raise Crash(f"crashed writing {path}")
        return await real_set(path, *args, **kwargs)

    store.create, store.set = create, set_  # type: ignore[method-assign]
    try:
        yield
    finally:
        store.create, store.set = real_create, real_set  # type: ignore[method-assign]


async def written_log(bk: BookKeeper, name: str, ledgers: int) -> tuple[Log, list[Position]]:
    """A log of at least ``ledgers`` closed ledgers (1000-byte ledgers, 100-byte records)."""
    log = await LogNamespace(bk).open_log(name, SMALL_LEDGERS)
    writer = await log.open_writer()
    positions = []
    while len({p.ledger_id for p in positions}) < ledgers:
        positions.append(await writer.append(b"r" * 100))
    await writer.close()
    return log, positions


def sqlite_at(path: Path, position: Position) -> Path:
    """A database file whose last applied record is ``position``."""
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE _quorumlog_applied (ledger_id INTEGER, entry_id INTEGER)")
    conn.execute("INSERT INTO _quorumlog_applied VALUES (?, ?)", tuple(position))
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    return path


async def crash_every_path(uri: str, tmp_path: Path) -> dict[str, Any]:
    """Run each deletion path into a crash; what each left, and what must stay."""
    async with await BookKeeper.connect(uri) as bk:
        left: dict[str, set[int]] = {}
        logs = LogNamespace(bk)

        # A log deleted: its node goes first, then its ledgers. Crash before the first
        # ledger, after one, and halfway through one (metadata gone, bookies not told).
        for name, step, mid in (("gone-a", 0, False), ("gone-b", 1, False), ("gone-c", 0, True)):
            log, _ = await written_log(bk, name, 3)
            ledgers = await log.ledgers()
            with crash_at_ledger_delete(bk, step, mid=mid), pytest.raises(Crash):
                await logs.delete_log(name)
            assert name not in await logs.list_logs()
            left[name] = set(ledgers[step + (1 if mid else 0) :])
            if mid:
                left["bookie-data"] = {ledgers[0]}

        # A log truncated: the list first, then the ledgers removed from it.
        log, positions = await written_log(bk, "trunc", 3)
        ledgers = await log.ledgers()
        cut = next(p for p in positions if p.ledger_id == ledgers[-1])
        with crash_at_ledger_delete(bk, 0), pytest.raises(Crash):
            await log.truncate(cut)
        assert await log.ledgers() == ledgers[-1:]
        left["trunc"] = set(ledgers[:-1])

        # A database's snapshots: a snapshot written but never recorded (crash before
        # its list is written), then one recorded whose predecessor's ledger was not
        # deleted yet (crash after the list, before the ledger and the truncation).
        db, positions = await written_log(bk, "db/shop", 2)
        first = await take_snapshot(db, sqlite_at(tmp_path / "a.sqlite", positions[0]), keep=1)
        assert first is not None
        with crash_at_write(bk, "/dbsnapshots"), pytest.raises(Crash):
            await take_snapshot(db, sqlite_at(tmp_path / "b.sqlite", positions[1]), keep=1)
        with crash_at_ledger_delete(bk, 0), pytest.raises(Crash):
            await take_snapshot(db, sqlite_at(tmp_path / "c.sqlite", positions[2]), keep=1)
        kept = [s.ledger_id for s in await list_snapshots(db)]
        tagged = [
            x
            for x in await bk.ledgers.list_ledger_ids()
            if (await bk.ledger_metadata(x)).custom_metadata.get("dbsnapshot") == b"db/shop"
        ]
        assert len(kept) == 1 and first.ledger_id in tagged
        unrecorded = set(tagged) - set(kept) - {first.ledger_id}
        assert len(unrecorded) == 1
        left["db-dropped"] = {first.ledger_id}
        left["db-unrecorded"] = unrecorded  # young and closed: only with --min-age-s 0

        # A Spark write aborted: the registration goes first, then the ledger.
        await sink.prepare_log(bk, "sunk")
        token = sink.new_write_token()
        await sink.open_staging(bk, token, "sunk")
        ledger_id = await sink.task_ledger_id(bk, token, "sunk", "s0", 0, 0, 4)
        handle = await sink.create_task_ledger(bk, token, "sunk", 0, ledger_id, 3, 2, 2)
        await handle.append(b"row")
        await handle.close()
        with crash_at_ledger_delete(bk, 0), pytest.raises(Crash):
            await sink.abort(bk, "sunk", token)
        left["sink"] = {ledger_id}

        # A Spark write whose driver died after its task wrote (no commit, no abort), its
        # staging silent since: as old as the sink's own sweep waits for.
        token = sink.new_write_token()
        await sink.open_staging(bk, token, "sunk")
        ledger_id = await sink.task_ledger_id(bk, token, "sunk", "s0", 0, 0, 4)
        handle = await sink.create_task_ledger(bk, token, "sunk", 0, ledger_id, 3, 2, 2)
        await handle.append(b"row")
        await handle.close()
        assert not await sink.staging_abandoned(bk, token)
        silent_ms = int(time.time() * 1000) - sink.STALE_STAGING_MS - 60_000
        stamp = {"log": "sunk", "created_ms": silent_ms, "alive_ms": silent_ms}
        await bk.store.set(sink.staging_path(token), json.dumps(stamp).encode())
        registration = f"{sink.staging_path(token)}/l{ledger_id}"
        stamp = {"partition": 0, "alive_ms": silent_ms}
        await bk.store.set(registration, json.dumps(stamp).encode())
        assert await sink.staging_abandoned(bk, token)
        left["sink-abandoned"] = {ledger_id}

        # A log writer that died after creating its next ledger, before adding it:
        # open, above the newest listed one, young: only with --min-age-s 0.
        log, _ = await written_log(bk, "fresh", 1)
        fresh = await log.create_ledger()
        left["fresh"] = {fresh.ledger_id}

        # What must stay: a user's own ledger (untagged, whatever it holds).
        user = await bk.create_ledger(3, 2, 2)
        await user.append(b"mine")
        await user.close()
        return {"left": {k: sorted(v) for k, v in left.items()}, "user": user.ledger_id}


async def ledger_exists(uri: str, ledger_id: int) -> bool:
    async with await BookKeeper.connect(uri) as bk:
        try:
            await bk.ledger_metadata(ledger_id)
        except NoSuchLedgerError:
            return False
        return True


async def published(uri: str, count: int) -> None:
    async with await BookKeeper.connect(uri) as bk:
        for _ in range(600):
            bookies = await bk.registry.writable_bookies()
            infos = [await bk.registry.read_service_info(b) for b in bookies]
            if len(bookies) == count and all(i and i.get("http") for i in infos):
                return
            await asyncio.sleep(0.05)
    raise AssertionError("bookies did not publish their admin API")


def orphans(uri: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = shell(uri, "orphans", "--json", *args)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_every_deletion_path_crashed_at_every_step_leaves_nothing_after_orphans_and_gc(
    metadata_uri: str, tmp_path: Path
) -> None:
    args = ["--gc-interval-ms", "3600000", "--http-port", "0"]
    with LocalCluster(metadata_uri, tmp_path / "cluster", 3, extra_args=args):
        run(published(metadata_uri, 3))
        state = run(crash_every_path(metadata_uri, tmp_path), timeout_s=240)
        left: dict[str, list[int]] = state["left"]
        # A live log whose writer holds an open ledger all along: referenced.
        live_bk = SyncBookKeeper(metadata_uri)
        live = SyncLogNamespace(live_bk).open_log("live", SMALL_LEDGERS)
        writer = live.open_writer()
        writer.append(b"still writing")
        young = set(left["fresh"]) | set(left["db-unrecorded"])
        every = {x for kind, ids in left.items() if kind != "bookie-data" for x in ids}

        # By default a ledger its owner may still add is not reported yet.
        status, report = orphans(metadata_uri)
        assert status == 1
        assert {o["ledger_id"] for o in report["ledgers"]} == every - young, (left, report)
        assert {b["ledger_id"] for b in report["bookie_data"]} == set(left["bookie-data"])
        assert report["unreached"] == []

        # With no minimum age: everything; --delete removes the orphan ledgers.
        status, report = orphans(metadata_uri, "--min-age-s", "0")
        assert {o["ledger_id"] for o in report["ledgers"]} == every
        status, report = orphans(metadata_uri, "--min-age-s", "0", "--delete")
        assert all(o["deleted"] for o in report["ledgers"]), report
        assert {o["ledger_id"] for o in report["ledgers"]} == every
        assert status == 1  # the bookie data is for the bookies' garbage collection

        gc = shell(metadata_uri, "gc")
        assert gc.returncode == 0, (gc.stdout, gc.stderr)
        status, report = orphans(metadata_uri, "--min-age-s", "0")
        assert (status, report["ledgers"], report["bookie_data"], report["left"]) == (
            0,
            [],
            [],
            0,
        ), report
        text = shell(metadata_uri, "orphans", "--min-age-s", "0")
        assert text.returncode == 0, text.stderr
        assert "0 orphan(s)" in text.stdout and "0 ledger(s) of bookie data" in text.stdout
        assert run(ledger_exists(metadata_uri, state["user"]))
        # The live writer never noticed: its open ledger was not touched.
        position = writer.append(b"and still")
        assert position.ledger_id == live.ledgers()[-1]
        writer.close()
        live_bk.close()


def test_the_next_snapshot_deletes_what_a_crash_left_dropped(cluster3: LocalCluster) -> None:
    """A snapshot that crashed after recording the list, before deleting the snapshot it
    dropped: the list names that ledger under ``dropped``; the next snapshot deletes it
    and writes the list without it."""

    async def main() -> None:
        tmp = Path(cluster3.base_dir)
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            db, positions = await written_log(bk, "db/crm", 2)
            first = await take_snapshot(db, sqlite_at(tmp / "a.sqlite", positions[0]), keep=1)
            assert first is not None
            with crash_at_ledger_delete(bk, 0), pytest.raises(Crash):
                await take_snapshot(db, sqlite_at(tmp / "b.sqlite", positions[1]), keep=1)
            node = json.loads((await bk.store.get("/dbsnapshots/db%2Fcrm")).data)
            assert node["dropped"] == [first.ledger_id]
            await bk.ledger_metadata(first.ledger_id)  # still there

            third = await take_snapshot(db, sqlite_at(tmp / "c.sqlite", positions[2]), keep=1)
            assert third is not None
            node = json.loads((await bk.store.get("/dbsnapshots/db%2Fcrm")).data)
            with pytest.raises(NoSuchLedgerError):
                await bk.ledger_metadata(first.ledger_id)
            assert first.ledger_id not in node.get("dropped", [])
            assert [s.ledger_id for s in await list_snapshots(db)] == [third.ledger_id]

    run(main(), timeout_s=120)


def test_an_orphan_scan_reads_a_logs_node_once_and_judges_a_suspect_afresh(
    cluster3: LocalCluster,
) -> None:
    """A scan keeps each log's node for the log's other ledgers (one read, not one per
    ledger). A ledger the kept node does not list (a commit since) is judged again on a
    node read after its own metadata, and not called an orphan when that lists it."""
    from quorumlog.commands import orphans
    from quorumlog.core.orphans import OwnerView

    async def main() -> None:
        async with await BookKeeper.connect(cluster3.metadata_uri) as bk:
            _log, positions = await written_log(bk, "scanned", 6)
            ledgers = sorted({p.ledger_id for p in positions})
            reads: list[str] = []
            real_view = orphans.owner_view

            async def counted(bk_: Any, ledger_id: int, owner: Any) -> OwnerView:
                reads.append(owner.name)
                view = await real_view(bk_, ledger_id, owner)
                if len(reads) == 1:  # the kept read: as if taken before the last commit
                    return OwnerView(exists=True, listed=view.listed - {ledgers[-1]})
                return view

            orphans.owner_view = counted  # type: ignore[assignment]
            try:
                found, checked = await orphans.find_orphan_ledgers(
                    bk, min_age_ms=0, reads_per_s=200.0
                )
            finally:
                orphans.owner_view = real_view  # type: ignore[assignment]
            assert checked >= len(ledgers)
            assert found == [], found
            # One kept read, and one fresh read for the ledger it did not list.
            assert reads == ["scanned", "scanned"], reads

    run(main(), timeout_s=120)
