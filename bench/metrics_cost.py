"""The cost of metrics on pipelined adds: the same write benchmark against bookies with
and without the metrics code, alternating in one run.

Three variants: "without", a copy of the source tree whose bookie has no metrics hooks
(made by the caller, see below); "hooks", this tree without ``--http-port`` (the
counting alone); "scraped", this tree with its bookies serving ``/metrics``, each
scraped every ``--scrape-interval-s`` during the run (the client keeps no metrics: off
by default). Each trial starts 3 fresh bookies (journal sync on), runs ``quorumlog bench
write --metadata`` (ensemble 3, write quorum 3, ack quorum 2, 100-byte entries, 1000
adds in flight) and records entries/s and the CPU time the bookie processes used per
entry (which other load on the machine disturbs far less than throughput); the order of
the variants rotates from round to round, so a machine that slows down over the run
weighs on all.

The tree without the hooks is made from this one by ``--make-base-tree DIR``: a copy
of the package whose bookie (journal/writer.py, reads.py, requests.py) has every counting
statement, and the clock reads that only they use, replaced by ``pass`` (the script
fails if it does not find each one), so that the two differ by the hooks alone:

    python bench/metrics_cost.py --make-base-tree /tmp/qbase
    python bench/metrics_cost.py --base-tree /tmp/qbase --rounds 5
    # the bookie alone, in process: CPU per entry without and with the hooks
    python bench/metrics_cost.py --base-tree /tmp/qbase --storage-batches 1,10,100 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def trial(
    tree: Path, with_metrics: bool, entries: int, scrape_interval_s: float
) -> dict[str, float]:
    """One trial, run in a child process whose PYTHONPATH is ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--trial",
        "--entries",
        str(entries),
        "--scrape-interval-s",
        str(scrape_interval_s),
    ]
    if with_metrics:
        args.append("--metrics")
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=False, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"trial failed ({tree}):\n{out.stdout}\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) a process has used: a figure that other load on
    the machine disturbs far less than throughput. Its own copy of
    ``quorumlog.bench.workloads.processes_cpu_s``: trials run on ``--base-tree``,
    an older tree that may not have it."""
    assert pid is not None
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_trial(entries: int, with_metrics: bool, scrape_interval_s: float) -> None:
    """In the child: a local cluster, the write benchmark, scrapes while it runs."""
    from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

    with tempfile.TemporaryDirectory(prefix="metrics-cost-") as tmp:
        uri = embedded_metadata_uri(tmp)
        extra = ["--http-port", "0"] if with_metrics else []
        with LocalCluster(uri, Path(tmp) / "bookies", 3, extra_args=extra) as cluster:
            ports = []
            for bookie in cluster.bookies:
                for line in bookie.stdout_text().splitlines():
                    if " admin http://" in line:
                        ports.append(int(line.rsplit(":", 1)[1]))
            stop = threading.Event()
            scrapes = [0]

            def scraper() -> None:
                while not stop.wait(scrape_interval_s):
                    for port in ports:
                        url = f"http://127.0.0.1:{port}/metrics"
                        with urllib.request.urlopen(url, timeout=10) as response:
                            response.read()
                        scrapes[0] += 1

            thread = threading.Thread(target=scraper, daemon=True)
            if ports:
                thread.start()
            command = [
                sys.executable,
                "-m",
                "quorumlog",
                "bench",
                "write",
                "--metadata",
                uri,
                "--entries",
                str(entries),
                "--json",
                "--quiet",
            ]
            cpu_before = sum(_cpu_s(b.pid) for b in cluster.bookies)
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            stop.set()
            cpu_s = sum(_cpu_s(b.pid) for b in cluster.bookies) - cpu_before
            if ports:
                thread.join()
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                json.dumps(
                    {
                        "entries_per_s": result["entries_per_s"],
                        "p50_ms": result["latency_ms"]["p50"],
                        "scrapes": scrapes[0],
                        "bookie_cpu_us_per_entry": 1e6 * cpu_s / entries,
                    }
                )
            )


VARIANTS = ("without", "hooks", "scraped")

# The metrics hooks of the bookie: (file, a statement's pattern, how many there are).
# Each matching line becomes ``pass`` in the tree made by --make-base-tree.
_HOOKS = (
    ("quorumlog/bookie/journal/writer.py", r"counters = self\.counters$", 1),
    (
        "quorumlog/bookie/journal/writer.py",
        r"counters\.journal_batch_\w+(\.observe\(.*\)| \+= .*)$",
        2,
    ),
    ("quorumlog/bookie/journal/writer.py", r"self\.counters\.add_latency\.observe\(.*\)$", 1),
    (
        "quorumlog/bookie/journal/writer.py",
        r"self\.counters\.journal_sync_latency\.observe\(.*\)$",
        1,
    ),
    ("quorumlog/bookie/journal/writer.py", r"started = self\._clock\(\)$", 1),
    ("quorumlog/bookie/reads.py", r"started = time\.perf_counter\(\)$", 1),
    ("quorumlog/bookie/reads.py", r"counters = self\.counters$", 1),
    ("quorumlog/bookie/reads.py", r"counters\.read_\w+(\.observe\(.*\)| \+= .*)$", 3),
    ("quorumlog/bookie/requests.py", r"counters = journal\.counters(  #.*)?$", 1),
    ("quorumlog/bookie/requests.py", r"counters\.add_\w+ \+= .*$", 2),
)


def make_base_tree(target: Path) -> None:
    """A copy of this tree (package and bench) without the bookie's metrics hooks."""
    if target.exists():
        raise SystemExit(f"{target} exists: give a new directory")
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(HERE / "quorumlog", target / "quorumlog", ignore=ignore)
    shutil.copytree(HERE / "bench", target / "bench", ignore=ignore)
    for name, pattern, expected in _HOOKS:
        path = target / name
        lines = path.read_text().splitlines(keepends=True)
        found = 0
        for i, line in enumerate(lines):
            if re.fullmatch(pattern, line.strip()):
                indent = line[: len(line) - len(line.lstrip())]
                lines[i] = f"{indent}pass  # metrics hook removed\n"
                found += 1
        if found != expected:
            raise SystemExit(f"{name}: {found} lines match {pattern!r}, expected {expected}")
        path.write_text("".join(lines))
        py_compile.compile(str(path), doraise=True)
    left = [
        f"{name}:{n}"
        for name in {h[0] for h in _HOOKS}
        for n, line in enumerate((target / name).read_text().splitlines(), 1)
        if re.search(r"\bcounters\.\w+(\.observe| \+=)", line)
    ]
    if left:
        raise SystemExit(f"hooks left in the base tree: {', '.join(left)}")
    print(f"{target}: this tree without the bookie's metrics hooks")


