"""Draw the Grafana dashboard's panels (docs/grafana/quorumlog.json) from a real scrape.

Starts 4 local bookies and an autorecovery daemon serving ``/metrics`` (``--http-port
0``, 2 s metadata sessions), writes closed ledgers, puts load on the bookies with a
client whose metrics are on (two writers on 3/3/2 ledgers at a fixed rate, a reader
of recent entries, a tailing long poll), kills one bookie of the first writer's
ensemble two thirds of the way through (an ensemble change, and autorecovery
re-replicating what it held), recovers a ledger left open, and scrapes every bookie,
the daemon and the client's registry every second.
The panels are then computed as the dashboard's PromQL computes them (rates over a
window, ``histogram_quantile`` over bucket rates) and drawn with matplotlib.

    python bench/metrics_dashboard.py                     # 60 s of load -> docs/metrics.png
    python bench/metrics_dashboard.py --duration-s 30 --out /tmp/m.png
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

Samples = dict[tuple[str, str], float]  # (sample name, le or "") -> value
Series = list[tuple[float, str, Samples]]  # (time, instance, samples)


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("le", ""))] = sample.value
    return out


def scrape_loop(ports: dict[str, int], series: Series, stop: threading.Event, t0: float) -> None:
    while not stop.wait(1.0):
        for instance, port in ports.items():
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/metrics", timeout=5
                ) as response:
                    text = response.read().decode()
            except OSError:
                continue  # a killed bookie: no more samples, as in Prometheus
            series.append((time.monotonic() - t0, instance, parse(text)))


async def load(
    uri: str,
    cluster: LocalCluster,
    duration_s: float,
    rate: int,
    series: Series,
    t0: float,
    closed_ledgers: int,
) -> None:
    bk = await BookKeeper.connect(uri)
    metrics = bk.enable_metrics()
    stop = asyncio.Event()

    async def client_scrapes() -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            text = generate_latest(metrics.registry).decode()
            series.append((time.monotonic() - t0, "client", parse(text)))

    # Closed ledgers for autorecovery to copy once a bookie is killed.
    for _ in range(closed_ledgers):
        closed = await bk.create_ledger(3, 3, 2, password=b"pw")
        entry = b"c" * 1000
        for _batch in range(8):  # 4,000 entries of 1 kB
            await asyncio.gather(*(closed.append(entry) for _ in range(500)))
        await closed.close()
    handles = [await bk.create_ledger(3, 3, 2, password=b"pw") for _ in range(2)]

    async def writer(handle: object, per_s: int) -> None:
        from quorumlog.client.writing import LedgerHandle

        assert isinstance(handle, LedgerHandle)
        payload = b"x" * 100
        pending: list[asyncio.Future[int]] = []
        tick = 0.05
        while not stop.is_set():
            for _ in range(max(1, int(per_s * tick))):
                await handle.wait_for_capacity()
                pending.append(handle.append(payload))
            await asyncio.sleep(tick)
            pending = [f for f in pending if not f.done()]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def reader() -> None:
        handle = handles[1]
        while not stop.is_set():
            lac = handle.last_add_confirmed
            if lac > 100:
                reading = await bk.open_ledger_no_recovery(handle.ledger_id, password=b"pw")
                reading.learn_last_add_confirmed(lac)
                for first in range(max(0, lac - 400), lac - 50, 50):
                    await reading.read_entries(first, first + 49)
            await asyncio.sleep(0.2)

    async def tailer() -> None:
        # Long polls park on a ledger whose LAC does not move for a while.
        quiet = await bk.create_ledger(3, 3, 2, password=b"pw")
        await quiet.add_entry(b"first")
        tail = await bk.open_ledger_no_recovery(quiet.ledger_id, password=b"pw")
        while not stop.is_set():
            try:
                await asyncio.wait_for(tail.read_last_add_confirmed_and_entry(1, 2_000), 3)
            except Exception:
                await asyncio.sleep(0.5)
        await quiet.close()

    async def faults() -> None:
        await asyncio.sleep(duration_s * 2 / 3)
        victim = handles[0].ensemble[0]
        cluster.kill(cluster.addresses.index(victim))
        await asyncio.sleep(duration_s / 8)
        # A ledger left open by a "crashed" writer, recovered by this client.
        orphan = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            await orphan.add_entry(b"orphan %d" % i)
        await bk.open_ledger(orphan.ledger_id, password=b"pw")

    tasks = [
        asyncio.create_task(client_scrapes()),
        asyncio.create_task(writer(handles[0], rate // 2)),
        asyncio.create_task(writer(handles[1], rate // 2)),
        asyncio.create_task(reader()),
        asyncio.create_task(tailer()),
        asyncio.create_task(faults()),
    ]
    await asyncio.sleep(duration_s)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for handle in handles:
        await handle.close()
    await bk.close()


# ------------------------------------------------------------ PromQL, by hand


def _by_instance(series: Series, client: bool) -> dict[str, list[tuple[float, Samples]]]:
    out: dict[str, list[tuple[float, Samples]]] = defaultdict(list)
    for t, instance, samples in series:
        if (instance == "client") == client:
            out[instance].append((t, samples))
    return out


def rate(
    series: Series, name: str, window_s: float, client: bool = False, le: str = ""
) -> dict[str, list[tuple[float, float]]]:
    """Per instance: (t, per-second increase of ``name`` over the last ``window_s``)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for instance, points in _by_instance(series, client).items():
        if not any((name, le) in s for _, s in points):
            continue  # another kind of process (a bookie, autorecovery) exports other names
        values = [(t, s.get((name, le), 0.0)) for t, s in points]
        line = []
        for i, (t, v) in enumerate(values):
            j = i
            while j > 0 and t - values[j - 1][0] <= window_s:
                j -= 1
            if j < i:
                t_old, v_old = values[j]
                line.append((t, max(0.0, v - v_old) / (t - t_old)))
        out[instance] = line
    return out


