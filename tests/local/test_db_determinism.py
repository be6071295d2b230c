"""quorumlog db, R19: a record does the same on every replica, whatever its statements.

Each test applies the same log records to several state machines (SQLite files, no
network) that differ only in their history: the leader's way (results, run ahead of
the log), a follower's (groups, ``executemany``), a replica that restarted in the
middle, one that replays everything from the start. Their files must end equal, and a
statement's error must be a result there, never a reason to stop. Only a fault of a
replica's own disk stops it, and only it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from quorumlog.db.machine import (
    EXECUTE,
    DbRecord,
    ReplicaStorageError,
    StateMachine,
    StatementResult,
)
from quorumlog.db.replica import Replica, ReplicaConfig
from quorumlog.db.sql import Statement
from quorumlog.log.position import Position

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.log.writer import LogWriter

# 2026-01-02 03:04:05.678 UTC, the leader's clock as a record carries it.
NOW_MS = 1_767_323_045_678
SEED = 1234567


def record(*statements: str | tuple[str, list[Any]], tx: bool = False, **fields: Any) -> DbRecord:
    """A record as the log holds it (JSON), with the leader's fields (``now``, ``seed``,
    ``steps``) where given."""
    stmts = [[s, []] if isinstance(s, str) else [s[0], s[1]] for s in statements]
    body = {"v": 1, "kind": EXECUTE, "tx": tx, "stmts": stmts, **fields}
    return DbRecord.decode(json.dumps(body).encode())


def apply_one_by_one(
    machine: StateMachine, records: Sequence[DbRecord], first: int = 0, ledger: int = 9
) -> list[list[StatementResult] | None]:
    """The leader's way: each record alone, with results."""
    return [machine.apply(Position(ledger, first + n), r) for n, r in enumerate(records)]


def apply_as_follower(
    machine: StateMachine, records: Sequence[DbRecord], first: int = 0, ledger: int = 9
) -> None:
    """A follower's way: every record in one group, no results (executemany)."""
    positioned = [(Position(ledger, first + n), r) for n, r in enumerate(records)]
    machine.apply_group(positioned, results_wanted=False)


def errors(results: list[StatementResult] | None) -> list[str | None]:
    assert results is not None
    return [r.error for r in results]


def values(machine: StateMachine, sql: str) -> list[list[object]]:
    result = machine.query([Statement(sql)])[0]
    assert result.error is None, result.error
    return result.values or []


# ---------------------------------------------------------------- D1: poison records

POISON = [
    record(
        "CREATE TABLE ai(id INTEGER PRIMARY KEY AUTOINCREMENT, x)",
        "INSERT INTO ai VALUES(9223372036854775807, 1)",
    ),
    record("INSERT INTO ai(x) VALUES(2)"),  # SQLITE_FULL: the AUTOINCREMENT counter is used up
    record("INSERT INTO ai(id, x) VALUES(5, 5)", "INSERT INTO ai(x) VALUES(6)"),
    record("PRAGMA wal_checkpoint(TRUNCATE)"),  # SQLITE_LOCKED inside the record's transaction
    record("PRAGMA query_only=1"),  # would make every later write SQLITE_READONLY
    record("INSERT INTO ai(id, x) VALUES(1, 3)"),
    record("PRAGMA max_page_count=1"),  # would make every later write SQLITE_FULL
    record("CREATE TABLE big(x)", "INSERT INTO big VALUES (zeroblob(100000))"),
]


