"""Histogram buckets kept as plain integers, shared by the bookie's and the client's metrics.

A metrics library call per entry is too dear on the hot paths (tens of thousands of
entries per second), so both sides bump these counts and turn them into Prometheus
families only when scraped. No I/O and no metrics library here: the bookie's storage
code and the client both import it without depending on each other.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["LATENCY_BUCKETS_S", "Buckets"]

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
