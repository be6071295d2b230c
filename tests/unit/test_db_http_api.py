"""rqlite's HTTP API, parameter by parameter: the table in docs/DB.md walked row by row
(every refused parameter and endpoint answers 400 naming it; every implemented one
names tests that exist), and the HTTP layer's own behaviour (durations, levels,
freshness, output flags, /leader, /readyz, /nodes) over aiohttp's test server, with a
stand-in replica (the replication behind it is tested in tests/integration/test_db.py)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from support import run

from quorumlog.db.http import (
    _ACCEPTED_PARAMS,
    REFUSED_ENDPOINTS,
    REFUSED_PARAMS,
    DbHttpApi,
    parse_duration,
)
from quorumlog.db.machine import StatementResult
from quorumlog.db.replica import WriteAnswer
from quorumlog.db.sql import BadRequestError, Statement
from quorumlog.log.position import Position

_ROOT = Path(__file__).resolve().parents[2]
_DOC = _ROOT / "docs" / "DB.md"


def _table_rows() -> list[list[str]]:
    """The cells of each row of docs/DB.md's table of rqlite's parameters and endpoints."""
    text = _DOC.read_text()
    start = text.index("<!-- api-table -->")
    end = text.index("<!-- /api-table -->")
    rows = []
    for line in text[start:end].splitlines():
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| rqlite"):
            continue
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _test_names() -> set[str]:
    names: set[str] = set()
    for path in (_ROOT / "tests").rglob("test_*.py"):
        names.update(re.findall(r"^def (test_\w+)\(", path.read_text(), re.MULTILINE))
    return names


class StubReplica:
    """What the HTTP layer asks of a replica, with answers set by each test."""

    def __init__(self) -> None:
        self.config = SimpleNamespace(node_id="a", name="shop", http_addr="http://127.0.0.1:1")
        self.is_leader = True
        self.applied: Position | None = Position(7, 3)
        self.failure: str | None = None
        self.leads = True
        self.staleness: dict[bool, float | None] = {False: 0.0, True: 0.0}
        self.barrier_timeouts: list[float | None] = []
        self.write_timeouts: list[float | None] = []
        self.barrier_takes_s = 0.0
        self.read_timeouts: list[float | None] = []
        self.sync_timeouts: list[float] = []
        self.write_takes_s = 0.0
        self.writes_done = 0
        self.synced = True
        self.started = True

    async def members(self) -> list[tuple[str, str, bool]]:
        return [("a", "http://127.0.0.1:1", self.leads)]

    async def recorded_nodes(self) -> list[tuple[str, str]]:
        return [("a", "http://127.0.0.1:1")]

    async def read_only(self, statements: list[Statement]) -> bool:
        return all(s.sql.startswith("SELECT") for s in statements)

    async def read(
        self,
        statements: list[Statement],
        *,
        qualify_columns: bool = False,
        timeout_s: float | None = None,
    ) -> list[StatementResult]:
        self.read_timeouts.append(timeout_s)
        columns = ["t.b", "t.s"] if qualify_columns else ["b", "s"]
        return [
            StatementResult(columns=columns, types=["blob", "text"], values=[[b"\x01\xff", "x"]])
            for _ in statements
        ]

    async def execute(
        self, statements: list[Statement], *, transaction: bool, timeout_s: float | None = None
    ) -> WriteAnswer:
        if statements[0].sql == "BEGIN":  # refused before anything is logged
            raise BadRequestError("BEGIN is not allowed")
        self.write_timeouts.append(timeout_s)
        await asyncio.sleep(self.write_takes_s)
        self.writes_done += 1
        return WriteAnswer(Position(7, 4), [StatementResult(rows_affected=1, last_insert_id=1)])

    async def barrier(self, timeout_s: float | None = None) -> Position:
        self.barrier_timeouts.append(timeout_s)
        await asyncio.wait_for(asyncio.sleep(self.barrier_takes_s), timeout_s)
        return Position(7, 5)

    def staleness_s(self, *, strict: bool) -> float | None:
        return self.staleness[strict]

    async def wait_synced(self, timeout_s: float) -> bool:
        self.sync_timeouts.append(timeout_s)
        return self.synced


async def _ask(replica: StubReplica, requests: list[tuple[str, str, Any]]) -> list[tuple[int, Any]]:
    """(status, JSON or text) of each (method, path, body) asked of the API."""
    api = DbHttpApi(replica)  # type: ignore[arg-type]
    out = []
    async with TestClient(TestServer(api.app)) as client:
        for method, path, body in requests:
            kwargs: dict[str, Any] = {}
            if isinstance(body, str):
                kwargs = {"data": body, "headers": {"Content-Type": "text/plain"}}
            elif body is not None:
                kwargs = {"json": body}
            async with client.request(method, path, **kwargs) as answer:
                text = await answer.text()
                try:
                    out.append((answer.status, await answer.json(content_type=None)))
                except ValueError:
                    out.append((answer.status, text))
    return out


def test_db_api_table_every_refused_row_answers_400_naming_it() -> None:
    rows = _table_rows()
    refused_params: set[str] = set()
    refused_endpoints: set[str] = set()
    requests: list[tuple[str, str, Any]] = []
    names: list[str] = []
    for first, where, status, _tests in rows:
        if not status.startswith("refused (400)"):
            continue
        (name,) = _ticked(first)
        if " " in name:  # an endpoint: METHOD /path
            method, path = name.split(" ", 1)
            refused_endpoints.add(path)
            requests.append((method, path, None))
            names.append(path)
        else:
            refused_params.add(name)
            for path in _ticked(where):
                requests.append(("POST", f"{path}?{name}=1", ["SELECT 1"]))
                names.append(name)
    assert refused_params == set(REFUSED_PARAMS)
    assert refused_endpoints == set(REFUSED_ENDPOINTS)
    answers = run(_ask(StubReplica(), requests))
    wrong = [
        (request, answer)
        for request, name, answer in zip(requests, names, answers, strict=True)
        if answer[0] != 400 or name not in answer[1].get("error", "")
    ]
    assert wrong == []


def test_db_api_table_every_implemented_row_names_tests_that_exist() -> None:
    rows = _table_rows()
    tests = _test_names()
    implemented: set[str] = set()
    for first, _where, status, tested_by in rows:
        assert status.startswith(("implemented", "refused (400)")), first
        if status.startswith("refused"):
            continue
        named = _ticked(tested_by)
        assert named, f"{first}: no test named"
        assert set(named) <= tests, (first, set(named) - tests)
        implemented.update(n for n in _ticked(first) if " " not in n)
    # Every parameter an endpoint takes is in the table (min_position is this API's own).
    accepted = set().union(*_ACCEPTED_PARAMS.values()) - {"min_position"}
    assert accepted <= implemented, accepted - implemented


def test_db_api_unknown_parameters_are_400_naming_them() -> None:
    answers = run(
        _ask(
            StubReplica(),
            [
                ("GET", "/db/query?levl=strong&q=SELECT+1", None),
                ("POST", "/db/execute?level=strong", ["INSERT INTO t VALUES (1)"]),
                ("GET", "/status?verbose", None),
            ],
        )
    )
    assert [status for status, _ in answers] == [400, 400, 400]
    assert "levl" in answers[0][1]["error"] and "level" in answers[1][1]["error"]
    assert "verbose" in answers[2][1]["error"]


def test_parse_duration_go_style() -> None:
    assert parse_duration("2m") == 120
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1.5s") == 1.5
    assert parse_duration("500ms") == 0.5
    assert parse_duration("250us") == pytest.approx(0.00025)
    assert parse_duration("10") == 10  # a bare number: seconds
    for bad in ("", "2x", "m", "1m2", "s1", "2 m", "-"):
        with pytest.raises(BadRequestError):
            parse_duration(bad)


def test_db_http_levels_and_read_bounds() -> None:
    replica = StubReplica()
    replica.barrier_takes_s = 0.2
    answers = run(
        _ask(
            replica,
            [
                ("GET", "/db/query?level=auto&q=SELECT+1", None),
                ("GET", "/db/query?level=AUTO&q=SELECT+1", None),
                ("GET", "/db/query?level=strng&q=SELECT+1", None),
                ("GET", "/db/query?level=strong&timeout=2m&q=SELECT+1", None),
                ("GET", "/db/query?level=linearizable&linearizable_timeout=50ms&q=SELECT+1", None),
                ("GET", "/db/query?level=linearizable&linearizable_timeout=1s&q=SELECT+1", None),
                ("GET", "/db/query?level=strong&timeout=soon&q=SELECT+1", None),
                ("POST", "/db/execute?timeout=2m", ["INSERT INTO t VALUES (1)"]),
                ("POST", "/db/execute?timeout=1h30m", ["INSERT INTO t VALUES (1)"]),
                ("POST", "/db/execute?timeout=0s", ["INSERT INTO t VALUES (1)"]),
                ("GET", "/db/query?db_timeout=2s&q=SELECT+1", None),
                ("POST", "/db/request?db_timeout=2s", ["INSERT INTO t VALUES (1)"]),
            ],
        )
    )
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 400, 200, 503, 200, 400, 200, 200, 400, 200, 400], answers
    assert "db_timeout" in answers[11][1]["error"]
    assert replica.read_timeouts[-1] == 2.0
    assert "strng" in answers[2][1]["error"]
    assert "timeout" in answers[6][1]["error"] and "timeout" in answers[9][1]["error"]
    assert replica.barrier_timeouts == [120.0, 0.05, 1.0]  # auto is weak: no barrier
    assert replica.write_timeouts == [120.0, 5400.0]


def test_db_http_freshness() -> None:
    replica = StubReplica()
    replica.is_leader = False
    replica.staleness = {False: 0.4, True: 3.0}
    query = "/db/query?level=none&q=SELECT+1"
    answers = run(
        _ask(
            replica,
            [
                ("GET", query, None),  # no freshness asked: served
                ("GET", f"{query}&freshness=1s", None),  # in contact 0.4 s ago
                ("GET", f"{query}&freshness=100ms", None),
                ("GET", f"{query}&freshness=1s&freshness_strict", None),  # held all 3 s ago
                ("GET", f"{query}&freshness=5s&freshness_strict", None),
                ("GET", f"{query}&freshness_strict", None),  # strict without a bound
                ("GET", f"{query}&freshness=fresh", None),
            ],
        )
    )
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 503, 503, 200, 400, 400], answers
    assert "stale read" in answers[2][1]["error"] and "stale read" in answers[3][1]["error"]
    replica.staleness = {False: None, True: None}  # never in contact
    (answer,) = run(_ask(replica, [("GET", f"{query}&freshness=1h", None)]))
    assert answer[0] == 503 and "never" in answer[1]["error"]


def test_db_http_output_flags() -> None:
    replica = StubReplica()
    answers = run(
        _ask(
            replica,
            [
                ("GET", "/db/query?q=SELECT+b", None),
                ("GET", "/db/query?q=SELECT+b&blob_array", None),
                ("GET", "/db/query?q=SELECT+b&raft_index", None),
                ("POST", "/db/execute?raft_index&timings", ["INSERT INTO t VALUES (1)"]),
                ("POST", "/db/request?raft_index", "SELECT b FROM t"),  # text/plain SQL
                ("POST", "/db/execute?pretty", "INSERT INTO t VALUES (1)"),
                ("GET", "/db/query?q=SELECT+b&qualify_columns", None),
                ("POST", "/db/request?qualify_columns", ["INSERT INTO t VALUES (1)"]),
            ],
        )
    )
    assert [status for status, _ in answers] == [200] * 7 + [400], answers
    assert answers[6][1]["results"][0]["columns"] == ["t.b", "t.s"]
    assert "qualify_columns" in answers[7][1]["error"]
    assert answers[0][1]["results"][0]["values"] == [["Af8=", "x"]]
    assert answers[1][1]["results"][0]["values"] == [[[1, 255], "x"]]
    assert answers[2][1]["raft_index"] == "7:3"  # the last record applied where it read
    assert "raft_index" not in answers[0][1]
    assert answers[3][1]["raft_index"] == "7:4" and answers[3][1]["position"] == "7:4"
    assert "time" in answers[3][1]["results"][0]
    assert answers[4][1]["raft_index"] == "7:3" and "values" in answers[4][1]["results"][0]
    assert answers[5][1]["results"] == [{"last_insert_id": 1, "rows_affected": 1}]


def test_db_http_nodes_and_readiness() -> None:
    replica = StubReplica()
    requests: list[tuple[str, str, Any]] = [
        ("GET", "/readyz", None),
        ("GET", "/readyz?noleader", None),
        ("GET", "/leader", None),
        ("GET", "/nodes?ver=2", None),
        ("GET", "/nodes?ver=2&nonvoters", None),
        ("GET", "/nodes?timeout=1s", None),
        ("GET", "/nodes?timeout=never", None),
    ]
    answers = run(_ask(replica, requests))
    assert [status for status, _ in answers] == [200, 200, 200, 200, 200, 200, 400], answers
    assert "leader ok" in answers[0][1] and "leader" not in answers[1][1]
    assert answers[2][1] == {
        "leader": {"id": "a", "api_addr": "http://127.0.0.1:1", "addr": "http://127.0.0.1:1"}
    }
    assert answers[3][1] == answers[4][1]  # every replica votes: nonvoters lists the same
    # ?sync: caught up with the log since the request came, within timeout (5 s)
    sync = [("GET", "/readyz?sync", None), ("GET", "/readyz?sync&timeout=250ms", None)]
    answers = run(_ask(replica, sync))
    assert [status for status, _ in answers] == [200, 200] and "[+]sync ok" in answers[0][1]
    replica.synced = False
    answers = run(_ask(replica, [*sync, ("GET", "/readyz?sync&timeout=later", None)]))
    assert [status for status, _ in answers] == [503, 503, 400], answers
    assert "[-]sync ok" in answers[0][1]
    assert replica.sync_timeouts == [5.0, 0.25, 5.0, 0.25]
    replica.leads = False  # no leader
    answers = run(_ask(replica, requests[:3]))
    assert [status for status, _ in answers] == [503, 200, 503], answers
    assert "[-]leader ok" in answers[0][1]
    # Listening, but not yet in the election nor recorded among the database's
    # replicas (its start under way): not ready, whoever leads.
    replica.leads, replica.started = True, False
    answers = run(_ask(replica, requests[:2]))
    assert [status for status, _ in answers] == [503, 503], answers
    assert "[-]node ok" in answers[0][1] and "[-]node ok" in answers[1][1]


def test_db_http_queued_writes() -> None:
    """rqlite's queue: answered with a sequence number before the write is confirmed;
    with wait, once it is, with its results; refused statements still 400."""
    replica = StubReplica()
    replica.write_takes_s = 1.0
    insert = ["INSERT INTO t VALUES (1)"]
    started = time.monotonic()
    answers = run(_ask(replica, [("POST", "/db/execute?queue", insert)] * 3))
    assert time.monotonic() - started < 0.9  # none waited for its write
    assert [a[1] for a in answers] == [{"results": [], "sequence_number": n} for n in (1, 2, 3)], (
        answers
    )
    replica.write_takes_s = 0.2
    answers = run(
        _ask(
            replica,
            [
                ("POST", "/db/execute?queue&wait", insert),
                ("POST", "/db/execute?queue&wait&timeout=50ms", insert),
                ("POST", "/db/execute?queue", ["BEGIN"]),
                ("POST", "/db/execute?wait", insert),
                ("POST", "/db/request?queue", ["SELECT 1"]),
            ],
        )
    )
    assert [a[0] for a in answers] == [200, 503, 400, 400, 400], answers
    assert "writes" in answers[4][1]["error"]
    assert answers[0][1]["sequence_number"] == 1 and answers[0][1]["position"] == "7:4"
    assert answers[0][1]["results"] == [{"last_insert_id": 1, "rows_affected": 1}]
    assert "BEGIN" in answers[2][1]["error"] and "queued" in answers[3][1]["error"]


def test_db_status_has_rqlites_sections_and_this_databases_own() -> None:
    """rqlite's /status sections a monitoring script reads (store.leader, store.sqlite3,
    node, http, build, os) with rqlite's key names; the replication state beside them."""
    replica = StubReplica()
    extra = {
        "role": "leader",
        "log_name": "db/shop",
        "machine": SimpleNamespace(
            path=Path("/d/a.sqlite"), size_bytes=lambda: 4096, verified=None
        ),
        "diverged": None,
        "snapshots_taken": 2,
        "restores": 0,
        "started_at": time.time() - 5,
    }
    for name, value in extra.items():
        setattr(replica, name, value)
    ((status, body),) = run(_ask(replica, [("GET", "/status", None)]))
    assert status == 200, body
    store = body["store"]
    assert store["leader"] == {"node_id": "a", "addr": "http://127.0.0.1:1"}
    assert store["node_id"] == "a" and store["ready"] is True
    assert store["sqlite3"]["path"] == "/d/a.sqlite" and store["sqlite3"]["db_size"] == 4096
    assert store["applied_position"] == "7:3" and store["snapshots_taken"] == 2
    assert body["http"]["bind_addr"] == "http://127.0.0.1:1"
    assert (
        4 < body["node"]["uptime"] < 60
        and body["node"]["current_time"] >= body["node"]["start_time"]
    )
    assert body["build"]["version"] and body["os"]["pid"] > 0 and body["os"]["hostname"]


