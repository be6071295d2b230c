"""``quorumlog bench``: write, read and tail workloads, after BookKeeper's benchmark tools.

    quorumlog bench write [--bookies 3 | --metadata URI] [--ensemble 3 --write-quorum 3
                          --ack-quorum 2] [--entry-size 100] [--entries N] [--duration-s S]
                          [--ledgers 1] [--max-outstanding 1000] [--rate 0] [--json]
    quorumlog bench write-sync [...]                 the same through add_entry_async
    quorumlog bench write-batch [...]                batches of 100 through add_entries_async
    quorumlog bench log-write  [...]                 appends through a log stream's writer
    quorumlog bench read  [...] [--entries N]       sequential reads of a closed ledger
    quorumlog bench tail  [...] [--rate 1000]       confirmation-to-delivery latency
    quorumlog bench ... --plot FILE                 latency distribution, throughput over time

Latencies go into an HDR histogram (microsecond resolution); the summary gives
throughput (entries/s, MB/s) and p50, p99, p99.9 and max. Without ``--metadata`` the
benchmark starts its own local cluster of ``--bookies`` bookie processes in a temporary
directory and removes it afterwards. The workloads, and where
they run, are :mod:`quorumlog.bench`; this module parses the options and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from quorumlog.bench.runner import bench_cluster, run_workload_blocking
from quorumlog.bench.workloads import BenchSettings
from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from quorumlog.errors import BKError


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    bench = subparsers.add_parser("bench", help="measure throughput and latency")
    workloads = bench.add_subparsers(dest="workload", metavar="WORKLOAD", required=True)
    for name, text in (
        ("write", "appends: throughput and add latency"),
        ("write-sync", "appends from a thread through the synchronous add_entry_async"),
        ("write-batch", "batches of 100 appends through the synchronous add_entries_async"),
        ("log-write", "appends through a log stream's writer (append_nowait)"),
        ("read", "sequential reads of a closed ledger"),
        ("tail", "a writer at a fixed rate and a tailing reader: confirmation-to-delivery"),
    ):
        p = workloads.add_parser(name, help=text)
        p.add_argument("--metadata", help="an existing cluster's metadata URI")
        p.add_argument("--bookies", type=int, default=3, help="local bookies to start")
        p.add_argument("--no-journal-sync", action="store_true", help="local bookies only")
        p.add_argument(
            "--bookie-option",
            action="append",
            default=[],
            metavar="OPTION",
            help="pass OPTION to each local bookie, e.g. "
            "--bookie-option=--no-entry-log-direct-io (repeatable)",
        )
        p.add_argument("--ensemble", type=int, default=3)
        p.add_argument("--write-quorum", type=int, default=3)
        p.add_argument("--ack-quorum", type=int, default=2)
        p.add_argument("--entry-size", type=int, default=100)
        p.add_argument("--entries", type=int, default=100_000)
        p.add_argument(
            "--duration-s",
            type=float,
            default=0.0,
            help="stop issuing after this many seconds, if --entries are not done first "
            "(every workload but read)",
        )
        p.add_argument("--ledgers", type=int, default=1, help="write: ledgers written at once")
        p.add_argument("--max-outstanding", type=int, default=1000, help="adds in flight")
        p.add_argument("--rate", type=float, default=0.0, help="entries/s, 0 = unlimited")
        p.add_argument("--warmup", type=int, default=1000, help="entries not measured")
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--quiet", action="store_true", help="no progress line")
        p.add_argument(
            "--plot",
            metavar="FILE",
            help="draw the latency distribution and throughput over time (PNG/SVG/PDF; "
            "needs matplotlib: the plot extra)",
        )
    from quorumlog.commands.db import add_bench_parser

    add_bench_parser(workloads, "db")  # its own options and function
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.entries < 1 or args.entry_size < 0 or args.max_outstanding < 1 or args.ledgers < 1:
        print(
            "quorumlog bench: --entries, --max-outstanding, --ledgers must be >= 1", file=sys.stderr
        )
        return EXIT_USAGE
    if args.workload == "read" and args.duration_s:
        print(
            "quorumlog bench read: --duration-s does not apply (read writes --entries "
            "entries, then reads them all back)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    settings = _settings(args)
    if args.plot:
        from quorumlog.bench.plot import pyplot

        try:
            pyplot()  # before the run: a missing matplotlib should not cost one
        except RuntimeError as exc:
            print(f"quorumlog bench: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        with bench_cluster(
            args.metadata,
            args.bookies,
            journal_sync=not args.no_journal_sync,
            bookie_options=args.bookie_option,
        ) as (metadata_uri, started):
            if started and not args.quiet and not args.json:
                print(f"started {args.bookies} local bookies: {', '.join(started)}")
            # Started once the cluster is up: its first rate covers only the workload.
            progress = _Progress(not (args.quiet or args.json), args.workload)
            result = run_workload_blocking(
                args.workload, settings, metadata_uri, progress=progress.update
            )
    except (BKError, OSError, RuntimeError) as exc:
        print(f"quorumlog bench {args.workload}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    progress.done()
    summary = result.summary()
    if args.plot:
        from quorumlog.bench.plot import plot_summary

        plot_summary(summary, Path(args.plot))
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
        if args.plot:
            print(f"figure: {args.plot}")
    return EXIT_OK


def _settings(args: argparse.Namespace) -> BenchSettings:
    return BenchSettings(
        ensemble=args.ensemble,
        write_quorum=args.write_quorum,
        ack_quorum=args.ack_quorum,
        entry_size=args.entry_size,
        entries=args.entries,
        duration_s=args.duration_s,
        ledgers=args.ledgers,
        max_outstanding=args.max_outstanding,
        rate=args.rate,
        warmup=args.warmup,
        # Known only for the bookies this command starts.
        journal_sync=None if args.metadata else not args.no_journal_sync,
    )


class _Progress:
    """A progress line on stderr, rewritten at most once a second."""

    def __init__(self, enabled: bool, what: str) -> None:
        self.enabled = enabled
        self.what = what
        self.started = time.perf_counter()
        self.last_print = self.started
        self.last_count = 0

    def update(self, count: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last_print >= 1.0:
            rate = (count - self.last_count) / (now - self.last_print)
            print(
                f"\r{self.what}: {count:,} entries, {rate:,.0f} entries/s now",
                end="",
                file=sys.stderr,
                flush=True,
            )
            self.last_print, self.last_count = now, count

    def done(self) -> None:
        if self.enabled:
            print(file=sys.stderr)


def _print_summary(s: dict[str, Any]) -> None:
    lat = s["latency_ms"]
    print(
        f"{s['workload']}: {s['entries']:,} entries in {s['seconds']:.2f} s = "
        f"{s['entries_per_s']:,.0f} entries/s, {s['mb_per_s']:.2f} MB/s "
        f"(quorum {s['quorum']}, {s['entry_size']} B entries, "
        f"{s['max_outstanding']} outstanding, {s['ledgers']} ledger(s))"
    )
    print(
        f"latency ms: p50 {lat['p50']:.3f}  p99 {lat['p99']:.3f}  p99.9 {lat['p99.9']:.3f}  "
        f"max {lat['max']:.3f}  mean {lat['mean']:.3f}  ({lat['samples']:,} samples)"
    )