def summed(per_instance: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Sum over instances, on a 1 s grid. Instances are scraped a moment apart, so a
    second may lack one of them: its value a second before stands in (as Prometheus's
    lookback does), so that a sum does not dip for a missed beat."""
    grid: dict[int, float] = defaultdict(float)
    for line in per_instance.values():
        points = {round(t): v for t, v in line}
        if not points:
            continue
        for second in range(min(points), max(points) + 1):
            value = points.get(second, points.get(second - 1))
            if value is not None:
                grid[second] += value
    return sorted((float(t), v) for t, v in grid.items())


def quantile(
    series: Series, name: str, q: float, window_s: float, client: bool = False
) -> list[tuple[float, float]]:
    """``histogram_quantile(q, sum by (le) (rate(name_bucket[window])))``."""
    bounds: set[str] = set()
    for _t, instance, samples in series:
        if (instance == "client") == client:
            bounds.update(le for (n, le) in samples if n == name + "_bucket")
    les = sorted(bounds, key=lambda b: math.inf if b == "+Inf" else float(b))
    rates = {le: summed(rate(series, name + "_bucket", window_s, client, le)) for le in les}
    times = [t for t, _ in rates[les[-1]]] if les else []
    out = []
    for k, t in enumerate(times):
        cum = [(le, rates[le][k][1] if k < len(rates[le]) else 0.0) for le in les]
        total = cum[-1][1]
        if total <= 0:
            continue
        rank = q * total
        prev_bound, prev_count = 0.0, 0.0
        for le, count in cum:
            bound = math.inf if le == "+Inf" else float(le)
            if count >= rank:
                if bound == math.inf:
                    value = prev_bound
                else:
                    span = count - prev_count
                    frac = (rank - prev_count) / span if span > 0 else 1.0
                    value = prev_bound + (bound - prev_bound) * frac
                out.append((t, value))
                break
            prev_bound, prev_count = bound, count
    return out


def gauge(series: Series, name: str) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for t, instance, samples in series:
        if instance != "client" and (name, "") in samples:
            out[instance].append((t, samples[(name, "")]))
    return out


def ratio(
    a: list[tuple[float, float]], b: list[tuple[float, float]], add_b_to_a: bool = False
) -> list[tuple[float, float]]:
    bmap = dict(b)
    out = []
    for t, va in a:
        vb = bmap.get(t)
        den = (va + vb) if add_b_to_a and vb is not None else vb
        if den:
            out.append((t, va / den))
    return out


# ------------------------------------------------------------ drawing


def draw(series: Series, out: Path, window_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    P = "quorumlog_bookie_"
    C = "quorumlog_client_"
    Line = list[tuple[float, float]]
    panels: list[tuple[str, str, Callable[[], Sequence[tuple[str, Line]]]]] = [
        (
            "Add rate (entries/s)",
            "entries/s",
            lambda: sorted(rate(series, P + "add_entries_total", window_s).items()),
        ),
        (
            "Bookie add latency",
            "ms",
            lambda: [
                (f"p{int(q * 100)}", _ms(quantile(series, P + "add_latency_seconds", q, window_s)))
                for q in (0.5, 0.99)
            ],
        ),
        (
            "Journal: fdatasync p99 (ms), records per batch",
            "",
            lambda: [
                (
                    "sync p99 ms",
                    _ms(quantile(series, P + "journal_sync_latency_seconds", 0.99, window_s)),
                ),
                (
                    "records/batch",
                    ratio(
                        summed(rate(series, P + "journal_batch_records_sum", window_s)),
                        summed(rate(series, P + "journal_batch_records_count", window_s)),
                    ),
                ),
            ],
        ),
        (
            "Read rate (entries/s)",
            "entries/s",
            lambda: sorted(rate(series, P + "read_entries_total", window_s).items()),
        ),
        (
            "Bookie read latency",
            "ms",
            lambda: [
                (f"p{int(q * 100)}", _ms(quantile(series, P + "read_latency_seconds", q, window_s)))
                for q in (0.5, 0.99)
            ],
        ),
        (
            "Read cache hit ratio",
            "",
            lambda: [
                (
                    "hit ratio",
                    ratio(
                        summed(rate(series, P + "read_cache_hits_total", window_s)),
                        summed(rate(series, P + "read_cache_misses_total", window_s)),
                        add_b_to_a=True,
                    ),
                )
            ],
        ),
        (
            "Entry-log, index and journal sizes (MiB)",
            "MiB",
            lambda: [
                (label, _mib(_sum_gauge(gauge(series, P + name))))
                for label, name in (
                    ("entry logs", "entry_log_size_bytes"),
                    ("index", "index_size_bytes"),
                    ("journal", "journal_size_bytes"),
                )
            ],
        ),
        (
            "Connections and parked long polls",
            "",
            lambda: [
                ("connections", _sum_gauge(gauge(series, P + "connections"))),
                ("parked long polls", _sum_gauge(gauge(series, P + "parked_long_polls"))),
            ],
        ),
        (
            "Read-only bookies and disk usage",
            "",
            lambda: [
                ("read-only bookies", _sum_gauge(gauge(series, P + "read_only"))),
                ("max disk usage", _max_gauge(gauge(series, P + "disk_usage_ratio"))),
            ],
        ),
        (
            "Client add latency",
            "ms",
            lambda: [
                (
                    f"p{int(q * 100)}",
                    _ms(quantile(series, C + "add_latency_seconds", q, window_s, client=True)),
                )
                for q in (0.5, 0.99)
            ],
        ),
        (
            "Client: ensemble changes, speculative reads, recoveries (per min)",
            "per min",
            lambda: [
                (
                    label,
                    [(t, v * 60) for t, v in summed(rate(series, C + name, window_s, client=True))],
                )
                for label, name in (
                    ("ensemble changes", "ensemble_changes_total"),
                    ("speculative reads", "speculative_reads_total"),
                    ("recoveries", "recoveries_total"),
                )
            ],
        ),
        (
            "Client confirmed entries/s",
            "entries/s",
            lambda: [
                (
                    "confirmed",
                    summed(rate(series, C + "add_confirmed_entries_total", window_s, client=True)),
                )
            ],
        ),
    ]
    A = "quorumlog_autorecovery_"
    panels += [
        (
            "Autorecovery: under-replicated ledgers, ledgers in repair",
            "ledgers",
            lambda: [
                ("under-replicated", _max_gauge(gauge(series, A + "under_replicated_ledgers"))),
                ("in repair", _sum_gauge(gauge(series, A + "ledgers_in_repair"))),
                ("auditors", _sum_gauge(gauge(series, A + "is_auditor"))),
            ],
        ),
        (
            "Autorecovery: copy rate (MB/s)",
            "MB/s",
            lambda: [
                (
                    "copied",
                    [
                        (t, v / 1e6)
                        for t, v in summed(rate(series, A + "copied_bytes_total", window_s))
                    ],
                )
            ],
        ),
        (
            "Autorecovery: marked, repaired, deferred, failed (per min)",
            "per min",
            lambda: [
                (label, [(t, v * 60) for t, v in summed(rate(series, A + name, window_s))])
                for label, name in (
                    ("ledgers marked", "ledgers_marked_total"),
                    ("ledgers repaired", "ledgers_repaired_total"),
                    ("deferred (open)", "ledgers_deferred_total"),
                    ("failed", "ledger_repair_failures_total"),
                    ("audit runs", "audit_runs_total"),
                )
            ],
        ),
    ]
    fig, axes = plt.subplots(5, 3, figsize=(16, 19))
    for ax, (title, unit, lines) in zip(axes.flat, panels, strict=True):
        for label, line in lines():
            if line:
                xs, ys = zip(*line, strict=True)
                ax.plot(xs, ys, label=label, linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("s", fontsize=8)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "quorumlog dashboard panels from a real scrape (4 local bookies and autorecovery, "
        "one bookie killed at 2/3)",
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the title
    fig.savefig(out, dpi=80)


def _ms(line: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(t, v * 1000) for t, v in line]


def _mib(line: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(t, v / (1 << 20)) for t, v in line]


def _sum_gauge(per: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    return summed(per)


def _max_gauge(per: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    grid: dict[int, float] = {}
    for line in per.values():
        for t, v in line:
            grid[round(t)] = max(grid.get(round(t), 0.0), v)
    return sorted((float(t), v) for t, v in grid.items())


def start_autorecovery(uri: str, home: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``quorumlog autorecovery --http-port 0``; its process and admin port."""
    out_path = home / "autorecovery.out"
    with open(out_path, "wb") as out, open(home / "autorecovery.err", "wb") as err:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "quorumlog", "autorecovery", "--metadata", uri),
                *("--http-port", "0", "--autorecovery-session-timeout-ms", "2000"),
                *("--password", "pw", "--open-ledger-grace-s", "10"),
            ],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        for line in out_path.read_text().splitlines():
            if " admin http://" in line:
                return process, int(line.rsplit(":", 1)[1])
        time.sleep(0.1)
    stop_process(process)
    raise SystemExit(f"autorecovery did not start: {(home / 'autorecovery.err').read_text()}")


