"""The figures of a ``bench/compare.py`` run, drawn from its JSON (matplotlib).

    python bench/plot_compare.py bench/results/compare-2026-11-24.json --out docs/figures

Writes, into ``--out`` (names prefixed with ``--prefix``, default ``compare-``):

- ``appends.png``: appends/s (log scale) and p50/p99 of every system, one at a time and
  pipelined, side by side;
- ``quorumlog.png``: each quorumlog row of the run (entries/s, p50 and p99), with the
  target where there is one (``bench/compare.py``'s);
- ``latency.png``: the latency distributions (CDF) of quorumlog's rows, and of every
  system one at a time and pipelined (from the listed percentiles where a stored run
  has no histogram);
- ``timeline.png``: entries/s over time of quorumlog's runs of median throughput;
- ``scaling.png``: the cost-growth runs, when the run had ``--scaling``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``quorumlog`` from a clone
sys.path.insert(1, str(Path(__file__).resolve().parent))  # ``compare``: the targets

from compare import (
    LARGE_MAX_P99_MS,
    ONE_AT_A_TIME_MAX_P50_MS,
    ONE_AT_A_TIME_MAX_P99_MS,
    PIPELINED_MIN_ENTRIES_PER_S,
    READ_MIN_ENTRIES_PER_S,
    SPARK_MIN_ROWS_PER_S,
    SYNC_FACADE_MIN_ENTRIES_PER_S,
    TAIL_MAX_P99_MS,
)

from quorumlog.bench.plot import cdf_points, pyplot, timeline_points

SYSTEM_NAMES = {
    "quorumlog": "quorumlog",
    "zookeeper": "ZooKeeper 3.8",
    "etcd": "etcd 3.4",
    "pysyncobj": "PySyncObj",
    "jetstream": "NATS JetStream 2.15",
}
MODES = ("one-at-a-time", "pipelined")

# (key in quorumlog_extra or a mode of the quorumlog peer, label, target entries/s), the
# targets being bench/compare.py's, so the figures judge by what the run's table does.
QUORUMLOG_FIGURES = (
    ("pipelined", "pipelined, asyncio", PIPELINED_MIN_ENTRIES_PER_S),
    ("one-at-a-time", "one at a time", None),
    ("write_sync", "pipelined, sync add_entry_async", SYNC_FACADE_MIN_ENTRIES_PER_S),
    ("write_batch", "pipelined, sync add_entries_async", None),
    ("log_write", "pipelined, log stream", None),
    ("write_64k", "64 KiB appends", None),
    ("read", "sequential read", READ_MIN_ENTRIES_PER_S),
    ("tail", "tail at 1,000/s", None),
)
# Latency targets by row key: (p50 ms or None, p99 ms).
LATENCY_TARGETS_MS = {
    "one-at-a-time": (ONE_AT_A_TIME_MAX_P50_MS, ONE_AT_A_TIME_MAX_P99_MS),
    "write_64k": (None, LARGE_MAX_P99_MS),
    "tail": (None, TAIL_MAX_P99_MS),
}


def quorumlog_summaries(report: dict[str, Any]) -> list[tuple[str, dict[str, Any], int | None]]:
    """(label, summary, target entries/s) of each quorumlog row the run has."""
    modes = report.get("systems", {}).get("quorumlog", {}).get("modes", {})
    extra = report.get("quorumlog_extra", {})
    found = []
    for key, label, target in QUORUMLOG_FIGURES:
        summary = modes.get(key) if key in MODES else extra.get(key)
        if summary:
            found.append((label, summary, target))
    return found


def subtitle(report: dict[str, Any]) -> str:
    disk = report.get("disk", {})
    sync = disk.get("fdatasync") or {}
    end = (disk.get("end") or {}).get("fdatasync") or {}
    commit = report.get("quorumlog_source", {}).get("commit", "")[:7]
    line = (
        f"{report.get('date', '')[:16]}, commit {commit}; disk: dd {disk.get('mb_per_s')} MB/s, "
        f"fdatasync p99 {sync.get('p99_ms')} ms"
    )
    if end:
        line += f" (start) / {end.get('p99_ms')} ms (end)"
    return line


def draw_appends(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    figure, (rate_axes, latency_axes) = plt.subplots(1, 2, figsize=(12, 4.2))
    systems = [name for name in SYSTEM_NAMES if name in report.get("systems", {})]
    width = 0.38
    for offset, mode in enumerate(MODES):
        rates, p50s, p99s = [], [], []
        for name in systems:
            summary = report["systems"][name].get("modes", {}).get(mode)
            rates.append(summary["entries_per_s"] if summary else 0)
            p50s.append(summary["latency_ms"]["p50"] if summary else 0)
            p99s.append(summary["latency_ms"]["p99"] if summary else 0)
        xs = [i + (offset - 0.5) * width for i in range(len(systems))]
        bars = rate_axes.bar(xs, rates, width, label=mode)
        rate_axes.bar_label(
            bars, labels=[f"{r:,.0f}" if r else "failed" for r in rates], fontsize=7
        )
        latency_axes.bar(xs, p99s, width, alpha=0.35, color=bars.patches[0].get_facecolor())
        latency_axes.bar(
            xs,
            p50s,
            width,
            label=f"{mode}: p50 (dark), p99 (light)",
            color=bars.patches[0].get_facecolor(),
        )
    for axes in (rate_axes, latency_axes):
        # A name on two lines ("NATS JetStream" / "2.15"): five fit under the bars.
        names = [SYSTEM_NAMES[s].rsplit(" ", 1) for s in systems]
        axes.set_xticks(range(len(systems)), ["\n".join(parts) for parts in names])
        axes.set_yscale("log")
        axes.legend(fontsize=8)
    rate_axes.set_ylabel("appends/s (100 B, 3 replicas)")
    latency_axes.set_ylabel("latency ms")
    figure.suptitle(
        "Durable replicated appends, one client on 127.0.0.1\n" + subtitle(report), fontsize=10
    )
    save(figure, path)


def draw_quorumlog(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = quorumlog_summaries(report)
    spark = report.get("quorumlog_extra", {}).get("spark")
    labels = [label for label, _, _ in rows]
    rates = [summary["entries_per_s"] for _, summary, _ in rows]
    targets = [target for _, _, target in rows]
    if spark:
        labels.append("Spark local[2] read, 1M")
        rates.append(spark["spark_rows_per_s"])
        targets.append(SPARK_MIN_ROWS_PER_S)
    figure, (rate_axes, latency_axes) = plt.subplots(1, 2, figsize=(12, 0.45 * len(labels) + 1.6))
    ys = list(range(len(labels)))[::-1]
    bars = rate_axes.barh(ys, rates)
    rate_axes.bar_label(bars, labels=[f"{r:,.0f}" for r in rates], fontsize=7)
    for y, target in zip(ys, targets, strict=True):
        if target:
            rate_axes.plot([target, target], [y - 0.4, y + 0.4], color="red", linewidth=2)
    rate_axes.set_yticks(ys, labels, fontsize=8)
    rate_axes.set_xscale("log")
    rate_axes.set_xlabel("entries/s (red: target)")
    lat_ys = ys[: len(rows)]
    latency_axes.barh(lat_ys, [s["latency_ms"]["p99"] for _, s, _ in rows], alpha=0.35, label="p99")
    latency_axes.barh(lat_ys, [s["latency_ms"]["p50"] for _, s, _ in rows], label="p50")
    keys = {label: key for key, label, _ in QUORUMLOG_FIGURES}
    for y, (label, _, _) in zip(lat_ys, rows, strict=True):
        p50_ms, p99_ms = LATENCY_TARGETS_MS.get(keys[label], (None, None))
        for limit, style in ((p50_ms, ":"), (p99_ms, "-")):
            if limit:
                latency_axes.plot(
                    [limit, limit], [y - 0.4, y + 0.4], color="red", linestyle=style, linewidth=2
                )
    latency_axes.set_yticks(lat_ys, [label for label, _, _ in rows], fontsize=8)
    latency_axes.set_xscale("log")
    latency_axes.set_xlabel("latency ms (read: a step's share; red: p99 target, dotted: p50)")
    latency_axes.legend(fontsize=8)
    figure.suptitle("quorumlog, medians of 3 runs\n" + subtitle(report), fontsize=10)
    save(figure, path)


def draw_latency(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    figure, (ours_axes, *mode_axes) = plt.subplots(1, 3, figsize=(15, 4.5))
    for label, summary, _ in quorumlog_summaries(report):
        xs, shares = cdf_points(summary)
        if xs:
            ours_axes.plot(xs, shares, label=label, linewidth=1.3)
    ours_axes.set_title("quorumlog's rows (run of median throughput)", fontsize=9)
    # Every system, each mode on its own panel: the same histogram code for all.
    for axes, mode in zip(mode_axes, MODES, strict=True):
        for name, data in report.get("systems", {}).items():
            summary = data.get("modes", {}).get(mode)
            if summary:
                xs, shares = cdf_points(summary)
                axes.plot(xs, shares, label=SYSTEM_NAMES.get(name, name), linewidth=1.3)
        axes.set_title(f"every system, {mode}", fontsize=9)
    for axes in (ours_axes, *mode_axes):
        axes.set_xscale("log")
        axes.xaxis.set_minor_formatter(plt.NullFormatter())
        axes.set_xlabel("latency ms")
        axes.set_ylabel("share at or below (CDF)")
        axes.grid(alpha=0.3)
        if axes.get_lines():
            axes.legend(fontsize=7)
    figure.suptitle("Latency distributions\n" + subtitle(report), fontsize=10)
    save(figure, path)


def draw_timeline(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for label, summary, _ in quorumlog_summaries(report):
        if label.startswith(("one at a time", "tail", "sequential")):
            continue  # steady by construction or too short to show a shape
        xs, rates = timeline_points(summary)
        if xs:
            axes.plot(xs, rates, label=label, linewidth=1)
    axes.set_xlabel("seconds since the measured start")
    axes.set_ylabel("entries/s per 0.1 s")
    axes.set_ylim(bottom=0)
    if axes.get_lines():
        axes.legend(fontsize=8)
    figure.suptitle("quorumlog throughput over time\n" + subtitle(report), fontsize=10)
    save(figure, path)


def draw_scaling(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    runs = [r for r in report.get("scaling", []) if "result" in r]
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run["varied"], []).append(run)
    figure, all_axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4))
    for axes, (varied, members) in zip(
        all_axes if len(groups) > 1 else [all_axes], groups.items(), strict=True
    ):
        labels = [
            m["setting"].replace(", ", "\n").replace(" outstanding", " in flight") for m in members
        ]
        rates = [m["result"]["entries_per_s"] for m in members]
        bars = axes.bar(range(len(members)), rates)
        axes.bar_label(bars, labels=[f"{r:,.0f}" for r in rates], fontsize=7)
        axes.set_xticks(range(len(members)), labels, fontsize=6, rotation=15)
        axes.set_title(varied)
        axes.set_ylabel("entries/s")
    figure.suptitle(
        "Cost growth (quorumlog bench write, medians of 3)\n" + subtitle(report), fontsize=10
    )
    save(figure, path)


def save(figure: Any, path: Path) -> None:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    pyplot().close(figure)
    print(path)


def draw_all(report: dict[str, Any], out: Path, prefix: str = "compare-") -> list[Path]:
    """Every figure the run has the figures for; the paths written."""
    paths = []
    steps = [
        ("appends", draw_appends),
        ("quorumlog", draw_quorumlog),
        ("latency", draw_latency),
        ("timeline", draw_timeline),
    ]
    if report.get("scaling"):
        steps.append(("scaling", draw_scaling))
    for name, draw in steps:
        path = out / f"{prefix}{name}.png"
        draw(report, path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("json", type=Path, help="a bench/compare.py run (bench/results/...)")
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    parser.add_argument("--prefix", default="compare-")
    args = parser.parse_args(argv)
    draw_all(json.loads(args.json.read_text()), args.out, args.prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
