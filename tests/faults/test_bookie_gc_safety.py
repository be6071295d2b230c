"""R15 on a real bookie process: garbage collection deletes a ledger only when the
metadata store says, for that ledger, that it no longer exists. A wiped or re-created
store (its ``/ledgers`` node gone, or this bookie's cookie gone) proves nothing: the bookie
skips collection and says why, and keeps every entry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from support import run

from quorumlog.errors import NoNodeError, Status
from quorumlog.meta.bookies import COOKIES_PATH
from quorumlog.meta.factory import open_store
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LEDGERS_PATH, LedgerManager
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.entry import DigestType
from quorumlog.server.local_cluster import LocalCluster
from quorumlog.testing.raw_client import RawClient, make_entry, master_key

KEY = master_key(b"gc-safety")


async def _delete_tree(store: MetadataStore, path: str) -> None:
    try:
        children = await store.children(path)
    except NoNodeError:
        return
    for child in children:
        await _delete_tree(store, f"{path}/{child}")
    with contextlib.suppress(NoNodeError):
        await store.delete(path)


def _wait_for_stderr(cluster: LocalCluster, text: str, after: int, timeout_s: float = 20) -> str:
    """The bookie's stderr once ``text`` appears in it past offset ``after`` (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stderr = cluster.bookies[0].stderr_text()
        if text in stderr[after:]:
            return stderr
        assert time.monotonic() < deadline, f"no {text!r} on the bookie's stderr:\n{stderr}"
        time.sleep(0.05)


def test_r15_gc_deletes_nothing_when_the_metadata_store_was_wiped(
    metadata_uri: str, tmp_path: Path
) -> None:
    with LocalCluster(
        metadata_uri, tmp_path / "cluster", 1, extra_args=["--gc-interval-ms", "100"]
    ) as cluster:
        address = cluster.addresses[0]
        blobs = {}

        async def write() -> int:
            store = await open_store(metadata_uri)
            client = await RawClient.connect(address)
            try:
                ledgers = LedgerManager(store)
                live_id = await ledgers.new_ledger_id()
                await ledgers.create(
                    new_ledger_metadata(live_id, (address,), 1, 1, DigestType.CRC32C, "")
                )
                dead_id = live_id + 1000  # no metadata: collected, which shows GC runs
                for ledger_id in (live_id, dead_id):
                    blobs[ledger_id] = [make_entry(ledger_id, i, b"%d" % i) for i in range(10)]
                    answer = await client.add(ledger_id, KEY, blobs[ledger_id])
                    assert answer.status == Status.OK
                deadline = time.monotonic() + 20
                while (await client.read(dead_id, 0)).status == Status.OK:
                    assert time.monotonic() < deadline, "garbage collection never ran"
                    await asyncio.sleep(0.05)
                return live_id
            finally:
                await client.close()
                await store.close()

        live_id = run(write())

        async def wipe(path: str) -> None:
            store = await open_store(metadata_uri)
            try:
                await _delete_tree(store, path)
            finally:
                await store.close()

        async def assert_kept() -> None:
            client = await RawClient.connect(address)
            try:
                read = await client.read(live_id, 0, count=10)
                assert (read.status, read.entries) == (Status.OK, blobs[live_id])
            finally:
                await client.close()

        # The ledgers' node is gone (a wiped store): not "no ledgers". A round between
        # the wipe's deletes of the children and of the node itself sees an empty
        # listing and skips too (its own message); the node's absence is waited for.
        seen = len(cluster.bookies[0].stderr_text())
        run(wipe(LEDGERS_PATH))
        stderr = _wait_for_stderr(cluster, f"has no {LEDGERS_PATH} node", seen)
        assert "garbage collection skipped, nothing deleted" in stderr[seen:]
        run(assert_kept())

        # A store re-created empty: the ledgers' node is back, this bookie's cookie is not.
        async def recreate() -> None:
            store = await open_store(metadata_uri)
            try:
                await store.create(LEDGERS_PATH, b"")
            finally:
                await store.close()

        run(recreate())
        seen = len(cluster.bookies[0].stderr_text())
        run(wipe(f"{COOKIES_PATH}/{address}"))
        stderr = _wait_for_stderr(cluster, "no cookie for this bookie", seen)
        run(assert_kept())
        assert cluster.bookies[0].alive()
