"""The namespace suite's client processes, each recording its history (JSON lines,
``<history dir>/<process>.jsonl``). Each runs in a client namespace of its own:
``python -m tests.harness.netns.workload KIND --history DIR --process NAME ...``.

Kinds:

- ``ledger``: one writer appends unique values (``e0``, ``e1``, ...) to a ledger
  (E=3, Qw=3, Qa=2), a few in flight; when its ledger fails it creates another.
  Every ``create`` is recorded with the ledger id, for the final read.
- ``log-writer``: a contender in a leader election; once it leads it opens the log's
  writer (R11, fencing the previous one) and appends ``<process>.<epoch>.<seq>``, one
  at a time, until its writer fails, even if it lost the election meanwhile (a zombie
  leader: only fencing keeps it out). Several run at once: competing writers.
- ``log-tail``: a tailing reader; records the values it saw, in order, at the end.
- ``db-client``: threads appending unique values to a few keys of a replicated
  database table and reading keys back with strong reads, through random replicas.
- ``final-ledger``, ``final-log``, ``final-db``: after the faults healed, read
  everything back (ledgers opened with recovery, the log fenced, strong reads), then a
  second time through another client: two readers that must agree.
- ``bookies``: print the registered bookies as JSON.

Outcomes are recorded conservatively: ``ok`` only for a confirmation, ``fail`` only
when the operation certainly did not happen (a connection refused), ``info`` for
anything else (timeouts, fenced writers, lost connections: R13's unknown outcomes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from quorumlog.aio import BookKeeper, ClientConfig, LogNamespace
from quorumlog.log.config import LogConfig
from quorumlog.recipes.election import LeaderElection
from tests.harness.netns.history import HistoryRecorder, pair_operations, read_events

# Faults last seconds: a client that waits 5 s for a silent bookie would sit out the
# whole fault, so the workloads give up on a bookie after 1 s and change ensembles.
CLIENT_CONFIG = ClientConfig(
    connect_timeout_ms=1_000,
    add_timeout_ms=1_000,
    read_timeout_ms=2_000,
    fence_timeout_ms=2_000,
    metadata_session_timeout_ms=4_000,
)
LEDGER_SHAPE = (3, 3, 2)
ROLLOVER_BYTES = 4096  # rollovers happen during a run (records are about 20 bytes)
ELECTION_SESSION_MS = 1_000
OPERATION_BOUND_S = 15.0  # an operation not done by then is recorded as unknown
DB_TABLE = "items"
# A replica that stopped answering (paused, cut off) holds a request this long: short,
# so that clients move on to the other replicas within a fault.
DB_REQUEST_TIMEOUT_S = 1.0


def _log_config(args: argparse.Namespace) -> LogConfig:
    return LogConfig(rollover_size_bytes=args.rollover_bytes)


def _running(args: argparse.Namespace, deadline: float) -> bool:
    """Until the harness creates the stop file, or the bound on the run passes."""
    return time.monotonic() < deadline and not (args.stop_file and Path(args.stop_file).exists())


def _recorder(args: argparse.Namespace) -> HistoryRecorder:
    directory = Path(args.history)
    directory.mkdir(parents=True, exist_ok=True)
    return HistoryRecorder(directory / f"{args.process}.jsonl", args.process)


# ---------------------------------------------------------------- ledger appends


async def ledger_writer(args: argparse.Namespace) -> None:
    history = _recorder(args)
    bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
    deadline = time.monotonic() + args.duration_s
    in_flight: set[asyncio.Task[None]] = set()
    broken = asyncio.Event()
    handle = None
    seq = 0

    async def track(op_id: str, future: asyncio.Future[int], ledger_id: int) -> None:
        done, _ = await asyncio.wait({future}, timeout=OPERATION_BOUND_S)
        if done and future.exception() is None:
            history.complete(op_id, "ok", "append", "ledgers", [ledger_id, future.result()])
        else:
            history.complete(op_id, "info", "append", "ledgers")
            broken.set()

    while _running(args, deadline):
        if handle is None or broken.is_set():
            if in_flight:
                await asyncio.wait(in_flight, timeout=OPERATION_BOUND_S)
            broken.clear()
            op_id = history.invoke("create", "ledgers", None)
            try:
                handle = await asyncio.wait_for(bk.create_ledger(*LEDGER_SHAPE), 5)
            except Exception:  # any failure: unknown whether a ledger was made
                history.complete(op_id, "info", "create", "ledgers")
                handle = None
                await asyncio.sleep(0.1)
                continue
            created = {"ledger_id": handle.ledger_id, "ensemble": list(handle.ensemble)}
            history.complete(op_id, "ok", "create", "ledgers", created)
        while len(in_flight) >= args.window:
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        value = f"e{seq}"
        seq += 1
        op_id = history.invoke("append", "ledgers", value)
        try:
            future = handle.append(value.encode())
        except Exception:  # refused before anything was sent: the ledger has failed
            history.complete(op_id, "fail", "append", "ledgers")
            broken.set()
            continue
        task = asyncio.ensure_future(track(op_id, future, handle.ledger_id))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
        await asyncio.sleep(args.pause_ms / 1000)
    if in_flight:
        await asyncio.wait(in_flight, timeout=OPERATION_BOUND_S)
    history.close()
    # The ledger stays open: the final read recovers it, as a new reader would.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bk.close(), 5)


async def final_ledger(args: argparse.Namespace) -> None:
    """Every ledger the writers created, opened with recovery and read, concatenated in
    creation order; then again by a second client (the ledgers are closed by then)."""
    operations = pair_operations(read_events(sorted(Path(args.history).glob("*.jsonl"))))
    ledger_ids = [op.result["ledger_id"] for op in operations if op.f == "create" and op.ok]
    history = _recorder(args)
    for reader in ("final", "final-2"):
        op_id = history.invoke("read", "ledgers", None)
        bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
        values: list[str] = []
        fragments = 0
        for ledger_id in ledger_ids:
            read, ensembles = await _read_ledger(bk, ledger_id, args.retry_s)
            values += read
            fragments += ensembles
        answer = {"reader": reader, "values": values, "fragments": fragments}
        history.complete(op_id, "ok", "read", "ledgers", answer)
        await bk.close()
    history.close()


async def _read_ledger(bk: BookKeeper, ledger_id: int, retry_s: float) -> tuple[list[str], int]:
    """The ledger's values, and how many fragments (ensembles) it has: more than one
    shows that the faults made the writer change ensembles."""
    handle = await _retry(lambda: bk.open_ledger(ledger_id), retry_s)
    last = handle.last_add_confirmed
    fragments = len(handle.metadata.ensembles)
    if last < 0:
        return [], fragments
    entries = await _retry(lambda: handle.read_entries(0, last), retry_s)
    return [entry.data.decode() for entry in entries], fragments


async def _retry(make: Any, bound_s: float) -> Any:
    """``await make()`` until it succeeds; the last error once ``bound_s`` has passed
    (the final reads run after healing, while the cluster may still be recovering)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            return await asyncio.wait_for(make(), 10)
        except Exception:
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------- log streams


