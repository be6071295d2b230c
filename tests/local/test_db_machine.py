"""quorumlog db's pure parts: request parsing, the rewrite of non-deterministic SQL, and
the state machine's exactly-once application (a local SQLite file, no network)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
from support import poll_until_async

from quorumlog.db.machine import (
    BARRIER,
    EXECUTE,
    VERIFY,
    DbRecord,
    ReplicaDivergedError,
    StateMachine,
    StatementResult,
)
from quorumlog.db.replica import (
    NotLeaderError,
    Replica,
    ReplicaConfig,
    _Pending,
    snapshot_due,
)
from quorumlog.db.sql import (
    BadRequestError,
    Choices,
    Statement,
    parse_statements,
    rewrite_all_for_replay,
    rewrite_for_replay,
    several_statements_refusal,
    split_sql,
)
from quorumlog.log.errors import LogFencedError
from quorumlog.log.position import Position

if TYPE_CHECKING:
    from quorumlog.client.bookkeeper import BookKeeper
    from quorumlog.log.writer import LogWriter

FIXED = Choices(
    now=datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    random_int=lambda: 42,
    random_bytes=lambda n: b"\xab" * n,
)


def rewrite(sql: str) -> str:
    return rewrite_for_replay(Statement(sql), FIXED).sql


def test_parse_statements_positional_named_and_bad_shapes() -> None:
    parsed = parse_statements(["SELECT 1", ["SELECT ?", 1, "a", None], ["SELECT :x", {"x": 2.5}]])
    assert parsed == [
        Statement("SELECT 1", []),
        Statement("SELECT ?", [1, "a", None]),
        Statement("SELECT :x", {"x": 2.5}),
    ]
    for bad in ({}, [], [1], [["SELECT ?", {"a": {"b": 1}}]], [[]]):
        with pytest.raises(BadRequestError):
            parse_statements(bad)
    with pytest.raises(BadRequestError):
        parse_statements([["SELECT ?", 1 << 70]])


def test_rewrite_replaces_random_and_now_with_the_leaders_values() -> None:
    assert rewrite("INSERT INTO t VALUES (random())") == "INSERT INTO t VALUES ((42))"
    assert rewrite("INSERT INTO t VALUES (randomblob(2))") == "INSERT INTO t VALUES (X'abab')"
    # Past 1 MiB no literal is written: the replicas' keyed draws give all the bytes asked
    # (once, the literal was cut to 1 MiB without a word).
    big = "INSERT INTO t VALUES (randomblob(2000000))"
    assert rewrite(big) == big
    assert (
        rewrite("INSERT INTO t VALUES (datetime('now'), 'now')")
        == "INSERT INTO t VALUES (datetime('2026-01-02 03:04:05.678'), 'now')"
    )
    assert rewrite("INSERT INTO t VALUES (date())") == (
        "INSERT INTO t VALUES (date('2026-01-02 03:04:05.678'))"
    )
    assert rewrite("INSERT INTO t VALUES (CURRENT_TIMESTAMP)") == (
        "INSERT INTO t VALUES ('2026-01-02 03:04:05')"
    )
    # inside a string literal or a comment, nothing changes
    assert rewrite("INSERT INTO t VALUES ('random()') -- random()") == (
        "INSERT INTO t VALUES ('random()') -- random()"
    )
    # a computed size is left to every replica's randomblob(), drawn from the record
    assert rewrite("INSERT INTO t VALUES (randomblob(length('x')))") == (
        "INSERT INTO t VALUES (randomblob(length('x')))"
    )


@pytest.mark.parametrize(
    "sql",
    [
        "BEGIN",
        "commit",
        "ATTACH 'x.db' AS x",
        "CREATE TABLE t (a DEFAULT CURRENT_TIMESTAMP)",
        "CREATE TABLE t (a DEFAULT (random()))",
        "INSERT INTO t VALUES (last_insert_rowid())",
        "CREATE TABLE t (a DEFAULT (randomblob(length('x'))))",
        "DELETE FROM _quorumlog_applied",
    ],
)
def test_rewrite_refuses_what_cannot_replay(sql: str) -> None:
    with pytest.raises(BadRequestError):
        rewrite(sql)


@pytest.mark.parametrize(
    ("sql", "params", "reads"),
    [
        ("SELECT 1", [], True),
        ("  with x as (select 1) select * from x", [], True),
        ("SELECT * FROM t WHERE a = ?", [1], True),
        ("SELECT * FROM t WHERE a = :a", {"a": 1}, True),
        # words that looked like writes to a judge of words
        ("WITH c(n) AS (SELECT 1) SELECT replace('ab', 'a', 'b') FROM c", [], True),
        ('SELECT "update", "delete" FROM (SELECT 1 AS "update", 2 AS "delete")', [], True),
        ("PRAGMA table_info(t)", [], True),
        ("PRAGMA user_version", [], True),
        ("EXPLAIN QUERY PLAN SELECT * FROM t", [], True),
        # writes, whatever their first word
        ("INSERT INTO t VALUES (1)", [], False),
        ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", [], False),
        ("WITH x AS (SELECT 1) UPDATE t SET a = (SELECT * FROM x)", [], False),
        ("REPLACE INTO t VALUES (2)", [], False),
        ("PRAGMA user_version = 3", [], False),
        ("CREATE TABLE u (b)", [], False),
        ("EXPLAIN DELETE FROM t", [], False),  # as the statement explained
        ("VACUUM", [], False),
        ("SELECT 1; DELETE FROM t", [], False),  # several statements, one writing
        ("SELECT * FROM not_here_yet", [], False),  # not compiled here: the leader's
    ],
)
def test_read_only_is_sqlites_verdict_not_the_first_word(
    tmp_path: Path, sql: str, params: list[object] | dict[str, object], reads: bool
) -> None:
    machine = StateMachine(tmp_path / "r.sqlite")
    try:
        machine.apply(Position(1, 0), DbRecord(EXECUTE, (Statement("CREATE TABLE t (a)"),)))
        assert machine.read_only([Statement(sql, params)]) is reads  # type: ignore[arg-type]
        if reads:
            assert machine.read_only([Statement("SELECT 1"), Statement("DELETE FROM t")]) is False
    finally:
        machine.close()


def test_records_apply_exactly_once_and_failures_repeat_identically(tmp_path: Path) -> None:
    records = [
        DbRecord(EXECUTE, (Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"),)),
        DbRecord(
            EXECUTE,
            (
                Statement("INSERT INTO t(v) VALUES (?)", ["a"]),
                Statement("INSRT nonsense"),
                Statement("INSERT INTO t(v) VALUES (:v)", {"v": "b"}),
            ),
        ),
        DbRecord(BARRIER),
        DbRecord(  # a transaction whose second statement fails: nothing of it stays
            EXECUTE,
            (Statement("INSERT INTO t(v) VALUES ('c')"), Statement("INSERT INTO t(id) VALUES (1)")),
            transaction=True,
        ),
    ]
    machines = [StateMachine(tmp_path / f"r{i}.sqlite") for i in range(2)]
    answers = []
    for machine in machines:
        out = []
        for entry_id, record in enumerate(records):
            results = machine.apply(Position(7, entry_id), DbRecord.decode(record.encode()))
            assert results is not None
            out.append([(r.error, r.rows_affected) for r in results])
        answers.append(out)
    assert answers[0] == answers[1]
    assert "syntax error" in str(answers[0][1][1][0])
    assert answers[0][3][1][0] is not None and "UNIQUE" in answers[0][3][1][0]
    # applied again (a replica that restarted and reread the log): skipped
    assert machines[0].apply(Position(7, 1), records[1]) is None
    machines[0].close()
    reopened = StateMachine(tmp_path / "r0.sqlite")
    assert reopened.applied == Position(7, 3)
    assert reopened.apply(Position(7, 3), records[1]) is None
    assert reopened.query([Statement("SELECT v FROM t ORDER BY id")])[0].values == [["a"], ["b"]]
    assert reopened.query([Statement("INSERT INTO t(v) VALUES ('x')")])[0].error
    assert reopened.dump() == machines[1].dump()


DUPLICATE_A = Statement("INSERT INTO t(v) VALUES ('a')")


def _summary(results: list[StatementResult] | None) -> object:
    assert results is not None
    return [(r.error, r.rows_affected, r.last_insert_id, r.values) for r in results]


@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_records_applied_in_groups_give_what_applying_each_alone_gives(
    tmp_path: Path, group_size: int
) -> None:
    """Group commit changes nothing a replica can see: the file, each record's results
    and the stored position are those of applying the records one by one, including a
    statement whose conflict clause ends the whole transaction (OR ROLLBACK) in the
    middle of a group."""
    records = [
        DbRecord(EXECUTE, (Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"),)),
        DbRecord(EXECUTE, (Statement("INSERT INTO t(v) VALUES ('a')"),)),
        DbRecord(EXECUTE, (Statement("INSERT INTO t(v) VALUES ('b')"), Statement("nonsense"))),
        DbRecord(BARRIER),
        DbRecord(EXECUTE, (Statement("INSERT OR ROLLBACK INTO t(v) VALUES ('a')"),)),
        DbRecord(EXECUTE, (Statement("INSERT INTO t(v) VALUES ('c')"),)),
        DbRecord(EXECUTE, (Statement("INSERT INTO t(v) VALUES ('d')"), DUPLICATE_A), True),
        DbRecord(EXECUTE, (Statement("UPDATE t SET v = v || '!' WHERE v != 'a'"),)),
    ]
    positioned = [(Position(3, n), r) for n, r in enumerate(records)]
    alone = StateMachine(tmp_path / "alone.sqlite")
    expected = [_summary(alone.apply(p, r)) for p, r in positioned]
    grouped = StateMachine(tmp_path / "grouped.sqlite")
    got: list[object] = []
    for first in range(0, len(positioned), group_size):
        got += [_summary(r) for r in grouped.apply_group(positioned[first : first + group_size])]
    assert got == expected
    assert grouped.dump() == alone.dump()
    assert grouped.applied == alone.applied == Position(3, len(records) - 1)
    # A group that overlaps what was applied applies only the rest, once.
    again = grouped.apply_group([*positioned[-2:], (Position(4, 0), records[1])])
    assert again[:2] == [None, None] and again[2] is not None and again[2][0].error
    assert grouped.applied == Position(4, 0)
    assert grouped.query([Statement("SELECT v FROM t ORDER BY id")])[0].values == [
        ["a"],
        ["b!"],
        ["c!"],
    ]


ROW = "INSERT INTO t(v) VALUES (?)"


@pytest.mark.parametrize("group_size", [1, 4])
def test_records_applied_without_results_leave_the_file_applying_them_with_results_leaves(
    tmp_path: Path, group_size: int
) -> None:
    """A follower applies without results: runs of one INSERT text go to executemany.
    A failing statement in a run (a duplicate, a conflict clause ending the whole
    transaction, a wrong parameter count) rolls the run back and the record runs
    statement by statement: the file is the one the leader's way gives."""
    many = tuple(Statement(ROW, [f"r{n}"]) for n in range(50))
    records = [
        DbRecord(EXECUTE, (Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"),)),
        DbRecord(EXECUTE, many, True),
        DbRecord(EXECUTE, (*many[:3], Statement(ROW, ["x"]), Statement(ROW, ["r1"]))),
        DbRecord(
            EXECUTE, (Statement(ROW, ["y"]), Statement(ROW, ["r2"]), Statement(ROW, ["z"])), True
        ),
        DbRecord(EXECUTE, (Statement(ROW, ["w"]), Statement(ROW, [1, 2]), Statement(ROW, ["v"]))),
        DbRecord(BARRIER),
        DbRecord(
            EXECUTE,
            (Statement(ROW, ["u"]), Statement("INSERT OR ROLLBACK INTO t(v) VALUES ('r3')")),
        ),
        DbRecord(
            EXECUTE,
            (
                Statement(ROW, ["s"]),
                Statement("INSERT OR ROLLBACK INTO t(v) VALUES (?)", ["x"]),
                Statement("INSERT OR ROLLBACK INTO t(v) VALUES (?)", ["x2"]),
            ),
        ),
        DbRecord(
            EXECUTE,
            (
                Statement("UPDATE t SET v = ? WHERE id = ?", ["q", 1]),
                Statement("UPDATE t SET v = ? WHERE id = ?", ["q2", 2]),
            ),
        ),
        DbRecord(EXECUTE, tuple(Statement(ROW, [f"tail{n}"]) for n in range(5))),
    ]
    positioned = [(Position(5, n), r) for n, r in enumerate(records)]
    leader = StateMachine(tmp_path / "leader.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    for first in range(0, len(positioned), group_size):
        group = positioned[first : first + group_size]
        leader.apply_group(group)
        quiet = follower.apply_group(group, results_wanted=False)
        assert quiet == [[] for _ in group]
    assert follower.dump() == leader.dump()
    assert follower.applied == leader.applied == Position(5, len(records) - 1)
    count = follower.query([Statement("SELECT count(*) FROM t")])[0].values
    assert count is not None and cast(int, count[0][0]) > 50


def test_records_run_ahead_commit_as_applied_and_leave_nothing_when_abandoned(
    tmp_path: Path,
) -> None:
    """The leader runs its records while their appends are in flight: committed, the
    file and the results are those of applying them; abandoned (an append failed),
    nothing of them stays and readers never saw any; a conflict clause that ends the
    transaction gives None and leaves nothing, to be applied the ordinary way."""
    create = DbRecord(
        EXECUTE, (Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"),)
    )
    rows = DbRecord(EXECUTE, (Statement(ROW, ["a"]), Statement(ROW, ["a"]), Statement(ROW, ["b"])))
    records = [create, rows, DbRecord(BARRIER), DbRecord(EXECUTE, (Statement(ROW, ["c"]),), True)]
    positioned = [(Position(2, n), r) for n, r in enumerate(records)]
    applied = StateMachine(tmp_path / "applied.sqlite")
    expected = [_summary(r) for r in applied.apply_group(positioned)]
    ahead = StateMachine(tmp_path / "ahead.sqlite")
    results = ahead.execute_ahead(records)
    assert results is not None and [_summary(r) for r in results] == expected
    assert ahead.applied is None
    assert (
        ahead.query([Statement("SELECT name FROM sqlite_master WHERE name = 't'")])[0].values == []
    )
    ahead.commit_ahead([p for p, _ in positioned], records)
    assert ahead.applied == Position(2, 3) and ahead.dump() == applied.dump()
    more = DbRecord(EXECUTE, (Statement(ROW, ["d"]),))
    assert ahead.execute_ahead([more]) is not None
    ahead.abandon_ahead()
    assert ahead.dump() == applied.dump() and ahead.applied == Position(2, 3)
    ending = DbRecord(EXECUTE, (Statement("INSERT OR ROLLBACK INTO t(v) VALUES ('a')"),))
    assert ahead.execute_ahead([more, ending]) is None
    assert ahead.dump() == applied.dump()
    for_both = [(Position(2, 4), more), (Position(2, 5), ending)]
    assert [_summary(r) for r in ahead.apply_group(for_both)] == [
        _summary(r) for r in applied.apply_group(for_both)
    ]
    assert ahead.dump() == applied.dump() and ahead.applied == Position(2, 5)


def test_a_leader_whose_append_fails_mid_group_answers_the_confirmed_ones_and_keeps_only_them(
    tmp_path: Path,
) -> None:
    """The leader runs a group ahead of its appends. When one append is fenced, the
    records confirmed before it are applied and answered, it and every later one fail
    (not confirmed: maybe in the log), and nothing of them is left in the file; a group
    still waiting when the leader stops is rolled back and its requests fail."""
    replica = Replica(cast("BookKeeper", None), ReplicaConfig(name="t", data_dir=tmp_path))
    create = DbRecord(EXECUTE, (Statement("CREATE TABLE t (v TEXT)"),))

    def insert(value: str) -> DbRecord:
        return DbRecord(EXECUTE, (Statement("INSERT INTO t VALUES (?)", [value]),))

    async def run() -> tuple[list[object], list[object]]:
        loop = asyncio.get_running_loop()
        appended = [loop.create_future() for _ in range(4)]
        group = [
            _Pending(r, a, loop.create_future())
            for r, a in zip([create, insert("a"), insert("b"), insert("c")], appended, strict=True)
        ]
        replica._taking_writes = True
        replica._pending.extend(group)
        replica._pending_added.set()
        applier = asyncio.create_task(replica._apply_pending())
        await poll_until_async(  # the group runs ahead, its appends still in flight
            lambda: len(replica._in_flight) == 4, timeout_s=10, what="the group taken"
        )
        appended[0].set_result(Position(1, 0))
        appended[1].set_result(Position(1, 1))
        appended[2].set_exception(LogFencedError("fenced"))
        await applier
        first = await asyncio.gather(*(p.answer for p in group), return_exceptions=True)
        assert not replica.is_leader  # a fenced append ends taking writes
        # A group still in flight when leadership ends (the applier is cancelled).
        late = _Pending(insert("d"), loop.create_future(), loop.create_future())
        replica._taking_writes = True
        replica._pending.append(late)
        applier = asyncio.create_task(replica._apply_pending())
        await poll_until_async(lambda: replica._in_flight, timeout_s=10, what="the group taken")
        applier.cancel()
        await asyncio.gather(applier, return_exceptions=True)
        second = await asyncio.gather(late.answer, return_exceptions=True)
        late.appended.cancel()
        return list(first), list(second)

    first, second = asyncio.run(run())
    assert [a.position for a in first[:2]] == [Position(1, 0), Position(1, 1)]  # type: ignore[attr-defined]
    assert [type(a) for a in first[2:] + second] == [NotLeaderError] * 3
    assert replica.applied == Position(1, 1)
    assert not replica.machine._conn.in_transaction
    assert replica.query([Statement("SELECT v FROM t")])[0].values == [["a"]]
    replica.machine.close()


class _UnconfirmedWriter:
    """A log writer whose appends are confirmed only when the test says so."""

    def __init__(self) -> None:
        self.appends: list[asyncio.Future[Position]] = []

    def append_nowait(self, data: bytes) -> asyncio.Future[Position]:
        self.appends.append(asyncio.get_running_loop().create_future())
        return self.appends[-1]


def test_a_write_past_its_timeout_fails_its_caller_and_is_still_applied_in_its_turn(
    tmp_path: Path,
) -> None:
    """rqlite's ``timeout``: the caller gets TimeoutError (HTTP 503, outcome unknown);
    the record stays queued, and once confirmed it is applied like any other."""
    replica = Replica(cast("BookKeeper", None), ReplicaConfig(name="t", data_dir=tmp_path))
    writer = _UnconfirmedWriter()

    async def run() -> object:
        replica._writer = cast("LogWriter", writer)
        replica._taking_writes = True
        applier = asyncio.create_task(replica._apply_pending())
        create = [Statement("CREATE TABLE t (v TEXT)")]
        with pytest.raises(TimeoutError):
            await replica.execute(create, timeout_s=0.05)
        writer.appends[0].set_result(Position(1, 0))
        insert = asyncio.create_task(
            replica.execute([Statement("INSERT INTO t VALUES ('a')")], timeout_s=30)
        )
        await poll_until_async(
            lambda: len(writer.appends) == 2, timeout_s=10, what="the insert appended"
        )
        writer.appends[1].set_result(Position(1, 1))
        answer = await insert
        applier.cancel()
        await asyncio.gather(applier, return_exceptions=True)
        return answer.position

    assert asyncio.run(run()) == Position(1, 1)
    assert replica.applied == Position(1, 1)
    assert replica.query([Statement("SELECT v FROM t")])[0].values == [["a"]]
    replica.machine.close()


def test_records_logged_by_the_json_encoder_replay_and_non_finite_floats_survive() -> None:
    """Records are JSON (the change stream's format). Those written before orjson (by
    json.dumps, which writes NaN/Infinity and escapes lone surrogates) decode as they
    did; a non-finite float parameter is still logged as itself, not as null."""
    old = (
        b'{"v":1,"kind":"execute","tx":true,"stmts":[["INSERT INTO t VALUES (?, ?, ?)",'
        b'[Infinity, "\\ud800", 1]],["INSERT INTO t VALUES (:a)",{"a":-Infinity}]]}'
    )
    decoded = DbRecord.decode(old)
    assert decoded.transaction and decoded.kind == EXECUTE
    assert decoded.statements[0].params == [float("inf"), "\ud800", 1]
    assert decoded.statements[1].params == {"a": float("-inf")}
    assert DbRecord.decode(DbRecord.encode(decoded)) == decoded
    assert b"Infinity" in decoded.encode()
    plain = DbRecord(EXECUTE, (Statement("INSERT INTO t VALUES (?)", ["é", 1.5, None]),))
    assert plain.encode() == (
        b'{"v":1,"kind":"execute","tx":false,'
        b'"stmts":[["INSERT INTO t VALUES (?)",["\xc3\xa9",1.5,null]]]}'
    )
    assert DbRecord.decode(plain.encode()) == plain
    assert DbRecord.decode(b'{"v":1,"kind":"barrier"}') == DbRecord(BARRIER)
    with pytest.raises(BadRequestError):
        DbRecord.decode(b"\x00not json")


def test_snapshot_due_on_whichever_trigger_comes_first() -> None:
    config = ReplicaConfig(
        "t", ".", snapshot_every_records=100, snapshot_every_bytes=1000, snapshot_every_s=60
    )
    assert not snapshot_due(config, records=99, size_bytes=999, elapsed_s=59)
    assert snapshot_due(config, records=100, size_bytes=0, elapsed_s=0)
    assert snapshot_due(config, records=1, size_bytes=1000, elapsed_s=0)
    assert snapshot_due(config, records=1, size_bytes=10, elapsed_s=60)
    # the time trigger only when something was applied since
    assert not snapshot_due(config, records=0, size_bytes=0, elapsed_s=3600)
    off = ReplicaConfig(
        "t", ".", snapshot_every_records=0, snapshot_every_bytes=0, snapshot_every_s=0
    )
    assert not snapshot_due(off, records=10**9, size_bytes=10**12, elapsed_s=10**6)


def test_a_database_named_name_is_the_log_db_slash_name(tmp_path: Path) -> None:
    replica = Replica(cast("BookKeeper", None), ReplicaConfig(name="t", data_dir=tmp_path))
    assert replica.log_name == "db/t"


# ---------------------------------------------------------------- D7: replicas compared

_D7_RECORDS = [
    DbRecord(EXECUTE, (Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"),)),
    # One INSERT text many times: a follower runs it with executemany.
    DbRecord(EXECUTE, tuple(Statement("INSERT INTO t(v) VALUES (?)", [v]) for v in "abcde")),
    # A statement that fails among others, and one in a transaction that fails.
    DbRecord(
        EXECUTE,
        (
            Statement("INSERT INTO t(v) VALUES ('f')"),
            Statement("INSERT INTO t(v) VALUES ('a')"),
            Statement("UPDATE t SET v = v || '!' WHERE v > 'c'"),
        ),
    ),
    DbRecord(
        EXECUTE,
        (Statement("DELETE FROM t WHERE v = 'b'"), Statement("INSERT INTO nope VALUES (1)")),
        True,
    ),
    DbRecord(BARRIER),
    DbRecord(EXECUTE, (Statement("DELETE FROM t WHERE v < 'c'"),)),
]


def _positioned(first_entry_id: int = 0) -> list[tuple[Position, DbRecord]]:
    return [(Position(3, first_entry_id + n), r) for n, r in enumerate(_D7_RECORDS)]


def test_d7_every_way_of_applying_a_record_gives_the_same_outcome(tmp_path: Path) -> None:
    """A leader runs records ahead with results, a follower applies them quietly (with
    executemany), one applied record by record: each keeps the same outcome of each."""
    positioned = _positioned()
    leader = StateMachine(tmp_path / "leader.sqlite")
    assert leader.execute_ahead([r for _, r in positioned]) is not None
    leader.commit_ahead([p for p, _ in positioned], [r for _, r in positioned])
    follower = StateMachine(tmp_path / "follower.sqlite")
    follower.apply_group(positioned, results_wanted=False)
    alone = StateMachine(tmp_path / "alone.sqlite")
    for position, record in positioned:
        alone.apply(position, record)
    outcomes = leader.unverified(None, 100)
    # Every write record has one (the barrier none), and they tell records apart.
    assert [p for p, _ in outcomes] == [p for p, r in positioned if r.kind == EXECUTE]
    assert len({d for _, d in outcomes}) == len(outcomes)
    assert follower.unverified(None, 100) == outcomes == alone.unverified(None, 100)
    assert leader.unverified(outcomes[1][0], 2) == outcomes[2:4]


def test_d7_a_replica_whose_file_differs_stops_at_the_first_record_it_applies_otherwise(
    tmp_path: Path,
) -> None:
    leader = StateMachine(tmp_path / "leader.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    positioned = _positioned()
    for machine in (leader, follower):
        machine.apply_group(positioned[:2], results_wanted=machine is leader)
    # The follower's file changes under it (a hand edit, a bug, a disk that lies).
    follower.close()
    with sqlite3.connect(tmp_path / "follower.sqlite") as raw:
        raw.execute("DELETE FROM t WHERE v = 'd'")
    follower = StateMachine(tmp_path / "follower.sqlite")
    leader.apply_group(positioned[2:])
    checks = tuple(leader.unverified(None, 100))
    verify = DbRecord.decode(DbRecord(VERIFY, checks=checks).encode())
    assert verify.checks == checks
    leader.apply(Position(3, 50), verify)
    assert leader.verified == checks[-1][0] and leader.unverified(None, 100) == []
    # The follower reads the records and the VERIFY at once: one group.
    with pytest.raises(ReplicaDivergedError) as raised:
        follower.apply_group([*positioned[2:], (Position(3, 50), verify)], results_wanted=False)
    # Records 0 and 1 agree (applied before the edit); record 2 updates one row fewer.
    assert "the record at 3:2 had another outcome" in str(raised.value)
    assert "verified by the record at 3:50" in str(raised.value)
    assert follower.applied == Position(3, 1)  # nothing of the group was kept


def test_d7_records_applied_before_a_restart_are_passed_over(tmp_path: Path) -> None:
    leader = StateMachine(tmp_path / "leader.sqlite")
    leader.apply_group(_positioned())
    follower = StateMachine(tmp_path / "follower.sqlite")
    follower.apply_group(_positioned())
    follower.close()
    follower = StateMachine(tmp_path / "follower.sqlite")  # nothing kept of them
    verify = DbRecord(VERIFY, checks=tuple(leader.unverified(None, 100)))
    follower.apply(Position(3, 50), verify)
    assert follower.verified is None and follower.applied == Position(3, 50)


def test_a_byte_array_parameter_binds_a_blob_and_anything_else_in_an_array_is_refused(
    tmp_path: Path,
) -> None:
    """rqlite's BLOB parameters: a JSON array of integers 0-255, positional or named. It is
    logged as the array (JSON has no bytes) and bound as a BLOB on every replica."""
    parsed = parse_statements(
        [
            ["INSERT INTO t VALUES (?, ?)", 1, [0, 1, 255]],
            ["INSERT INTO t VALUES (:k, :b)", {"k": 2, "b": []}],
        ]
    )
    assert parsed[0].params == [1, [0, 1, 255]] and parsed[1].params == {"k": 2, "b": []}
    for bad, named in (
        ([256], "statement 0 parameter 1"),
        ([-1], "statement 0 parameter 1"),
        ([1, "a"], "statement 0 parameter 1"),
        ([True], "statement 0 parameter 1"),
        ([1.5], "statement 0 parameter 1"),
        ([[1]], "statement 0 parameter 1"),
    ):
        with pytest.raises(BadRequestError, match=named) as refused:
            parse_statements([["SELECT ?", bad]])
        assert "0 to 255" in str(refused.value)
    with pytest.raises(BadRequestError, match="statement 0 parameter 'b'"):
        parse_statements([["SELECT :b", {"b": [300]}]])

    record = DbRecord(EXECUTE, (Statement("CREATE TABLE t (k INTEGER, b BLOB)"), *parsed, *parsed))
    replayed = DbRecord.decode(record.encode())
    assert replayed.statements == record.statements
    machine = StateMachine(tmp_path / "r.sqlite")
    try:
        results = machine.apply(Position(1, 0), replayed)
        assert results is not None and [r.error for r in results] == [None] * 5
        rows = machine.query([Statement("SELECT k, b, typeof(b) FROM t ORDER BY rowid")])
        assert rows[0].values == [[1, b"\x00\x01\xff", "blob"], [2, b"", "blob"]] * 2
        found = machine.query([Statement("SELECT k FROM t WHERE b = ?", [[0, 1, 255]])])
        assert found[0].error is None and found[0].values == [[1], [1]]
    finally:
        machine.close()


def test_with_insert_and_update_report_rows_affected_and_last_insert_id(tmp_path: Path) -> None:
    """Python's sqlite3 counts rows only for statements whose first word is INSERT,
    UPDATE, DELETE or REPLACE; a WITH ... INSERT changes rows all the same."""
    machine = StateMachine(tmp_path / "r.sqlite")
    try:
        statements = (
            Statement("CREATE TABLE t (id INTEGER PRIMARY KEY, v)"),
            Statement(
                "WITH n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 3) "
                "INSERT INTO t(v) SELECT x FROM n"
            ),
            Statement(
                "WITH m(k) AS (SELECT 2) UPDATE t SET v = v * 10 WHERE v >= (SELECT k FROM m)"
            ),
            Statement("WITH m(k) AS (SELECT 1) DELETE FROM t WHERE v = (SELECT k FROM m)"),
            Statement("WITH m(k) AS (SELECT 1) SELECT count(*) FROM t, m"),
            Statement("WITH m(k) AS (SELECT 7) INSERT INTO t(v) SELECT k FROM m RETURNING id"),
        )
        results = machine.apply(Position(1, 0), DbRecord(EXECUTE, statements))
        assert results is not None
        assert [r.error for r in results] == [None] * 6
        assert [r.rows_affected for r in results[1:4]] == [3, 2, 1]
        assert results[1].last_insert_id == 3
        assert results[2].last_insert_id is None  # an UPDATE inserts nothing
        assert results[4].rows_affected == 0 and results[4].values == [[2]]
        assert results[5].rows_affected == 1 and results[5].last_insert_id == 4
    finally:
        machine.close()


def test_several_statements_in_one_string_all_run_on_every_replica(tmp_path: Path) -> None:
    """rqlite runs every statement of a string; the string is one result (its last
    statement's), all or nothing; records logged before keep failing as they did."""
    several = (
        Statement("CREATE TABLE a (x); INSERT INTO a VALUES (1);\nINSERT INTO a VALUES (2); "),
        Statement("INSERT INTO a VALUES (:v); UPDATE a SET x = x * 10 WHERE x < :v", {"v": 3}),
        Statement("INSERT INTO a VALUES (4); INSERT INTO nowhere VALUES (5)"),
        Statement(
            "CREATE TRIGGER tr AFTER INSERT ON a BEGIN UPDATE a SET x = x + 1 WHERE x = 6; END;"
            " INSERT INTO a VALUES (6)"
        ),
    )
    record = DbRecord.decode(DbRecord(EXECUTE, several, split=True).encode())
    assert record.split
    leader = StateMachine(tmp_path / "leader.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    old = StateMachine(tmp_path / "old.sqlite")
    try:
        results = leader.apply(Position(1, 0), record)
        assert results is not None
        assert [r.error for r in results[:2]] == [None, None]
        assert (results[0].rows_affected, results[0].last_insert_id) == (1, 2)
        assert results[1].rows_affected == 2 and results[1].last_insert_id is None
        assert results[2].error is not None and "nowhere" in results[2].error
        assert results[3].error is None
        assert follower.apply(Position(1, 0), record, results_wanted=False) == []
        # several reads in one string: the last one's rows
        (read,) = leader.query([Statement("SELECT count(*) FROM a; SELECT min(x) FROM a")])
        assert read.values == [[3]]
        assert leader.read_only([Statement("SELECT 1; SELECT x FROM a")])
        assert not leader.read_only([Statement("SELECT 1; DELETE FROM a")])
        assert leader.dump() == follower.dump()
        assert sorted(
            v for (v,) in leader.query([Statement("SELECT x FROM a")])[0].values or []
        ) == [
            3,
            7,
            10,
            20,
        ]
        # the same record logged without the mark: one statement at a time, as then
        unmarked = old.apply(Position(1, 0), DbRecord(EXECUTE, several))
        assert unmarked is not None
        assert all(r.error is not None for r in unmarked)
    finally:
        for machine in (leader, follower, old):
            machine.close()


def test_positional_parameters_with_several_statements_are_refused() -> None:
    assert several_statements_refusal(Statement("SELECT ?; SELECT ?", [1, 2]))
    assert not several_statements_refusal(Statement("SELECT :a; SELECT :a", {"a": 1}))
    assert not several_statements_refusal(Statement("SELECT ?;", [1]))
    assert split_sql("SELECT ';'; SELECT 2 -- ;") == ("SELECT ';';", " SELECT 2 -- ;")
    assert split_sql("SELECT 1;;SELECT 2") == ("SELECT 1;", "SELECT 2")


def test_query_types_are_the_columns_declared_types(tmp_path: Path) -> None:
    """rqlite's types are the declared types (pyrqlite picks converters by them): a
    column declared TEXT holding a number is still text; one without a declared type
    gets its values' storage class when they share one, else nothing."""
    from quorumlog.db.decltypes import available

    assert available()  # the SQLite Python links to is found in this process
    machine = StateMachine(tmp_path / "r.sqlite")
    try:
        machine.apply(
            Position(1, 0),
            DbRecord(
                EXECUTE,
                (
                    Statement("CREATE TABLE m (id INTEGER PRIMARY KEY, t TEXT, d DATETIME, x)"),
                    Statement("INSERT INTO m VALUES (1, 42, '2026-01-01', 1.5)"),
                    Statement("INSERT INTO m VALUES (2, 'a', 7, 'b')"),
                ),
            ),
        )
        (result,) = machine.query([Statement("SELECT id, t, d, x, count(*) OVER () AS n FROM m")])
        assert result.types == ["integer", "text", "datetime", "", "integer"]
        (result,) = machine.query([Statement("SELECT x, x || '' FROM m WHERE id = 1")])
        assert result.types == ["real", "text"]
        # rqlite's qualify_columns: a column read from a table is named table.column
        (result,) = machine.query(
            [Statement("SELECT a.id, b.t AS bt, 1 AS one FROM m a JOIN m b ON a.id = b.id")],
            qualify_columns=True,
        )
        assert result.columns == ["m.id", "m.bt", "one"]
        (result,) = machine.query(
            [Statement("SELECT 1; SELECT t AS renamed FROM m WHERE id = :i", {"i": 2})]
        )
        assert result.types == ["text"] and result.values == [["a"]]
        # a table made again with other types: the new schema's
        machine.apply(
            Position(1, 1),
            DbRecord(
                EXECUTE,
                (Statement("DROP TABLE m"), Statement("CREATE TABLE m (id BLOB, t REAL)")),
            ),
        )
        (result,) = machine.query([Statement("SELECT id, t FROM m")])
        assert result.types == ["blob", "real"]
    finally:
        machine.close()


def test_db_timeout_stops_a_long_read(tmp_path: Path) -> None:
    """rqlite's db_timeout on reads: a statement running past it is stopped with that
    error (well before the read budget); a quick one is not."""
    machine = StateMachine(tmp_path / "r.sqlite")
    try:
        runaway = Statement(
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        )
        started = time.monotonic()
        quick, slow = machine.query([Statement("SELECT 1"), runaway], timeout_s=0.2)
        assert quick.values == [[1]] and quick.error is None
        assert slow.error is not None and "db_timeout of 0.2 s" in slow.error
        assert time.monotonic() - started < 1.5
        (again,) = machine.query([Statement("SELECT 2")])  # the next read has no bound
        assert again.values == [[2]]
    finally:
        machine.close()


def test_a_nul_before_a_semicolon_is_a_statements_error_not_a_crash(tmp_path: Path) -> None:
    """``["SELECT 1\\u0000; SELECT 2"]`` answered 500: splitting the string asked SQLite
    whether a piece with a NUL was complete, which raises. It splits, and the piece with
    the NUL fails as a statement, alike on every replica."""
    assert split_sql("SELECT 1\0; SELECT 2") == ("SELECT 1\0;", " SELECT 2")
    statement = Statement("CREATE TABLE n (x); INSERT INTO n VALUES (1)\0; SELECT 2")
    record = DbRecord.decode(DbRecord(EXECUTE, (statement,), split=True).encode())
    leader = StateMachine(tmp_path / "leader.sqlite")
    follower = StateMachine(tmp_path / "follower.sqlite")
    try:
        (result,) = leader.apply(Position(1, 0), record) or []
        assert result.error is not None and "null character" in result.error
        assert follower.apply(Position(1, 0), record, results_wanted=False) == []
        assert leader.dump() == follower.dump()
    finally:
        leader.close()
        follower.close()


def test_a_rowid_sqlite_chooses_at_random_is_the_same_on_every_replica(tmp_path: Path) -> None:
    """Once a table holds rowid 9223372036854775807, SQLite picks a new row's rowid at
    random, from its own generator: each replica picked another, and nothing noticed
    (the outcomes compared count rows, not rowids). Seeded per statement from the
    record, the generator picks the same rowid everywhere."""
    records = [
        DbRecord(
            EXECUTE,
            (
                Statement("CREATE TABLE r (v)"),
                Statement("INSERT INTO r (rowid, v) VALUES (9223372036854775807, 'max')"),
            ),
            now_ms=1,
            seed=7,
        ),
        DbRecord(EXECUTE, (Statement("INSERT INTO r (v) VALUES ('a')"),), now_ms=2, seed=8),
        DbRecord(EXECUTE, (Statement("INSERT INTO r (v) VALUES ('b')"),), now_ms=3, seed=9),
    ]
    machines = [StateMachine(tmp_path / f"{name}.sqlite") for name in ("a", "b", "c")]
    try:
        for n, machine in enumerate(machines):
            for entry_id, record in enumerate(records):
                machine.apply(Position(1, entry_id), DbRecord.decode(record.encode()))
                # A read drawing random numbers between records, as clients' reads do.
                machine.query([Statement(f"SELECT random() FROM r LIMIT {n + 1}")])
        rows = [m.query([Statement("SELECT rowid, v FROM r ORDER BY v")])[0] for m in machines]
        assert rows[0].values is not None and len(rows[0].values) == 3
        assert rows[0].values[0][0] not in (9223372036854775807, None)  # a random rowid
        assert all(r.values == rows[0].values for r in rows[1:]), [r.values for r in rows]
    finally:
        for machine in machines:
            machine.close()


def test_a_randomblob_past_a_mib_in_a_write_has_every_byte_asked(tmp_path: Path) -> None:
    statement = Statement("INSERT INTO b VALUES (randomblob(2000000))")
    (rewritten,) = rewrite_all_for_replay([statement], now=datetime(2026, 1, 2, tzinfo=UTC))
    records = [
        DbRecord(EXECUTE, (Statement("CREATE TABLE b (x)"),), now_ms=1, seed=4),
        DbRecord(EXECUTE, (rewritten,), now_ms=2, seed=5),
    ]
    machines = [StateMachine(tmp_path / f"{n}.sqlite") for n in ("a", "b")]
    try:
        for machine in machines:
            for entry_id, record in enumerate(records):
                (result,) = machine.apply(Position(1, entry_id), record) or [None]
                assert result is not None and result.error is None, result
        query = [Statement("SELECT length(x), hex(substr(x, -4)) FROM b")]
        reads = [m.query(query)[0].values for m in machines]
        assert reads[0] == reads[1] and reads[0] is not None and reads[0][0][0] == 2000000
    finally:
        for machine in machines:
            machine.close()


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("ATTACH 'x.db' AS x", "reaches files outside the replica"),
        ("detach x", "reaches files outside the replica"),
        ("VACUUM", "rewrites one replica's file"),
        ("BEGIN", "ask for one with the 'transaction' parameter"),
    ],
)
def test_a_refused_first_word_says_why_it_is_refused(sql: str, reason: str) -> None:
    """ATTACH, DETACH and VACUUM were answered that each request runs in a transaction
    of its own, which has nothing to do with them."""
    with pytest.raises(BadRequestError, match=reason) as refused:
        rewrite(sql)
    if "transaction" not in reason:
        assert "transaction" not in refused.value.message
