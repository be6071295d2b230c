"""Plain counters and bucketed latencies that a bookie keeps for its metrics.

The hot paths (adds at tens of thousands of entries per second) cannot afford a
metrics library call per entry: a bookie only bumps integers here, at most once per
request or per journal batch, and the server turns them into Prometheus families
when ``/metrics`` is scraped (:mod:`quorumlog.server.metrics`). Nothing here imports
a metrics library, so the bookie's storage code has no such dependency; the histogram
buckets (:class:`quorumlog.stats.Buckets`) are shared with the client's metrics.

Each :class:`Buckets` has one writer (the event loop, or the journal's thread); the
scrape reads it on the loop. A scrape that runs while the journal thread updates
may see one batch in the count and not yet in the sum: metrics are samples, and the
next scrape is consistent again.
"""

from __future__ import annotations

from quorumlog.stats import LATENCY_BUCKETS_S, Buckets

__all__ = ["BATCH_SIZE_BUCKETS", "BookieCounters"]

# Records per journal batch (group commit): 1 when idle, thousands under load.
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class BookieCounters:
    """What a bookie counts on its hot paths; read at scrape time."""

    __slots__ = (
        "add_entries",
        "add_latency",
        "add_requests",
        "journal_batch_bytes",
        "journal_batch_records",
        "journal_sync_latency",
        "read_entries",
        "read_latency",
        "read_requests",
    )

    def __init__(self) -> None:
        # Loop side.
        self.add_requests = 0
        self.add_entries = 0
        self.read_requests = 0
        self.read_entries = 0
        self.read_latency = Buckets(LATENCY_BUCKETS_S)
        # Observed once per journal batch, weighted by the adds it answers.
        self.add_latency = Buckets(LATENCY_BUCKETS_S)
        # Journal thread side.
        self.journal_sync_latency = Buckets(LATENCY_BUCKETS_S)
        self.journal_batch_records = Buckets(BATCH_SIZE_BUCKETS)
        self.journal_batch_bytes = 0
