"""The Grafana dashboard's units match what its queries compute.

Each query's unit follows from the metrics it reads, whose types are taken from the
collectors themselves (bookie, client, autorecovery), and from what the query does
with them: a quantile or a mean of a histogram has the histogram's unit (``_seconds``:
seconds; batch sizes: a plain count), the rate of a counter is per second (bytes per
second for ``_bytes_total``), its increase a count, a ratio of rates a fraction, and a
gauge its own unit (``_bytes``, ``_ratio``, else a count). A panel may show series of
several units: each series' unit is the panel's default or its override by query
(Grafana's field overrides, ``byFrameRefID``), and every series must carry its own.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.registry import Collector

from quorumlog.bookie.metrics import BookieCounters
from quorumlog.client.metrics import ClientMetrics
from quorumlog.replication.auditor import AuditorStats
from quorumlog.replication.metrics import AutoRecoveryCollector
from quorumlog.replication.worker import WorkerStats
from quorumlog.server.metrics import BookieCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "quorumlog.json"
METRIC = re.compile(r"quorumlog_\w+")


def metric_types(tmp_path: Path) -> dict[str, str]:
    """Sample name -> the type of its family, as the collectors export them."""
    bookie = SimpleNamespace(
        journal=SimpleNamespace(counters=BookieCounters()),
        stats=lambda: defaultdict(int),
        storage=SimpleNamespace(read_cache=SimpleNamespace(hits=0, misses=0, size_bytes=0)),
        data_dir=str(tmp_path),
        journal_dir=str(tmp_path),
        read_only=False,
    )
    autorecovery = AutoRecoveryCollector(
        SimpleNamespace(
            is_auditor=False,
            worker=None,
            sessions_started=0,
            worker_stats=WorkerStats(),
            auditor_stats=AuditorStats(),
        )
    )
    autorecovery.under_replicated_ledgers = 0
    collectors: list[Collector] = [
        BookieCollector(SimpleNamespace(connection_count=0, bookie=bookie)),  # type: ignore[arg-type]
        ClientMetrics(),
        autorecovery,
    ]
    types: dict[str, str] = {}
    for collector in collectors:
        for family in collector.collect():
            for sample in family.samples:
                types[sample.name] = family.type
    return types


def base_unit(name: str) -> str:
    """A measurement's unit from its name (Prometheus's suffixes)."""
    name = re.sub(r"_(bucket|sum|count|total)$", "", name)
    if name.endswith("_seconds"):
        return "s"
    if name.endswith("_bytes"):
        return "bytes"
    if name.endswith("_ratio"):
        return "percentunit"
    return "short"  # a count: records, ledgers, bookies, connections


def expected_unit(expr: str, types: dict[str, str]) -> str:
    names = METRIC.findall(expr)
    assert names, expr
    kinds = {types[name] for name in names}
    assert len(kinds) == 1, f"{expr}: mixes metric types {kinds}"
    (kind,) = kinds
    if kind == "histogram":
        if "histogram_quantile" in expr:
            assert all(n.endswith("_bucket") for n in names), expr
        else:  # a mean: sum over count of one histogram
            assert {n.rsplit("_", 1)[1] for n in names} == {"sum", "count"}, expr
            assert len({n.rsplit("_", 1)[0] for n in names}) == 1, expr
        return base_unit(names[0])
    if kind == "counter":
        if "/" in expr:
            assert "rate(" in expr, expr
            return "percentunit"  # a ratio of rates
        if "increase(" in expr:
            return "short"
        assert "rate(" in expr, f"{expr}: a counter's raw value means nothing"
        return "Bps" if all(base_unit(n) == "bytes" for n in names) else "ops"
    assert kind == "gauge", (expr, kind)
    assert "rate(" not in expr and "increase(" not in expr, expr
    units = {base_unit(n) for n in names}
    assert len(units) == 1, expr
    return units.pop()


def series_unit(panel: dict[str, Any], ref_id: str) -> str | None:
    """The unit Grafana gives a query's series: its override, else the panel's default."""
    config = panel.get("fieldConfig", {})
    unit = config.get("defaults", {}).get("unit")
    for override in config.get("overrides", []):
        matcher = override.get("matcher", {})
        if matcher.get("id") == "byFrameRefID" and matcher.get("options") == ref_id:
            for prop in override.get("properties", []):
                if prop.get("id") == "unit":
                    unit = prop["value"]
    return unit


def test_every_series_of_the_dashboard_has_its_metrics_unit(tmp_path: Path) -> None:
    types = metric_types(tmp_path)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    checked = 0
    wrong = []
    for panel in panels:
        for target in panel["targets"]:
            want = expected_unit(target["expr"], types)
            got = series_unit(panel, target["refId"])
            checked += 1
            if got != want:
                wrong.append(f"{panel['title']!r} {target['legendFormat']!r}: {got} != {want}")
    assert checked >= 15
    assert wrong == []


def test_the_unit_rules_see_the_mistakes_they_are_for(tmp_path: Path) -> None:
    types = metric_types(tmp_path)
    mean_batch = (
        "sum(rate(quorumlog_bookie_journal_batch_records_sum[1m])) / "
        "sum(rate(quorumlog_bookie_journal_batch_records_count[1m]))"
    )
    assert expected_unit(mean_batch, types) == "short"  # records, not seconds
    assert expected_unit("sum(quorumlog_bookie_read_only)", types) == "short"  # not percent
    assert expected_unit("max(quorumlog_bookie_disk_usage_ratio)", types) == "percentunit"
    panel = {
        "fieldConfig": {
            "defaults": {"unit": "s"},
            "overrides": [
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [{"id": "unit", "value": "short"}],
                }
            ],
        }
    }
    assert series_unit(panel, "A") == "s" and series_unit(panel, "B") == "short"