def test_r19_statements_failing_with_disk_error_codes_are_results_on_every_replica(
    tmp_path: Path,
) -> None:
    """Statements that make SQLite answer codes a failing disk also gives (SQLITE_FULL,
    SQLITE_LOCKED, SQLITE_READONLY) are logged before anyone runs them: each replica
    records the error as that statement's result and goes on; none stops, a restart
    replays them without stopping, and every file ends the same."""
    leader = StateMachine(tmp_path / "leader.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    answers = apply_one_by_one(leader, POISON)
    apply_as_follower(follower, POISON)
    assert "full" in str(errors(answers[1])[0])
    assert errors(answers[2])[0] is None and "full" in str(errors(answers[2])[1])
    assert errors(answers[3])[0] is not None  # refused: SQLite's checkpoint is not the record's
    assert errors(answers[4])[0] is not None and errors(answers[6])[0] is not None
    assert errors(answers[5]) == [None] and errors(answers[7]) == [None, None]
    assert leader.applied == follower.applied == Position(9, len(POISON) - 1)
    assert follower.dump() == leader.dump()
    # Restarted, and replayed from the start: the same file, nobody stops.
    leader.close()
    restarted = StateMachine(tmp_path / "leader.sqlite")
    more = [record("INSERT INTO ai(id, x) VALUES(2, 4)")]
    apply_one_by_one(restarted, more, first=len(POISON))
    apply_as_follower(follower, more, first=len(POISON))
    replayed = StateMachine(tmp_path / "replayed.sqlite")
    apply_as_follower(replayed, [*POISON, *more])
    assert restarted.dump() == follower.dump() == replayed.dump()
    assert values(restarted, "SELECT id, x FROM ai ORDER BY id") == [
        [1, 3],
        [2, 4],
        [5, 5],
        [9223372036854775807, 1],
    ]


def test_r19_a_disk_fault_stops_its_replica_only_and_the_record_applies_once_repaired(
    tmp_path: Path,
) -> None:
    """The same SQLITE_FULL on a replica whose disk is at fault (the probe after the
    error finds it so) stops that replica, and only it: the others record the error.
    Once the disk is repaired, the stopped replica applies the record as they did."""
    healthy = StateMachine(tmp_path / "healthy.sqlite")
    faulty = StateMachine(tmp_path / "faulty.sqlite")
    setup, full = POISON[0], POISON[1]
    for machine in (healthy, faulty):
        machine.apply(Position(9, 0), setup)
    faulty._disk_fault = lambda: "no space left on device (test)"  # type: ignore[method-assign]
    with pytest.raises(ReplicaStorageError, match="no space left"):
        faulty.apply(Position(9, 1), full)
    assert faulty.applied == Position(9, 0) and not faulty._conn.in_transaction
    assert "full" in str(errors(healthy.apply(Position(9, 1), full))[0])
    faulty.close()
    repaired = StateMachine(tmp_path / "faulty.sqlite")
    assert "full" in str(errors(repaired.apply(Position(9, 1), full))[0])
    assert repaired.dump() == healthy.dump()


# ---------------------------------------------------------------- D5: schema writes


def test_r19_schema_writes_and_dangerous_pragmas_are_refused(tmp_path: Path) -> None:
    """``PRAGMA writable_schema`` would let an UPDATE of sqlite_master rewrite the schema
    under the data on every replica; SQLite's authorizer refuses it (and a settable
    schema_version), whatever the spelling, and the file stays sound."""
    machine = StateMachine(tmp_path / "r.sqlite")
    answers = apply_one_by_one(
        machine,
        [
            record("CREATE TABLE t(a)", "INSERT INTO t VALUES (1)"),
            record("PRAGMA writable_schema=ON"),
            record("pragma main.WRITABLE_SCHEMA = 1"),
            record("UPDATE sqlite_master SET sql = 'CREATE TABLE t(a, b, c)' WHERE name = 't'"),
            record(
                "PRAGMA writable_schema=1",
                "UPDATE sqlite_schema SET rootpage = 99 WHERE name = 't'",
                tx=True,
            ),
            record("PRAGMA schema_version=1"),
            # The schema's change counter is another number in a file rebuilt from a
            # snapshot: written into a table, it made the replicas differ unseen.
            record("INSERT INTO t SELECT schema_version FROM pragma_schema_version"),
            record("PRAGMA schema_version"),
            record("INSERT INTO t VALUES (2)"),
        ],
    )
    assert all(errors(a)[0] is not None for a in answers[1:8])
    assert "not authorized" in str(errors(answers[1])[0])
    assert "schema_version" in str(errors(answers[6])[0])
    assert errors(answers[8]) == [None]
    assert values(machine, "SELECT sql, rootpage > 1 FROM sqlite_master WHERE name = 't'") == [
        ["CREATE TABLE t(a)", 1]
    ]
    assert values(machine, "PRAGMA integrity_check") == [["ok"]]
    assert values(machine, "SELECT a FROM t ORDER BY a") == [[1], [2]]


# ---------------------------------------------------------------- D4: connection state


CONNECTION_STATE = [
    record(
        "CREATE TABLE words(w TEXT)",
        "INSERT INTO words VALUES ('Apple'), ('apple')",
        "CREATE TABLE hits(w TEXT)",
    ),
    record("PRAGMA case_sensitive_like=ON"),
    record("PRAGMA recursive_triggers = true"),
    record("CREATE TEMP TABLE scratch(x)"),
    record("CREATE TABLE temp.scratch2(x)"),
    record("CREATE TEMP VIEW v AS SELECT 1"),
    # a restart falls here on one replica
    record("INSERT INTO hits SELECT w FROM words WHERE w LIKE 'a%'"),
    record("INSERT INTO hits SELECT 'scratch' FROM scratch"),
    record("INSERT INTO hits SELECT 'scratch2' FROM temp.scratch2"),
]


def test_r19_connection_state_is_refused_so_a_restart_splits_no_replicas(tmp_path: Path) -> None:
    """Pragmas and temporary objects live in one replica's SQLite connection, not in its
    file: a replica that restarts loses them while the others keep them. Refused
    (the authorizer), they leave every replica the same, restarted or not."""
    steady = StateMachine(tmp_path / "steady.sqlite")
    answers = apply_one_by_one(steady, CONNECTION_STATE)
    restarted = StateMachine(tmp_path / "restarted.sqlite")
    apply_as_follower(restarted, CONNECTION_STATE[:6])
    restarted.close()
    restarted = StateMachine(tmp_path / "restarted.sqlite")
    apply_as_follower(restarted, CONNECTION_STATE[6:], first=6)
    assert all("not authorized" in str(errors(a)[0]) for a in answers[1:6])
    assert restarted.dump() == steady.dump()
    assert values(steady, "SELECT w FROM hits ORDER BY w") == [["Apple"], ["apple"]]


# ---------------------------------------------------------------- D3: clock and randomness

ESCAPES = [
    ("INSERT INTO seen(what, v) VALUES ('quoted random', \"random\"())", []),
    ("INSERT INTO seen(what, v) VALUES ('bracketed random', [random]())", []),
    ("INSERT INTO seen(what, v) VALUES ('backquoted randomblob', `randomblob`(8))", []),
    (
        "INSERT INTO seen(what, v) VALUES ('blob of a computed size', randomblob(length('abcd')))",
        [],
    ),
    ("INSERT INTO seen(what, v) VALUES ('strftime, no time', strftime('%Y-%m-%d %H:%M:%f'))", []),
    (
        "INSERT INTO seen(what, v) VALUES ('now as a parameter', strftime('%Y-%m-%d %H:%M:%f', ?))",
        ["now"],
    ),
    ("INSERT INTO seen(what, v) VALUES ('now built', datetime('n' || 'ow'))", []),
    ("INSERT INTO seen(what, v) VALUES ('julianday', julianday(lower('NOW')))", []),
    ("INSERT INTO seen(what, v) VALUES ('unixepoch', unixepoch(upper('now')))", []),
    ("INSERT INTO seen(what, v) VALUES ('localtime', datetime(?, 'localtime'))", ["now"]),
    ("INSERT INTO seen(what) VALUES ('default')", []),
    (
        "INSERT INTO seen(what, v) SELECT 'rows', \"random\"() FROM (SELECT 1 UNION ALL SELECT 2)",
        [],
    ),
]


class _ConfirmingWriter:
    """A log writer that confirms every append at once and keeps the records."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def append_nowait(self, data: bytes) -> asyncio.Future[Position]:
        self.records.append(data)
        future = asyncio.get_running_loop().create_future()
        future.set_result(Position(1, len(self.records) - 1))
        return future


def _leader(tmp_path: Path, **config: Any) -> tuple[Replica, _ConfirmingWriter]:
    replica = Replica(
        cast("BookKeeper", None), ReplicaConfig(name="t", data_dir=tmp_path / "leader", **config)
    )
    writer = _ConfirmingWriter()
    replica._writer = cast("LogWriter", writer)
    replica._taking_writes = True
    return replica, writer


async def _with_applier(replica: Replica, requests: Sequence[Any]) -> list[Any]:
    """Run ``requests`` (coroutine functions of the replica) with the leader's applier."""
    applier = asyncio.create_task(replica._apply_pending())
    try:
        return [await request() for request in requests]
    finally:
        applier.cancel()
        await asyncio.gather(applier, return_exceptions=True)


def _stamp_of(data: bytes) -> str:
    """The leader's clock of a logged record, as SQLite writes a time with milliseconds."""
    now_ms = json.loads(data)["now"]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now_ms // 1000))
    return f"{stamp}.{now_ms % 1000:03d}"


def test_r19_random_and_clock_functions_give_every_replica_the_leaders_values(
    tmp_path: Path,
) -> None:
    """Spellings the leader's text rewrite does not see (quoted names, a computed 'now',
    'now' as a parameter, a default, one value per row) are computed by the functions
    themselves from the record (the leader's clock and seed): a follower applying the
    record later, and a replica replaying it, store what the leader stored."""
    leader, writer = _leader(tmp_path)
    create = [
        Statement(
            "CREATE TABLE seen (what TEXT, v, at TEXT DEFAULT (strftime('%Y-%m-%d %H:%M:%f')))"
        )
    ]
    requests = [lambda: leader.execute(create)]
    requests += [
        (lambda sql=sql, params=params: leader.execute([Statement(sql, params)]))
        for sql, params in ESCAPES
    ]
    answers = asyncio.run(_with_applier(leader, requests))
    assert all(r.error is None for a in answers for r in a.results), answers
    time.sleep(0.02)  # the followers apply later: their clocks have moved on
    records = [DbRecord.decode(data) for data in writer.records]
    follower = StateMachine(tmp_path / "follower.sqlite")
    apply_as_follower(follower, records, ledger=1)
    one_by_one = StateMachine(tmp_path / "one_by_one.sqlite")
    apply_one_by_one(one_by_one, records, ledger=1)
    assert follower.dump() == one_by_one.dump() == leader.machine.dump()
    seen = dict(values(follower, "SELECT what, v FROM seen WHERE what != 'rows'"))
    assert seen["strftime, no time"] == _stamp_of(writer.records[5])
    assert seen["now as a parameter"] == _stamp_of(writer.records[6])
    assert seen["localtime"] == _stamp_of(writer.records[10])[:19]  # replicas compute in UTC
    rows = values(follower, "SELECT v FROM seen WHERE what = 'rows'")
    assert len(rows) == 2 and rows[0] != rows[1]


# ---------------------------------------------------------------- D2: runaway statements

BUDGET = 200_000  # SQLite VM steps a statement may take, as the leader set it
RUNAWAY_READ = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
)
RUNAWAY_WRITE = (
    "INSERT INTO t(v) SELECT x FROM (WITH RECURSIVE c(x) AS "
    "(SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000000) SELECT x FROM c)"
)


