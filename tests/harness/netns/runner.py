"""One nemesis run: start a workload's client processes in their namespaces, wait for
service, apply the nemesis for a bounded time, heal, wait for service to come back,
stop the clients, read everything back, check the history and keep it.

Each run keeps under ``<out>/<driver>/<nemesis>/``: ``history/<process>.jsonl`` (each
client's own), ``history.jsonl`` (all of them merged in time order), ``summary.json``,
and the clients' output (``logs/``).

Example::

    with NetnsCluster("zk", base_dir=out / "zk-cluster") as cluster:
        cluster.start()
        result = run_nemesis(cluster, SUITE["kill-bookie"], out / "zk")
        print(result.summary_line())
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.harness.netns.checker import (
    AppendReport,
    check_appends,
    longest_stall_ns,
    recovery_time_ns,
)
from tests.harness.netns.cluster import NetnsCluster
from tests.harness.netns.history import Operation, pair_operations, read_events
from tests.harness.netns.linearizability import (
    OrderedListAppendModel,
    check_linearizable,
    describe_results,
)
from tests.harness.netns.nemesis import (
    BookieFromZooKeeper,
    IsolateBookie,
    IsolateDbLeader,
    KillBookie,
    KillLeader,
    LeaderFromZooKeeper,
    Nemesis,
    OneWayLoss,
    PauseBookie,
    PauseDbLeader,
    PauseLeader,
    ProxyFaults,
    RunContext,
    WriterFromBookies,
    ZooKeeperMinority,
    registered_bookies,
)
from tests.harness.netns.proxy import LinkFaults

WORKLOAD_MODULE = "tests.harness.netns.workload"
SERVICE_BOUND_S = 30.0  # the workload's first acknowledgement, from its start
RECOVERY_BOUND_S = 20.0  # service back after healing: the checked bound
AFTER_RECOVERY_S = 0.5  # load kept after service came back
CLIENT_EXIT_BOUND_S = 30.0
FINAL_READ_BOUND_S = 60.0
REREGISTER_BOUND_S = 20.0
DB_NAME = "netns"


@dataclass(frozen=True)
class RunSpec:
    """A nemesis, the workload it runs against, and how long the fault holds."""

    nemesis: Nemesis
    workload: str  # "ledger", "log" or "db"
    fault_s: float = 2.0  # past the workloads' 1 s add timeout: ensemble changes happen
    warmup_s: float = 0.5
    workload_args: tuple[str, ...] = ()  # more arguments for every client of the run

    @property
    def name(self) -> str:
        return self.nemesis.name

    @property
    def drivers(self) -> tuple[str, ...]:
        return self.nemesis.drivers


SUITE_SPECS: tuple[RunSpec, ...] = (
    RunSpec(IsolateBookie(), "ledger"),
    RunSpec(WriterFromBookies(count=2), "ledger"),
    RunSpec(OneWayLoss(), "ledger"),
    RunSpec(ProxyFaults("latency", LinkFaults(delay_ms=30, jitter_ms=10)), "ledger"),
    RunSpec(ProxyFaults("loss", LinkFaults(loss_rate=0.2), count=2), "ledger"),
    RunSpec(ProxyFaults("reorder", LinkFaults(jitter_ms=40)), "ledger"),
    RunSpec(PauseBookie(), "ledger"),
    RunSpec(KillBookie(), "ledger"),
    RunSpec(PauseLeader(), "log", fault_s=2.5),  # past the 1 s election session
    RunSpec(KillLeader(), "log"),
    RunSpec(IsolateDbLeader(), "db", fault_s=3.0),
    RunSpec(PauseDbLeader(), "db", fault_s=3.0),
    # No rollover (which needs ZooKeeper) in this run: the cut-off leader keeps appending
    # to its bookies until the new leader fences its ledger.
    RunSpec(LeaderFromZooKeeper(), "log", fault_s=3.0, workload_args=("--rollover-bytes", "0")),
    RunSpec(ZooKeeperMinority(), "log", fault_s=3.0),
    RunSpec(BookieFromZooKeeper(), "ledger", fault_s=4.0),  # past the 2 s session
)
SUITE: dict[str, RunSpec] = {spec.name: spec for spec in SUITE_SPECS}


@dataclass
class RunResult:
    driver: str
    nemesis: str
    description: str
    mechanism: str
    workload: str
    operations: int = 0
    acknowledged: int = 0
    failed: int = 0
    unknown: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    divergent: int = 0
    real_time: int = 0
    fenced_acks: int = 0
    failed_present: int = 0
    linearizable: bool | None = None
    fault_s: float = 0.0
    recovery_s: float | None = None
    stall_s: float | None = None  # the longest time without an acknowledgement, fault to recovery
    run_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    directory: str = ""

    @property
    def valid(self) -> bool:
        return not self.problems

    def summary_line(self) -> str:
        recovered = "never" if self.recovery_s is None else f"{self.recovery_s:.2f} s"
        extra = "" if self.linearizable is None else f" linearizable={self.linearizable}"
        verdict = "valid" if self.valid else "INVALID: " + "; ".join(self.problems)
        notes = " ".join(f"{key}={value}" for key, value in sorted(self.notes.items()))
        return (
            f"{self.driver:6} {self.nemesis:32} [{self.mechanism}, {self.workload}] "
            f"ops {self.operations} ok {self.acknowledged} fail {self.failed} "
            f"unknown {self.unknown} lost {self.lost} dup {self.duplicated}{extra} "
            f"fault {self.fault_s:.1f} s stall {self.stall_s or 0:.2f} s "
            f"recovered in {recovered} ({self.run_s:.1f} s) "
            f"[{notes}] {verdict}"
        )


# ---------------------------------------------------------------- workloads


@dataclass
class _Workload:
    clients: dict[str, list[str]]  # process name -> workload arguments
    final: list[str]  # the final reader's arguments


def _workload(spec: RunSpec, cluster: NetnsCluster) -> _Workload:
    meta = ["--metadata", cluster.metadata_uri]
    if spec.workload == "ledger":
        return _Workload({"writer": ["ledger", *meta]}, ["final-ledger", *meta])
    if spec.workload == "log":
        log = ["--log", f"log-{spec.name}"]
        return _Workload(
            {
                "writer1": ["log-writer", *meta, *log],
                "writer2": ["log-writer", *meta, *log],
                "tail": ["log-tail", *meta, *log],
            },
            ["final-log", *meta, *log],
        )
    if spec.workload == "db":
        addresses = ",".join(cluster.db_address(r) for r in cluster.db_replicas)
        tagged = ["--addresses", addresses, "--tag", spec.name]
        return _Workload({"dbclient": ["db-client", *tagged]}, ["final-db", *tagged])
    raise ValueError(f"unknown workload {spec.workload!r}")


def ensure_db(cluster: NetnsCluster) -> None:
    """The database's replicas, started on first use, with a leader."""
    if not cluster.db_replicas:
        cluster.start_db(DB_NAME)
    _poll(lambda: cluster.db_leader() is not None, SERVICE_BOUND_S, "a database leader")


