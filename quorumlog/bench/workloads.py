"""Write, read and tail workloads on a cluster, after BookKeeper's benchmark tools.

What ``quorumlog bench`` runs, importable by benchmark scripts:

- ``write``: appends to ``ledgers`` ledgers at once, at most ``max_outstanding`` in
  flight per ledger, optionally at a fixed ``rate``; latency is add to confirmation.
- ``write-sync``: the same appends from a thread through the synchronous client's
  ``add_entry_async`` (what a program without asyncio uses), ``max_outstanding`` in
  flight.
- ``write-batch``: the same in batches of ``BATCH_ENTRIES`` through the synchronous
  client's ``add_entries_async``, ``max_outstanding`` entries in flight.
- ``log-write``: pipelined appends through a log stream's writer (``append_nowait``).
- ``read``: writes ``entries`` to a ledger, closes it, then reads it back in steps of
  ``read_batch_entries * reads_in_flight`` with the next step in flight while one is
  checked (read-ahead, as a sequential reader does); latency is each step's time
  shared out over its entries.
- ``tail``: a writer at a fixed rate and a reader long-polling the LAC; latency is
  writer confirmation to reader delivery.

Latencies go into an HDR histogram (microsecond resolution); completions are also
counted per ``TIMELINE_INTERVAL_S`` for throughput over time. Example::

    from quorumlog.bench.workloads import BenchSettings, run_workload
    from quorumlog.server.local_cluster import temporary_cluster

    with temporary_cluster(3) as cluster:
        result = asyncio.run(run_workload("write", BenchSettings(), cluster.metadata_uri))
    print(result.summary()["entries_per_s"])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from quorumlog.log.namespace import LogNamespace

if TYPE_CHECKING:
    from quorumlog.proto.entry import Entry

HIST_MAX_US = 60_000_000  # one minute
# Completions are counted per interval of this length: throughput over time.
TIMELINE_INTERVAL_S = 0.1
# The percentiles a summary lists for a latency distribution (CDF) drawn later.
DISTRIBUTION_PERCENTILES = (0.0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 99.99, 100.0)
# Buckets per factor of ten of the latency histogram a summary carries.
HISTOGRAM_BUCKETS_PER_DECADE = 20
# Entries per add_entries_async call in ``write-batch``.
BATCH_ENTRIES = 100
# The garbage collector's first threshold while a workload runs (Python's default is
# 700), as a program with many adds in flight would set it. With 1,000 adds in flight,
# each holding a few objects the collector tracks (its future, its pending record),
# 700 net new objects are reached every few hundred adds: every add was scanned again
# and again and moved to the oldest generation, whose collections then scanned the
# whole heap, 5 or 6 times per 100,000 adds, 1.3-1.5 µs of the client's CPU per add
# (measured with gc.callbacks). At 10,000 the collector takes 0.02 µs per add.
GC_THRESHOLD0 = 10_000
# Read steps in flight at once in ``read``: one being checked, one on the wire.
READ_STEPS_AHEAD = 2

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
    # The writing workloads (all but read) stop issuing after this long, whichever comes
    # first with ``entries`` (0: after ``entries``); what is in flight then completes.
    duration_s: float = 0.0
    ledgers: int = 1  # write: ledgers written at once
    max_outstanding: int = 1000  # adds in flight (per ledger)
    rate: float = 0.0  # entries/s, 0 = unlimited (tail: 0 means 1000)
    warmup: int = 1000  # entries not measured
    # Whether the bookies fsync their journal, when known (it is reported, not set here).
    journal_sync: bool | None = None
    # The collector's first threshold during the run (0: the interpreter's as it is).
    gc_threshold0: int = GC_THRESHOLD0

    def summary_settings(self) -> dict[str, Any]:
        """The settings a summary reports beside the figures."""
        return {
            "quorum": f"{self.ensemble}/{self.write_quorum}/{self.ack_quorum}",
            "entry_size": self.entry_size,
            "max_outstanding": self.max_outstanding,
            "ledgers": self.ledgers,
            "rate": self.rate,
            "journal_sync": self.journal_sync,
            "gc_threshold0": self.gc_threshold0 or gc.get_threshold()[0],
        }


def log_buckets(
    hist: HdrHistogram, per_decade: int = HISTOGRAM_BUCKETS_PER_DECADE
) -> list[list[float]]:
    """``[[upper bound µs, count], ...]`` of the non-empty buckets of width 10^(1/per_decade):
    a latency histogram small enough to keep beside the figures (at most 120 buckets
    from 1 µs to 1 s), which the figures draw on a logarithmic axis."""
    counts: dict[int, int] = {}
    for step in hist.get_recorded_iterator():
        value_us = max(1, step.value_iterated_to)
        bucket = math.ceil(math.log10(value_us) * per_decade - 1e-9)
        counts[bucket] = counts.get(bucket, 0) + step.count_added_in_this_iter_step
    return [[round(10 ** (b / per_decade), 1), counts[b]] for b in sorted(counts)]


def processes_cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes ``pids`` used so far (/proc)."""
    total_ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return total_ticks / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by this process and by its child processes (the local bookies
    ``quorumlog bench`` starts), from ``/proc``: what a phase cost per entry, which on a
    shared machine says more than its wall-clock rate."""

    def __init__(self) -> None:
        self._start = self._now()

    @staticmethod
    def _children_s() -> float:
        me = os.getpid()
        total = 0.0
        try:
            entries = os.listdir("/proc")
        except OSError:
            return 0.0
        for name in entries:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:  # utime and stime: fields 14 and 15 of stat
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def _now(self) -> tuple[float, float]:
        return time.process_time(), self._children_s()

    def per_entry_us(self, entries: int) -> dict[str, float]:
        own, children = self._now()
        return {
            "client": round((own - self._start[0]) / max(1, entries) * 1e6, 2),
            "local_bookies": round((children - self._start[1]) / max(1, entries) * 1e6, 2),
        }


class Timeline:
    """Completions counted per ``interval_s`` from ``start()``: throughput over time.

    One list index per interval, so recording costs an addition, not an object."""

    def __init__(self, interval_s: float = TIMELINE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.counts: list[int] = []
        self._start_s = time.perf_counter()

    def start(self) -> None:
        self._start_s = time.perf_counter()
        self.counts.clear()

    def record(self, entries: int = 1) -> None:
        self.record_at(time.perf_counter(), entries)

    def record_at(self, when_s: float, entries: int = 1) -> None:
        """``entries`` completed at ``when_s`` (``time.perf_counter()``'s clock)."""
        index = int((when_s - self._start_s) / self.interval_s)
        counts = self.counts
        if index >= len(counts):
            counts.extend([0] * (index + 1 - len(counts)))
        counts[index] += entries

    def entries_per_s(self) -> list[float]:
        return [round(count / self.interval_s, 1) for count in self.counts]


@dataclass
class Result:
    """One run's figures: ``entries`` measured (warm-up excluded) in ``seconds``, the
    latency of each in an HDR histogram (microseconds), and completions over time."""

    workload: str
    entries: int = 0
    seconds: float = 0.0
    entry_size: int = 0
    latency_us: HdrHistogram = field(
        default_factory=lambda: HdrHistogram(1, HIST_MAX_US, 3), repr=False
    )
    timeline: Timeline = field(default_factory=Timeline, repr=False)
    settings: dict[str, Any] = field(default_factory=dict)

    def record_measured(self, seconds: float, entries: int, cpu: CpuMeter | None) -> None:
        """The measured phase's length, its entries and, when ``cpu`` metered it (from
        its start to now), their CPU per entry."""
        self.seconds = seconds
        self.entries = entries
        if cpu is not None:
            self.settings["cpu_us_per_entry"] = cpu.per_entry_us(entries)

    def record_completions(self, completions: list[int], measured_from_ns: int) -> None:
        """``completions`` holds an issue and a confirmation time
        (``time.perf_counter_ns()``) per entry, flat; of each entry issued at or after
        ``measured_from_ns``, the latency goes into the histogram, the confirmation into
        the timeline. Workloads keep the times while they run (two list appends per entry)
        and record them afterwards, so that the CPU measured per entry is the client's,
        not the pure-Python histogram's (a microsecond per entry). Flat integers, not a
        tuple per entry: a tuple is an object the garbage collector tracks, and 100,000
        of them living to the end of a run made it scan them over and over."""
        record_value = self.latency_us.record_value
        record_at = self.timeline.record_at
        times = iter(completions)
        for issued_ns, confirmed_ns in zip(times, times, strict=True):
            if issued_ns >= measured_from_ns:
                record_value(max(1, (confirmed_ns - issued_ns) // 1000))
                record_at(confirmed_ns / 1e9)

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
            "latency_distribution_ms": [
                [percentile, h.get_value_at_percentile(percentile) / 1000]
                for percentile in DISTRIBUTION_PERCENTILES
            ],
            "latency_histogram_us": log_buckets(h),
            "timeline": {
                "interval_s": self.timeline.interval_s,
                "entries_per_s": self.timeline.entries_per_s(),
            },
            **self.settings,
        }


async def _connect(metadata_uri: str):  # type: ignore[no-untyped-def]
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig

    return await BookKeeper.connect(metadata_uri, config=ClientConfig())


# Appends one payload and returns the future of its confirmation.
Append = Callable[[bytes], "asyncio.Future[Any]"]


async def _write(settings: BenchSettings, metadata_uri: str, report: ProgressCallback) -> Result:
    bk = await _connect(metadata_uri)
    try:
        handles = [
            await bk.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum)
            for _ in range(settings.ledgers)
        ]
        result = await _append_pipelined(
            "write", settings, [h.append for h in handles], bk.config.max_outstanding_adds, report
        )
        for handle in handles:
            await handle.close()
            await bk.delete_ledger(handle.ledger_id)
    finally:
        await bk.close()
    return result


async def _log_write(
    settings: BenchSettings, metadata_uri: str, report: ProgressCallback
) -> Result:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.client.config import ClientConfig
    from quorumlog.log.config import LogConfig
    from quorumlog.log.log import delete_log

    bk = await BookKeeper.connect(metadata_uri, config=ClientConfig())
    name = f"bench-{os.getpid()}-{time.time_ns()}"
    config = LogConfig(
        ensemble=settings.ensemble,
        write_quorum=settings.write_quorum,
        ack_quorum=settings.ack_quorum,
    )
    try:
        writers = [
            await (await LogNamespace(bk).open_log(f"{name}-{i}", config)).open_writer()
            for i in range(settings.ledgers)
        ]
        result = await _append_pipelined(
            "log-write",
            settings,
            [w.append_nowait for w in writers],
            bk.config.max_outstanding_adds,
            report,
        )
        for i, writer in enumerate(writers):
            await writer.close()
            await delete_log(bk, f"{name}-{i}")
    finally:
        await bk.close()
    return result


async def _write_sync(
    settings: BenchSettings, metadata_uri: str, report: ProgressCallback
) -> Result:
    # The synchronous client runs its own loop thread; this one only waits for it.
    return await asyncio.to_thread(_write_sync_thread, settings, metadata_uri, report)


def _write_sync_thread(
    settings: BenchSettings, metadata_uri: str, report: ProgressCallback
) -> Result:
    """Pipelined appends from this thread through ``add_entry_async`` of the
    synchronous client, at most ``max_outstanding`` unconfirmed (one ledger).

    The bound is the client's own (``max_outstanding_adds``): ``add_entry_async`` blocks
    while it is full, as a program adding in a loop sees it. A semaphore of the
    benchmark's own, released by each confirmation, would wake this thread once per
    entry (a thread switch each) and measure that instead of the client."""
    from quorumlog.client.config import ClientConfig
    from quorumlog.client.sync import BookKeeper

    result = Result(
        "write-sync", entry_size=settings.entry_size, settings=settings.summary_settings()
    )
    payload = os.urandom(settings.entry_size)
    total = settings.entries + settings.warmup
    # Issued and confirmed times of every add, flat; whether each succeeded is checked
    # once at the end.
    completions: list[int] = []
    keep = completions.append
    now_ns = time.perf_counter_ns

    window = max(1, min(settings.max_outstanding, ClientConfig().max_outstanding_adds))
    bk = BookKeeper(metadata_uri, config=ClientConfig(max_outstanding_adds=window))
    try:
        # Runs on the client's loop thread.
        def on_done(sent_ns: int, _: concurrent.futures.Future[int]) -> None:
            keep(sent_ns)
            keep(now_ns())

        # Adds complete in entry-id order: the last one's callback comes after all others.
        all_done = threading.Event()
        handle = bk.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum)
        started = time.perf_counter()
        started_ns = now_ns()
        cpu = CpuMeter()
        future = None
        deadline = _deadline(settings)
        for index in range(total):
            if deadline is not None and index % 100 == 0 and time.perf_counter() > deadline:
                total = index
                break
            if index == settings.warmup:
                started = time.perf_counter()
                started_ns = now_ns()
                result.timeline.start()
                cpu = CpuMeter()
            future = handle.add_entry_async(payload)
            future.add_done_callback(functools.partial(on_done, now_ns()))
            if index % 1000 == 0:
                report(index)
        if future is not None:
            future.add_done_callback(lambda _: all_done.set())
            all_done.wait()
        measured = max(0, total - settings.warmup)
        result.record_measured(
            completions[-1] / 1e9 - started if completions else 0.0, measured, cpu
        )
        # A confirmed entry means every earlier one is (R3): the last confirmed, all were.
        if handle.last_add_confirmed != total - 1:
            raise RuntimeError(
                f"ledger {handle.ledger_id}: {total} adds, confirmed up to "
                f"{handle.last_add_confirmed}: {future.exception() if future else ''}"
            )
        result.record_completions(completions, started_ns)
        handle.close()
        bk.delete_ledger(handle.ledger_id)
    finally:
        bk.close()
    return result