def storage_ab(base_tree: Path, rounds: int, entries: int, batches: list[int]) -> None:
    """The bookie alone (bench/bookie_storage_bench.py, in one process, journal sync off
    so that CPU is what limits it): CPU per entry without and with the hooks,
    alternating which runs first."""
    cpu: dict[tuple[int, str], list[float]] = {}
    for round_no in range(rounds):
        for batch in batches:
            order = [("without", base_tree), ("hooks", HERE)]
            if round_no % 2:
                order.reverse()
            for name, tree in order:
                out = subprocess.run(
                    [
                        sys.executable,
                        str(tree / "bench" / "bookie_storage_bench.py"),
                        "--entries",
                        str(entries),
                        "--batch",
                        str(batch),
                        "--in-flight",
                        "256",
                        "--no-sync",
                    ],
                    env=dict(os.environ, PYTHONPATH=str(tree)),
                    capture_output=True,
                    text=True,
                    check=True,
                )
                line = next(x for x in out.stdout.splitlines() if "CPU per entry" in x)
                us = float(line.split()[-2])
                cpu.setdefault((batch, name), []).append(us)
                print(f"round {round_no + 1} batch {batch:4d} {name:8s}: {us:.2f} us/entry")
    for batch in batches:
        a = statistics.median(cpu[(batch, "without")])
        b = statistics.median(cpu[(batch, "hooks")])
        print(
            f"median CPU per entry, {batch} entries per add request: without {a:.2f} us, "
            f"with hooks {b:.2f} us ({100 * (b - a) / a:+.1f}%)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--base-tree", type=Path, help="a source tree without metrics hooks")
    parser.add_argument(
        "--make-base-tree", type=Path, metavar="DIR", help="make that tree in DIR, then stop"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--scrape-interval-s", type=float, default=1.0)
    parser.add_argument(
        "--storage-batches",
        help="instead: the bookie alone, in process, these entries per add request (1,10,100)",
    )
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--metrics", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        run_trial(args.entries, args.metrics, args.scrape_interval_s)
        return
    if args.make_base_tree is not None:
        make_base_tree(args.make_base_tree.resolve())
        return
    if args.base_tree is None:
        parser.error("--base-tree is required")
    if args.storage_batches:
        batches = [int(b) for b in args.storage_batches.split(",")]
        storage_ab(args.base_tree.resolve(), args.rounds, args.entries, batches)
        return
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_no in range(args.rounds):
        # Rotate the order, so that no variant always runs first or last.
        k = round_no % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            tree = args.base_tree.resolve() if name == "without" else HERE
            started = time.monotonic()
            result = trial(tree, name == "scraped", args.entries, args.scrape_interval_s)
            rates[name].append(result["entries_per_s"])
            cpu[name].append(result["bookie_cpu_us_per_entry"])
            print(
                f"round {round_no + 1} {name:8s}: {result['entries_per_s']:9.0f} entries/s  "
                f"p50 {result['p50_ms']:5.1f} ms  bookie CPU "
                f"{result['bookie_cpu_us_per_entry']:.2f} us/entry  "
                f"scrapes {int(result['scrapes'])}  ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    base_rate, base_cpu = statistics.median(rates["without"]), statistics.median(cpu["without"])
    for name in VARIANTS:
        r, c = statistics.median(rates[name]), statistics.median(cpu[name])
        print(
            f"median {name:8s}: {r:9.0f} entries/s ({100 * (r - base_rate) / base_rate:+.1f}%), "
            f"bookie CPU {c:.2f} us/entry ({100 * (c - base_cpu) / base_cpu:+.1f}%)"
        )


if __name__ == "__main__":
    main()
