"""Write, read and tail workloads on a cluster, after BookKeeper's benchmark tools.

What ``quorumlog bench`` runs, importable by benchmark scripts:

- ``write``: appends to ``ledgers`` ledgers at once, at most ``max_outstanding`` in
  flight per ledger, optionally at a fixed ``rate``; latency is add to confirmation.
- ``read``: writes ``entries`` to a ledger, closes it, then reads it back in batches;
  latency is each batch's time shared out over its entries.
- ``tail``: a writer at a fixed rate and a reader long-polling the LAC; latency is
  writer confirmation to reader delivery.

Latencies go into an HDR histogram (microsecond resolution). Example::

    from quorumlog.benchmark import BenchSettings, run_workload
    from quorumlog.server.local_cluster import temporary_cluster

    with temporary_cluster(3) as cluster:
        result = asyncio.run(run_workload("write", BenchSettings(), cluster.metadata_uri))
    print(result.summary()["entries_per_s"])
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

HIST_MAX_US = 60_000_000  # one minute

# Called now and then with the number of entries done so far (for a progress line).
ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class BenchSettings:
    """The shape of a run (``quorumlog bench``'s options of the same names)."""

    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    entry_size: int = 100
    entries: int = 100_000
    duration_s: float = 0.0  # write: stop after this long (0: after ``entries``)
    ledgers: int = 1  # write: ledgers written at once
    max_outstanding: int = 1000  # adds in flight (per ledger)
    rate: float = 0.0  # entries/s, 0 = unlimited (tail: 0 means 1000)
    warmup: int = 1000  # entries not measured
    # Whether the bookies fsync their journal, when known (it is reported, not set here).
    journal_sync: bool | None = None

    def summary_settings(self) -> dict[str, Any]:
        """The settings a summary reports beside the figures."""
        return {
            "quorum": f"{self.ensemble}/{self.write_quorum}/{self.ack_quorum}",
            "entry_size": self.entry_size,
            "max_outstanding": self.max_outstanding,
            "ledgers": self.ledgers,
            "rate": self.rate,
            "journal_sync": self.journal_sync,
        }


@dataclass
class Result:
    """One run's figures: ``entries`` measured (warm-up excluded) in ``seconds``, and the
    latency of each in an HDR histogram (microseconds)."""

    workload: str
    entries: int = 0
    seconds: float = 0.0
    entry_size: int = 0
    latency_us: HdrHistogram = field(
        default_factory=lambda: HdrHistogram(1, HIST_MAX_US, 3), repr=False
    )
    settings: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Throughput and latency percentiles (ms) with the run's settings, as
        ``quorumlog bench --json`` prints them."""
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


async def _connect(metadata_uri: str):  # type: ignore[no-untyped-def]
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig

    return await BookKeeper.connect(metadata_uri, config=ClientConfig())


async def _write(settings: BenchSettings, metadata_uri: str, report: ProgressCallback) -> Result:
    bk = await _connect(metadata_uri)
    result = Result("write", entry_size=settings.entry_size, settings=settings.summary_settings())
    payload = os.urandom(settings.entry_size)
    try:
        handles = [
            await bk.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum)
            for _ in range(settings.ledgers)
        ]
        hist = result.latency_us
        loop = asyncio.get_running_loop()
        total = settings.entries + settings.warmup
        # append() refuses past the client's bound rather than queue (R16).
        per_ledger_limit = max(1, min(settings.max_outstanding, bk.config.max_outstanding_adds))
        deadline = time.perf_counter() + settings.duration_s if settings.duration_s else None
        counters = {"sent": 0, "done": 0}
        measured_start = 0.0

        def on_done(sent_ns: int, measured: bool, future: asyncio.Future[int]) -> None:
            counters["done"] += 1
            if measured and not future.exception():
                hist.record_value(max(1, (time.perf_counter_ns() - sent_ns) // 1000))

        async def drive(handle) -> None:  # type: ignore[no-untyped-def]
            nonlocal measured_start
            in_flight: list[asyncio.Future[int]] = []
            interval = settings.ledgers / settings.rate if settings.rate else 0.0
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
                if index == settings.warmup:
                    measured_start = time.perf_counter()
                future = handle.append(payload)
                future.add_done_callback(
                    functools.partial(on_done, time.perf_counter_ns(), index >= settings.warmup)
                )
                in_flight.append(future)
                if index % 1000 == 0:
                    report(counters["done"])
                    await asyncio.sleep(0)
            await asyncio.gather(*in_flight)

        if settings.warmup == 0:
            measured_start = time.perf_counter()
        await asyncio.gather(*(drive(h) for h in handles))
        result.seconds = time.perf_counter() - measured_start
        result.entries = max(0, counters["sent"] - settings.warmup)
        for handle in handles:
            await handle.close()
            await bk.delete_ledger(handle.ledger_id)
    finally:
        await bk.close()
    return result


async def _read(settings: BenchSettings, metadata_uri: str, report: ProgressCallback) -> Result:
    bk = await _connect(metadata_uri)
    result = Result("read", entry_size=settings.entry_size, settings=settings.summary_settings())
    payload = os.urandom(settings.entry_size)
    try:
        writer = await bk.create_ledger(
            settings.ensemble, settings.write_quorum, settings.ack_quorum
        )
        futures: list[asyncio.Future[int]] = []
        for _ in range(settings.entries):
            if len(futures) >= 1000:
                await futures[-1000]
            futures.append(writer.append(payload))
        await asyncio.gather(*futures)
        await writer.close()
        reader = await bk.open_ledger(writer.ledger_id)
        step = max(1, bk.config.read_batch_entries * bk.config.reads_in_flight)
        started = time.perf_counter()
        count = 0
        for first in range(0, settings.entries, step):
            last = min(settings.entries - 1, first + step - 1)
            t0 = time.perf_counter_ns()
            entries = await reader.read_entries(first, last)
            per_entry_us = (time.perf_counter_ns() - t0) // 1000 // max(1, len(entries))
            result.latency_us.record_value(max(1, per_entry_us), len(entries))
            if any(e.data != payload for e in entries):
                raise RuntimeError(f"ledger {writer.ledger_id}: read back different data")
            count += len(entries)
            report(count)
        result.seconds = time.perf_counter() - started
        result.entries = count
        result.settings["latency_note"] = "per-entry share of each batch read"
        await bk.delete_ledger(writer.ledger_id)
    finally:
        await bk.close()
    return result


async def _tail(settings: BenchSettings, metadata_uri: str, report: ProgressCallback) -> Result:
    bk = await _connect(metadata_uri)
    reader_bk = await _connect(metadata_uri)
    rate = settings.rate or 1000.0
    result = Result(
        "tail",
        entry_size=settings.entry_size,
        settings={**settings.summary_settings(), "rate": rate},
    )
    confirmed_at: dict[int, int] = {}
    try:
        writer = await bk.create_ledger(
            settings.ensemble, settings.write_quorum, settings.ack_quorum
        )
        reader = await reader_bk.open_ledger_no_recovery(writer.ledger_id)
        total = settings.entries
        loop = asyncio.get_running_loop()

        async def write() -> None:
            next_send = loop.time()
            futures: list[asyncio.Future[int]] = []
            for i in range(total):
                next_send += 1.0 / rate
                delay = next_send - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                payload = i.to_bytes(8, "big") + bytes(max(0, settings.entry_size - 8))
                future = writer.append(payload)
                future.add_done_callback(
                    lambda f: confirmed_at.__setitem__(f.result(), time.perf_counter_ns())
                )
                futures.append(future)
            await asyncio.gather(*futures)

        async def tail() -> None:
            next_id = 0
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
                    if sent is not None and e.entry_id >= settings.warmup:
                        result.latency_us.record_value(max(1, (now - sent) // 1000))
                next_id = delivered[-1].entry_id + 1
                report(next_id)

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


_Workload = Callable[[BenchSettings, str, ProgressCallback], Awaitable[Result]]

_WORKLOADS: dict[str, _Workload] = {"write": _write, "read": _read, "tail": _tail}
WORKLOADS: tuple[str, ...] = tuple(_WORKLOADS)


async def run_workload(
    workload: str,
    settings: BenchSettings,
    metadata_uri: str,
    *,
    progress: ProgressCallback | None = None,
) -> Result:
    """Run ``workload`` (one of :data:`WORKLOADS`) on the cluster of ``metadata_uri``
    with clients of its own; its ledgers are deleted at the end."""
    return await _WORKLOADS[workload](settings, metadata_uri, progress or _no_progress)


def _no_progress(count: int) -> None:
    pass
