"""quorumlog through its own benchmark, ``quorumlog bench``, one process per run.

Every run starts its own local cluster (``--bookies``, journal sync on) in a temporary
directory and removes it, so repeated runs are independent. Figures that are reported
as one number are medians over ``repeat`` runs, each metric on its own; the raw runs
are kept next to them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from typing import Any

from peers.common import (
    BENCH_DIR,
    REPO_ROOT,
    client_env,
    ensure_binary,
    ensure_modules,
    last_json_line,
    log,
)

# The comparison's common workload: 3 bookies, ensemble 3, write quorum 3, ack quorum 2.
QUORUM_ARGS = ("--bookies", "3", "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2")


# What the Spark read needs beyond quorumlog: the project's spark extra.
SPARK_PACKAGES = (
    ("pyspark", "pyspark>=4.2,<5"),
    ("pyarrow", "pyarrow>=15,<30"),
    ("numpy", "numpy>=1.24,<3"),
)


def ensure_quorumlog() -> None:
    """quorumlog and its dependencies importable by the benchmark's processes; from a
    fresh clone, ``pip install -e`` of the clone (its declared dependencies) once."""
    check = [
        sys.executable,
        "-c",
        "import quorumlog.bench.workloads, quorumlog.server.local_cluster",
    ]
    env = client_env()
    if subprocess.run(check, env=env, capture_output=True, check=False).returncode == 0:
        return
    log(f"installing quorumlog's dependencies (pip install -e {REPO_ROOT})")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "-e", str(REPO_ROOT)],
        check=True,
        timeout=900,
    )
    subprocess.run(check, env=env, check=True, capture_output=True)


def spark_read(
    entries: int, jobs: int, warmup_jobs: int = 3, timeout_s: float = 900.0
) -> dict[str, Any]:
    """``bench/spark_read.py`` on its own cluster: ``entries`` read by Spark ``local[2]``,
    the median of ``jobs`` timed jobs after ``warmup_jobs`` untimed ones (and one client
    read beside it)."""
    ensure_modules(SPARK_PACKAGES)
    ensure_binary("java", "default-jre-headless")
    command = [
        sys.executable,
        str(BENCH_DIR / "spark_read.py"),
        "--entries",
        str(entries),
        "--jobs",
        str(jobs),
        "--warmup-jobs",
        str(warmup_jobs),
        "--no-copy",
        "--json",
    ]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=client_env(), check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"spark_read.py failed ({proc.returncode}): {proc.stderr[-800:]}")
    # Its JSON is indented: the object is everything from the first brace.
    result: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{") :])
    result["command"] = " ".join(["python", "bench/spark_read.py", *command[2:]])
    log(
        f"Spark local[2]: {result['spark_rows_per_s']:,} rows/s (jobs: "
        f"{', '.join(f'{r:,}' for r in result['spark_job_rows_per_s'])})"
    )
    return result


def bench(workload: str, args: list[str], timeout_s: float = 300.0) -> dict[str, Any]:
    """One ``quorumlog bench WORKLOAD ARGS --json --quiet`` run; its JSON summary."""
    command = [sys.executable, "-m", "quorumlog", "bench", workload, *args, "--json", "--quiet"]
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout_s, env=client_env(), check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"quorumlog bench {workload} {' '.join(args)} failed ({proc.returncode}): "
            f"{proc.stderr[-800:]}"
        )
    result = last_json_line(proc.stdout)
    result["command"] = " ".join(["quorumlog", "bench", workload, *args, "--json"])
    return result


def median_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each throughput and latency figure over ``runs`` (raw runs kept);
    the latency distribution and timeline are those of the run of median throughput."""
    first = runs[0]
    by_rate = sorted(runs, key=lambda r: r["entries_per_s"])
    middle = by_rate[(len(by_rate) - 1) // 2]
    merged = {k: v for k, v in middle.items() if k not in ("latency_ms",)}
    for key in ("entries_per_s", "mb_per_s", "seconds"):
        if key in first:
            merged[key] = round(statistics.median(r[key] for r in runs), 3)
    merged["latency_ms"] = {
        key: statistics.median(r["latency_ms"][key] for r in runs) for key in first["latency_ms"]
    }
    merged["repeat"] = len(runs)
    if "command" in first:
        merged["command"] = first["command"]
    merged["runs"] = [
        {"entries_per_s": r["entries_per_s"], "latency_ms": r["latency_ms"]} for r in runs
    ]
    merged["distribution_of_run"] = runs.index(middle) + 1
    return merged


def bench_median(workload: str, args: list[str], repeat: int, label: str) -> dict[str, Any]:
    runs = []
    for i in range(repeat):
        runs.append(bench(workload, args))
        log(f"quorumlog {label} run {i + 1}/{repeat}: {runs[-1]['entries_per_s']:,.0f} entries/s")
    return median_summary(runs)


def write_args(
    entries: int,
    warmup: int,
    max_outstanding: int,
    entry_size: int = 100,
    extra: tuple[str, ...] = QUORUM_ARGS,
) -> list[str]:
    return [
        *extra,
        "--entry-size",
        str(entry_size),
        "--entries",
        str(entries),
        "--warmup",
        str(warmup),
        "--max-outstanding",
        str(max_outstanding),
    ]


def measure(
    modes: dict[str, dict[str, Any]], repeat: int
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each mode (``{mode: {entries, warmup, window}}``) ``repeat`` times; medians."""
    ensure_quorumlog()
    results = {}
    for mode, spec in modes.items():
        args = write_args(spec["entries"], spec["warmup"], spec["window"])
        results[mode] = bench_median("write", args, repeat, mode)
    setup = {
        "version": _version(),
        "bookies": 3,
        "config": "ensemble 3, write quorum 3, ack quorum 2; journal fdatasynced before "
        "a bookie acknowledges (group commit)",
        "client": "quorumlog bench write (asyncio client, one connection per bookie)",
    }
    return results, setup


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("quorumlog")
    except importlib.metadata.PackageNotFoundError:
        return "source tree"