def test_r19_a_runaway_statement_is_stopped_by_its_budget_the_same_on_every_replica(
    tmp_path: Path,
) -> None:
    """Every statement runs within a budget of SQLite VM steps (the record's); one over
    it fails with that as its result, everywhere, and the statements around it keep
    their effects, on the leader and on a follower alike."""
    fields = {"now": NOW_MS, "seed": SEED, "steps": BUDGET}
    records = [
        record("CREATE TABLE t(id INTEGER PRIMARY KEY, v)", **fields),
        record(
            "INSERT INTO t(v) VALUES ('before')",
            RUNAWAY_READ,
            "INSERT INTO t(v) VALUES ('after')",
            **fields,
        ),
        record(
            "INSERT INTO t(v) VALUES ('w1')",
            RUNAWAY_WRITE,
            "INSERT INTO t(v) VALUES ('w2')",
            **fields,
        ),
        record("INSERT INTO t(v) VALUES ('tx')", RUNAWAY_WRITE, tx=True, **fields),
        record("INSERT INTO t(v) VALUES ('last')", **fields),
    ]
    leader = StateMachine(tmp_path / "leader.sqlite")
    started = time.monotonic()
    answers = apply_one_by_one(leader, records)
    assert time.monotonic() - started < 30
    assert [e is None for e in errors(answers[1])] == [True, False, True]
    assert "budget" in str(errors(answers[1])[1])
    assert [e is None for e in errors(answers[2])] == [True, False, True]
    assert errors(answers[3])[1] is not None
    follower = StateMachine(tmp_path / "follower.sqlite")
    apply_as_follower(follower, records)
    assert follower.dump() == leader.dump()
    assert values(leader, "SELECT v FROM t ORDER BY id") == [
        ["before"],
        ["after"],
        ["w1"],
        ["w2"],
        ["last"],
    ]


