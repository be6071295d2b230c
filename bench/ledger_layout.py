"""Ledger metadata at scale: create, open (read), delete and a GC scan, per layout.

For each ``--ledgers`` size (a comma-separated list: ``10000,100000,1000000``), on an
embedded store (or, with ``--zookeeper``, a local ZooKeeper started for the run) in the
``--layout`` given (hierarchical by default; ``flat`` makes a cluster from before
layouts): creates that many ledgers' metadata, ``--in-flight`` operations at a time, then
times reading each ledger (open), a GC scan (the walk a bookie's GC round makes, keeping
the ids of a snapshot the size of the cluster, paced to ``--scan-reads-per-s`` as a
bookie paces it), and deleting each ledger. Create, open and delete report p50/p99 per
operation. While scans repeat for ``--probe-s`` seconds, a writer in a process of its
own creates and deletes one ledger's metadata at ``--probe-per-s``; the same writer runs
as long with no scan first, and the two windows alternate ``--probe-rounds`` times: the
ratio of its p99s over all windows is what a scan costs writers. ``--compare-reads-per-s``
adds a third window to each round, scans at that pace, so two paces are compared in one
run (``compare_writer_p99_ratio``).

Prints one JSON line per phase; ``--out FILE`` also writes every size's phases as one
JSON document, and ``--plot FILE.png`` draws p99 and scan time against the size::

    python bench/ledger_layout.py --ledgers 10000,100000,1000000 --out bench/results/layout.json
    python bench/ledger_layout.py --ledgers 10000,100000 --zookeeper --plot layout-zk.png
    python bench/ledger_layout.py --ledgers 100000 --zookeeper --layout flat

A flat ZooKeeper cluster above about 80,000 ledgers fails its scan (a listing over
``jute.maxbuffer``): that is the point of the hierarchical layout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from quorumlog.meta.factory import open_store
from quorumlog.meta.layout import LEDGERS_PATH, LEVEL_DIGITS_DEFAULT, Layout
from quorumlog.meta.ledger_metadata import new_ledger_metadata
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.store import MetadataStore
from quorumlog.proto.entry import DigestType
from quorumlog.server.config import ServerConfig
from quorumlog.server.local_zookeeper import ZooKeeperServer

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")
PROBE_IDS_PER_WINDOW = 1_000_000  # ledger ids a probe window may use, past the cluster's
MAX_PROBE_ROUNDS = 10
WINDOWS_PER_ROUND = 3  # idle, scans at the pace, scans at the compared pace


def percentile_ms(latencies_s: Sequence[float], fraction: float) -> float:
    ordered = sorted(latencies_s)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000, 3)


def phase(name: str, count: int, elapsed_s: float, latencies_s: Sequence[float] = ()) -> dict:
    row: dict[str, Any] = {
        "phase": name,
        "operations": count,
        "seconds": round(elapsed_s, 2),
        "per_s": round(count / elapsed_s, 1) if elapsed_s else None,
    }
    if latencies_s:
        row["p50_ms"] = percentile_ms(latencies_s, 0.5)
        row["p99_ms"] = percentile_ms(latencies_s, 0.99)
    print(json.dumps(row), flush=True)
    return row


async def timed(
    name: str, ids: Sequence[int], action: Callable[[int], Awaitable[object]], in_flight: int
) -> dict:
    queue = list(reversed(ids))
    latencies: list[float] = []
    started = time.monotonic()

    async def worker() -> None:
        while queue:
            ledger_id = queue.pop()
            began = time.perf_counter()
            await action(ledger_id)
            latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return phase(name, len(ids), time.monotonic() - started, latencies)


async def probe_here(uri: str, first_id: int, per_s: float, seconds: float) -> list[float]:
    """A writer: create then delete one ledger's metadata, ``per_s`` pairs a second for
    ``seconds``; the latency of each operation."""
    store = await open_store(uri, create=False)
    try:
        ledgers = LedgerManager(store)
        latencies: list[float] = []
        period_s = 1 / per_s
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            md = new_ledger_metadata(first_id + n, BOOKIES, 3, 2, DigestType.CRC32C, "key")
            began = time.perf_counter()
            await ledgers.create(md)
            latencies.append(time.perf_counter() - began)
            began = time.perf_counter()
            await ledgers.delete(first_id + n)
            latencies.append(time.perf_counter() - began)
            n += 1
            await asyncio.sleep(max(0.0, started + n * period_s - time.monotonic()))
        return latencies
    finally:
        await store.close()


async def probe(uri: str, first_id: int, per_s: float, seconds: float) -> list[float]:
    """:func:`probe_here` in a process of its own, so that what it measures is the
    store's latency, not this process's loop busy with a scan."""
    args = ["--probe", uri, str(first_id), str(per_s), str(seconds)]
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the writer probe exited with status {child.returncode}")
    return list(json.loads(out))


async def scan(ledgers: LedgerManager, snapshot: set[int], reads_per_s: float | None) -> int:
    found = 0
    async for ledger_id in ledgers.ledger_ids(reads_per_s=reads_per_s):
        found += ledger_id in snapshot
    return found


async def bench_one(uri: str, count: int, layout: Layout, args: argparse.Namespace) -> dict:
    store: MetadataStore = await open_store(uri, create=True)
    rows: dict[str, Any] = {"ledgers": count}
    try:
        if not layout.is_hierarchical:
            await store.create(LEDGERS_PATH)  # no marker: a flat cluster
        ledgers = LedgerManager(store, new_layout=layout)
        first = await ledgers.reserve_ledger_ids(
            count + WINDOWS_PER_ROUND * MAX_PROBE_ROUNDS * PROBE_IDS_PER_WINDOW
        )
        ids = range(first, first + count)
        probe_first = first + count  # the probe's ids, past the cluster's

        async def create(ledger_id: int) -> None:
            md = new_ledger_metadata(ledger_id, BOOKIES, 3, 2, DigestType.CRC32C, "key")
            await ledgers.create(md)

        await create(ids[0])  # the cluster's marker, once
        rows["create"] = await timed("create", ids[1:], create, args.in_flight)
        rows["open"] = await timed("open", ids, ledgers.read, args.in_flight)
        snapshot = set(ids)
        reads_per_s = args.scan_reads_per_s or None
        started = time.monotonic()
        found = await scan(ledgers, snapshot, reads_per_s)
        assert found == count, (found, count)
        rows["gc_scan"] = phase("gc_scan", count, time.monotonic() - started)

        # Idle and busy windows alternate, so that a drift of the machine (another
        # process, the disk's cache) weighs on both sides of the ratio alike.
        paces = {"": reads_per_s}
        if args.compare_reads_per_s is not None:
            paces["compare_"] = args.compare_reads_per_s or None
        idle: list[float] = []
        busy: dict[str, list[float]] = {name: [] for name in paces}
        ratios: dict[str, list[float]] = {name: [] for name in paces}
        scans = dict.fromkeys(paces, 0)

        async def scan_repeatedly(name: str) -> None:
            deadline = time.monotonic() + args.probe_s
            while time.monotonic() < deadline:
                await scan(ledgers, snapshot, paces[name])
                scans[name] += 1

        for window in range(args.probe_rounds):
            first_id = probe_first + WINDOWS_PER_ROUND * window * PROBE_IDS_PER_WINDOW
            alone = await probe(uri, first_id, args.probe_per_s, args.probe_s)
            idle += alone
            for offset, name in enumerate(paces, start=1):
                beside, _ = await asyncio.gather(
                    probe(
                        uri,
                        first_id + offset * PROBE_IDS_PER_WINDOW,
                        args.probe_per_s,
                        args.probe_s,
                    ),
                    scan_repeatedly(name),
                )
                busy[name] += beside
                ratio = percentile_ms(beside, 0.99) / percentile_ms(alone, 0.99)
                ratios[name].append(round(ratio, 2))
        probe_s = args.probe_s * args.probe_rounds
        rows["writer_idle"] = phase("writer_idle", len(idle), probe_s, idle)
        summary: dict[str, Any] = {}
        for name, pace in paces.items():
            during = phase(f"writer_during_{name}scans", len(busy[name]), probe_s, busy[name])
            rows[f"writer_during_{name}scans"] = during
            rows[f"{name}scan_reads_per_s"] = pace
            rows[f"{name}writer_p99_ratio"] = round(
                during["p99_ms"] / rows["writer_idle"]["p99_ms"], 2
            )
            rows[f"{name}writer_p99_ratio_per_round"] = ratios[name]
            rows[f"{name}scans_during_probe"] = scans[name]
            summary[f"{name}writer_p99_ratio"] = rows[f"{name}writer_p99_ratio"]
            summary[f"{name}per_round"] = ratios[name]
        print(json.dumps(summary), flush=True)
        rows["delete"] = await timed("delete", ids, ledgers.delete, args.in_flight)
    finally:
        await store.close()
    return rows


def plot(results: list[dict], path: str, title: str) -> None:
    from quorumlog.bench.plot import pyplot

    plt = pyplot()
    sizes = [r["ledgers"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in ("create", "open", "delete"):
        measured = [r for r in results if name in r]  # a run stopped early lacks a phase
        left.plot(
            [r["ledgers"] for r in measured],
            [r[name]["p99_ms"] for r in measured],
            marker="o",
            label=f"{name} p99",
        )
    left.plot(
        sizes,
        [r["writer_during_scans"]["p99_ms"] for r in results],
        marker="x",
        linestyle="--",
        label="writer p99 during GC scans",
    )
    left.set_xscale("log")
    left.set_xlabel("ledgers")
    left.set_ylabel("ms")
    left.legend()
    right.plot(sizes, [r["gc_scan"]["seconds"] for r in results], marker="o")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("ledgers")
    right.set_ylabel("GC scan, s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    if sys.argv[1:2] == ["--probe"]:
        uri, first_id, per_s, seconds = sys.argv[2:6]
        latencies = asyncio.run(probe_here(uri, int(first_id), float(per_s), float(seconds)))
        print(json.dumps(latencies))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--ledgers", default="10000", help="sizes, comma-separated")
    parser.add_argument("--layout", choices=("hierarchical", "flat"), default="hierarchical")
    parser.add_argument("--zookeeper", action="store_true", help="a local ZooKeeper")
    parser.add_argument(
        "--level-digits",
        type=int,
        default=LEVEL_DIGITS_DEFAULT,
        help="digits per level of the hierarchical layout (names per node: 10 to this power)",
    )
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument(
        "--scan-reads-per-s",
        type=float,
        default=ServerConfig().gc_metadata_reads_per_s,
        help="the scan's pace, as a bookie's gc_metadata_reads_per_s (0: none)",
    )
    parser.add_argument(
        "--compare-reads-per-s",
        type=float,
        help="a second pace whose scans get windows of their own in each round (0: none)",
    )
    parser.add_argument("--probe-per-s", type=float, default=100.0)
    parser.add_argument("--probe-s", type=float, default=5.0, help="seconds per window")
    parser.add_argument(
        "--probe-rounds",
        type=int,
        default=3,
        choices=range(1, MAX_PROBE_ROUNDS + 1),
        metavar=f"1..{MAX_PROBE_ROUNDS}",
        help="idle and busy windows alternated this many times; p99s over all of them",
    )
    parser.add_argument("--zookeeper-heap-mb", type=int, default=2048)
    parser.add_argument("--out", help="write every size's phases as one JSON document")
    parser.add_argument("--plot", help="draw p99 and scan time against the size (PNG)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.ledgers.split(",")]
    if args.layout == "hierarchical":
        layout = Layout.hierarchical(args.level_digits)
    else:
        layout = Layout.flat()
    head = {
        "sizes": sizes,
        "layout": args.layout,
        "level_digits": args.level_digits,
        "zookeeper": args.zookeeper,
    }
    print(json.dumps(head), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="ledger-layout-") as tmp:
        server = (
            ZooKeeperServer(heap_mb=args.zookeeper_heap_mb, peak_throughput=True).start()
            if args.zookeeper
            else None
        )
        try:
            for count in sizes:
                print(json.dumps({"ledgers": count}), flush=True)
                if server is not None:
                    uri = server.uri(f"/bench-{count}")
                else:
                    uri = f"sqlite://{Path(tmp) / f'metadata-{count}.db'}"
                results.append(asyncio.run(bench_one(uri, count, layout, args)))
        finally:
            if server is not None:
                server.stop()
    if args.out:
        Path(args.out).write_text(json.dumps({**head, "results": results}, indent=1) + "\n")
    if args.plot:
        driver = "ZooKeeper" if args.zookeeper else "embedded SQLite"
        plot(results, args.plot, f"ledger metadata at scale ({driver}, {args.layout})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
