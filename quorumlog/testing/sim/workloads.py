"""What the simulated clients do, and what they are told: one seeded run.

:func:`run_seed` builds a :class:`~quorumlog.testing.sim.cluster.Cluster` of five
real bookies on simulated machines, draws a workload and a nemesis plan from the
seed, runs them on a :class:`~quorumlog.testing.sim.loop.VirtualTimeLoop`, heals
every fault, and then does the checker's own part: a fresh client with no faults
recovers and reads everything. It returns the history;
:func:`quorumlog.testing.checkers.check_run` judges it.

Workloads:

``ledger``  one ledger of a random shape (Qa < Qw or Qa = Qw, striping when E > Qw):
            a writer pipelines entries, a reader tails the LAC, then one to three
            clients recover it at once while the old writer (a zombie) keeps adding;
            sometimes the writer closes it first.
``log``     a log stream with small rollovers: one to three writers take it from each
            other (R11), a reader tails it.

Nothing that goes wrong inside a run escapes as a harness error: an exception in
the system, a hang past the virtual-time budget, or a failure of the final
recovery is recorded in the history with the seed, and becomes a named violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
from collections.abc import Iterator
from typing import Any

from quorumlog.client.bookkeeper import BookKeeper
from quorumlog.errors import BKError, NoSuchEntryError
from quorumlog.log.config import LogConfig
from quorumlog.log.errors import LogFencedError
from quorumlog.log.position import Position
from quorumlog.testing.checkers import LedgerHistory, LogHistory, RunHistory
from quorumlog.testing.sim.cluster import Cluster, NetworkFaults, Trace
from quorumlog.testing.sim.disk import PowerLoss
from quorumlog.testing.sim.loop import VirtualTimeLoop
from quorumlog.testing.sim.nemesis import Nemesis, NemesisPlan

__all__ = ["BUDGET_S", "WORKLOADS", "run_seed"]

WORKLOADS = ("ledger", "ledger", "ledger", "log")
BUDGET_S = 900.0  # virtual seconds a run may take before it counts as hung
PASSWORD = b"pw"


class _Run:
    """The state one run's coroutines share."""

    def __init__(self, seed: int, loop: asyncio.AbstractEventLoop, trace: Trace) -> None:
        self.seed = seed
        self.loop = loop
        self.rng = random.Random(seed)
        self.trace = trace
        self.history = RunHistory(seed)
        self.order = itertools.count()  # one sequence for "which came first"
        self.network_faults = NetworkFaults(
            drop_probability=self.rng.choice([0.0, 0.0, 0.005, 0.02]),
            delay_ms_min=0.05,
            delay_ms_max=self.rng.choice([0.5, 2.0, 8.0]),
        )
        self.cluster_rng = random.Random(self.rng.random())
        self.cluster: Cluster  # made on the loop (its stores need it)

    def shape(self) -> tuple[int, int, int]:
        rng = self.rng
        ensemble = rng.randint(2, 4)
        write_quorum = rng.randint(1, ensemble)
        return ensemble, write_quorum, rng.randint(1, write_quorum)

    def nemesis(self, ack_quorum: int) -> Nemesis:
        addresses = [n.address for n in self.cluster.nodes]
        plan = NemesisPlan.draw(random.Random(self.rng.random()), addresses, ack_quorum)
        self.trace("nemesis", "plan: %s; damageable: %s", plan.kinds(), plan.damageable)
        return Nemesis(self.cluster, random.Random(self.rng.random()), plan)

    def client(self, name: str, nemesis: Nemesis, kind: type[Any] | None = None) -> Any:
        faults = nemesis.plan.metadata_faults(self.rng)
        nemesis.clients.append(name)
        return self.cluster.client(name, metadata_faults=faults, kind=kind)


def _payload(seed: int, who: str, n: int) -> bytes:
    return f"s{seed}-{who}-{n}-".encode() * (1 + n % 3)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- ledger workload