COUNT_TO = (
    "INSERT INTO t(v) SELECT count(*) FROM "
    "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < ?) SELECT x FROM c)"
)


def test_r19_a_budget_verdict_does_not_depend_on_the_replicas_history(tmp_path: Path) -> None:
    """Statements whose cost is right around the budget get the same verdict on a fresh
    replica, on one that ran the same statement text many times before, and on a
    follower applying them in groups."""
    fields = {"now": NOW_MS, "seed": SEED, "steps": BUDGET}
    create = record("CREATE TABLE t(id INTEGER PRIMARY KEY, v)", **fields)
    sweep = [record((COUNT_TO, [n]), **fields) for n in range(3_000, 12_000, 53)]
    fresh = StateMachine(tmp_path / "fresh.sqlite")
    warm = StateMachine(tmp_path / "warm.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    apply_one_by_one(fresh, [create])
    # The warm one ran the same text (other values) 41 times first: any count kept by
    # SQLite's statement or by the connection would now differ from the fresh one's.
    warmup = [record((COUNT_TO, [n]), **fields) for n in range(1, 42)]
    apply_one_by_one(warm, [create, *warmup])
    apply_as_follower(follower, [create, *warmup])
    verdicts = [[e is None for e in errors(a)] for a in apply_one_by_one(fresh, sweep, first=100)]
    assert [True] in verdicts and [False] in verdicts  # the budget falls inside the sweep
    assert [
        [e is None for e in errors(a)] for a in apply_one_by_one(warm, sweep, first=100)
    ] == verdicts
    apply_as_follower(follower, sweep, first=100)
    stored = "SELECT v FROM t WHERE id > 41 ORDER BY id"
    assert (
        values(follower, stored)
        == values(warm, stored)
        == values(fresh, "SELECT v FROM t ORDER BY id")
    )


def test_r19_the_leader_runs_sqlite_off_its_event_loop(tmp_path: Path) -> None:
    """A long statement runs on the replica's SQLite thread: meanwhile its event loop
    keeps turning (appends, answers, the election's heartbeats)."""
    leader, _writer = _leader(tmp_path)
    long_write = Statement(
        "CREATE TABLE t AS SELECT count(*) AS n FROM (WITH RECURSIVE c(x) AS "
        "(SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 5000000) SELECT x FROM c)"
    )

    async def run() -> tuple[float, float]:
        longest = 0.0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal longest
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.monotonic()
                longest = max(longest, now - last)
                last = now

        ticking = asyncio.create_task(ticker())

        async def write() -> object:
            try:
                return await leader.execute([long_write])
            finally:
                done.set()

        started = time.monotonic()
        await _with_applier(leader, [write])
        await ticking
        return longest, time.monotonic() - started

    longest, took = asyncio.run(run())
    assert took > 0.2  # the statement was long enough to tell
    assert longest < took / 2, (longest, took)
    assert values(leader.machine, "SELECT n FROM t") == [[5000000]]


# ---------------------------------------------------------------- D6: long reads

LONG_READ = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 4000000) "
    "SELECT count(*) FROM c"
)


