"""``quorumlog bench``: write, read and tail workloads, after BookKeeper's benchmark tools.

    quorumlog bench write [--bookies 3 | --metadata URI] [--ensemble 3 --write-quorum 3
                          --ack-quorum 2] [--entry-size 100] [--entries N | --duration-s S]
                          [--ledgers 1] [--max-outstanding 1000] [--rate 0] [--json]
    quorumlog bench read  [...] [--entries N]       sequential reads of a closed ledger
    quorumlog bench tail  [...] [--rate 1000]       confirmation-to-delivery latency

Latencies go into an HDR histogram (microsecond resolution); the summary gives
throughput (entries/s, MB/s) and p50, p99, p99.9 and max. Without ``--metadata`` the
benchmark starts its own local cluster of ``--bookies`` bookie processes in a temporary
directory and removes it afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from quorumlog.errors import BKError

_HIST_MAX_US = 60_000_000  # one minute


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bench = subparsers.add_parser("bench", help="measure throughput and latency")
    workloads = bench.add_subparsers(dest="workload", metavar="WORKLOAD", required=True)
    for name, text in (
        ("write", "appends: throughput and add latency"),
        ("read", "sequential reads of a closed ledger"),
        ("tail", "a writer at a fixed rate and a tailing reader: confirmation-to-delivery"),
    ):
        p = workloads.add_parser(name, help=text)
        p.add_argument("--metadata", help="an existing cluster's metadata URI")
        p.add_argument("--bookies", type=int, default=3, help="local bookies to start")
        p.add_argument("--no-journal-sync", action="store_true", help="local bookies only")
        p.add_argument("--ensemble", type=int, default=3)
        p.add_argument("--write-quorum", type=int, default=3)
        p.add_argument("--ack-quorum", type=int, default=2)
        p.add_argument("--entry-size", type=int, default=100)
        p.add_argument("--entries", type=int, default=100_000)
        p.add_argument("--duration-s", type=float, default=0.0, help="write: stop after this")
        p.add_argument("--ledgers", type=int, default=1, help="write: ledgers written at once")
        p.add_argument("--max-outstanding", type=int, default=1000, help="adds in flight")
        p.add_argument("--rate", type=float, default=0.0, help="entries/s, 0 = unlimited")
        p.add_argument("--warmup", type=int, default=1000, help="entries not measured")
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--quiet", action="store_true", help="no progress line")
    bench.set_defaults(func=run)


@dataclass
class Result:
    workload: str
    entries: int = 0
    seconds: float = 0.0
    entry_size: int = 0
    latency_us: HdrHistogram = field(
        default_factory=lambda: HdrHistogram(1, _HIST_MAX_US, 3), repr=False
    )
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        h = self.latency_us
        rate = self.entries / self.seconds if self.seconds else 0.0
        return {
            "workload": self.workload,
            "entries": self.entries,
            "seconds": round(self.seconds, 3),
            "entries_per_s": round(rate, 1),
            "mb_per_s": round(rate * self.entry_size / 1e6, 3),
            "latency_ms": {
                "p50": h.get_value_at_percentile(50) / 1000,
                "p99": h.get_value_at_percentile(99) / 1000,
                "p99.9": h.get_value_at_percentile(99.9) / 1000,
                "max": h.get_max_value() / 1000,
                "mean": round(h.get_mean_value() / 1000, 3),
                "samples": h.get_total_count(),
            },
            **self.settings,
        }


def run(args: argparse.Namespace) -> int:
    from quorumlog.client.sync import new_event_loop

    if args.entries < 1 or args.entry_size < 0 or args.max_outstanding < 1 or args.ledgers < 1:
        print(
            "quorumlog bench: --entries, --max-outstanding, --ledgers must be >= 1", file=sys.stderr
        )
        return 2
    try:
        with _cluster(args) as metadata_uri:
            loop = new_event_loop()
            try:
                result = loop.run_until_complete(_WORKLOADS[args.workload](args, metadata_uri))
            finally:
                loop.close()
    except (BKError, OSError, RuntimeError) as exc:
        print(f"quorumlog bench {args.workload}: {exc}", file=sys.stderr)
        return 1
    summary = result.summary()
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    return 0


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator[str]:
    if args.metadata:
        yield args.metadata
        return
    from quorumlog.server.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="quorumlog-bench-") as tmp:
        uri = "sqlite://" + os.path.join(tmp, "metadata.db")
        cluster = LocalCluster(uri, tmp, args.bookies, journal_sync=not args.no_journal_sync)
        try:
            cluster.start()
            if not args.quiet and not args.json:
                print(f"started {args.bookies} local bookies: {', '.join(cluster.addresses)}")
            yield uri
        finally:
            cluster.stop_all()


class _Progress:
    def __init__(self, enabled: bool, what: str) -> None:
        self.enabled = enabled
        self.what = what
        self.started = time.perf_counter()
        self.last_print = self.started
        self.last_count = 0

    def update(self, count: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last_print >= 1.0:
            rate = (count - self.last_count) / (now - self.last_print)
            print(
                f"\r{self.what}: {count:,} entries, {rate:,.0f} entries/s now",
                end="",
                file=sys.stderr,
                flush=True,
            )
            self.last_print, self.last_count = now, count

    def done(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


async def _connect(metadata_uri: str):  # type: ignore[no-untyped-def]
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig

    return await BookKeeper.connect(metadata_uri, config=ClientConfig())


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "quorum": f"{args.ensemble}/{args.write_quorum}/{args.ack_quorum}",
        "entry_size": args.entry_size,
        "max_outstanding": args.max_outstanding,
        "ledgers": args.ledgers,
        "rate": args.rate,
        "journal_sync": not args.no_journal_sync if not args.metadata else None,
    }


async def _write(args: argparse.Namespace, metadata_uri: str) -> Result:
    bk = await _connect(metadata_uri)
    result = Result("write", entry_size=args.entry_size, settings=_settings(args))
    payload = os.urandom(args.entry_size)
    try:
        handles = [
            await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
            for _ in range(args.ledgers)
        ]
        progress = _Progress(not (args.quiet or args.json), "write")
        hist = result.latency_us
        loop = asyncio.get_running_loop()
        total = args.entries + args.warmup
        per_ledger_limit = max(1, args.max_outstanding)
        deadline = time.perf_counter() + args.duration_s if args.duration_s else None
        counters = {"sent": 0, "done": 0}
        measured_start = 0.0

        def on_done(sent_ns: int, measured: bool, future: asyncio.Future[int]) -> None:
            counters["done"] += 1
            if measured and not future.exception():
                hist.record_value(max(1, (time.perf_counter_ns() - sent_ns) // 1000))

        async def drive(handle) -> None:  # type: ignore[no-untyped-def]
            nonlocal measured_start
            in_flight: list[asyncio.Future[int]] = []
            interval = args.ledgers / args.rate if args.rate else 0.0
            next_send = loop.time()
            while counters["sent"] < total:
                if deadline is not None and time.perf_counter() > deadline:
                    break
                if len(in_flight) >= per_ledger_limit:
                    await in_flight[len(in_flight) - per_ledger_limit]
                    del in_flight[: len(in_flight) - per_ledger_limit + 1]
                if interval:
                    next_send += interval
                    delay = next_send - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                index = counters["sent"]
                counters["sent"] += 1
                if index == args.warmup:
                    measured_start = time.perf_counter()
                future = handle.append(payload)
                future.add_done_callback(
                    functools.partial(on_done, time.perf_counter_ns(), index >= args.warmup)
                )
                in_flight.append(future)
                if index % 1000 == 0:
                    progress.update(counters["done"])
                    await asyncio.sleep(0)
            await asyncio.gather(*in_flight)

        if args.warmup == 0:
            measured_start = time.perf_counter()
        await asyncio.gather(*(drive(h) for h in handles))
        result.seconds = time.perf_counter() - measured_start
        result.entries = max(0, counters["sent"] - args.warmup)
        progress.done()
        for handle in handles:
            await handle.close()
            await bk.delete_ledger(handle.ledger_id)
    finally:
        await bk.close()
    return result


async def _read(args: argparse.Namespace, metadata_uri: str) -> Result:
    bk = await _connect(metadata_uri)
    result = Result("read", entry_size=args.entry_size, settings=_settings(args))
    payload = os.urandom(args.entry_size)
    try:
        writer = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
        futures: list[asyncio.Future[int]] = []
        for _ in range(args.entries):
            if len(futures) >= 1000:
                await futures[-1000]
            futures.append(writer.append(payload))
        await asyncio.gather(*futures)
        await writer.close()
        reader = await bk.open_ledger(writer.ledger_id)
        progress = _Progress(not (args.quiet or args.json), "read")
        step = max(1, bk.config.read_batch_entries * bk.config.reads_in_flight)
        started = time.perf_counter()
        count = 0
        for first in range(0, args.entries, step):
            last = min(args.entries - 1, first + step - 1)
            t0 = time.perf_counter_ns()
            entries = await reader.read_entries(first, last)
            per_entry_us = (time.perf_counter_ns() - t0) // 1000 // max(1, len(entries))
            result.latency_us.record_value(max(1, per_entry_us), len(entries))
            if any(e.data != payload for e in entries):
                raise RuntimeError(f"ledger {writer.ledger_id}: read back different data")
            count += len(entries)
            progress.update(count)
        result.seconds = time.perf_counter() - started
        result.entries = count
        progress.done()
        result.settings["latency_note"] = "per-entry share of each batch read"
        await bk.delete_ledger(writer.ledger_id)
    finally:
        await bk.close()
    return result


async def _tail(args: argparse.Namespace, metadata_uri: str) -> Result:
    bk = await _connect(metadata_uri)
    reader_bk = await _connect(metadata_uri)
    rate = args.rate or 1000.0
    result = Result("tail", entry_size=args.entry_size, settings={**_settings(args), "rate": rate})
    confirmed_at: dict[int, int] = {}
    try:
        writer = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
        reader = await reader_bk.open_ledger_no_recovery(writer.ledger_id)
        total = args.entries
        loop = asyncio.get_running_loop()

        async def write() -> None:
            next_send = loop.time()
            futures: list[asyncio.Future[int]] = []
            for i in range(total):
                next_send += 1.0 / rate
                delay = next_send - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                payload = i.to_bytes(8, "big") + bytes(max(0, args.entry_size - 8))
                future = writer.append(payload)
                future.add_done_callback(
                    lambda f: confirmed_at.__setitem__(f.result(), time.perf_counter_ns())
                )
                futures.append(future)
            await asyncio.gather(*futures)

        async def tail() -> None:
            next_id = 0
            progress = _Progress(not (args.quiet or args.json), "tail")
            while next_id < total:
                lac, entry = await reader.read_last_add_confirmed_and_entry(next_id, 1000)
                now = time.perf_counter_ns()
                if entry is None:
                    continue
                delivered = [entry]
                if lac > next_id:
                    delivered += await reader.read_entries(next_id + 1, min(lac, total - 1))
                    now = time.perf_counter_ns()
                for e in delivered:
                    sent = confirmed_at.get(e.entry_id)
                    if sent is not None and e.entry_id >= args.warmup:
                        result.latency_us.record_value(max(1, (now - sent) // 1000))
                next_id = delivered[-1].entry_id + 1
                progress.update(next_id)
            progress.done()

        started = time.perf_counter()
        await asyncio.gather(write(), tail())
        result.seconds = time.perf_counter() - started
        result.entries = total
        result.settings["latency_note"] = "writer confirmation to reader delivery"
        await writer.close()
        await bk.delete_ledger(writer.ledger_id)
    finally:
        await reader_bk.close()
        await bk.close()
    return result


_WORKLOADS = {"write": _write, "read": _read, "tail": _tail}


def _print_summary(s: dict[str, Any]) -> None:
    lat = s["latency_ms"]
    print(
        f"{s['workload']}: {s['entries']:,} entries in {s['seconds']:.2f} s = "
        f"{s['entries_per_s']:,.0f} entries/s, {s['mb_per_s']:.2f} MB/s "
        f"(quorum {s['quorum']}, {s['entry_size']} B entries, "
        f"{s['max_outstanding']} outstanding, {s['ledgers']} ledger(s))"
    )
    print(
        f"latency ms: p50 {lat['p50']:.3f}  p99 {lat['p99']:.3f}  p99.9 {lat['p99.9']:.3f}  "
        f"max {lat['max']:.3f}  mean {lat['mean']:.3f}  ({lat['samples']:,} samples)"
    )