def _poll(condition: Callable[[], object], bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {bound_s} s")
        time.sleep(0.1)


def _operations(history_dir: Path) -> list[Operation]:
    return pair_operations(read_events(sorted(history_dir.glob("*.jsonl"))))


def _acknowledged_after(history_dir: Path, since_ns: int) -> bool:
    return any(
        op.ok and op.f == "append" and op.start_ns >= since_ns for op in _operations(history_dir)
    )


# ---------------------------------------------------------------- a run


def run_nemesis(cluster: NetnsCluster, spec: RunSpec, out_dir: Path) -> RunResult:
    """One run of ``spec`` on ``cluster``; the nemesis is healed whatever happens."""
    started = time.monotonic()
    run_dir = Path(out_dir) / spec.name
    history_dir = run_dir / "history"
    logs = run_dir / "logs"
    if run_dir.exists():  # histories append: two runs in one directory would mix
        raise FileExistsError(f"{run_dir} holds an earlier run: give another output directory")
    history_dir.mkdir(parents=True)
    stop_file = run_dir / "stop"
    result = RunResult(
        driver=cluster.driver,
        nemesis=spec.name,
        description=spec.nemesis.describe(),
        mechanism=spec.nemesis.mechanism,
        workload=spec.workload,
        directory=str(run_dir),
    )
    if spec.workload == "db":
        ensure_db(cluster)
    workload = _workload(spec, cluster)
    common = ["--history", str(history_dir), "--stop-file", str(stop_file), *spec.workload_args]
    clients = {name: cluster.client(name) for name in workload.clients}
    context = RunContext(cluster, history_dir, clients, processes={})
    try:
        for name, args in workload.clients.items():
            context.processes[name] = cluster.run_python(
                clients[name], WORKLOAD_MODULE, [*args, *common, "--process", name],
                log_dir=logs, name=name,
            )  # fmt: skip
        fault_ns, healed_ns = _fault_window(spec, context, result)
    finally:
        stop_file.touch()
        _stop_clients(spec, context, logs, result)
    _final_read(cluster, [*workload.final, *common, "--process", "final"], logs, result)
    _judge_run(spec, context, fault_ns, healed_ns, result)
    result.run_s = time.monotonic() - started
    _keep(run_dir, history_dir, result)
    return result


def _fault_window(spec: RunSpec, context: RunContext, result: RunResult) -> tuple[int, int]:
    """Wait for service, hold the fault, heal it (also when starting it fails), wait for
    service to come back; the monotonic times (ns) the fault started and was healed."""
    history_dir = context.history_dir
    _poll(
        lambda: _acknowledged_after(history_dir, 0),
        SERVICE_BOUND_S,
        "the workload's first acknowledged append",
    )
    time.sleep(spec.warmup_s)  # load before the fault: a window, not an assertion
    fault_ns = time.monotonic_ns()
    try:
        spec.nemesis.start(context)
        time.sleep(spec.fault_s)  # the fault holds: a window, not an assertion
    finally:
        spec.nemesis.heal(context)
        healed_ns = time.monotonic_ns()
    result.fault_s = (healed_ns - fault_ns) / 1e9
    try:
        _poll(
            lambda: _acknowledged_after(history_dir, healed_ns),
            RECOVERY_BOUND_S,
            "an append acknowledged after healing",
        )
    except TimeoutError as error:
        result.problems.append(str(error))
    time.sleep(AFTER_RECOVERY_S)
    if isinstance(spec.nemesis, BookieFromZooKeeper):
        _check_reregistered(context.cluster, context, result)
    return fault_ns, healed_ns


def _stop_clients(spec: RunSpec, context: RunContext, logs: Path, result: RunResult) -> None:
    """Wait for every client, told to stop, within the bound (killed past it); a client
    that did not exit cleanly is a problem, unless it is the leader kill-leader killed."""
    for name, process in context.processes.items():
        try:
            process.wait(timeout=CLIENT_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            result.problems.append(f"client {name} did not stop within the bound")
        killed = name == context.notes.get("target") and spec.nemesis.name == "kill-leader"
        if process.returncode != 0 and not killed:
            tail = (logs / f"{name}.err").read_text(errors="replace")[-1500:]
            result.problems.append(f"client {name} exited with {process.returncode}: {tail}")


def _final_read(cluster: NetnsCluster, args: list[str], logs: Path, result: RunResult) -> None:
    """The final reader, from a namespace of its own, within its bound."""
    final = cluster.run_python(
        cluster.client("checker"), WORKLOAD_MODULE, args, log_dir=logs, name="final"
    )
    try:
        final.wait(timeout=FINAL_READ_BOUND_S)
    except subprocess.TimeoutExpired:
        final.kill()
        final.wait(timeout=10)
    if final.returncode != 0:
        tail = (logs / "final.err").read_text(errors="replace")[-1500:]
        result.problems.append(f"the final read failed (status {final.returncode}): {tail}")


def _judge_run(
    spec: RunSpec, context: RunContext, fault_ns: int, healed_ns: int, result: RunResult
) -> None:
    """The history checked, and the recovery time and longest stall around the fault."""
    operations = _operations(context.history_dir)
    judge_history(spec.workload, operations, result)
    appends = [op for op in operations if op.f == "append"]
    recovery_ns = recovery_time_ns(appends, healed_ns)
    result.recovery_s = None if recovery_ns is None else recovery_ns / 1e9
    window_end_ns = healed_ns + (recovery_ns or 0)
    result.stall_s = longest_stall_ns(appends, fault_ns, window_end_ns) / 1e9
    result.notes.update({k: v for k, v in context.notes.items() if k != "ensemble"})


def _check_reregistered(cluster: NetnsCluster, context: RunContext, result: RunResult) -> None:
    """After its session expired in the partition, the bookie must register again."""
    address = str(context.notes["bookie"])
    checker = cluster.client("checker")
    deadline = time.monotonic() + REREGISTER_BOUND_S
    healed = time.monotonic()
    while True:
        try:
            listed = registered_bookies(cluster, checker)
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            listed = []
        if address in listed:
            result.notes["reregistered_s"] = round(time.monotonic() - healed, 2)
            return
        if time.monotonic() >= deadline:
            result.problems.append(
                f"bookie {address} not registered again within {REREGISTER_BOUND_S} s "
                f"of healing (registered: {listed})"
            )
            return
        time.sleep(0.5)


def _final_reads(operations: Sequence[Operation], f: str) -> dict[str, Any]:
    """reader name -> what it read, from the final readers' and tail readers' ops."""
    reads: dict[str, Any] = {}
    for op in operations:
        if op.f == f and op.ok and isinstance(op.result, dict):
            reads[str(op.result["reader"])] = op.result["values"]
    return reads


def judge_history(workload: str, operations: list[Operation], result: RunResult) -> None:
    """Check a run's operations (the clients' and the final readers') for ``workload``
    (``ledger``, ``log`` or ``db``), adding the counts and any problem to ``result``."""
    if workload == "db":
        _judge_db(operations, result)
        return
    reads = _final_reads(operations, "read")
    if "final" not in reads:
        result.problems.append("no final read")
        return
    final = reads.pop("final")
    session_of = None
    tails: list[str] = []
    if workload == "ledger":
        # Evidence that the faults bit: ledgers opened and fragments (ensembles) in them.
        result.notes["ledgers"] = sum(1 for op in operations if op.f == "create" and op.ok)
        for op in operations:
            if op.f == "read" and op.ok and isinstance(op.result, dict):
                result.notes["fragments"] = op.result.get("fragments", 0)
    if workload == "log":
        session_of = {value: value.rsplit(".", 1)[0] for value in final}
        result.notes["writer_sessions"] = len(set(session_of.values()))
        tails = [name for name in reads if name != "final-2"]
    report = check_appends(operations, final, reads, prefix_readers=tails, session_of=session_of)
    _add_report(result, report)


def _add_report(result: RunResult, report: AppendReport) -> None:
    result.operations += report.operations
    result.acknowledged += report.acknowledged
    result.failed += report.failed
    result.unknown += report.unknown
    result.lost += len(report.lost)
    result.duplicated += len(report.duplicated)
    result.unexpected += len(report.unexpected)
    result.divergent += len(report.divergent)
    result.real_time += len(report.real_time)
    result.fenced_acks += len(report.fenced_acks)
    result.failed_present += len(report.failed_present)
    result.problems += report.problems()


def _judge_db(operations: list[Operation], result: RunResult) -> None:
    # The final reads of each key, in the order they were made: the database is live
    # (a write whose client gave up may still be on its way to the leader), so the
    # last read is the reference and an earlier one may lack only unknown outcomes.
    by_key: dict[str, dict[str, Any]] = {}
    for op in sorted(operations, key=lambda op: op.start_ns):
        if op.f == "final-read" and op.ok and isinstance(op.result, dict):
            by_key.setdefault(op.key, {})[str(op.result["reader"])] = op.result["values"]
    keys = sorted({op.key for op in operations if op.f == "append"})
    for key in keys:
        reads = by_key.get(key, {})
        if "final" not in reads:
            result.problems.append(f"no final read of {key}")
            continue
        *earlier, last = reads
        final = reads.pop(last)
        by_key[key]["final_order"] = final
        ops = [op for op in operations if op.key == key]
        report = check_appends(ops, final, reads, earlier_readers=earlier)
        _add_report(result, report)
    result.operations += sum(1 for op in operations if op.f == "read")
    # Strong reads, the final ones included, against a list per key whose order is the
    # one the final read found (see OrderedListAppendModel).
    model_ops = [_as_read(op) if op.f == "final-read" else op for op in operations]
    checked = {}
    for key in keys:
        order = by_key.get(key, {}).get("final_order", [])
        ops = [op for op in model_ops if op.key == key and op.f in ("append", "read")]
        checked[key] = check_linearizable(OrderedListAppendModel(order), ops)
    result.linearizable = all(r.linearizable for r in checked.values())
    result.problems += describe_results(checked)


def _as_read(op: Operation) -> Operation:
    values = op.result["values"] if isinstance(op.result, dict) else None
    return Operation(
        op.process, "read", op.key, None, op.op_id, op.start_ns, op.end_ns, op.completion, values
    )


def _keep(run_dir: Path, history_dir: Path, result: RunResult) -> None:
    events = read_events(sorted(history_dir.glob("*.jsonl")))
    with open(run_dir / "history.jsonl", "w", encoding="utf-8") as merged:
        for event in events:
            merged.write(event.to_json() + "\n")
    summary = {**asdict(result), "valid": result.valid}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def default_out_dir() -> Path:
    return (
        Path(os.environ.get("TMPDIR", "/tmp")) / f"quorumlog-netns-{time.strftime('%Y%m%d-%H%M%S')}"
    )
