"""Ledger metadata at scale: create, open (read), delete and a GC scan, per layout.

Creates ``--ledgers`` ledgers' metadata on an embedded store (or, with
``--zookeeper``, a local ZooKeeper started for the run) in the ``--layout`` given
(hierarchical by default; ``flat`` makes a cluster from before layouts), ``--in-flight``
operations at a time, then times: reading each ledger, one GC scan (the walk a bookie's
GC round makes, keeping the ids of a snapshot the size of the cluster), and deleting
each ledger. Prints one JSON line per phase (operations, seconds, operations a second)::

    python bench/ledger_layout.py --ledgers 10000
    python bench/ledger_layout.py --ledgers 10000 --zookeeper
    python bench/ledger_layout.py --ledgers 100000 --zookeeper --layout flat

A flat ZooKeeper cluster above about 80,000 ledgers fails its scan (a listing over
``jute.maxbuffer``): that is the point of the hierarchical layout. The scan here is
unpaced (``reads_per_s=None``); a bookie paces it to ``gc_metadata_reads_per_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import LEDGERS_PATH, Layout
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.proto.entry import DigestType
from quorumlog.server.local_zookeeper import ZooKeeperServer

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


async def timed(
    name: str, ids: Iterable[int], action: Callable[[int], Awaitable[object]], in_flight: int
) -> None:
    queue = list(ids)
    count = len(queue)
    started = time.monotonic()

    async def worker() -> None:
        while queue:
            await action(queue.pop())

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    report(name, count, started)


def report(name: str, count: int, started: float) -> None:
    elapsed_s = time.monotonic() - started
    print(
        json.dumps(
            {
                "phase": name,
                "operations": count,
                "seconds": round(elapsed_s, 2),
                "per_s": round(count / elapsed_s, 1) if elapsed_s else None,
            }
        ),
        flush=True,
    )


async def bench(uri: str, count: int, layout: Layout, in_flight: int) -> None:
    store = await open_store(uri, create=True)
    try:
        if not layout.is_hierarchical:
            await store.create(LEDGERS_PATH)  # no marker: a flat cluster
        ledgers = LedgerManager(store, new_layout=layout)
        first = await ledgers.reserve_ledger_ids(count)
        ids = range(first, first + count)

        async def create(ledger_id: int) -> None:
            md = new_ledger_metadata(ledger_id, BOOKIES, 3, 2, DigestType.CRC32C, "key")
            await ledgers.create(md)

        await create(ids[0])  # the cluster's marker, once
        await timed("create", ids[1:], create, in_flight)
        await timed("open", ids, ledgers.read, in_flight)
        started = time.monotonic()
        snapshot = set(ids)
        found = 0
        async for ledger_id in ledgers.ledger_ids():
            found += ledger_id in snapshot
        assert found == count, (found, count)
        report("gc_scan", count, started)
        await timed("delete", ids, ledgers.delete, in_flight)
    finally:
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--ledgers", type=int, default=10_000)
    parser.add_argument("--layout", choices=("hierarchical", "flat"), default="hierarchical")
    parser.add_argument("--zookeeper", action="store_true", help="a local ZooKeeper")
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    layout = Layout.hierarchical() if args.layout == "hierarchical" else Layout.flat()
    print(
        json.dumps({"ledgers": args.ledgers, "layout": args.layout, "zookeeper": args.zookeeper}),
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ledger-layout-") as tmp:
        if args.zookeeper:
            server = ZooKeeperServer().start()
            try:
                asyncio.run(bench(server.uri("/bench"), args.ledgers, layout, args.in_flight))
            finally:
                server.stop()
        else:
            uri = f"sqlite://{Path(tmp) / 'metadata.db'}"
            asyncio.run(bench(uri, args.ledgers, layout, args.in_flight))
    return 0


if __name__ == "__main__":
    sys.exit(main())
