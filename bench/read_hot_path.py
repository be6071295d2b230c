"""CPU time per entry of sequential reads, client and bookies apart, in one run.

Starts three local bookies (journal sync off: only reads are measured), writes
``--entries`` entries of ``--entry-size`` bytes to a 3/3/2 ledger, closes it, then
reads it back ``--rounds`` times the way ``quorumlog bench read`` does (``--cold``: a new
ledger each round, so no read is served from the bookies' read cache). For each round it
prints the wall-clock rate and the CPU time per entry of the reading client
(``time.process_time``) and of the bookies (``/proc/<pid>/stat``, all three summed).
Wall-clock rates on a shared machine are noisy; the CPU figures are what to compare
between two versions of the code::

    python bench/read_hot_path.py --entries 200000 --rounds 5
    python bench/read_hot_path.py --profile /tmp/read.prof   # cProfile of the client
    python bench/read_hot_path.py --cold --from-index   # entries found through the index
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``quorumlog`` from a clone

import quorumlog.aio as aio
from quorumlog.client.sync import new_event_loop
from quorumlog.server.local_cluster import LocalCluster

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (fields 14 and 15 of its stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


async def write_ledger(uri: str, entries: int, entry_size: int) -> int:
    async with await aio.BookKeeper.connect(uri) as bk:
        handle = await bk.create_ledger(3, 3, 2)
        payload = os.urandom(entry_size)
        futures: list[asyncio.Future[int]] = []
        for _ in range(entries):
            if len(futures) >= 1000:
                await futures[-1000]
            futures.append(handle.append(payload))
        await asyncio.gather(*futures)
        await handle.close()
        return handle.ledger_id


async def read_ledger(uri: str, ledger_id: int, entries: int) -> int:
    """Read the whole ledger in the steps ``quorumlog bench read`` uses; entries read."""
    async with await aio.BookKeeper.connect(uri) as bk:
        reader = await bk.open_ledger(ledger_id)
        step = max(1, bk.config.read_batch_entries * bk.config.reads_in_flight)
        count = 0
        for first in range(0, entries, step):
            got = await reader.read_entries(first, min(entries - 1, first + step - 1))
            count += len(got)
        await reader.close()
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=Path, help="write a cProfile of the last round here")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="a new ledger for each round: every read misses the bookies' read cache, as "
        "a single quorumlog bench read does",
    )
    parser.add_argument(
        "--from-index",
        action="store_true",
        help="restart the bookies after each write (their close checkpoints): every read "
        "then finds its entries through the index, as a read of older data does, instead "
        "of the locations of recent adds held in memory",
    )
    args = parser.parse_args(argv)
    if args.entries < 1 or args.rounds < 1:
        parser.error("--entries and --rounds must be >= 1")
    with tempfile.TemporaryDirectory(prefix="quorumlog-read-bench-") as scratch:
        uri = f"sqlite://{scratch}/metadata.db"
        cluster = LocalCluster(uri, Path(scratch) / "cluster", 3, journal_sync=False)
        with cluster.start():
            pids = [b.pid for b in cluster.bookies if b.pid is not None]
            loop = new_event_loop()
            try:
                ledger_id = loop.run_until_complete(
                    write_ledger(uri, args.entries, args.entry_size)
                )
                client_us, bookie_us, rates = [], [], []
                for round_index in range(args.rounds):
                    if args.cold and round_index:
                        ledger_id = loop.run_until_complete(
                            write_ledger(uri, args.entries, args.entry_size)
                        )
                    if args.from_index and (args.cold or not round_index):
                        for i in range(len(cluster.bookies)):
                            cluster.restart(i)
                        pids = [b.pid for b in cluster.bookies if b.pid is not None]
                    profiler = cProfile.Profile()
                    profiling = args.profile is not None and round_index == args.rounds - 1
                    bookies0 = sum(process_cpu_s(pid) for pid in pids)
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    if profiling:
                        profiler.enable()
                    count = loop.run_until_complete(read_ledger(uri, ledger_id, args.entries))
                    if profiling:
                        profiler.disable()
                        profiler.dump_stats(args.profile)
                    wall_s = time.perf_counter() - wall0
                    client = (time.process_time() - cpu0) / count * 1e6
                    bookies = (sum(process_cpu_s(pid) for pid in pids) - bookies0) / count * 1e6
                    client_us.append(client)
                    bookie_us.append(bookies)
                    rates.append(count / wall_s)
                    print(
                        f"round {round_index + 1}: {count / wall_s:>10,.0f} entries/s  "
                        f"client {client:.2f} µs/entry  bookies {bookies:.2f} µs/entry"
                        + ("  (profiled)" if profiling else "")
                    )
            finally:
                loop.close()
    print(
        f"median: {statistics.median(rates):,.0f} entries/s, client "
        f"{statistics.median(client_us):.2f} µs/entry, bookies "
        f"{statistics.median(bookie_us):.2f} µs/entry"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