def test_a_long_read_does_not_hold_up_the_other_reads(tmp_path: Path) -> None:
    """Reads run on a small pool of read-only connections: short reads are answered
    while a long one runs."""
    replica = Replica(cast("BookKeeper", None), ReplicaConfig(name="t", data_dir=tmp_path))

    async def run() -> tuple[float, float]:
        started = time.monotonic()
        long_read = asyncio.create_task(replica.read([Statement(LONG_READ)]))
        await asyncio.sleep(0.05)  # the long read has started
        short = [await replica.read([Statement("SELECT 1")]) for _ in range(3)]
        shorts_done = time.monotonic() - started
        assert [r[0].values for r in short] == [[[1]]] * 3
        answer = await long_read
        assert answer[0].values == [[4000000]], answer
        return shorts_done, time.monotonic() - started

    shorts_done, long_done = asyncio.run(run())
    assert shorts_done < long_done / 2, (shorts_done, long_done)
    replica.machine.close()


def test_a_read_over_its_budget_is_stopped(tmp_path: Path) -> None:
    machine = StateMachine(tmp_path / "r.sqlite", read_steps=BUDGET)
    started = time.monotonic()
    over, fine = machine.query([Statement(RUNAWAY_READ), Statement("SELECT 2")])
    assert time.monotonic() - started < 10
    assert "budget" in str(over.error) and fine.values == [[2]]
    machine.close()


def test_db_serve_defaults_are_the_state_machines() -> None:
    from quorumlog.commands import db as command
    from quorumlog.db import machine

    assert command.DEFAULT_STATEMENT_STEPS == machine.DEFAULT_STATEMENT_STEPS
    assert command.DEFAULT_READERS == machine.DEFAULT_READERS
    assert command.DEFAULT_READ_STEPS == machine.DEFAULT_READ_STEPS
