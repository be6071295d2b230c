"""A bookie's Prometheus metrics, computed when ``/metrics`` is scraped.

The request paths only bump plain integers (:mod:`quorumlog.bookie.metrics`); this
collector reads them, and the state the bookie keeps anyway (read cache, parked
long polls, connections, read-only mode, the sizes of its files, disk usage), once
per scrape. So a bookie that is never scraped pays a few integer additions per
request and per journal batch, and nothing else.

Names follow Prometheus's conventions: ``quorumlog_bookie_`` prefix, the unit in
the name (``_seconds``, ``_bytes``), ``_total`` on counters.

Example::

    registry = bookie_registry(server)
    print(prometheus_client.generate_latest(registry).decode())
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from quorumlog.bookie.disk_checker import disk_usage
from quorumlog.stats import Buckets

if TYPE_CHECKING:
    from quorumlog.bookie.bookie import Bookie
    from quorumlog.bookie.metrics import BookieCounters
    from quorumlog.bookie.read_cache import ReadCache

__all__ = ["BookieCollector", "ScrapedServer", "bookie_registry", "directory_bytes"]


class ScrapedServer(Protocol):
    """What a scrape reads of a bookie server (:class:`quorumlog.server.server.BookieServer`)."""

    @property
    def connection_count(self) -> int: ...

    @property
    def bookie(self) -> Bookie | None: ...


PREFIX = "quorumlog_bookie_"


def directory_bytes(directory: Path, suffix: str = "") -> int:
    """Bytes held by the files of ``directory`` (not recursive) ending in ``suffix``.

    A file removed while it is being listed (a checkpoint deleting an entry log)
    counts as zero: the next scrape sees the directory as it is then."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if not entry.name.endswith(suffix):
                    continue
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return 0
    return total


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=buckets.cumulative(), sum_value=buckets.sum)


