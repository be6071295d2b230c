"""A ZooKeeper read after a lost connection syncs first (R13).

The read that resolves an unknown outcome (a compare-and-set whose reply was lost
with the connection) may reach a server that has not applied that write yet: the
store calls ZooKeeper's sync() on the path before that read, and only then. The
kazoo client is a stand-in that records the calls it gets; the real server's side
of sync runs in tests/integration/test_meta_contract.py's server-restart test.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kazoo import exceptions as kz  # type: ignore[import-untyped]
from kazoo.protocol.states import KazooState  # type: ignore[import-untyped]

from quorumlog.errors import MetadataError, MetadataVersionError
from quorumlog.meta.zk_store import ZkStore


class _Done:
    """A kazoo AsyncResult, already settled."""

    def __init__(self, value: Any = None, exception: BaseException | None = None) -> None:
        self.value = value
        self.exception = exception

    def successful(self) -> bool:
        return self.exception is None

    def rawlink(self, callback: Any) -> None:
        callback(self)


class _Stat:
    version = 7


class _RecordingKazoo:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_next_set: BaseException | None = None

    def sync_async(self, path: str) -> _Done:
        self.calls.append(("sync", path))
        return _Done(path)

    def get_async(self, path: str) -> _Done:
        self.calls.append(("get", path))
        return _Done((b"data", _Stat()))

    def exists_async(self, path: str) -> _Done:
        self.calls.append(("exists", path))
        return _Done(_Stat())

    def get_children_async(self, path: str) -> _Done:
        self.calls.append(("children", path))
        return _Done(["b", "a"])

    def set_async(self, path: str, data: bytes, version: int) -> _Done:
        self.calls.append(("set", path))
        failure, self.fail_next_set = self.fail_next_set, None
        return _Done(_Stat(), failure)


def _store() -> tuple[ZkStore, _RecordingKazoo]:
    store = ZkStore("zk://127.0.0.1:1/x", "127.0.0.1:1", "/x", 1000)  # never connected
    kazoo = _RecordingKazoo()
    store._client = kazoo
    return store, kazoo


@pytest.mark.parametrize(
    "lost", [kz.ConnectionLoss(), kz.OperationTimeoutError()], ids=["connection", "timeout"]
)
def test_r13_the_read_after_an_unknown_write_outcome_syncs_first(lost: BaseException) -> None:
    async def scenario() -> None:
        store, kazoo = _store()
        await store.get("/ledgers/1")
        kazoo.fail_next_set = lost
        with pytest.raises(MetadataError, match="outcome unknown"):
            await store.set("/ledgers/1", b"new", 7)
        kazoo.calls.clear()
        assert (await store.get("/ledgers/1")).data == b"data"
        assert kazoo.calls == [("sync", "/ledgers/1"), ("get", "/ledgers/1")]
        kazoo.calls.clear()
        await store.get("/ledgers/1")  # synced once: reads go straight on again
        assert kazoo.calls == [("get", "/ledgers/1")]

    asyncio.run(scenario())


def test_reads_after_a_suspended_session_sync_first_and_a_conflict_does_not() -> None:
    async def scenario() -> None:
        store, kazoo = _store()
        kazoo.fail_next_set = kz.BadVersionError()
        with pytest.raises(MetadataVersionError):
            await store.set("/ledgers/1", b"new", 6)  # a known outcome: nothing to sync
        store._on_state(KazooState.SUSPENDED)
        store._on_state(KazooState.CONNECTED)
        kazoo.calls.clear()
        assert await store.children("/ledgers") == ["a", "b"]
        assert await store.exists("/ledgers/1") == 7
        assert kazoo.calls == [
            ("sync", "/ledgers"),
            ("children", "/ledgers"),
            ("exists", "/ledgers/1"),
        ]

    asyncio.run(scenario())