def stop_process(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=4000, help="entries/s, both writers")
    parser.add_argument("--window-s", type=float, default=5.0, help="rate() window")
    parser.add_argument(
        "--closed-ledgers", type=int, default=8, help="closed ledgers of 4 MB written first"
    )
    parser.add_argument("--out", type=Path, default=Path("docs/metrics.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="metrics-dashboard-") as tmp:
        uri = embedded_metadata_uri(tmp)
        bookie_args = ["--http-port", "0", "--metadata-session-timeout-ms", "2000"]
        with LocalCluster(uri, Path(tmp) / "bookies", 4, extra_args=bookie_args) as c:
            ports = {}
            for bookie in c.bookies:
                for line in bookie.stdout_text().splitlines():
                    if " admin http://" in line:
                        ports[line.split()[1]] = int(line.rsplit(":", 1)[1])
            daemon, ports["autorecovery"] = start_autorecovery(uri, Path(tmp))
            series: Series = []
            stop = threading.Event()
            t0 = time.monotonic()
            thread = threading.Thread(target=scrape_loop, args=(ports, series, stop, t0))
            thread.start()
            try:
                asyncio.run(
                    load(uri, c, args.duration_s, args.rate, series, t0, args.closed_ledgers)
                )
            finally:
                stop.set()
                thread.join()
                stop_process(daemon)
    draw(series, args.out, args.window_s)
    copied = max(
        (s.get(("quorumlog_autorecovery_copied_bytes_total", ""), 0.0) for _, _, s in series),
        default=0.0,
    )
    print(f"{len(series)} scrapes -> {args.out}; autorecovery copied {copied / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