async def _ledger_workload(run: _Run) -> None:
    rng = run.rng
    loop = run.loop
    shape = run.shape()
    ensemble, write_quorum, ack_quorum = shape
    nemesis = run.nemesis(ack_quorum)
    writer_bk = run.client("writer", nemesis, BookKeeper)
    handle = None
    for _ in range(20):
        try:
            handle = await writer_bk.create_ledger(
                ensemble, write_quorum, ack_quorum, password=PASSWORD
            )
            break
        except BKError as exc:
            run.trace("writer", "create_ledger failed: %s", exc)
            await asyncio.sleep(0.05)
    if handle is None:
        return
    lh = LedgerHistory(handle.ledger_id, shape)
    run.history.ledgers.append(lh)
    run.trace("writer", "created ledger %d with E=%d Qw=%d Qa=%d", lh.ledger_id, *shape)
    next_id = 0

    def confirmed(expected: int, future: asyncio.Future[int]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        entry_id = future.result()
        lh.confirmed.append((entry_id, loop.time(), next(run.order)))
        if entry_id != expected:
            run.history.system_errors.append(
                f"ledger {lh.ledger_id}: the {expected}th append was confirmed as entry {entry_id}"
            )

    async def write(count: int) -> None:
        nonlocal next_id
        for _ in range(count):
            payload = _payload(run.seed, "w", next_id)
            try:
                future = handle.append(payload)
            except BKError as exc:
                run.trace("writer", "append refused: %s", exc)
                return
            lh.written[next_id] = payload
            future.add_done_callback(lambda f, n=next_id: confirmed(n, f))
            next_id += 1
            if handle.outstanding_adds >= 50 or rng.random() < 0.3:
                await asyncio.sleep(rng.uniform(0, 0.004))

    async def tail() -> None:
        reader_bk = run.client("tailer", nemesis, BookKeeper)
        reader = None
        for _ in range(20):
            try:
                reader = await reader_bk.open_ledger_no_recovery(lh.ledger_id, PASSWORD)
                break
            except BKError:
                await asyncio.sleep(0.01)
        if reader is None:
            return
        next_entry = 0
        for _ in range(40):
            await asyncio.sleep(rng.uniform(0.001, 0.01))
            try:
                lac = await reader.read_last_add_confirmed()
                if lac >= next_entry:
                    for entry in await reader.read_entries(next_entry, lac):
                        lh.reads.append(("tailer", entry.entry_id, entry.data, lac))
                    next_entry = lac + 1
            except BKError:
                continue

    async def recover(name: str) -> None:
        bk = run.client(name, nemesis, BookKeeper)
        for _ in range(20):
            try:
                rh = await bk.open_ledger(lh.ledger_id, PASSWORD)
            except BKError as exc:
                run.trace(name, "recovery failed: %s", exc)
                await asyncio.sleep(0.05)
                continue
            last = rh.metadata.last_entry_id
            lh.closes.append((name, last, loop.time(), next(run.order)))
            run.trace(name, "recovered: ledger %d closed at %d", lh.ledger_id, last)
            if last >= 0:
                with contextlib.suppress(BKError):
                    for entry in await rh.read_entries(0, last):
                        lh.reads.append((name, entry.entry_id, entry.data, None))
            return

    async def close_writer() -> None:
        try:
            await handle.close()
        except BKError as exc:
            run.trace("writer", "close failed: %s", exc)
            return
        last = handle.metadata.last_entry_id
        lh.closes.append(("writer", last, loop.time(), next(run.order)))
        run.trace("writer", "closed ledger %d at %d", lh.ledger_id, last)

    fault_period = asyncio.ensure_future(nemesis.run(rng.uniform(0.02, 0.3)))
    tailer = asyncio.ensure_future(tail())
    await write(rng.randint(5, 120))
    if rng.random() < 0.15:
        await close_writer()
    recoverers = rng.randint(1, 3)
    await asyncio.gather(
        *(recover(f"recoverer{i}") for i in range(recoverers)),
        write(rng.randint(0, 30)),
    )
    await tailer
    await fault_period
    await nemesis.heal()
    await asyncio.sleep(2.0)  # the zombie writer's last adds settle (fail, or are in)
    await _final_ledger_check(run, lh)


async def _final_ledger_check(run: _Run, lh: LedgerHistory) -> None:
    """The checker's part: recover with a client that has no faults, read everything."""
    bk = run.cluster.client("checker", kind=BookKeeper)
    error = ""
    for _ in range(10):
        try:
            rh = await bk.open_ledger(lh.ledger_id, PASSWORD)
            last = rh.metadata.last_entry_id
            entries = await rh.read_entries(0, last) if last >= 0 else []
        except BKError as exc:
            error = _why(exc)
            await asyncio.sleep(0.5)
            continue
        lh.final_last = last
        lh.final_entries = {e.entry_id: e.data for e in entries}
        try:
            await rh.read_entries(last + 1, last + 1)
            lh.read_past_end = True
        except NoSuchEntryError:
            pass
        except BKError as exc:
            error = f"reading past the end: {_why(exc)}"
            break
        run.trace("checker", "ledger %d ends at %d", lh.ledger_id, last)
        return
    lh.final_error = error


# ---------------------------------------------------------------- log workload


async def _log_workload(run: _Run) -> None:
    rng = run.rng
    ensemble, write_quorum, ack_quorum = run.shape()
    config = LogConfig(
        ensemble=ensemble,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        password=PASSWORD,
        rollover_size_bytes=rng.choice([64, 256, 2048]),
        read_batch_entries=rng.choice([3, 16]),
        long_poll_ms=100,
        rollover_retry_ms=50,
    )
    nemesis = run.nemesis(ack_quorum)
    name = "events"
    history = LogHistory(name)
    run.history.logs.append(history)
    writers = rng.randint(1, 3)
    appends = rng.randint(5, 40)

    async def write(who: str) -> None:
        records = history.confirmed.setdefault(who, [])
        log = await _open_log(run, run.client(who, nemesis), name, config)
        if log is None:
            return
        sent = 0
        for _ in range(30):  # terms: each open takes the log over
            if sent >= appends:
                return
            try:
                writer = await log.open_writer()
            except BKError as exc:
                run.trace(who, "open_writer failed: %s", exc)
                await asyncio.sleep(rng.uniform(0.005, 0.05))
                continue
            run.trace(who, "is the writer")
            try:
                while sent < appends:
                    data = _payload(run.seed, who, sent)
                    sent += 1
                    position = await writer.append(data)
                    records.append((position, data))
                    await asyncio.sleep(rng.uniform(0, 0.003))
            except LogFencedError as exc:
                run.trace(who, "fenced: %s", exc)
            except BKError as exc:
                run.trace(who, "append failed: %s", exc)
            await asyncio.sleep(rng.uniform(0.005, 0.05))

    async def tail(stop: asyncio.Event) -> None:
        log = await _open_log(run, run.client("tailer", nemesis), name, config)
        reader = None
        while log is not None and reader is None and not stop.is_set():
            try:
                reader = await log.open_reader()
            except BKError:
                await asyncio.sleep(0.02)
        while reader is not None and not stop.is_set():
            try:
                record = await reader.read_next(50)
            except BKError as exc:
                run.trace("tailer", "read failed: %s", exc)
                return  # a reader that fails stops; what it saw stays a prefix
            if record is not None:
                history.tailed.append((record.position, record.data))

    stop = asyncio.Event()
    fault_period = asyncio.ensure_future(nemesis.run(rng.uniform(0.02, 0.3)))
    tailer = asyncio.ensure_future(tail(stop))
    await asyncio.gather(*(write(f"writer{i}") for i in range(writers)))
    await fault_period
    await nemesis.heal()
    await asyncio.sleep(1.0)
    await _final_log_check(run, history, config)
    await asyncio.sleep(0.5)  # the reader catches up with the final log
    stop.set()
    await tailer


async def _open_log(run: _Run, bk: Any, name: str, config: LogConfig) -> Any:
    for _ in range(20):
        try:
            return await bk.open_log(name, config)
        except BKError as exc:
            run.trace(bk.sim_name, "open_log failed: %s", exc)
            await asyncio.sleep(0.02)
    return None


async def _final_log_check(run: _Run, history: LogHistory, config: LogConfig) -> None:
    log = await _open_log(run, run.cluster.client("checker"), history.name, config)
    if log is None:
        history.final_error = "the log could not be opened"
        return
    error = ""
    for _ in range(10):
        try:
            records = await log.read_all(fence=True)
        except BKError as exc:
            error = _why(exc)
            await asyncio.sleep(0.5)
            continue
        history.final = [(Position(*r.position), r.data) for r in records]
        run.trace("checker", "log %s holds %d records", history.name, len(records))
        return
    history.final_error = error


# ---------------------------------------------------------------- one run


@contextlib.contextmanager
def _quiet_logs(trace: Trace) -> Iterator[None]:
    """quorumlog's log lines go to the trace (with virtual time) or nowhere."""
    logger = logging.getLogger("quorumlog")
    saved = (logger.level, logger.propagate, list(logger.handlers))

    class ToTrace(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            trace("log", "%s %s: %s", record.levelname, record.name, record.getMessage())

    logger.handlers = [ToTrace()] if trace.enabled else []
    logger.propagate = False
    logger.setLevel(logging.INFO if trace.enabled else logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def _on_loop_error(run: _Run) -> Any:
    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if exc is None or isinstance(exc, PowerLoss | BKError | asyncio.CancelledError):
            return  # a dead process's leftovers, or an error a caller chose not to await
        where = context.get("message", "")
        run.history.system_errors.append(f"{where}: {_why(exc)}")
        run.trace("system", "UNEXPECTED %s: %s", where, _why(exc))

    return handler


async def _main(run: _Run) -> None:
    run.cluster = cluster = Cluster(
        run.loop, run.cluster_rng, network_faults=run.network_faults, trace=run.trace
    )
    await cluster.start()
    workload = run.rng.choice(WORKLOADS)
    run.history.workload = workload
    run.trace("run", "seed %d: %s workload", run.seed, workload)
    try:
        if workload == "ledger":
            await _ledger_workload(run)
        else:
            await _log_workload(run)
    finally:
        run.history.refused_starts += [
            f"{n.address} refused to start though its disk lost no synced byte: {n.start_error}"
            for n in cluster.nodes
            if n.state == "broken" and n.address not in _flipped(cluster)
        ]
        await cluster.close()


def _flipped(cluster: Cluster) -> set[str]:
    return {n.address for n in cluster.nodes if n.disk.bits_flipped}


def run_seed(seed: int, *, trace: bool = False) -> RunHistory:
    """One seeded run on a fresh virtual-time loop; never raises for what the system did."""
    loop = VirtualTimeLoop()
    tracer = Trace(loop, trace)
    run = _Run(seed, loop, tracer)
    loop.set_exception_handler(_on_loop_error(run))
    try:
        with _quiet_logs(tracer):
            loop.run_until_complete(asyncio.wait_for(_main(run), BUDGET_S))
    except TimeoutError:
        run.history.unfinished = f"the run did not finish within {BUDGET_S:.0f} virtual seconds"
    except Exception as exc:  # the system's exception, reported with its seed
        run.history.system_errors.append(f"the run raised {_why(exc)}")
    finally:
        _stop_everything(loop)
        loop.close()
    run.history.faults = dict(_counts(run))
    run.history.trace = tracer.lines
    return run.history


def _stop_everything(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left of the run (a zombie writer's tasks, parked reads)."""
    for _ in range(3):
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not tasks:
            break
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    with contextlib.suppress(Exception):
        loop.run_until_complete(loop.shutdown_asyncgens())


def _counts(run: _Run) -> dict[str, int]:
    if not hasattr(run, "cluster"):
        return {}
    nodes = run.cluster.nodes
    return {
        "crashes": sum(n.crashes for n in nodes),
        "restarts": sum(n.restarts for n in nodes),
        "power_losses": sum(n.disk.power_losses for n in nodes),
        "syncs_failed": sum(n.disk.syncs_failed for n in nodes),
        "bits_flipped": sum(n.disk.bits_flipped for n in nodes),
        "requests": run.cluster.network.requests_delivered,
    }
