"""Reading a log with Spark next to the project's own client, in one run.

Writes a log of ``--entries`` records of ``--entry-size`` bytes (default 1,000,000 of
100 bytes, several ledgers) on a local cluster of three bookies (or on the cluster
at ``--metadata``), then reads all of it

1. with the single-process client (``Log``: ledger by ledger, pipelined batch reads),
2. with Spark ``local[2]`` through the ``quorumlog`` data source (a job that
   touches every row's data: ``sum(length(data))``, so nothing is pruned),
3. and copies it with Spark into a new log through the exactly-once sink,

checks both saw every record, and prints rows per second for each::

    python bench/spark_read.py                 # starts and stops its own cluster
    python bench/spark_read.py --entries 200000 --json

The Spark figure is the median of ``--jobs`` timed jobs after ``--warmup-jobs`` untimed
ones (default 1; the first also starts the executors' Python workers). The JVM compiles
the read's code over the first jobs (its CPU per row fell from about 1.5 to 0.65 µs
over eight jobs of one session), so ``bench/compare.py`` warms up with 3 jobs to time
the steady state of a long-lived session; every warm-up job's time is reported too, as
is the session start. ``--no-copy`` leaves out the copy through the sink.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from quorumlog.aio import LogNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``quorumlog`` from a clone

import quorumlog.aio as aio
from quorumlog.server.local_cluster import LocalCluster

LOG_NAME = "bench-spark"


async def write_log(uri: str, entries: int, entry_size: int, ledger_entries: int) -> list[int]:
    payload = os.urandom(entry_size)
    async with await aio.BookKeeper.connect(uri) as bk:
        log = await LogNamespace(bk).open_log(LOG_NAME)
        writer = await log.open_writer()
        futures = []
        for index in range(entries):
            if index and index % ledger_entries == 0:
                await asyncio.gather(*futures)
                futures.clear()
                await writer.rollover()
            if len(futures) >= 2_000:
                await futures[-2_000]
            futures.append(writer.append_nowait(payload))
        await asyncio.gather(*futures)
        await writer.close()
        return await log.ledgers()


async def client_read(uri: str, expected: int) -> tuple[int, int, float]:
    """Every record through one client; (records, bytes, seconds)."""
    async with await aio.BookKeeper.connect(uri) as bk:
        log = await LogNamespace(bk).open_log(LOG_NAME)
        metadata, _ = await log.metadata()
        started = time.perf_counter()
        count = size = 0
        step = 8_192
        for ledger_id in metadata.ledgers:
            handle = await bk.open_ledger_no_recovery(ledger_id)
            last = handle.metadata.last_entry_id
            # The executors' way: chunks of 8,192 entries, three in flight.
            lows = list(range(0, last + 1, step))
            pending: list[asyncio.Future[list]] = []
            while lows or pending:
                while lows and len(pending) < 3:
                    low = lows.pop(0)
                    read = handle.read_entries(low, min(last, low + step - 1))
                    pending.append(asyncio.ensure_future(read))
                for entry in await pending.pop(0):
                    count += 1
                    size += len(entry.data)
            await handle.close()
        seconds = time.perf_counter() - started
    if count != expected:
        raise RuntimeError(f"client read {count} records, expected {expected}")
    return count, size, seconds


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, str, float] | None:
    """(parent pid, command name, CPU seconds of the process and its reaped children)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the name.
    ticks = sum(int(x) for x in fields[11:15])
    return int(fields[1]), name, ticks / CLOCK_TICKS_PER_S


