"""R18 on a real ZooKeeper: garbage collection's reads that can lead to a drop go out
after a sync() of the session, so that a follower lagging the quorum cannot hide a
ledger created moments ago. The store's kazoo client is wrapped to record the calls
that reach the server, in order; the calls themselves run as usual."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from support import run

from quorumlog.meta.bookies import COOKIES_PATH, BookieRegistry
from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import DEFAULT_LAYOUT, LAYOUT_PATH
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LEDGERS_PATH, LedgerManager
from quorumlog.meta.zk_store import ZkStore
from quorumlog.proto.entry import DigestType
from quorumlog.server.gc import StoreGcMetadata, collect_once
from quorumlog.server.local_zookeeper import ZooKeeperServer

ADDRESS = "127.0.0.1:3181"


class Bookie:
    """What garbage collection needs of a bookie: its ledger ids, and the drop."""

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


def _record(client: Any, calls: list[tuple[str, str]]) -> None:
    """Wrap the kazoo calls a ZkStore reads with: each records (kind, path) first."""

    def wrapped(kind: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def recording(path: str, *args: Any, **kwargs: Any) -> Any:
            calls.append((kind, path))
            return call(path, *args, **kwargs)

        return recording

    for kind, name in (
        ("sync", "sync_async"),
        ("get", "get_async"),
        ("exists", "exists_async"),
        ("children", "get_children_async"),
    ):
        setattr(client, name, wrapped(kind, getattr(client, name)))


@pytest.mark.zookeeper
def test_r18_gc_on_zookeeper_syncs_before_the_listing_and_the_existence_reads(
    zookeeper_server: ZooKeeperServer,
) -> None:
    root = f"/gc-sync-{os.getpid()}-{time.monotonic_ns()}"

    async def scenario() -> tuple[int, list[tuple[str, str]], int]:
        store = await open_store(zookeeper_server.uri(root), create=True)
        assert isinstance(store, ZkStore)
        try:
            await BookieRegistry(store).write_cookie(ADDRESS, b"cookie", -1)
            ledgers = LedgerManager(store)
            live = [await ledgers.new_ledger_id() for _ in range(2)]
            for ledger_id in live:
                await ledgers.create(
                    new_ledger_metadata(ledger_id, (ADDRESS,), 1, 1, DigestType.CRC32C, "")
                )
            gone = max(live) + 1000  # entries on the bookie, no metadata: deleted
            calls: list[tuple[str, str]] = []
            _record(store._client, calls)
            bookie = Bookie({*live, gone})
            dropped = await collect_once(bookie, StoreGcMetadata(lambda: store, ADDRESS))
            assert bookie.held == set(live)
            return dropped, calls, gone
        finally:
            await store.close()

    dropped, calls, gone = run(scenario())
    assert dropped == 1
    cookie = f"{COOKIES_PATH}/{ADDRESS}"
    leaf = DEFAULT_LAYOUT.path(1)  # /ledgers/000/000/000/000/000/000/L001
    directories = leaf.split("/")[2:-1]
    levels = [
        LEDGERS_PATH + "/" + "/".join(directories[:n]) for n in range(1, len(directories) + 1)
    ]
    missing = DEFAULT_LAYOUT.path(gone)
    assert calls == [
        ("sync", LEDGERS_PATH),
        ("get", cookie),
        ("children", LEDGERS_PATH),
        ("get", LAYOUT_PATH),
        *(("children", level) for level in levels),  # the walk, level by level
        ("sync", LEDGERS_PATH),
        # Absence is proven in both layouts: hierarchical, flat, hierarchical again (a
        # ledger moved between the first two reads is found by the third).
        ("get", missing),
        ("get", f"{LEDGERS_PATH}/{gone}"),
        ("get", missing),
        ("get", cookie),
    ]