async def log_writer(args: argparse.Namespace) -> None:
    history = _recorder(args)
    bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
    election = LeaderElection(
        bk, f"{args.log}-writers", identifier=args.process, session_timeout_ms=args.election_ms
    )
    await election.start()
    deadline = time.monotonic() + args.duration_s
    epoch = 0
    while _running(args, deadline):
        if not election.is_leader:
            await election.wait_for_leadership(timeout_s=0.2)
            continue
        epoch += 1
        session = f"{args.process}.{epoch}"
        op_id = history.invoke("open", args.log, session)
        try:
            log = await asyncio.wait_for(LogNamespace(bk).open_log(args.log, _log_config(args)), 10)
            writer = await asyncio.wait_for(log.open_writer(), 10)
        except Exception:
            history.complete(op_id, "info", "open", args.log)
            await asyncio.sleep(0.2)
            continue
        history.complete(op_id, "ok", "open", args.log, writer.ledger_id)
        seq = 0
        # A zombie on purpose: once it holds the writer it keeps appending whatever the
        # election says, until the writer fails. A leader that lost its session (paused,
        # cut off from ZooKeeper) does exactly this until it notices, so only fencing
        # (R11) may keep its late appends out of the log.
        while _running(args, deadline):
            value = f"{session}.{seq}"
            seq += 1
            op_id = history.invoke("append", args.log, value)
            try:
                future = writer.append_nowait(value.encode())
            except Exception:  # the writer had already stopped: nothing was sent
                history.complete(op_id, "fail", "append", args.log)
                break
            done, _ = await asyncio.wait({future}, timeout=OPERATION_BOUND_S)
            if done and future.exception() is None:
                position = future.result()
                history.complete(op_id, "ok", "append", args.log, list(position))
            else:
                # A fenced writer (LogFencedError) may or may not have stored it.
                history.complete(op_id, "info", "append", args.log)
                break
        # The writer failed: it is abandoned, never closed (the next one fences its
        # ledger, which is what a crashed leader leaves).
    history.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(election.close(), 5)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bk.close(), 5)


