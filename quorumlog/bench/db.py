"""``quorumlog db bench``: durable replicated INSERTs through the HTTP API, beside PostgreSQL.

Three workloads, each run on both systems in the same run, both systems up at once
and taking turns for ``--rounds`` rounds (which one goes first alternates), so that
both meet the disk and the machine's load of the same minutes; each figure is the
median over the rounds:

- ``serial``: one client, one single-row INSERT at a time (latency p50/p99, writes/s);
- ``concurrent``: 16 clients, single-row INSERTs (writes/s);
- ``batch``: one client, 100-row batches, each one transaction (rows/s).

quorumlog: a local cluster of three bookies (journal sync on) and three
``quorumlog db serve`` replicas; requests go to the leader over HTTP (a minimal
keep-alive client, one connection per client: :class:`_HttpClient`), and an answer
means the record is confirmed by the log's ack quorum and applied. PostgreSQL 15
(Debian's package): a primary and one synchronous streaming standby on loopback
(``synchronous_commit = on``, ``synchronous_standby_names = '*'``), driven with
psycopg's asyncio API, one connection per client, autocommit for single rows. Every
process is started here and stopped by pid; the directories are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from quorumlog.bench.workloads import processes_cpu_s

PG_BIN = Path("/usr/lib/postgresql/15/bin")
CONCURRENCY = 16
BATCH_ROWS = 100
WORKLOADS = ("serial", "concurrent", "batch")
# One measurement of one workload: its figures (requests, per_s, p50_ms, p99_ms, ...).
Workload = Callable[[], Awaitable[dict[str, Any]]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _measure(
    one: Callable[[int], Awaitable[None]], count: int, clients: int
) -> dict[str, float]:
    latencies: list[float] = []
    per_client = max(1, count // clients)

    async def client(c: int) -> None:
        for i in range(per_client):
            started = time.perf_counter()
            await one(c * per_client + i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "per_s": len(latencies) / elapsed,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
    }


# ---------------------------------------------------------------- quorumlog


@contextlib.contextmanager
def _quorumlog_group(base: Path) -> Iterator[tuple[str, dict[str, list[int]]]]:
    """Three bookies and three replicas; the leader's address and the pids of each role
    (``leader``, ``followers``, ``bookies``), whose CPU time the benchmark reads."""
    from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri

    uri = embedded_metadata_uri(base)
    processes: list[subprocess.Popen[bytes]] = []
    with LocalCluster(uri, base / "cluster", 3) as cluster:
        try:
            addrs = []
            for n in range(3):
                addr = f"127.0.0.1:{_free_port()}"
                addrs.append(addr)
                log = open(base / f"db-{n}.log", "wb")  # noqa: SIM115 - closed with the process
                processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "quorumlog",
                            "db",
                            "serve",
                            "--metadata",
                            cluster.metadata_uri,
                            "--name",
                            "bench",
                            "--data-dir",
                            str(base / f"db-{n}"),
                            "--http-addr",
                            addr,
                            "--node-id",
                            f"db-{n}",
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            leader = _wait_leader(addrs)
            at = addrs.index(leader)
            pids = {
                "leader": [processes[at].pid],
                "followers": [p.pid for n, p in enumerate(processes) if n != at],
                "bookies": [b.pid for b in cluster.bookies if b.pid is not None],
            }
            yield leader, pids
        finally:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait(10)


def _wait_leader(addrs: list[str]) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for addr in addrs:
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(f"http://{addr}/status", timeout=2) as answer,
            ):
                if json.loads(answer.read())["store"]["role"] == "leader":
                    return addr
        time.sleep(0.1)
    raise RuntimeError("no database leader within 60 s")


class _HttpClient(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time: the load generator.

    A few microseconds of Python per request, where aiohttp's client spent 110 to 350
    µs of CPU on the same two cores the servers run on (psycopg, on the PostgreSQL
    side, is C): the figures measure the database, not the client. It speaks only
    what the benchmark needs: POST with a Content-Length body, answers with one.
    """

    def __init__(self, host: str) -> None:
        self._host = host
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._answer: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(ConnectionError(f"{self._host}: connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0 or self._answer is None:
            return
        head = bytes(self._buffer[:head_end]).decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        end = head_end + 4 + length
        if len(self._buffer) < end:
            return
        body = bytes(self._buffer[head_end + 4 : end])
        del self._buffer[:end]
        if not self._answer.done():
            self._answer.set_result((int(head[0].split()[1]), body))

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        assert self._transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(
            f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return await self._answer


async def _with_cpu(
    figures: Awaitable[dict[str, Any]], pids: dict[str, list[int]]
) -> dict[str, Any]:
    """``figures`` of one workload, with the CPU µs each role spent per request: where
    the time goes when two cores are shared by every process of the run."""
    before = {role: processes_cpu_s(p) for role, p in pids.items()}
    client_before = time.process_time()
    out = await figures
    requests = out["requests"]
    for role, role_pids in pids.items():
        out[f"cpu_us_{role}"] = (processes_cpu_s(role_pids) - before[role]) / requests * 1e6
    out["cpu_us_client"] = (time.process_time() - client_before) / requests * 1e6
    return out


def fsync_ms(directory: Path, rounds: int = 100) -> dict[str, float]:
    """p50 and p99 of a 4 KiB write and fdatasync in ``directory``: the disk's state
    during the run, printed beside the figures (it bounds every durable write)."""
    path = directory / "fsync-probe"
    latencies: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(rounds):
            os.write(fd, b"\0" * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50": _percentile(latencies, 0.5) * 1000, "p99": _percentile(latencies, 0.99) * 1000}


@contextlib.asynccontextmanager
async def _quorumlog_workloads(
    addr: str, pids: dict[str, list[int]], count: int, batches: int
) -> AsyncIterator[dict[str, Workload]]:
    """The three workloads against the leader at ``addr``, its table created and the
    connections warmed up."""
    host, port = addr.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    clients: list[_HttpClient] = []

    import orjson  # C, as psycopg is on the other side: the client costs microseconds

    async def post(client: _HttpClient, body: list[Any], query: str = "") -> None:
        status, text = await client.post("/db/execute" + query, orjson.dumps(body))
        result = orjson.loads(text)
        if status != 200 or any("error" in r for r in result["results"]):
            raise RuntimeError(f"write failed: {result}")

    try:
        for _ in range(CONCURRENCY):
            _, client = await loop.create_connection(lambda: _HttpClient(addr), host, int(port))
            clients.append(client)
        await post(clients[0], ["CREATE TABLE bench (id INTEGER PRIMARY KEY, v TEXT)"])
        row = ["INSERT INTO bench(v) VALUES (?)", "x" * 32]
        await _measure(lambda i: post(clients[0], [row]), 200, 1)  # warm-up, not reported
        per_client = max(1, count * 4 // CONCURRENCY)
        yield {
            "serial": lambda: _with_cpu(
                _measure(lambda i: post(clients[0], [row]), count, 1), pids
            ),
            "concurrent": lambda: _with_cpu(
                _measure(
                    lambda i: post(clients[i // per_client % CONCURRENCY], [row]),
                    count * 4,
                    CONCURRENCY,
                ),
                pids,
            ),
            "batch": lambda: _with_cpu(
                _rows(
                    _measure(
                        lambda i: post(clients[0], [row] * BATCH_ROWS, "?transaction"), batches, 1
                    )
                ),
                pids,
            ),
        }
    finally:
        for client in clients:
            if client._transport is not None:
                client._transport.close()


async def _rows(figures: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    out = await figures
    out["rows_per_s"] = out["per_s"] * BATCH_ROWS
    return out


# ---------------------------------------------------------------- PostgreSQL


def _as_postgres(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    user = pwd.getpwnam("postgres")
    done = subprocess.run(
        args, user=user.pw_uid, group=user.pw_gid, capture_output=True, cwd="/", **kwargs
    )
    if done.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed: {done.stderr.decode()[-500:]}")
    return done


def _start_postgres(data: Path) -> subprocess.Popen[bytes]:
    user = pwd.getpwnam("postgres")
    log = open(data.parent / f"{data.name}.log", "wb")  # noqa: SIM115 - lives with the process
    return subprocess.Popen(
        [str(PG_BIN / "postgres"), "-D", str(data)],
        user=user.pw_uid,
        group=user.pw_gid,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd="/",
    )


def _wait_pg(port: int) -> None:
    for _ in range(600):
        done = subprocess.run(
            [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)], capture_output=True
        )
        if done.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"PostgreSQL on port {port} did not start")


@contextlib.contextmanager
def _postgres_pair(base: Path) -> Iterator[int]:
    """A primary with one synchronous standby; the primary's port."""
    user = pwd.getpwnam("postgres")
    os.chown(base, user.pw_uid, user.pw_gid)
    primary, standby = base / "primary", base / "standby"
    port, standby_port = _free_port(), _free_port()
    _as_postgres([str(PG_BIN / "initdb"), "-D", str(primary), "-U", "postgres", "--auth=trust"])
    with open(primary / "postgresql.conf", "a") as conf:
        conf.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{base}'\n"
            "wal_level = replica\nmax_wal_senders = 4\nsynchronous_commit = on\n"
            "synchronous_standby_names = '*'\nfsync = on\n"
        )
    processes = [_start_postgres(primary)]
    try:
        _wait_pg(port)
        _as_postgres(
            [
                str(PG_BIN / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                "postgres",
                "-D",
                str(standby),
                "-R",
            ]
        )
        with open(standby / "postgresql.conf", "a") as conf:
            conf.write(f"port = {standby_port}\n")
        processes.append(_start_postgres(standby))
        _wait_pg(standby_port)
        _wait_sync(port)
        yield port
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)  # fast shutdown
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)


def _wait_sync(port: int) -> None:
    import psycopg

    for _ in range(300):
        with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres") as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            if (row.fetchone() or [0])[0] >= 1:
                return
        time.sleep(0.1)
    raise RuntimeError("the standby never became synchronous")


@contextlib.asynccontextmanager
async def _postgres_workloads(
    port: int, count: int, batches: int
) -> AsyncIterator[dict[str, Workload]]:
    """The same three workloads against the primary on ``port``."""
    import psycopg

    dsn = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    conns: list[Any] = []
    try:
        for _ in range(CONCURRENCY):
            conns.append(await psycopg.AsyncConnection.connect(dsn, autocommit=True))
        await conns[0].execute("CREATE TABLE bench (id SERIAL PRIMARY KEY, v TEXT)")
        value = "x" * 32

        async def insert(i: int, conn: Any = None) -> None:
            await (conn or conns[0]).execute("INSERT INTO bench(v) VALUES (%s)", (value,))

        async def batch(i: int) -> None:
            conn = conns[0]
            async with conn.transaction(), conn.cursor() as cursor:
                await cursor.executemany(
                    "INSERT INTO bench(v) VALUES (%s)", [(value,)] * BATCH_ROWS
                )

        await _measure(lambda i: insert(i), 200, 1)  # warm-up, not reported
        per_client = max(1, count * 4 // CONCURRENCY)
        yield {
            "serial": lambda: _measure(lambda i: insert(i), count, 1),
            "concurrent": lambda: _measure(
                lambda i: insert(i, conns[i // per_client % CONCURRENCY]), count * 4, CONCURRENCY
            ),
            "batch": lambda: _rows(_measure(batch, batches, 1)),
        }
    finally:
        for conn in conns:
            await conn.close()


async def _alternate(
    systems: dict[str, contextlib.AbstractAsyncContextManager[dict[str, Workload]]], rounds: int
) -> dict[str, dict[str, Any]]:
    """Every workload ``rounds`` times on each system, the systems taking turns (which
    one goes first alternates), so that both see the disk and the machine's load of
    the same minutes; each figure is the median over the rounds."""
    async with contextlib.AsyncExitStack() as stack:
        ready = {name: await stack.enter_async_context(cm) for name, cm in systems.items()}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {w: [] for w in WORKLOADS} for name in ready
        }
        for turn in range(rounds):
            for workload in WORKLOADS:
                order = list(ready) if turn % 2 == 0 else list(reversed(ready))
                for name in order:
                    runs[name][workload].append(await ready[name][workload]())
    return {
        name: {w: _median(figures) for w, figures in by_workload.items()}
        for name, by_workload in runs.items()
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    out["rounds"] = len(runs)
    out["per_s_each_round"] = [r["per_s"] for r in runs]
    return out


# ---------------------------------------------------------------- the command


def bench(count: int, batches: int, with_postgres: bool, rounds: int = 3) -> dict[str, Any]:
    """Run both, taking turns ``rounds`` times; the figures as a dict."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="quorumlog-dbbench-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # the postgres user must reach its directories below
        out["load_1min_before"] = os.getloadavg()[0]  # other work on the machine
        out["fsync_ms_before"] = fsync_ms(base)
        pg_base = base / "pg"
        pg_base.mkdir()
        with contextlib.ExitStack() as stack:
            leader, pids = stack.enter_context(_quorumlog_group(base / "ql"))
            port = stack.enter_context(_postgres_pair(pg_base)) if with_postgres else None

            async def run_all() -> dict[str, dict[str, Any]]:
                systems: dict[str, contextlib.AbstractAsyncContextManager[dict[str, Workload]]]
                systems = {"quorumlog": _quorumlog_workloads(leader, pids, count, batches)}
                if port is not None:
                    systems["postgresql"] = _postgres_workloads(port, count, batches)
                return await _alternate(systems, rounds)

            out.update(asyncio.run(run_all()))
        out["fsync_ms_after"] = fsync_ms(base)
        shutil.rmtree(base, ignore_errors=True)
    return out


def table(figures: dict[str, Any]) -> str:
    ql, pg = figures.get("quorumlog", {}), figures.get("postgresql")
    lines = [
        f"{'workload':<34}{'quorumlog db':>16}{'PostgreSQL':>16}{'ratio':>8}",
    ]

    def row(label: str, workload: str, key: str, fmt: str, lower_is_better: bool) -> None:
        a = ql[workload][key]
        b = pg[workload][key] if pg else None
        ratio = "" if not b else f"{(b / a if lower_is_better else a / b):.2f}"
        lines.append(f"{label:<34}{format(a, fmt):>16}{format(b, fmt) if b else '-':>16}{ratio:>8}")

    row("1 client, p50 ms", "serial", "p50_ms", ".2f", True)
    row("1 client, p99 ms", "serial", "p99_ms", ".2f", True)
    row("1 client, writes/s", "serial", "per_s", ".0f", False)
    row(f"{CONCURRENCY} clients, writes/s", "concurrent", "per_s", ".0f", False)
    row(f"{CONCURRENCY} clients, p50 ms", "concurrent", "p50_ms", ".2f", True)
    row(f"{BATCH_ROWS}-row batches, rows/s", "batch", "rows_per_s", ".0f", False)
    lines.append("ratio: quorumlog db relative to PostgreSQL (above 1: quorumlog db better)")
    lines.append("")
    lines.append(
        f"{'quorumlog db, CPU µs per request':<34}"
        + "".join(f"{role:>10}" for role in ("leader", "followers", "bookies", "client"))
    )
    for label, workload in (
        ("1 client", "serial"),
        (f"{CONCURRENCY} clients", "concurrent"),
        (f"{BATCH_ROWS}-row batches", "batch"),
    ):
        cpu = [ql[workload].get(f"cpu_us_{r}", 0.0) for r in ("leader", "followers", "bookies")]
        cpu.append(ql[workload].get("cpu_us_client", 0.0))
        lines.append(f"{label:<34}" + "".join(f"{value:>10.0f}" for value in cpu))
    before, after = figures.get("fsync_ms_before"), figures.get("fsync_ms_after")
    if before and after:
        lines.append(
            f"disk: 4 KiB write + fdatasync p50 {before['p50']:.2f} ms before the run, "
            f"{after['p50']:.2f} ms after (p99 {before['p99']:.2f} / {after['p99']:.2f}); "
            f"load average {figures.get('load_1min_before', 0.0):.1f} before"
        )
    return "\n".join(lines)
