"""R18, reads can be stale: every decision that deletes, or that takes something for
absent, reads after a sync. Each test gives the deciding session a lagging server
(MemoryStore's StaleReads, never catching up by itself): it shows the store as it was
before the last writes of other sessions, until ``sync()`` or a write of its own, as a
ZooKeeper follower behind the quorum does. Without the sync each decision below would
delete, forget or leave out something that exists."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable

import pytest
from support import run

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.errors import BKError
from quorumlog.log import writer as log_writer
from quorumlog.log.errors import NoSuchLogError
from quorumlog.log.log import Log
from quorumlog.log.metadata import create_log_if_absent, log_path, read_log
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.proto.entry import DigestType
from quorumlog.replication.auditor import Auditor
from quorumlog.replication.decommission import ledgers_naming
from quorumlog.replication.report import LedgerOutcome
from quorumlog.replication.rereplicate import recover_bookie, replicate_ledger
from quorumlog.server.gc import StoreGcMetadata, collect_once
from quorumlog.spark import commit as commits
from quorumlog.testing.memory_store import MemoryStore, MemoryTree, StaleReads

# Nothing listens on these: a request to them fails at once.
A, B, C = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


def lagging(tree: MemoryTree) -> MemoryStore:
    """A session on ``tree`` whose server applies nothing more until it must."""
    store = MemoryStore(tree)
    store.stale = StaleReads(random.Random(0), catch_up_probability=0.0)
    return store


async def catch_up(store: MemoryStore) -> None:
    """Bring ``store``'s lagging server up to now by a write of its own (not by a sync,
    so that the syncs the tests look for are the code's own)."""
    await store.create("/caught-up/n", b"", sequential=True)


async def create_ledger(store: MemoryStore, ensemble: tuple[str, ...]) -> int:
    ledgers = LedgerManager(store)
    ledger_id = await ledgers.new_ledger_id()
    await ledgers.create(
        new_ledger_metadata(ledger_id, ensemble, len(ensemble), 1, DigestType.CRC32C, "")
    )
    return ledger_id


def in_session(
    scenario: Callable[[MemoryTree, MemoryStore, MemoryStore], Awaitable[None]],
) -> None:
    """``scenario(tree, lagging session, up-to-date session)``; the lagging one has read
    (and so fixed its view) before the scenario's own writes."""

    async def main() -> None:
        tree = MemoryTree()
        behind, current = lagging(tree), MemoryStore(tree)
        await current.create("/ledgers", b"")
        await behind.exists("/ledgers")  # its server's view: as of now
        await scenario(tree, behind, current)

    run(main())


def test_r18_the_lagging_server_of_the_memory_store_catches_up_at_sync_and_own_writes():
    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await current.create("/ledgers/7", b"x")
        assert await behind.exists("/ledgers/7") is None  # stale
        assert await behind.children("/ledgers") == []
        await behind.sync("/ledgers")
        assert await behind.exists("/ledgers/7") == 0
        await current.set("/ledgers/7", b"y")
        assert (await behind.get("/ledgers/7")).data == b"x"  # stale again
        await behind.create("/mine", b"")  # a write of its own: its server caught up
        assert (await behind.get("/ledgers/7")).data == b"y"
        assert behind.stale is not None and behind.stale.stale_reads == 3

    in_session(scenario)


class Bookie:
    def __init__(self, ledger_ids: set[int]) -> None:
        self.held = set(ledger_ids)

    def ledger_ids(self) -> set[int]:
        return set(self.held)

    def garbage_collect(self, live_ledger_ids: Iterable[int], snapshot: set[int]) -> int:
        gone = snapshot - set(live_ledger_ids)
        self.held -= gone
        return len(gone)

    def halt(self, where: str, exc: BaseException) -> None:
        raise AssertionError(f"{where}: {exc}")


def test_r18_gc_keeps_a_ledger_its_lagging_server_neither_lists_nor_finds():
    """A ledger created after the GC session's server last caught up, whose entries the
    bookie already holds: listed nowhere and absent when read alone, on that server."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await BookieRegistry(current).write_cookie(A, b"cookie", -1)
        old = await create_ledger(current, (A,))
        await catch_up(behind)  # the cookie and the old ledger are in its view
        new = await create_ledger(current, (A,))
        bookie = Bookie({old, new})
        assert await collect_once(bookie, StoreGcMetadata(lambda: behind, A)) == 0
        assert bookie.held == {old, new}

    in_session(scenario)


def test_r18_the_auditor_counts_a_bookie_registered_moments_ago_as_available():
    """A bookie missing from the registration lists is lost, and its ledgers are marked
    once the delay is over."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await BookieRegistry(current).register(A)
        bk = BookKeeper(behind)
        try:
            assert await Auditor(bk, "auditor").available_bookies() == {A}
        finally:
            await bk.close()

    in_session(scenario)