async def _write_batch(
    settings: BenchSettings, metadata_uri: str, report: ProgressCallback
) -> Result:
    return await asyncio.to_thread(_write_batch_thread, settings, metadata_uri, report)


def _write_batch_thread(
    settings: BenchSettings, metadata_uri: str, report: ProgressCallback
) -> Result:
    """Pipelined batches of ``BATCH_ENTRIES`` from this thread through the synchronous
    client's ``add_entries_async``, at most ``max_outstanding`` entries unconfirmed;
    each entry's latency is its batch's, issue to confirmation."""
    from quorumlog.client.sync import BookKeeper

    result = Result(
        "write-batch", entry_size=settings.entry_size, settings=settings.summary_settings()
    )
    batch = [os.urandom(settings.entry_size)] * BATCH_ENTRIES
    hist = result.latency_us
    record_completion = result.timeline.record
    batches = max(1, (settings.entries + BATCH_ENTRIES - 1) // BATCH_ENTRIES)
    warmup_batches = (settings.warmup + BATCH_ENTRIES - 1) // BATCH_ENTRIES
    last_done_s = [0.0]

    bk = BookKeeper(metadata_uri)
    try:
        handle = bk.create_ledger(settings.ensemble, settings.write_quorum, settings.ack_quorum)
        add_entries_async = getattr(handle, "add_entries_async", None)
        if add_entries_async is None:
            raise RuntimeError("this client has no add_entries_async: no batch form to measure")
        limit = min(settings.max_outstanding, bk.aio.config.max_outstanding_adds)
        window = max(1, limit // BATCH_ENTRIES)
        slots = threading.Semaphore(window)

        def on_done(sent_ns: int, measured: bool, future: concurrent.futures.Future[Any]) -> None:
            if measured and future.exception() is None:
                hist.record_value(max(1, (time.perf_counter_ns() - sent_ns) // 1000), BATCH_ENTRIES)
                record_completion(BATCH_ENTRIES)
            last_done_s[0] = time.perf_counter()
            slots.release()

        started = time.perf_counter()
        cpu = CpuMeter()
        deadline = _deadline(settings)
        for index in range(warmup_batches + batches):
            if deadline is not None and time.perf_counter() > deadline:
                batches = max(0, index - warmup_batches)
                break
            slots.acquire()
            if index == warmup_batches:
                started = time.perf_counter()
                result.timeline.start()
                cpu = CpuMeter()
            future = add_entries_async(batch)
            future.add_done_callback(
                functools.partial(on_done, time.perf_counter_ns(), index >= warmup_batches)
            )
            report(index * BATCH_ENTRIES)
        for _ in range(window):  # every slot back: every batch confirmed
            slots.acquire()
        result.record_measured(last_done_s[0] - started, batches * BATCH_ENTRIES, cpu)
        handle.close()
        bk.delete_ledger(handle.ledger_id)
    finally:
        bk.close()
    return result


async def _append_pipelined(
    workload: str,
    settings: BenchSettings,
    appenders: list[Append],
    max_outstanding_adds: int,
    report: ProgressCallback,
) -> Result:
    """``settings.entries`` (after the warm-up) through each appender at once, at most
    ``max_outstanding`` unconfirmed per appender."""
    result = Result(workload, entry_size=settings.entry_size, settings=settings.summary_settings())
    payload = os.urandom(settings.entry_size)
    loop = asyncio.get_running_loop()
    total = settings.entries + settings.warmup
    # append() refuses past the client's bound rather than queue (R16).
    per_ledger_limit = max(1, min(settings.max_outstanding, max_outstanding_adds))
    deadline = _deadline(settings)
    counters = {"sent": 0}
    measured_start = 0.0
    measured_start_ns = 0
    # Issued and confirmed times of every confirmed append, flat, recorded after the run.
    completions: list[int] = []
    keep = completions.append
    now_ns = time.perf_counter_ns

    def on_done(sent_ns: int, future: asyncio.Future[Any]) -> None:
        if not future.exception():
            keep(sent_ns)
            keep(now_ns())

    async def drive(append: Append) -> None:
        nonlocal measured_start, measured_start_ns
        in_flight: list[asyncio.Future[Any]] = []
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
                measured_start_ns = now_ns()
                result.timeline.start()
                meters.append(CpuMeter())
            future = append(payload)
            future.add_done_callback(functools.partial(on_done, now_ns()))
            in_flight.append(future)
            if index % 1000 == 0:
                report(len(completions) // 2)
                await asyncio.sleep(0)
        await asyncio.gather(*in_flight)

    # The first ledger to pass its warm-up starts the meter (several ledgers: the first).
    meters: list[CpuMeter] = []
    if settings.warmup == 0:
        measured_start = time.perf_counter()
        measured_start_ns = now_ns()
        result.timeline.start()
        meters.append(CpuMeter())
    await asyncio.gather(*(drive(a) for a in appenders))
    result.record_measured(
        time.perf_counter() - measured_start,
        max(0, counters["sent"] - settings.warmup),
        meters[0] if meters else None,
    )
    result.record_completions(completions, measured_start_ns)
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
        steps = [
            (first, min(settings.entries - 1, first + step - 1))
            for first in range(0, settings.entries, step)
        ]
        cpu = CpuMeter()
        started = time.perf_counter()
        result.timeline.start()
        count = 0
        # (issue time, read) of the steps in flight, oldest first.
        ahead: list[tuple[int, asyncio.Future[list[Entry]]]] = []
        next_step = 0
        while next_step < len(steps) or ahead:
            while next_step < len(steps) and len(ahead) < READ_STEPS_AHEAD:
                first, last = steps[next_step]
                read = asyncio.ensure_future(reader.read_entries(first, last))
                ahead.append((time.perf_counter_ns(), read))
                next_step += 1
            t0, read = ahead.pop(0)
            entries = await read
            per_entry_us = (time.perf_counter_ns() - t0) // 1000 // max(1, len(entries))
            result.latency_us.record_value(max(1, per_entry_us), len(entries))
            result.timeline.record(len(entries))
            if any(e.data != payload for e in entries):
                raise RuntimeError(f"ledger {writer.ledger_id}: read back different data")
            count += len(entries)
            report(count)
        result.record_measured(time.perf_counter() - started, count, cpu)
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
        # How many entries the writer sends: ``entries``, or fewer once ``duration_s``
        # is up (then the reader stops at the last one sent).
        issued = {"total": settings.entries}
        deadline = _deadline(settings)
        loop = asyncio.get_running_loop()

        async def write() -> None:
            next_send = loop.time()
            futures: list[asyncio.Future[int]] = []
            for i in range(settings.entries):
                next_send += 1.0 / rate
                delay = next_send - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                if deadline is not None and time.perf_counter() > deadline:
                    issued["total"] = i
                    break
                payload = i.to_bytes(8, "big") + bytes(max(0, settings.entry_size - 8))
                future = writer.append(payload)
                future.add_done_callback(
                    lambda f: confirmed_at.__setitem__(f.result(), time.perf_counter_ns())
                )
                futures.append(future)
            await asyncio.gather(*futures)

        async def tail() -> None:
            next_id = 0
            while next_id < issued["total"]:
                # A long poll of at most 1 s: past the last entry sent, it ends empty.
                lac, entry = await reader.read_last_add_confirmed_and_entry(next_id, 1000)
                now = time.perf_counter_ns()
                if entry is None:
                    continue
                delivered = [entry]
                if lac > next_id:
                    delivered += await reader.read_entries(next_id + 1, lac)
                    now = time.perf_counter_ns()
                for e in delivered:
                    sent = confirmed_at.get(e.entry_id)
                    if sent is not None and e.entry_id >= settings.warmup:
                        result.latency_us.record_value(max(1, (now - sent) // 1000))
                        result.timeline.record()
                next_id = delivered[-1].entry_id + 1
                report(next_id)

        cpu = CpuMeter()
        started = time.perf_counter()
        result.timeline.start()
        await asyncio.gather(write(), tail())
        # The writer's and the reader's CPU together: both run in this process.
        result.record_measured(time.perf_counter() - started, issued["total"], cpu)
        result.settings["latency_note"] = "writer confirmation to reader delivery"
        await writer.close()
        await bk.delete_ledger(writer.ledger_id)
    finally:
        await reader_bk.close()
        await bk.close()
    return result


def _deadline(settings: BenchSettings) -> float | None:
    """When a workload stops issuing (``time.perf_counter()``'s clock), or None."""
    return time.perf_counter() + settings.duration_s if settings.duration_s > 0 else None


_Workload = Callable[[BenchSettings, str, ProgressCallback], Awaitable[Result]]

_WORKLOADS: dict[str, _Workload] = {
    "write": _write,
    "write-sync": _write_sync,
    "write-batch": _write_batch,
    "log-write": _log_write,
    "read": _read,
    "tail": _tail,
}
WORKLOADS: tuple[str, ...] = tuple(_WORKLOADS)


async def run_workload(
    workload: str,
    settings: BenchSettings,
    metadata_uri: str,
    *,
    progress: ProgressCallback | None = None,
) -> Result:
    """Run ``workload`` (one of :data:`WORKLOADS`) on the cluster of ``metadata_uri``
    with clients of its own; its ledgers are deleted at the end. The collector's first
    threshold is ``settings.gc_threshold0`` while it runs (see :data:`GC_THRESHOLD0`)."""
    with _collector_threshold(settings.gc_threshold0):
        return await _WORKLOADS[workload](settings, metadata_uri, progress or _no_progress)


@contextlib.contextmanager
def _collector_threshold(threshold0: int) -> Iterator[None]:
    before = gc.get_threshold()
    if threshold0:
        gc.set_threshold(threshold0, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _no_progress(count: int) -> None:
    pass
