"""The client's Prometheus metrics: off unless a program asks for them.

``BookKeeper.enable_metrics()`` returns a :class:`ClientMetrics`; its
:attr:`~ClientMetrics.registry` is a ``CollectorRegistry`` the program exposes as it
likes (``prometheus_client.start_http_server(port, registry=...)``, or
``generate_latest(registry)`` in its own HTTP handler). Without that call the
client keeps no metrics: each hook is one ``is None`` test.

With it, the hot path pays per add *request* (a frame carrying a batch of entries
to one bookie), not per entry: plain integers and one bucket increment, turned
into Prometheus families only when the registry is scraped.

Example::

    bk = await BookKeeper.connect(uri)
    metrics = bk.enable_metrics()
    prometheus_client.start_http_server(9100, registry=metrics.registry)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from quorumlog.stats import LATENCY_BUCKETS_S, Buckets

__all__ = ["ClientMetrics"]

PREFIX = "quorumlog_client_"


class ClientMetrics(Collector):
    """Counters of one :class:`~quorumlog.client.bookkeeper.BookKeeper` (event loop only)."""

    def __init__(self) -> None:
        self.add_requests = 0
        self.add_request_entries = 0
        self.add_request_failures = 0
        self.add_latency = Buckets(LATENCY_BUCKETS_S)
        self.confirmed_entries = 0
        self.ensemble_changes = 0
        self.speculative_reads = 0
        self.recoveries = 0
        self.recoveries_completed = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def timed_add(self, callback: Callable[[Any], None], entries: int) -> Callable[[Any], None]:
        """``callback`` (an add request's answer handler) wrapped to time the request."""
        started = time.perf_counter()

        def answered(response: Any) -> None:
            self.add_latency.observe(time.perf_counter() - started)
            self.add_requests += 1
            self.add_request_entries += entries
            if getattr(response, "status", 1) != 0:
                self.add_request_failures += 1
            callback(response)

        return answered

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            PREFIX + "add_requests_total",
            "Add requests answered by bookies (each carries a batch of entries to one bookie).",
            value=self.add_requests,
        )
        yield CounterMetricFamily(
            PREFIX + "add_request_entries_total",
            "Entries carried by the add requests answered.",
            value=self.add_request_entries,
        )
        yield CounterMetricFamily(
            PREFIX + "add_request_failures_total",
            "Add requests answered with an error or not at all (timeout, lost connection).",
            value=self.add_request_failures,
        )
        buckets = self.add_latency
        yield HistogramMetricFamily(
            PREFIX + "add_latency_seconds",
            "Time from sending an add request to a bookie to its answer.",
            buckets=buckets.cumulative(),
            sum_value=buckets.sum,
        )
        yield CounterMetricFamily(
            PREFIX + "add_confirmed_entries_total",
            "Entries confirmed to the application (on an ack quorum, in order).",
            value=self.confirmed_entries,
        )
        yield CounterMetricFamily(
            PREFIX + "ensemble_changes_total",
            "Ledger fragments started by this client's writers after a bookie failed.",
            value=self.ensemble_changes,
        )
        yield CounterMetricFamily(
            PREFIX + "speculative_reads_total",
            "Reads sent to another replica because the first had not answered in time.",
            value=self.speculative_reads,
        )
        yield CounterMetricFamily(
            PREFIX + "recoveries_total",
            "Ledger recoveries (fence, read forward, close) started.",
            value=self.recoveries,
        )
        yield CounterMetricFamily(
            PREFIX + "recoveries_completed_total",
            "Ledger recoveries that closed the ledger.",
            value=self.recoveries_completed,
        )