def test_a_request_forwarded_to_a_hung_leader_is_answered_within_its_timeout() -> None:
    """A follower forwarding a write with ``timeout=1s`` to a leader that never answers
    (SIGSTOPped) held the caller until the leader woke, 12 s later: the request's
    bound holds for the forwarded call too, and the 503 says the outcome is unknown."""
    from aiohttp import web

    async def scenario() -> tuple[int, Any, float]:
        async def hang(request: web.Request) -> web.Response:
            await asyncio.sleep(30)
            return web.Response(text="{}")

        leader_app = web.Application()
        leader_app.router.add_post("/db/execute", hang)
        async with TestServer(leader_app) as leader:
            follower = StubReplica()
            follower.is_leader = False
            url = str(leader.make_url("")).rstrip("/")

            async def members() -> list[tuple[str, str, bool]]:
                return [("a", "http://127.0.0.1:1", False), ("b", url, True)]

            follower.members = members  # type: ignore[method-assign]
            api = DbHttpApi(follower)  # type: ignore[arg-type]
            port = await api.start("127.0.0.1", 0)
            try:
                started = time.monotonic()
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        f"http://127.0.0.1:{port}/db/execute?timeout=1s",
                        json=[["INSERT INTO t VALUES (1)"]],
                    ) as answer,
                ):
                    body = await answer.text()
                    return answer.status, body, time.monotonic() - started
            finally:
                await api.close()

    status, body, took_s = run(scenario())
    assert status == 503 and "outcome is unknown" in str(body), body
    assert took_s < 10, took_s
