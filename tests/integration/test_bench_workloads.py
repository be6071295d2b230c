"""quorumlog bench's workloads against real bookie processes: each counts what it did, its
histogram and timeline agree with its count, and --plot draws a figure.

One cluster of three bookies on the embedded store for the module (the workloads do not
depend on the metadata driver; the client tests cover both), small runs: a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quorumlog.bench.workloads import BenchSettings, Result, run_workload
from quorumlog.client.sync import new_event_loop
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

ENTRIES = 2_000
WARMUP = 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("bench-cluster")
    with LocalCluster(embedded_metadata_uri(base), base / "bookies", 3).start() as started:
        yield started


def run(workload: str, uri: str, entries: int = ENTRIES, rate: float = 0.0) -> Result:
    settings = BenchSettings(entries=entries, warmup=WARMUP, max_outstanding=200, rate=rate)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(run_workload(workload, settings, uri), 60))
    finally:
        loop.close()


def assert_consistent(summary: dict[str, Any], measured: int) -> None:
    assert summary["entries"] == measured
    assert summary["entries_per_s"] > 0
    assert summary["latency_ms"]["samples"] == measured
    histogram_total = sum(count for _, count in summary["latency_histogram_us"])
    assert histogram_total == measured
    timeline = summary["timeline"]
    assert sum(timeline["entries_per_s"]) * timeline["interval_s"] == pytest.approx(measured)
    percentiles = [value for _, value in summary["latency_distribution_ms"]]
    assert percentiles == sorted(percentiles)
    # The client's CPU is measured (the bookies are not this process's children here).
    assert summary["cpu_us_per_entry"]["client"] > 0


@pytest.mark.parametrize("workload", ["write", "write-sync", "write-batch", "log-write"])
def test_pipelined_appends_measure_every_entry_after_the_warmup(
    cluster: LocalCluster, workload: str
) -> None:
    summary = run(workload, cluster.metadata_uri).summary()
    assert summary["workload"] == workload
    assert_consistent(summary, ENTRIES)


def test_read_reads_back_every_entry_it_wrote(cluster: LocalCluster) -> None:
    summary = run("read", cluster.metadata_uri).summary()
    # Latency is shared out per entry of each step; every entry is one sample.
    assert_consistent(summary, ENTRIES)


def test_tail_delivers_every_entry_at_the_rate(cluster: LocalCluster) -> None:
    summary = run("tail", cluster.metadata_uri, entries=1_000, rate=4_000.0).summary()
    assert summary["entries"] == 1_000
    assert summary["latency_ms"]["samples"] == 1_000 - WARMUP


def test_command_plot_draws_a_figure_and_json_carries_the_figures(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    figure = tmp_path / "read.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "quorumlog",
            "bench",
            "read",
            "--metadata",
            cluster.metadata_uri,
            "--entries",
            "1000",
            "--json",
            "--plot",
            str(figure),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["entries"] == 1000
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("workload", "rate"),
    [("tail", 500.0), ("write", 0.0), ("write-sync", 0.0), ("write-batch", 0.0)],
)
def test_duration_s_stops_a_workload_in_time(
    cluster: LocalCluster, workload: str, rate: float
) -> None:
    """--duration-s 10 once ran the tail workload for 102 s (its --entries at --rate)."""
    duration_s = 1.0
    settings = BenchSettings(
        entries=10_000_000, warmup=WARMUP, max_outstanding=200, rate=rate, duration_s=duration_s
    )
    loop = new_event_loop()
    started = time.monotonic()
    try:
        result = loop.run_until_complete(
            asyncio.wait_for(run_workload(workload, settings, cluster.metadata_uri), 60)
        )
    finally:
        loop.close()
    elapsed_s = time.monotonic() - started
    # The bound leaves room for setting up, draining what is in flight and a loaded
    # machine; the entries were enough for minutes.
    assert elapsed_s < duration_s + 5, elapsed_s
    summary = result.summary()
    assert 0 < summary["entries"] < settings.entries
    if workload == "tail":
        assert summary["latency_ms"]["samples"] == summary["entries"] - WARMUP


def test_command_refuses_duration_s_for_read(cluster: LocalCluster) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "quorumlog", "bench", "read", "--duration-s", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--duration-s" in proc.stderr and len(proc.stderr.splitlines()) == 1