async def log_tail(args: argparse.Namespace) -> None:
    history = _recorder(args)
    bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
    log = await LogNamespace(bk).open_log(args.log, _log_config(args))
    deadline = time.monotonic() + args.duration_s
    seen: list[str] = []
    op_id = history.invoke("read", args.log, None)
    reader = None
    resume_at = None  # where a reopened reader carries on
    while _running(args, deadline):
        try:
            if reader is None:
                reader = await asyncio.wait_for(log.open_reader(resume_at), 10)
            record = await asyncio.wait_for(reader.read_next(timeout_ms=200), 10)
        except Exception:
            if reader is not None:
                resume_at = reader.position
            reader = None
            await asyncio.sleep(0.2)
            continue
        if record is not None:
            seen.append(record.data.decode())
    history.complete(op_id, "ok", "read", args.log, {"reader": args.process, "values": seen})
    history.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(bk.close(), 5)


async def final_log(args: argparse.Namespace) -> None:
    """The whole log, fenced first (no writer may add after it), then read again by a
    second client."""
    history = _recorder(args)
    for reader, fence in (("final", True), ("final-2", False)):
        op_id = history.invoke("read", args.log, None)
        bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
        log = await LogNamespace(bk).open_log(args.log, _log_config(args))
        records = await _retry(lambda lg=log, f=fence: lg.read_all(fence=f), args.retry_s)
        values = [record.data.decode() for record in records]
        history.complete(op_id, "ok", "read", args.log, {"reader": reader, "values": values})
        await bk.close()
    history.close()


# ---------------------------------------------------------------- database


def _http(address: str, path: str, body: object | None, timeout_s: float) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{address}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        with contextlib.suppress(ValueError):
            return error.code, json.loads(error.read())
        return error.code, None


def _refused(error: BaseException) -> bool:
    """A connection refused or a host unreachable: the request never reached a server."""
    reason = getattr(error, "reason", error)  # urllib wraps socket errors in URLError
    return isinstance(reason, OSError) and reason.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH)


def _strong_read(address: str, key: str, timeout_s: float) -> list[str] | None:
    query = urllib.parse.quote(f"SELECT v FROM {DB_TABLE} WHERE k = '{key}' ORDER BY id")
    status, answer = _http(address, f"/db/query?level=strong&q={query}", None, timeout_s)
    if status != 200 or not isinstance(answer, dict):
        return None
    result = answer["results"][0]
    if "error" in result:
        return None
    return [row[0] for row in result.get("values", []) or []]


def _db_keys(args: argparse.Namespace) -> list[str]:
    """The run's own keys: runs on one cluster share the table, never a key or value."""
    return [f"{args.tag}.k{i}" for i in range(args.keys)]


