"""An autorecovery process's Prometheus metrics, read from its daemon at each scrape.

The worker and the auditor count with plain integers (:class:`WorkerStats`,
:class:`AuditorStats`, kept by the daemon across its metadata sessions); this collector
turns them into families when ``/metrics`` is scraped. The number of under-replicated
ledgers is the metadata store's, not this process's: :meth:`AutoRecoveryMetrics.refresh`
reads it before each scrape (the admin API awaits it), as the collector itself may not
wait for the store.

Names follow Prometheus's conventions: ``quorumlog_autorecovery_`` prefix, the unit in
the name, ``_total`` on counters.

Example::

    metrics = AutoRecoveryMetrics(daemon)
    await metrics.refresh()
    print(prometheus_client.generate_latest(metrics.registry).decode())
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from quorumlog.errors import BKError
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.replication.autorecovery import AutoRecovery

__all__ = ["PREFIX", "AutoRecoveryCollector", "AutoRecoveryMetrics"]

log = logging.getLogger(__name__)

PREFIX = "quorumlog_autorecovery_"

# A scrape must answer even when the store hangs: the gauge is then left out.
_STORE_READ_TIMEOUT_S = 5.0


class AutoRecoveryCollector(Collector):
    """Reads one :class:`AutoRecovery` daemon at every scrape."""

    def __init__(self, daemon: AutoRecovery) -> None:
        self._daemon = daemon
        # Marked ledgers in the store at the last refresh; None when it could not be read.
        self.under_replicated_ledgers: int | None = None

    def collect(self) -> Iterator[Metric]:
        daemon = self._daemon
        if self.under_replicated_ledgers is not None:
            yield GaugeMetricFamily(
                PREFIX + "under_replicated_ledgers",
                "Ledgers marked under-replicated in the metadata store (cluster-wide).",
                value=self.under_replicated_ledgers,
            )
        yield GaugeMetricFamily(
            PREFIX + "is_auditor",
            "1 while this process is the elected auditor, else 0.",
            value=1.0 if daemon.is_auditor else 0.0,
        )
        worker = daemon.worker
        yield GaugeMetricFamily(
            PREFIX + "ledgers_in_repair",
            "Ledgers this process's worker has claimed and is repairing now.",
            value=len(worker.current) if worker is not None else 0,
        )
        yield CounterMetricFamily(
            PREFIX + "sessions_total",
            "Metadata sessions the daemon started (one more after each lost session).",
            value=daemon.sessions_started,
        )
        w = daemon.worker_stats
        for name, doc, value in (
            ("ledgers_repaired_total", "Marked ledgers repaired and unmarked.", w.ledgers_repaired),
            (
                "ledgers_deferred_total",
                "Repairs that left an open ledger's last fragment to its writer for now.",
                w.ledgers_deferred,
            ),
            (
                "ledger_repair_failures_total",
                "Repairs that failed (no replacement bookie, a failed copy, no bookie "
                "giving the ledger's key); the ledger is tried again after the backoff.",
                w.ledgers_failed,
            ),
            (
                "ledgers_lost_total",
                "Ledgers found with entries of which no copy is left on any bookie: "
                "recorded lost once, never retried.",
                w.ledgers_lost,
            ),
            (
                "copied_fragments_total",
                "Fragments whose lost copies were written to a replacement bookie.",
                w.fragments_copied,
            ),
            ("copied_entries_total", "Entries copied to replacement bookies.", w.entries_copied),
            (
                "copied_bytes_total",
                "Bytes of entries copied to replacement bookies.",
                w.bytes_copied,
            ),
            (
                "copy_throttled_seconds_total",
                "Time copies waited for the copy rate's bound (--replication-rate-bytes-per-s).",
                w.throttled_s,
            ),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        a = daemon.auditor_stats
        for name, doc, value in (
            (
                "audit_runs_total",
                "Periodic or requested audits of the closed ledgers completed.",
                a.audits,
            ),
            (
                "bookie_checks_total",
                "Passes of the auditor over which bookies are available and which are lost.",
                a.bookie_checks,
            ),
            (
                "ledgers_marked_total",
                "Ledgers this process's auditor marked under-replicated.",
                a.ledgers_marked,
            ),
            (
                "lost_bookies_marked_total",
                "Distinct bookies whose ledgers this process's auditor marked as lost.",
                len(a.lost_marked),
            ),
            (
                "placement_violations_total",
                "Closed ledgers an audit found with write sets that break the placement "
                "policy (--placement), counted at each audit.",
                a.placement_violations,
            ),
        ):
            yield CounterMetricFamily(PREFIX + name, doc, value=value)


class AutoRecoveryMetrics:
    """The daemon's registry (its own, never the process-wide default) and the
    store read it needs before each scrape."""

    def __init__(self, daemon: AutoRecovery) -> None:
        self._daemon = daemon
        self.collector = AutoRecoveryCollector(daemon)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    async def refresh(self) -> None:
        """Read the number of marked ledgers; on failure the gauge is left out."""
        bk = self._daemon.bk
        count: int | None = None
        if bk is not None:
            try:
                marked = await asyncio.wait_for(
                    UnderReplicationManager(bk.store).marked_ledgers(), _STORE_READ_TIMEOUT_S
                )
                count = len(marked)
            except (TimeoutError, BKError, OSError) as exc:
                log.warning("autorecovery metrics: under-replicated ledgers unread: %s", exc)
        self.collector.under_replicated_ledgers = count
