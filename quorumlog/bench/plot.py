"""Figures of benchmark summaries: the latency distribution and throughput over time.

Drawn with matplotlib (the ``plot`` extra: ``pip install 'quorumlog[plot]'``) from the
summary ``quorumlog bench --json`` prints, so a stored run can be drawn again later::

    quorumlog bench write --entries 100000 --plot /tmp/write.png
    python bench/plot_compare.py bench/results/compare-2026-11-24.json --out docs/figures

Each figure has two panels: a histogram of latencies on a logarithmic axis with the
cumulative share (CDF) over it, and entries per second in each interval of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quorumlog.bench.workloads import HISTOGRAM_BUCKETS_PER_DECADE

PLOT_EXTRA_HINT = "matplotlib is missing: pip install 'quorumlog[plot]' (or matplotlib)"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise RuntimeError(PLOT_EXTRA_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def histogram_points(summary: dict[str, Any]) -> tuple[list[float], list[int]]:
    """(bucket upper bounds in ms, counts) of a summary's ``latency_histogram_us``."""
    buckets = summary.get("latency_histogram_us") or []
    return [bound / 1000 for bound, _ in buckets], [int(count) for _, count in buckets]


def cdf_points(summary: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(latency ms, share of samples at or below it) from the histogram, or from the
    listed percentiles when a summary has no histogram (or p50/p99/p99.9/max)."""
    bounds_ms, counts = histogram_points(summary)
    total = sum(counts)
    if total:
        shares, running = [], 0
        for count in counts:
            running += count
            shares.append(running / total)
        return bounds_ms, shares
    pairs = summary.get("latency_distribution_ms") or []
    if not pairs:  # an older summary: the four figures it has
        lat = summary.get("latency_ms") or {}
        named = (("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9), ("max", 100.0))
        pairs = [[percentile, lat[key]] for key, percentile in named if key in lat]
    return [value for _, value in pairs], [percentile / 100 for percentile, _ in pairs]


def timeline_points(summary: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(seconds since the measured start, entries/s in the interval ending there)."""
    timeline = summary.get("timeline") or {}
    interval_s = float(timeline.get("interval_s") or 0.0)
    rates = timeline.get("entries_per_s") or []
    return [interval_s * (i + 1) for i in range(len(rates))], list(rates)


def draw_latency(axes: Any, summary: dict[str, Any], label: str | None = None) -> None:
    """Latency histogram (bars, left axis) and CDF (line, right axis) of one summary."""
    bounds_ms, counts = histogram_points(summary)
    if counts:
        # Each bar spans its logarithmic bucket: from the previous bound to its own.
        ratio = 10 ** (1 / HISTOGRAM_BUCKETS_PER_DECADE)
        lefts = [bound / ratio for bound in bounds_ms]
        widths = [bound - left for bound, left in zip(bounds_ms, lefts, strict=True)]
        axes.bar(lefts, counts, width=widths, align="edge", alpha=0.5, label=label)
    axes.set_xscale("log")
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("entries")
    xs, shares = cdf_points(summary)
    cdf_axes = axes.twinx()
    cdf_axes.plot(xs, shares, color="black", linewidth=1.2)
    cdf_axes.set_ylim(0, 1.01)
    cdf_axes.set_ylabel("share at or below (CDF)")
    lat = summary.get("latency_ms", {})
    for key, style in (("p50", ":"), ("p99", "--")):
        if lat.get(key):
            axes.axvline(lat[key], color="grey", linestyle=style, linewidth=1)
            axes.text(
                lat[key],
                0.98,
                f" {key} {lat[key]:.3g}",
                transform=axes.get_xaxis_transform(),
                va="top",
                fontsize=8,
            )


def draw_timeline(axes: Any, summary: dict[str, Any], label: str | None = None) -> None:
    xs, rates = timeline_points(summary)
    axes.plot(xs, rates, linewidth=1, label=label)
    axes.set_xlabel("seconds since the measured start")
    axes.set_ylabel("entries/s")
    axes.set_ylim(bottom=0)


def plot_summary(summary: dict[str, Any], path: Path, title: str | None = None) -> Path:
    """One run's figure (latency distribution and throughput over time) into ``path``
    (PNG, SVG or PDF by its suffix)."""
    plt = pyplot()
    figure, (latency_axes, time_axes) = plt.subplots(1, 2, figsize=(11, 4))
    draw_latency(latency_axes, summary)
    draw_timeline(time_axes, summary)
    rate = summary.get("entries_per_s", 0.0)
    lat = summary.get("latency_ms", {})
    figure.suptitle(
        title
        or (
            f"quorumlog bench {summary.get('workload', '')}: {rate:,.0f} entries/s, "
            f"p50 {lat.get('p50', 0):.3f} ms, p99 {lat.get('p99', 0):.3f} ms "
            f"({summary.get('entry_size', '?')} B, quorum {summary.get('quorum', '?')})"
        )
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