def test_r18_decommission_sees_a_ledger_created_on_the_bookie_moments_ago():
    """No ledger naming the bookie lets decommission delete its cookie."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        ledger_id = await create_ledger(current, (A, B))
        bk = BookKeeper(behind)
        try:
            assert await ledgers_naming(bk, A) == [ledger_id]
        finally:
            await bk.close()

    in_session(scenario)


def test_r18_recover_bookie_scans_a_ledger_created_moments_ago():
    """A run that leaves out a ledger naming the lost bookie reports it complete."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        ledger_id = await create_ledger(current, (A, B))
        bk = BookKeeper(behind)
        try:
            report = await recover_bookie(bk, A, dry_run=True)
        finally:
            await bk.close()
        assert [r.ledger_id for r in report.ledgers] == [ledger_id]

    in_session(scenario)


def test_r18_a_replication_worker_does_not_take_a_new_ledger_for_deleted():
    """ "Deleted" clears the ledger's under-replication mark."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        ledger_id = await create_ledger(current, (B, C))
        bk = BookKeeper(behind)
        try:
            result = await replicate_ledger(bk, ledger_id, A)
        finally:
            await bk.close()
        assert result.outcome is LedgerOutcome.UNAFFECTED, result

    in_session(scenario)


def test_r18_a_spark_abort_keeps_the_ledgers_a_commit_appended():
    """A driver's commit appended the write's ledger and left its marker; an abort on a
    session whose server has neither must not delete that ledger."""
    token, log_name = "w1", "events"

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        writer_bk = BookKeeper(current)
        bk = BookKeeper(behind)
        try:
            await create_log_if_absent(current, log_name)
            await commits.open_staging(writer_bk, token, log_name)
            ledger_id = await create_ledger(current, (A,))
            await current.create(f"{commits.staging_path(token)}/l{ledger_id}", b"0")
            await catch_up(behind)  # its server has the staging, not the commit
            await current.create(f"{commits.staging_path(token)}/{commits.COMMIT_MARKER}")
            metadata, version = await read_log(current, log_name)
            appended = type(metadata)(log_name, ledgers=(ledger_id,))
            await current.set(log_path(log_name), appended.to_bytes(), version)
            assert await commits.abort(bk, log_name, token) == ()
            assert await current.exists(f"/ledgers/{ledger_id}") is not None
        finally:
            await bk.close()
            await writer_bk.close()

    in_session(scenario)


class _Handle:
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id

    async def close(self) -> None:
        raise BKError("closed already")


def test_r18_a_log_writer_keeps_a_ledger_the_list_holds_after_all():
    """A compare-and-set that added the ledger with its reply lost, read back from a
    server that has not applied it: the ledger must stay (a listed ledger deleted stops
    every reader at it)."""
    log_name = "events"

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await create_log_if_absent(current, log_name)
        ledger_id = await create_ledger(current, (A,))
        await catch_up(behind)
        metadata, version = await read_log(current, log_name)
        appended = type(metadata)(log_name, ledgers=(ledger_id,))
        await current.set(log_path(log_name), appended.to_bytes(), version)
        bk = BookKeeper(behind)
        try:
            await log_writer._discard(Log(bk, log_name), _Handle(ledger_id))  # type: ignore[arg-type]
        finally:
            await bk.close()
        assert await current.exists(f"/ledgers/{ledger_id}") is not None

    in_session(scenario)


def test_r18_the_lagging_server_bites_a_gc_whose_sync_does_nothing(monkeypatch):
    """The tests above hold only through their syncs: with a sync that leaves the server
    behind, garbage collection drops the new ledger (R15's read-alone check is no help
    when that read goes to the same lagging server)."""

    async def no_catch_up(self: MemoryStore, path: str = "/") -> None:
        return None

    monkeypatch.setattr(MemoryStore, "sync", no_catch_up)

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await BookieRegistry(current).write_cookie(A, b"cookie", -1)
        old = await create_ledger(current, (A,))
        await catch_up(behind)
        new = await create_ledger(current, (A,))
        bookie = Bookie({old, new})
        assert await collect_once(bookie, StoreGcMetadata(lambda: behind, A)) == 1
        assert bookie.held == {old}

    in_session(scenario)


def test_r18_a_synced_read_of_a_log_sees_one_created_moments_ago():
    """``read_log(sync=True)`` (what `quorumlog pipeline` checks a log with before it
    says the log does not exist) catches the lagging server up first; a plain read may
    not see the log yet."""

    async def scenario(tree: MemoryTree, behind: MemoryStore, current: MemoryStore) -> None:
        await create_log_if_absent(current, "fresh")
        with pytest.raises(NoSuchLogError):
            await read_log(behind, "fresh")
        metadata, _version = await read_log(behind, "fresh", sync=True)
        assert metadata.ledgers == ()

    in_session(scenario)