class BookieCollector(Collector):
    """Reads one bookie server's bookie at every scrape."""

    def __init__(self, server: ScrapedServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        yield GaugeMetricFamily(
            PREFIX + "connections",
            "Client and peer connections the bookie holds now.",
            value=server.connection_count,
        )
        bookie = server.bookie
        if bookie is None:
            return
        yield from _journal_counter_metrics(bookie.journal.counters)
        yield from _bookie_state_metrics(bookie.stats())
        yield from _read_cache_metrics(bookie.storage.read_cache)
        data_dir = Path(bookie.data_dir)
        yield from _file_size_metrics(data_dir, Path(bookie.journal_dir))
        yield GaugeMetricFamily(
            PREFIX + "read_only",
            "1 while the bookie refuses adds (disk full, a failed journal or storage, or "
            "set by an operator), else 0.",
            value=1.0 if bookie.read_only else 0.0,
        )
        yield from _disk_usage_metrics(data_dir)


def _journal_counter_metrics(c: BookieCounters) -> Iterator[Metric]:
    """What the journal's request paths counted: adds, reads and journal batches."""
    yield CounterMetricFamily(
        PREFIX + "add_requests_total",
        "Add requests accepted into the journal (each may carry several entries).",
        value=c.add_requests,
    )
    yield CounterMetricFamily(
        PREFIX + "add_entries_total",
        "Entries accepted into the journal by add requests.",
        value=c.add_entries,
    )
    yield _histogram(
        PREFIX + "add_latency_seconds",
        "Time from an add request queued in the journal to its answer (durable). "
        "Measured once per journal batch, from the batch's oldest request, and "
        "counted for each request of the batch.",
        c.add_latency,
    )
    yield CounterMetricFamily(
        PREFIX + "read_requests_total",
        "Read requests answered from ledger storage (long polls excluded).",
        value=c.read_requests,
    )
    yield CounterMetricFamily(
        PREFIX + "read_entries_total",
        "Entries returned by read requests.",
        value=c.read_entries,
    )
    yield _histogram(
        PREFIX + "read_latency_seconds",
        "Time to look up and read the entries of one read request.",
        c.read_latency,
    )
    yield _histogram(
        PREFIX + "journal_sync_latency_seconds",
        "Duration of one journal fdatasync.",
        c.journal_sync_latency,
    )
    yield _histogram(
        PREFIX + "journal_batch_records",
        "Records written and synced together by one journal batch (group commit).",
        c.journal_batch_records,
    )
    yield CounterMetricFamily(
        PREFIX + "journal_written_bytes_total",
        "Bytes of records written to the journal.",
        value=c.journal_batch_bytes,
    )


def _bookie_state_metrics(stats: dict[str, int]) -> Iterator[Metric]:
    """The journal's syncs and queue, checkpoints, ledgers and parked long polls."""
    yield CounterMetricFamily(
        PREFIX + "journal_syncs_total",
        "Journal fdatasync calls.",
        value=stats["journal_syncs"],
    )
    yield GaugeMetricFamily(
        PREFIX + "journal_queued_bytes",
        "Bytes queued for the journal and not yet durable.",
        value=stats["journal_queued_bytes"],
    )
    yield CounterMetricFamily(
        PREFIX + "checkpoints_total",
        "Checkpoints of ledger storage completed since the bookie started.",
        value=stats["checkpoints"],
    )
    yield GaugeMetricFamily(
        PREFIX + "ledgers",
        "Ledgers the bookie holds data or state for.",
        value=stats["ledgers"],
    )
    yield GaugeMetricFamily(
        PREFIX + "parked_long_polls",
        "Long-poll reads parked, waiting for a ledger's LAC to move.",
        value=stats["parked_polls"],
    )


def _read_cache_metrics(cache: ReadCache) -> Iterator[Metric]:
    yield CounterMetricFamily(
        PREFIX + "read_cache_hits_total",
        "Entry lookups answered by the read cache.",
        value=cache.hits,
    )
    yield CounterMetricFamily(
        PREFIX + "read_cache_misses_total",
        "Entry lookups the read cache did not hold.",
        value=cache.misses,
    )
    yield GaugeMetricFamily(
        PREFIX + "read_cache_size_bytes",
        "Bytes of entries held by the read cache.",
        value=cache.size_bytes,
    )


def _file_size_metrics(data_dir: Path, journal_dir: Path) -> Iterator[Metric]:
    """Bytes on disk of the entry logs, the index and the journal."""
    yield GaugeMetricFamily(
        PREFIX + "entry_log_size_bytes",
        "Bytes of the entry-log files on disk.",
        value=directory_bytes(data_dir / "entrylogs", ".log"),
    )
    yield GaugeMetricFamily(
        PREFIX + "index_size_bytes",
        "Bytes of the entry index's files on disk.",
        value=directory_bytes(data_dir / "index"),
    )
    yield GaugeMetricFamily(
        PREFIX + "journal_size_bytes",
        "Bytes of the journal files on disk.",
        value=directory_bytes(journal_dir),
    )


def _disk_usage_metrics(data_dir: Path) -> Iterator[Metric]:
    """The data directory's filesystem; nothing when it cannot be read."""
    try:
        usage = disk_usage(data_dir)
    except OSError:
        return
    yield GaugeMetricFamily(
        PREFIX + "disk_total_bytes",
        "Size of the filesystem holding the data directory.",
        value=usage.total_bytes,
    )
    yield GaugeMetricFamily(
        PREFIX + "disk_free_bytes",
        "Free bytes on the filesystem holding the data directory.",
        value=usage.free_bytes,
    )
    yield GaugeMetricFamily(
        PREFIX + "disk_usage_ratio",
        "Fraction (0..1) of the data directory's filesystem in use.",
        value=usage.used_fraction,
    )


def bookie_registry(server: ScrapedServer) -> CollectorRegistry:
    """A registry of its own for one bookie server (never the process-wide default:
    tests run several bookies in one process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BookieCollector(server))
    return registry