def db_client(args: argparse.Namespace) -> None:
    history = _recorder(args)
    addresses = args.addresses.split(",")
    keys = _db_keys(args)
    create = [f"CREATE TABLE IF NOT EXISTS {DB_TABLE} (id INTEGER PRIMARY KEY, k TEXT, v TEXT)"]
    setup_deadline = time.monotonic() + 30
    while time.monotonic() < setup_deadline:
        with contextlib.suppress(OSError):
            status, answer = _http(random.choice(addresses), "/db/execute", create, 3)
            if status == 200 and "error" not in answer["results"][0]:
                break
        time.sleep(0.1)
    deadline = time.monotonic() + args.duration_s

    def worker(index: int) -> None:
        rng = random.Random(f"{args.process}-{index}")
        seq = 0
        while _running(args, deadline):
            address = rng.choice(addresses)
            key = rng.choice(keys)
            if rng.random() < 0.6:
                value = f"{args.tag}.{args.process}-{index}-{seq}"
                seq += 1
                op_id = history.invoke("append", key, value)
                statement = [[f"INSERT INTO {DB_TABLE}(k, v) VALUES (?, ?)", key, value]]
                try:
                    status, answer = _http(address, "/db/execute", statement, DB_REQUEST_TIMEOUT_S)
                except OSError as error:
                    history.complete(op_id, "fail" if _refused(error) else "info", "append", key)
                    time.sleep(0.05)
                    continue
                done = status == 200 and isinstance(answer, dict)
                if done and "error" not in answer["results"][0]:
                    # Which replica led when it was applied, for inspection.
                    history.complete(op_id, "ok", "append", key, {"node": answer.get("node")})
                else:
                    history.complete(op_id, "info", "append", key)
                    time.sleep(0.05)
            else:
                op_id = history.invoke("read", key, None)
                try:
                    values = _strong_read(address, key, DB_REQUEST_TIMEOUT_S)
                except OSError as error:
                    history.complete(op_id, "fail" if _refused(error) else "info", "read", key)
                    time.sleep(0.05)
                    continue
                # A read that did not answer constrains nothing: recorded as failed.
                history.complete(op_id, "ok" if values is not None else "fail", "read", key, values)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    history.close()


def final_db(args: argparse.Namespace) -> None:
    history = _recorder(args)
    addresses = args.addresses.split(",")
    for reader in ("final", "final-2"):
        for key in _db_keys(args):
            deadline = time.monotonic() + args.retry_s
            values = None
            while values is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    values = _strong_read(random.choice(addresses), key, 3)
                if values is None:
                    time.sleep(0.2)
            op_id = history.invoke("final-read", key, reader)
            if values is None:
                history.complete(op_id, "fail", "final-read", key)
            else:
                history.complete(
                    op_id, "ok", "final-read", key, {"reader": reader, "values": values}
                )
    history.close()


# ---------------------------------------------------------------- bookies


async def bookies(args: argparse.Namespace) -> None:
    bk = await BookKeeper.connect(args.metadata, config=CLIENT_CONFIG)
    print(json.dumps(await bk.list_bookies()), flush=True)
    await bk.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.harness.netns.workload", allow_abbrev=False
    )
    parser.add_argument("kind", choices=sorted(_KINDS))
    parser.add_argument("--metadata", default="")
    parser.add_argument("--history", default=".")
    parser.add_argument("--process", default="client")
    parser.add_argument("--duration-s", type=float, default=60.0, help="bound on the run")
    parser.add_argument("--stop-file", default="", help="stop once this file exists")
    parser.add_argument("--retry-s", type=float, default=30.0)
    parser.add_argument("--window", type=int, default=8, help="ledger appends in flight")
    parser.add_argument("--pause-ms", type=float, default=2.0, help="between ledger appends")
    parser.add_argument("--log", default="netns-log")
    parser.add_argument("--rollover-bytes", type=int, default=ROLLOVER_BYTES)
    parser.add_argument("--election-ms", type=int, default=ELECTION_SESSION_MS)
    parser.add_argument("--addresses", default="", help="database replicas, HOST:PORT,...")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--tag", default="run", help="prefix of the run's keys and values")
    parser.add_argument("--threads", type=int, default=3)
    args = parser.parse_args(argv)
    run = _KINDS[args.kind]
    result = run(args)
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    sys.exit(0)


_KINDS: dict[str, Any] = {
    "ledger": ledger_writer,
    "final-ledger": final_ledger,
    "log-writer": log_writer,
    "log-tail": log_tail,
    "final-log": final_log,
    "db-client": db_client,
    "final-db": final_db,
    "bookies": bookies,
}

if __name__ == "__main__":
    main()
