"""The figures of benchmark runs: the histogram a summary carries, its CDF and timeline,
and bench/plot_compare.py drawing every figure of a compare run's JSON."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped]

from quorumlog.bench.plot import cdf_points, plot_summary, timeline_points
from quorumlog.bench.workloads import Result, Timeline, log_buckets

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_log_buckets_keep_every_sample_in_its_factor_of_ten() -> None:
    hist = HdrHistogram(1, 60_000_000, 3)
    for value_us, count in ((5, 10), (120, 30), (121, 5), (9_000, 1)):
        hist.record_value(value_us, count)
    buckets = log_buckets(hist, per_decade=1)
    assert buckets == [[10.0, 10], [1000.0, 35], [10000.0, 1]]
    assert sum(count for _, count in log_buckets(hist)) == 46


def test_cdf_from_the_histogram_ends_at_one_and_timeline_counts_per_interval() -> None:
    summary = {
        "latency_histogram_us": [[100.0, 1], [1000.0, 3]],
        "timeline": {"interval_s": 0.5, "entries_per_s": [10.0, 20.0]},
    }
    assert cdf_points(summary) == ([0.1, 1.0], [0.25, 1.0])
    assert timeline_points(summary) == ([0.5, 1.0], [10.0, 20.0])
    # A stored summary without a histogram: the listed percentiles.
    assert cdf_points({"latency_distribution_ms": [[50, 1.5], [100, 3.0]]}) == (
        [1.5, 3.0],
        [0.5, 1.0],
    )
    timeline = Timeline(interval_s=3600.0)
    timeline.record(4)
    timeline.record()
    assert timeline.counts == [5]


def test_plot_summary_draws_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = Result("write", entries=3, seconds=1.0, entry_size=100)
    for value_us in (300, 900, 2_000):
        result.latency_us.record_value(value_us)
        result.timeline.record()
    path = plot_summary(result.summary(), tmp_path / "run.png")
    assert path.read_bytes()[:8] == PNG_MAGIC


def summary(rate: float) -> dict[str, Any]:
    return {
        "entries_per_s": rate,
        "mb_per_s": rate / 1e4,
        "latency_ms": {"p50": 1.0, "p99": 3.0, "p99.9": 4.0},
        "latency_histogram_us": [[1000.0, 5], [3000.0, 1]],
        "timeline": {"interval_s": 0.1, "entries_per_s": [rate, rate]},
    }


def test_plot_compare_draws_every_figure_of_a_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(BENCH_DIR))
    spec = importlib.util.spec_from_file_location(
        "bench_plot_compare", BENCH_DIR / "plot_compare.py"
    )
    assert spec is not None and spec.loader is not None
    plot_compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_compare)
    report = {
        "date": "2026-11-24T00:10:00+00:00",
        "quorumlog_source": {"commit": "0123456789"},
        "disk": {
            "mb_per_s": 280.0,
            "fdatasync": {"p99_ms": 0.3},
            "end": {"fdatasync": {"p99_ms": 0.4}},
        },
        "systems": {
            "quorumlog": {
                "modes": {"one-at-a-time": summary(1_500.0), "pipelined": summary(70_000.0)}
            },
            "etcd": {"error": "RuntimeError('x')"},
        },
        "quorumlog_extra": {
            "read": summary(300_000.0),
            "spark": {"spark_rows_per_s": 250_000},
        },
        "scaling": [
            {"varied": "bookies", "setting": "3 bookies, 3/3/2", "result": summary(60_000.0)},
            {"varied": "ledgers", "setting": "4 ledgers", "result": summary(65_000.0)},
        ],
    }
    paths = plot_compare.draw_all(report, tmp_path)
    assert [p.name for p in paths] == [
        "compare-appends.png",
        "compare-quorumlog.png",
        "compare-latency.png",
        "compare-timeline.png",
        "compare-scaling.png",
    ]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)