def cpu_by_role(bookie_pids: set[int]) -> dict[str, float]:
    """CPU seconds so far of this process's tree, by role: the bookies, the JVM (driver
    and executor threads of local mode), the Python workers it started, this driver."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None:
                stats[int(entry.name)] = found
    roles = {"bookies": 0.0, "jvm": 0.0, "python_workers": 0.0, "driver": 0.0}
    me = os.getpid()
    for pid, (_, name, cpu_s) in stats.items():
        chain, cursor = [], pid
        while cursor in stats and cursor not in (me, 1) and len(chain) < 32:
            chain.append(cursor)
            cursor = stats[cursor][0]
        if pid == me:
            roles["driver"] += cpu_s
        elif cursor != me:
            continue  # not ours
        elif pid in bookie_pids:
            roles["bookies"] += cpu_s
        elif name == "java":
            roles["jvm"] += cpu_s
        elif any(stats[c][1] == "java" for c in chain[1:]):
            roles["python_workers"] += cpu_s
    return roles


def spark_read(
    uri: str,
    expected: int,
    master: str,
    jobs: int = 3,
    copy: bool = True,
    bookie_pids: set[int] | None = None,
    warmup_jobs: int = 1,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from quorumlog.spark.session import local_session

    started = time.perf_counter()
    spark = local_session(master, "quorumlog-bench")
    session_s = time.perf_counter() - started
    try:
        times = []
        cpu_us_per_row: list[dict[str, float]] = []
        for _ in range(warmup_jobs + jobs):
            cpu0 = cpu_by_role(bookie_pids or set())
            t0 = time.perf_counter()
            df = spark.read.format("quorumlog").option("metadata", uri).option("log", LOG_NAME)
            row = df.load().agg(F.count("*").alias("n"), F.sum(F.length("data")).alias("b"))
            result = row.collect()[0]
            times.append(time.perf_counter() - t0)
            cpu1 = cpu_by_role(bookie_pids or set())
            cpu_us_per_row.append(
                {role: round((cpu1[role] - cpu0[role]) / expected * 1e6, 2) for role in cpu1}
            )
            if result["n"] != expected:
                raise RuntimeError(f"Spark read {result['n']} records, expected {expected}")
        partitions = df.load().rdd.getNumPartitions()
        write_s = None
        if copy:
            # The sink: the same rows' data into a new log, exactly once (a ledger per task).
            t0 = time.perf_counter()
            df.load().select("data").write.format("quorumlog").option("metadata", uri).option(
                "log", f"{LOG_NAME}-copy"
            ).mode("append").save()
            write_s = time.perf_counter() - t0
    finally:
        spark.stop()
    return {
        "session_start_s": session_s,
        "first_job_s": times[0],
        "warmup_job_s": times[:warmup_jobs],
        "job_s": times[warmup_jobs:],
        "seconds": statistics.median(times[warmup_jobs:]),
        "partitions": partitions,
        "copy_s": write_s,
        # CPU per row of each timed job by role: what the cores spent on the read.
        "cpu_us_per_row": cpu_us_per_row[warmup_jobs:],
        "warmup_cpu_us_per_row": cpu_us_per_row[:warmup_jobs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--entry-size", type=int, default=100)
    parser.add_argument("--ledger-entries", type=int, default=250_000, help="records per ledger")
    parser.add_argument("--metadata", help="use this cluster instead of starting one")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--jobs", type=int, default=3, help="timed jobs after the warm-up")
    parser.add_argument(
        "--warmup-jobs", type=int, default=1, help="untimed jobs first (the JVM compiles)"
    )
    parser.add_argument("--no-copy", action="store_true", help="leave out the sink's copy")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if min(args.entries, args.ledger_entries, args.jobs, args.warmup_jobs) < 1 or (
        args.entry_size < 0
    ):
        parser.error(
            "--entries, --ledger-entries, --jobs, --warmup-jobs must be >= 1, --entry-size >= 0"
        )

    with tempfile.TemporaryDirectory(prefix="quorumlog-spark-bench-") as scratch:
        cluster = None
        uri = args.metadata
        if uri is None:
            uri = f"sqlite://{scratch}/metadata.db"
            cluster = LocalCluster(uri, Path(scratch) / "cluster", 3).start()
        try:
            print(f"writing {args.entries:,} records of {args.entry_size} B ...", file=sys.stderr)
            t0 = time.perf_counter()
            ledgers = asyncio.run(
                write_log(uri, args.entries, args.entry_size, args.ledger_entries)
            )
            write_s = time.perf_counter() - t0
            print(f"  {len(ledgers)} ledgers in {write_s:.1f} s", file=sys.stderr)
            print("reading with the client ...", file=sys.stderr)
            count, _, client_s = asyncio.run(client_read(uri, args.entries))
            print(f"reading with Spark {args.master} ...", file=sys.stderr)
            bookie_pids = set() if cluster is None else {b.pid for b in cluster.bookies if b.pid}
            spark = spark_read(
                uri,
                args.entries,
                args.master,
                args.jobs,
                not args.no_copy,
                bookie_pids,
                args.warmup_jobs,
            )
        finally:
            if cluster is not None:
                cluster.stop_all()
    result = {
        "entries": args.entries,
        "entry_size": args.entry_size,
        "ledgers": len(ledgers),
        "write_s": round(write_s, 2),
        "client_read_s": round(client_s, 2),
        "client_rows_per_s": round(count / client_s),
        "spark_master": args.master,
        "spark_partitions": spark["partitions"],
        "spark_session_start_s": round(spark["session_start_s"], 2),
        "spark_first_job_s": round(spark["first_job_s"], 2),
        "spark_warmup_job_rows_per_s": [round(args.entries / s) for s in spark["warmup_job_s"]],
        "spark_warmup_cpu_us_per_row": spark["warmup_cpu_us_per_row"],
        "spark_read_s": round(spark["seconds"], 2),
        "spark_rows_per_s": round(args.entries / spark["seconds"]),
        "spark_job_rows_per_s": [round(args.entries / s) for s in spark["job_s"]],
        "spark_cpu_us_per_row": spark["cpu_us_per_row"],
        "spark_copy_s": None if spark["copy_s"] is None else round(spark["copy_s"], 2),
        "spark_copy_rows_per_s": (
            None if spark["copy_s"] is None else round(args.entries / spark["copy_s"])
        ),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{args.entries:,} records of {args.entry_size} B in {len(ledgers)} ledgers\n"
            f"  client (one process):       {result['client_rows_per_s']:>10,} rows/s "
            f"({client_s:.2f} s)\n"
            f"  Spark {args.master:<10} ({spark['partitions']} partitions): "
            f"{result['spark_rows_per_s']:>10,} rows/s ({spark['seconds']:.2f} s; first job "
            f"{spark['first_job_s']:.2f} s, session start {spark['session_start_s']:.1f} s; "
            f"median of {args.jobs} jobs after {args.warmup_jobs} untimed)"
        )
        for job, roles in enumerate(spark["cpu_us_per_row"], args.warmup_jobs):
            print(
                f"  job {job + 1} CPU per row: "
                + ", ".join(f"{role} {us:.2f} µs" for role, us in roles.items())
            )
        if spark["copy_s"] is not None:
            print(
                f"  Spark read + sink into a new log: {result['spark_copy_rows_per_s']:>10,} "
                f"rows/s ({spark['copy_s']:.2f} s, exactly once)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
