"""Pipelined appends through a log writer next to plain ledger adds, in one run.

Starts three local bookies on an embedded store, then, twice each, times ``--entries``
pipelined appends of ``--entry-size`` bytes (``--in-flight`` unconfirmed at most) to a
3/3/2 ledger (``LedgerHandle.append``) and to a log (``LogWriter.append_nowait``),
and prints appends per second. The log adds the ledger list and positions on top of
the ledger; this shows what that costs on the hot path::

    python bench/log_write.py --entries 200000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import quorumlog.aio as aio
from quorumlog.aio import LogNamespace
from quorumlog.client.sync import new_event_loop
from quorumlog.server.local_cluster import LocalCluster


async def ledger_appends(uri: str, entries: int, size: int, in_flight: int) -> float:
    async with await aio.BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(3, 3, 2)
        payload = os.urandom(size)
        futures: list[asyncio.Future[int]] = []
        started = time.perf_counter()
        for _ in range(entries):
            if len(futures) >= in_flight:
                await futures[-in_flight]
            futures.append(handle.append(payload))
        await asyncio.gather(*futures)
        seconds = time.perf_counter() - started
        await handle.close()
    return entries / seconds


async def log_appends(uri: str, entries: int, size: int, in_flight: int) -> float:
    async with await aio.BookKeeper.connect(uri) as bk:
        writer = await (
            await LogNamespace(bk).open_log(f"bench-{time.monotonic_ns()}")
        ).open_writer()
        payload = os.urandom(size)
        futures: list[asyncio.Future[object]] = []
        started = time.perf_counter()
        for _ in range(entries):
            if len(futures) >= in_flight:
                await futures[-in_flight]
            futures.append(writer.append_nowait(payload))  # type: ignore[arg-type]
        await asyncio.gather(*futures)
        seconds = time.perf_counter() - started
        await writer.close()
    return entries / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=2_000)
    args = parser.parse_args(argv)
    if args.entries < 1 or args.entry_size < 0 or args.in_flight < 1:
        parser.error("--entries and --in-flight must be >= 1, --entry-size >= 0")
    with tempfile.TemporaryDirectory(prefix="quorumlog-log-bench-") as scratch:
        uri = f"sqlite://{scratch}/metadata.db"
        with LocalCluster(uri, Path(scratch) / "cluster", 3).start():
            for run in (1, 2):
                for name, bench in (("ledger", ledger_appends), ("log", log_appends)):
                    loop = new_event_loop()
                    try:
                        rate = loop.run_until_complete(
                            bench(uri, args.entries, args.entry_size, args.in_flight)
                        )
                    finally:
                        loop.close()
                    print(f"run {run}: {name:<6} {rate:>10,.0f} appends/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
