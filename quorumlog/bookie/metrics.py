"""Plain counters and bucketed latencies that a bookie keeps for its metrics.

The hot paths (adds at tens of thousands of entries per second) cannot afford a
metrics library call per entry: a bookie only bumps integers here, at most once per
request or per journal batch, and the server turns them into Prometheus families
when ``/metrics`` is scraped (:mod:`quorumlog.server.metrics`). Nothing here imports
a metrics library, so the bookie's storage code has no such dependency; the client's
metrics (:mod:`quorumlog.client.metrics`) use the same :class:`Buckets`.

Each :class:`Buckets` has one writer (the event loop, or the journal's thread); the
scrape reads it on the loop. A scrape that runs while the journal thread updates
may see one batch in the count and not yet in the sum: metrics are samples, and the
next scrape is consistent again.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "LATENCY_BUCKETS_S",
    "BookieCounters",
    "Buckets",
]

# Seconds: from a cached read (tens of microseconds) to a slow fsync (seconds).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)

# Records per journal batch (group commit): 1 when idle, thousands under load.
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class Buckets:
    """A histogram's bucket counts, not yet cumulative: ``counts[i]`` holds the
    observations at or below ``bounds[i]`` and above the previous bound; the last slot
    is above every bound (+Inf). One ``bisect`` and two additions per observation."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, weight: int = 1) -> None:
        """``weight`` observations of ``value`` at the cost of one: a batch's latency
        stands for each of its requests."""
        self.counts[bisect_left(self.bounds, value)] += weight
        self.count += weight
        self.sum += value * weight

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs, the last one ``+Inf``, as Prometheus wants."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            total += n
            out.append((_le(bound), float(total)))
        out.append(("+Inf", float(total + self.counts[-1])))
        return out


def _le(bound: float) -> str:
    return repr(float(bound))


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
