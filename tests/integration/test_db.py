"""quorumlog db: three ``quorumlog db serve`` processes over three real bookies, on both
metadata drivers, driven through rqlite's HTTP API (plain HTTP and pyrqlite)."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import pytest
from support import port_for_a_child

from quorumlog.log.position import Position
from quorumlog.server.local_cluster import LocalCluster

_ROOT = str(Path(__file__).resolve().parents[2])
DB = "shop"


class DbProcess:
    """One ``quorumlog db serve`` replica; stdout/stderr go to files, stopped by pid."""

    def __init__(
        self,
        uri: str,
        node_id: str,
        base: Path,
        *,
        max_body_bytes: int = 4 << 20,
        port: int | None = None,
        extra_args: tuple[str, ...] = (),
        session_timeout_ms: int = 5000,
        name: str = DB,
    ) -> None:
        self.node_id = node_id
        self.name = name
        self.port = port or port_for_a_child()
        self.addr = f"127.0.0.1:{self.port}"
        self.data_dir = base / node_id
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.err_path = base / f"{node_id}.err"
        with open(base / f"{node_id}.out", "ab") as out, open(self.err_path, "ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorumlog",
                    "db",
                    "serve",
                    "--metadata",
                    uri,
                    "--name",
                    name,
                    "--data-dir",
                    str(self.data_dir),
                    "--http-addr",
                    self.addr,
                    "--node-id",
                    node_id,
                    "--session-timeout-ms",
                    # Long enough that a loaded machine does not depose a leader in the
                    # middle of a test that is not about failover (the chaos test's is short).
                    str(session_timeout_ms),
                    "--max-body-bytes",
                    str(max_body_bytes),
                    "--verbose",
                    *extra_args,
                ],
                stdout=out,
                stderr=err,
                env={**os.environ, "PYTHONPATH": _ROOT},
            )

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / f"{self.name}.sqlite"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(10)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def http(
    addr: str,
    path: str,
    body: object | None = None,
    *,
    raw: bytes | None = None,
    timeout_s: float = 30,
) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(
        f"http://{addr}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            text = answer.read()
            status = answer.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read(), exc.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text.decode()


def wait_ready(replicas: list[DbProcess], timeout_s: float = 60) -> DbProcess:
    """Wait until a leader takes writes and every replica is up; the leader."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = []
        for replica in replicas:
            assert replica.process.poll() is None, replica.err_path.read_text()[-3000:]
            try:
                answer = http(replica.addr, "/status")[1]
                statuses.append(answer if isinstance(answer, dict) else None)
            except OSError:
                statuses.append(None)
        leaders = [
            r
            for r, s in zip(replicas, statuses, strict=True)
            if s and s["store"]["role"] == "leader"
        ]
        # Each started (its /status answers while its start is under way), whatever
        # else it reports: a replica halted by a failure is still one to wait for.
        if len(leaders) == 1 and all(s and s["store"]["started"] for s in statuses):
            return leaders[0]
        time.sleep(0.1)
    errors = "".join(r.err_path.read_text()[-2000:] for r in replicas)
    raise AssertionError(f"no leader taking writes within the bound:\n{errors}")


def dump(path: Path) -> list[str]:
    """The file's SQL, but the row of the position applied: replicas that hold the same
    data may stand at different records that change nothing (the leader's verification
    records follow the last write by up to a second, docs/DB.md)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            line
            for line in conn.iterdump()
            if not line.startswith('INSERT INTO "_quorumlog_applied"')
        ]
    finally:
        conn.close()


@pytest.fixture
def replicas(cluster3: LocalCluster, tmp_path: Path) -> Any:
    group = [DbProcess(cluster3.metadata_uri, f"n{i}", tmp_path / "db") for i in range(3)]
    try:
        yield group
    finally:
        for replica in group:
            replica.stop()


def test_db_writes_through_any_replica_reads_at_each_level(replicas: list[DbProcess]) -> None:
    leader = wait_ready(replicas)
    followers = [r for r in replicas if r is not leader]
    status, answer = http(
        followers[0].addr,
        "/db/execute",
        ["CREATE TABLE fruit (id INTEGER PRIMARY KEY, name TEXT, price REAL)"],
    )
    assert status == 200 and "error" not in answer["results"][0], answer
    positions = []
    for i, replica in enumerate(replicas):
        status, answer = http(
            replica.addr,
            "/db/execute?timings",
            [
                ["INSERT INTO fruit(name, price) VALUES (?, ?)", f"apple{i}", 1.5],
                [
                    "INSERT INTO fruit(name, price) VALUES (:name, :price)",
                    {"name": f"pear{i}", "price": 2},
                ],
            ],
        )
        assert status == 200, answer
        assert [r["rows_affected"] for r in answer["results"]] == [1, 1]
        assert "time" in answer and "position" in answer
        positions.append(answer["position"])
    # read-your-writes on a follower: it waits until it applied the last write
    status, answer = http(
        followers[1].addr, f"/db/query?min_position={positions[-1]}&q=SELECT+count(*)+FROM+fruit"
    )
    assert status == 200 and answer["results"][0]["values"] == [[6]], answer
    for replica in replicas:
        for level in ("weak", "strong", "linearizable"):
            status, answer = http(
                replica.addr, f"/db/query?level={level}&q=SELECT+count(*)+FROM+fruit"
            )
            assert status == 200 and answer["results"][0]["values"] == [[6]], (level, answer)
    status, answer = http(
        leader.addr, "/db/query?associative", ["SELECT name, price FROM fruit WHERE id = 1"]
    )
    assert answer["results"][0]["rows"] == [{"name": "apple0", "price": 1.5}]
    assert answer["results"][0]["types"] == {"name": "text", "price": "real"}
    # a transaction that fails is rolled back as a whole, everywhere
    status, answer = http(
        followers[0].addr,
        "/db/execute?transaction",
        [["INSERT INTO fruit(name) VALUES (?)", "kiwi"], "INSERT INTO fruit(id) VALUES (1)"],
    )
    assert status == 200 and "error" in answer["results"][-1], answer
    # the unified endpoint mixes reads and writes
    status, answer = http(
        leader.addr,
        "/db/request",
        [["INSERT INTO fruit(name) VALUES (?)", "plum"], "SELECT count(*) FROM fruit"],
    )
    assert answer["results"][1]["values"] == [[7]], answer
    last = answer["position"]
    status, nodes = http(leader.addr, "/nodes?ver=2")
    assert [n["id"] for n in nodes["nodes"] if n["leader"]] == [leader.node_id]
    for replica in replicas:
        assert http(replica.addr, "/readyz")[0] == 200
        status, answer = http(
            replica.addr, f"/db/query?min_position={last}&q=SELECT+count(*)+FROM+fruit"
        )
        assert answer["results"][0]["values"] == [[7]]
    # non-deterministic calls are evaluated once, on the leader, and replayed as values
    status, answer = http(
        followers[0].addr,
        "/db/execute",
        [
            "CREATE TABLE chance (r INTEGER, b BLOB, t TEXT, c TEXT)",
            "INSERT INTO chance VALUES "
            "(random(), randomblob(8), datetime('now'), CURRENT_TIMESTAMP)",
        ],
    )
    assert status == 200 and "error" not in answer["results"][1], answer
    status, refused = http(
        leader.addr, "/db/execute", ["CREATE TABLE late (t DEFAULT CURRENT_TIME)"]
    )
    assert status == 400 and "CREATE" in refused["error"], refused
    for replica in replicas:
        assert (
            http(replica.addr, f"/db/query?min_position={answer['position']}&q=SELECT+1")[0] == 200
        )
    # every replica holds the same contents
    for replica in replicas:
        replica.stop()
    dumps = [dump(r.sqlite_path) for r in replicas]
    assert dumps[0] == dumps[1] == dumps[2]
    assert sum('INSERT INTO "fruit"' in line for line in dumps[0]) == 7


def _poll_status(addr: str, path: str, wanted: int, timeout_s: float = 30) -> Any:
    """Ask ``path`` until it answers ``wanted``; that answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, answer = http(addr, path)
        if status == wanted or time.monotonic() > deadline:
            assert status == wanted, (path, status, answer)
            return answer
        time.sleep(0.2)


def test_db_rqlite_api_on_real_replicas(cluster3: LocalCluster, replicas: list[DbProcess]) -> None:
    leader = wait_ready(replicas)
    follower = next(r for r in replicas if r is not leader)
    # parameters not offered (or not on writes, or not rqlite's) are refused by name
    for path in ("/db/execute?wait=true", "/db/execute?db_timeout=1s", "/db/execute?levl=strong"):
        status, answer = http(follower.addr, path, ["CREATE TABLE never (a)"])
        assert status == 400 and path.split("?")[1].split("=")[0] in answer["error"], answer
    status, answer = http(follower.addr, "/db/load", raw=b"x")
    assert status == 400 and "/db/load" in answer["error"]
    # a text/plain body is the SQL itself; a Go duration as the timeout
    request = urllib.request.Request(
        f"http://{follower.addr}/db/execute?timeout=2m",
        data=b"CREATE TABLE fruit (id INTEGER PRIMARY KEY, name TEXT)",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.loads(reply.read())
    assert "error" not in answer["results"][0] and "position" in answer, answer
    # several statements in one string all run, on every replica (the last one's result)
    request = urllib.request.Request(
        f"http://{follower.addr}/db/execute",
        data=b"CREATE TABLE veg (n TEXT); INSERT INTO veg VALUES ('leek');\n"
        b"INSERT INTO veg VALUES ('kale'); -- the end",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.loads(reply.read())
    assert answer["results"] == [{"last_insert_id": 2, "rows_affected": 1}], answer
    for replica in replicas:
        status, rows = http(
            replica.addr,
            f"/db/query?min_position={answer['position']}&level=none",
            ["SELECT count(*) FROM veg; SELECT n FROM veg ORDER BY n"],
        )
        assert status == 200 and rows["results"][0]["values"] == [["kale"], ["leek"]], rows
    # a BLOB parameter as an array of bytes, read back as base64 and with blob_array
    status, answer = http(
        follower.addr,
        "/db/execute",
        ["CREATE TABLE blobs (b BLOB)", ["INSERT INTO blobs VALUES (?)", [0, 7, 255]]],
    )
    assert status == 200 and answer["results"][1]["rows_affected"] == 1, answer
    for replica in replicas:
        for flag, value in (("", "AAf/"), ("&blob_array", [0, 7, 255])):
            status, rows = http(
                replica.addr,
                f"/db/query?min_position={answer['position']}&level=none{flag}",
                ["SELECT b FROM blobs"],
            )
            assert status == 200 and rows["results"][0]["values"] == [[value]], rows
    status, answer = http(follower.addr, "/db/execute", [["INSERT INTO blobs VALUES (?)", [256]]])
    assert status == 400 and "statement 0 parameter 1" in answer["error"], answer
    status, answer = http(
        follower.addr, "/db/execute", [["INSERT INTO veg VALUES (?); SELECT ?", 1, 2]]
    )
    assert status == 400 and "several statements" in answer["error"], answer
    # /db/request: SQLite decides; a WITH ... INSERT is a write with its counts
    status, answer = http(
        follower.addr,
        "/db/request?raft_index",
        [
            "WITH n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 3) "
            "INSERT INTO fruit(name) SELECT 'f' || x FROM n"
        ],
    )
    assert status == 200 and answer["results"][0] == {"last_insert_id": 3, "rows_affected": 3}
    assert answer["raft_index"] == answer["position"], answer
    written = answer["position"]
    # read-only by SQLite's verdict (a judge of words took both for writes), served here
    status, answer = http(
        follower.addr,
        f"/db/request?level=none&min_position={written}&raft_index",
        ["PRAGMA table_info(fruit)", "SELECT replace(name, 'f', 'g') FROM fruit ORDER BY id"],
    )
    assert status == 200 and "position" not in answer, answer
    assert [row[1] for row in answer["results"][0]["values"]] == ["id", "name"]
    assert answer["results"][1]["values"] == [["g1"], ["g2"], ["g3"]]
    assert Position.parse(answer["raft_index"]) >= Position.parse(written)
    status, answer = http(
        follower.addr,
        f"/db/query?level=none&min_position={written}&qualify_columns",
        ["SELECT f.name, count(*) AS n FROM fruit f"],
    )
    assert status == 200 and answer["results"][0]["columns"] == ["fruit.name", "n"], answer
    assert answer["results"][0]["types"] == ["text", "integer"], answer
    # level=auto is weak (forwarded to the leader); an unknown level is refused
    status, answer = http(follower.addr, "/db/query?level=auto&q=SELECT+count(*)+FROM+fruit")
    assert status == 200 and answer["results"][0]["values"] == [[3]], answer
    assert http(follower.addr, "/db/query?level=strog&q=SELECT+1")[0] == 400
    # /leader names the leader from any replica; a step down names no successor
    for replica in replicas:
        status, answer = http(replica.addr, "/leader")
        assert status == 200 and answer["leader"]["id"] == leader.node_id, answer
    status, answer = http(follower.addr, "/leader", {"id": follower.node_id})
    assert status == 400 and "no body" in answer["error"], answer
    # queued writes through a follower: answered at once, all in the log in order
    for i in range(10):
        status, answer = http(
            follower.addr, "/db/execute?queue", [["INSERT INTO veg VALUES (?)", f"q{i}"]]
        )
        assert status == 200 and answer["results"] == [] and answer["sequence_number"] >= 1
    status, answer = http(
        follower.addr, "/db/execute?queue&wait", ["INSERT INTO veg VALUES ('last')"]
    )
    assert status == 200 and answer["results"][0]["rows_affected"] == 1, answer
    for replica in replicas:
        status, rows = http(
            replica.addr,
            f"/db/query?level=none&min_position={answer['position']}&q=SELECT+count(*)+FROM+veg",
        )
        assert status == 200 and rows["results"][0]["values"] == [[13]], rows
    status, answer = http(follower.addr, "/db/execute?queue", ["BEGIN"])
    assert status == 400, answer
    # a snapshot on demand, asked of a follower, taken by the leader
    status, answer = http(follower.addr, "/snapshot", raw=b"")
    assert status == 200 and Position.parse(answer["position"]) >= Position.parse(written), answer
    assert http(leader.addr, "/status")[1]["store"]["snapshots_taken"] >= 1
    # backups through a follower: gzipped and vacuumed, or chosen tables as SQL
    backup_url = f"http://{follower.addr}/db/backup"
    with urllib.request.urlopen(f"{backup_url}?compress&vacuum", timeout=60) as reply:
        assert reply.headers.get_content_type() == "application/gzip"
        copy = gzip.decompress(reply.read())
    assert copy.startswith(b"SQLite format 3\x00")
    scratch = replicas[0].data_dir.parent / "vacuumed.sqlite"
    scratch.write_bytes(copy)
    with contextlib.closing(sqlite3.connect(scratch)) as vacuumed:
        assert vacuumed.execute("SELECT count(*) FROM veg").fetchone() == (13,)
    with urllib.request.urlopen(f"{backup_url}?fmt=sql&tables=veg", timeout=60) as reply:
        text = reply.read().decode()
    assert "CREATE TABLE veg" in text and "'kale'" in text and "fruit" not in text, text
    for path in (
        "/db/backup?fmt=sql&vacuum",
        "/db/backup?tables=veg",
        "/db/backup?fmt=json",
        "/db/backup?fmt=sql&tables=nothere",
    ):
        status, answer = http(follower.addr, path)
        assert status == 400 and "error" in answer, (path, answer)
    # freshness: a follower cut off from the log (every bookie stopped) refuses reads
    # asked with a freshness bound once it is over it, and serves them again after
    fresh = "/db/query?level=none&q=SELECT+count(*)+FROM+fruit&freshness=3s"
    strict = fresh + "&freshness_strict"
    _poll_status(follower.addr, fresh, 200)
    _poll_status(follower.addr, strict, 200)
    for i in range(3):
        cluster3.pause(i)
    try:
        answer = _poll_status(follower.addr, fresh, 503, timeout_s=30)
        assert "stale read" in answer["error"], answer
        # nor can it tell it caught up with the log: not ready with ?sync
        status, text = http(follower.addr, "/readyz?sync&timeout=1s")
        assert status == 503 and "[-]sync ok" in text, text
        assert http(follower.addr, strict)[0] == 503
        # without a bound it serves what it has, as level none does
        status, answer = http(follower.addr, "/db/query?level=none&q=SELECT+count(*)+FROM+fruit")
        assert status == 200 and answer["results"][0]["values"] == [[3]], answer
        # the leader writes the log: it serves whatever the freshness
        assert http(leader.addr, strict.replace("3s", "1ms"))[0] == 200
    finally:
        for i in range(3):
            cluster3.resume(i)
    _poll_status(follower.addr, strict, 200, timeout_s=60)
    status, text = http(follower.addr, "/readyz?sync")
    assert status == 200 and "[+]sync ok" in text, text


def test_db_leader_steps_down_to_the_next_replica(replicas: list[DbProcess]) -> None:
    """rqlite's POST /leader, asked of a follower: the leader gives the lead up, another
    replica takes it, and nothing acknowledged is lost."""
    leader = wait_ready(replicas)
    follower = next(r for r in replicas if r is not leader)
    status, answer = http(
        leader.addr, "/db/execute", ["CREATE TABLE t (a)", "INSERT INTO t VALUES (1)"]
    )
    assert status == 200, answer
    status, answer = http(follower.addr, "/leader", raw=b"")
    assert status == 200, answer
    deadline = time.monotonic() + 60
    while True:  # another replica takes writes, and the election names it
        successor = wait_ready(replicas)
        status, answer = http(follower.addr, "/leader")
        if successor is not leader and answer["leader"]["id"] == successor.node_id:
            break
        assert time.monotonic() < deadline, (status, answer)
        time.sleep(0.2)
    # the old leader follows and forwards; every replica has both writes
    status, answer = http(leader.addr, "/db/execute", ["INSERT INTO t VALUES (2)"])
    assert status == 200 and answer["node"] == successor.node_id, answer
    for replica in replicas:
        status, rows = http(
            replica.addr,
            f"/db/query?min_position={answer['position']}&q=SELECT+a+FROM+t+ORDER+BY+a",
        )
        assert status == 200 and rows["results"][0]["values"] == [[1], [2]], rows
    status, state = http(leader.addr, "/status")
    assert state["store"]["role"] == "follower"


def test_db_bad_input_gets_rqlite_status_codes_and_stores_nothing(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    replicas = [
        DbProcess(cluster3.metadata_uri, f"b{i}", tmp_path / "db", max_body_bytes=4096)
        for i in range(2)
    ]
    try:
        leader = wait_ready(replicas)
        follower = next(r for r in replicas if r is not leader)
        assert http(leader.addr, "/db/execute", ["CREATE TABLE t (a INTEGER)"])[0] == 200
        before = http(leader.addr, "/db/query?level=strong&q=SELECT+count(*)+FROM+t")[1]
        for replica in (leader, follower):
            status, answer = http(replica.addr, "/db/execute", raw=b"[not json")
            assert status == 400 and "error" in answer
            status, answer = http(replica.addr, "/db/nothing")
            assert status == 404 and "error" in answer
            # an array is a BLOB of bytes 0-255: anything else in it is refused by name
            status, answer = http(
                replica.addr, "/db/execute", [["INSERT INTO t VALUES (?)", [1, 300]]]
            )
            assert status == 400 and "parameter 1" in answer["error"], answer
            status, answer = http(
                replica.addr, "/db/execute", ["INSERT INTO t VALUES ('x')" + " " * 5000]
            )
            assert status == 413 and "error" in answer
            status, answer = http(replica.addr, "/db/execute", ["INSRT INTO t VALUES (1)"])
            assert status == 200 and "syntax error" in answer["results"][0]["error"]
            status, answer = http(replica.addr, "/db/execute", ["BEGIN"])
            assert status == 400
        after = http(leader.addr, "/db/query?level=strong&q=SELECT+count(*)+FROM+t")[1]
        assert before == after
        # no leader: the leader goes, the follower's write gets 503 until one is elected
        leader.kill()
        status, answer = http(follower.addr, "/db/execute", ["INSERT INTO t VALUES (9)"])
        assert status in (200, 503), answer
    finally:
        for replica in replicas:
            replica.stop()


def test_db_pyrqlite_and_sqlalchemy_clients(replicas: list[DbProcess]) -> None:
    """rqlite's DB-API driver and its SQLAlchemy dialect (sqlalchemy-rqlite, from PyPI),
    unchanged, against a follower: create, parameterised inserts, a transaction, selects."""
    import pyrqlite.dbapi2 as dbapi2
    import sqlalchemy as sa

    leader = wait_ready(replicas)
    follower = next(r for r in replicas if r is not leader)
    connection = dbapi2.connect(host="127.0.0.1", port=follower.port)
    try:
        cursor = connection.cursor()
        cursor.execute("CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
        cursor.execute("INSERT INTO people(name, age) VALUES (?, ?)", ("ada", 36))
        cursor.executemany("INSERT INTO people(name, age) VALUES (?, ?)", [("bob", 20), ("cy", 30)])
        cursor.execute("SELECT name, age FROM people ORDER BY id", consistency="strong")
        assert cursor.fetchall() == [("ada", 36), ("bob", 20), ("cy", 30)]
        cursor.execute("SELECT count(*) FROM people WHERE age > ?", (25,))
        assert cursor.fetchone()[0] == 2
        # columns holding values of several types: pyrqlite converts by the declared
        # type (a column typed by its first value, real, failed on the text after it)
        cursor.execute("CREATE TABLE mixed (id INTEGER PRIMARY KEY, label TEXT, anything, b BLOB)")
        cursor.execute("INSERT INTO mixed(label, anything, b) VALUES (?, ?, X'0102')", (7, 1.5))
        cursor.execute("INSERT INTO mixed(label, anything, b) VALUES (?, ?, NULL)", ("x", "b"))
        cursor.execute(
            "INSERT INTO mixed(label, anything, b) VALUES (?, ?, ?)", ("y", 3, b"\xff\x00")
        )
        cursor.execute("SELECT label, anything, b FROM mixed ORDER BY id", consistency="strong")
        assert cursor.fetchall() == [
            ("7", 1.5, b"\x01\x02"),
            ("x", "b", None),
            ("y", 3, b"\xff\x00"),
        ]
    finally:
        connection.close()

    engine = sa.create_engine(f"rqlite+pyrqlite://127.0.0.1:{follower.port}/")
    metadata = sa.MetaData()
    fruit = sa.Table(
        "fruit",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(20)),
        sa.Column("price", sa.Float),
        sa.Column("photo", sa.LargeBinary, nullable=True),
    )
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            rows_in = [
                {"name": "apple", "price": 1.5, "photo": b"\x89PNG\x00\xff"},
                {"name": "fig", "price": 2, "photo": None},
            ]
            conn.execute(fruit.insert(), rows_in)
        with engine.connect() as conn:
            chosen = sa.select(fruit.c.name, fruit.c.price, fruit.c.photo).order_by(fruit.c.id)
            rows = conn.execute(chosen)
            assert rows.fetchall() == [("apple", 1.5, b"\x89PNG\x00\xff"), ("fig", 2.0, None)]
            above = sa.text("SELECT count(*) FROM fruit WHERE price > :p")
            assert conn.execute(above, {"p": 1.6}).scalar() == 1
    finally:
        engine.dispose()


def test_db_backup_and_restore_through_the_log(replicas: list[DbProcess], tmp_path: Path) -> None:
    leader = wait_ready(replicas)
    follower = next(r for r in replicas if r is not leader)
    rows = [["INSERT INTO notes(body) VALUES (?)", f"note {i}"] for i in range(20)]
    status, written = http(follower.addr, "/db/execute", ["CREATE TABLE notes (body TEXT)", *rows])
    assert status == 200, written
    committed = Position.parse(written["position"])
    # Through a follower, the backup is the leader's file with what the leader says of
    # it: its type and the position it holds, never a JSON type and no position.
    for query, content_type in (("", "application/octet-stream"), ("?fmt=sql", "application/sql")):
        with urllib.request.urlopen(f"http://{follower.addr}/db/backup{query}", timeout=60) as r:
            assert r.status == 200
            assert r.headers.get_content_type() == content_type, query
            assert Position.parse(r.headers["X-Quorumlog-Position"]) >= committed, query
            body = r.read()
        if query:
            assert "CREATE TABLE notes" in body.decode() and "note 19" in body.decode()
        else:
            assert body.startswith(b"SQLite format 3\x00")
    backup = tmp_path / "backup.sqlite"
    command = [sys.executable, "-m", "quorumlog", "db"]
    done = subprocess.run(
        [*command, "backup", "--addr", follower.addr, str(backup)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    printed = re.search(r"applied position (\d+:\d+)$", done.stdout.strip())
    assert printed is not None, done.stdout
    assert Position.parse(printed.group(1)) >= committed
    with contextlib.closing(sqlite3.connect(backup)) as copy:
        assert copy.execute("SELECT count(*) FROM notes").fetchone() == (20,)
    assert http(leader.addr, "/db/execute", ["DROP TABLE notes"])[0] == 200
    done = subprocess.run(
        [*command, "restore", "--addr", follower.addr, str(backup)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for replica in replicas:
        answer = http(replica.addr, "/db/query?level=strong&q=SELECT+count(*)+FROM+notes")[1]
        assert answer["results"][0]["values"] == [[20]], answer


def test_db_commands_status_nodes_shell(replicas: list[DbProcess]) -> None:
    leader = wait_ready(replicas)
    follower = next(r for r in replicas if r is not leader)
    command = [sys.executable, "-m", "quorumlog", "db"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)

    done = run(
        "shell",
        "--addr",
        follower.addr,
        "CREATE TABLE city (name TEXT, people INTEGER)",
        "INSERT INTO city VALUES ('Oslo', 700000), ('Bergen', 290000)",
        "SELECT name, people FROM city ORDER BY people DESC",
    )
    assert done.returncode == 0, done.stderr
    assert "rows affected: 2" in done.stdout
    assert "name   | people" in done.stdout and "Oslo   | 700000" in done.stdout
    done = run("shell", "--addr", follower.addr, "SELEC nonsense")
    assert done.returncode == 1 and "syntax error" in done.stdout
    nodes = json.loads(run("nodes", "--addr", follower.addr).stdout)
    assert {n for n, v in nodes.items() if v["leader"]} == {leader.node_id}
    status = json.loads(run("status", "--addr", follower.addr).stdout)
    assert status["store"]["leader"]["node_id"] == leader.node_id
    assert status["store"]["role"] == "follower"
    # ?redirect: a follower answers 301 with the leader's address instead of proxying
    connection = HTTPConnection("127.0.0.1", follower.port, timeout=30)
    try:
        connection.request(
            "POST",
            "/db/execute?redirect",
            body=json.dumps(["INSERT INTO city VALUES ('Tromso', 77000)"]),
            headers={"Content-Type": "application/json"},
        )
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 301
        assert answer.getheader("Location") == f"http://{leader.addr}/db/execute?redirect"
    finally:
        connection.close()


def test_db_nodes_lists_a_stopped_replica_as_unreachable(replicas: list[DbProcess]) -> None:
    leader = wait_ready(replicas)
    stopped, killed = [r for r in replicas if r is not leader]
    everyone = {r.node_id for r in replicas}
    status, nodes = http(leader.addr, "/nodes")
    assert status == 200 and set(nodes) == everyone, nodes
    assert all(node["reachable"] for node in nodes.values()), nodes

    stopped.stop()  # SIGTERM by pid: it leaves the election at once
    assert stopped.process.returncode is not None
    for replica in (leader, killed):
        status, nodes = http(replica.addr, "/nodes")
        assert status == 200 and set(nodes) == everyone, nodes
        assert nodes[stopped.node_id]["reachable"] is False and nodes[stopped.node_id]["error"]
        assert nodes[stopped.node_id]["leader"] is False
        assert nodes[stopped.node_id]["api_addr"] == f"http://{stopped.addr}"
        assert nodes[leader.node_id]["reachable"] and nodes[leader.node_id]["leader"]
        assert nodes[killed.node_id]["reachable"] and not nodes[killed.node_id]["leader"]
    status, listed = http(leader.addr, "/nodes?ver=2")
    assert {n["id"]: n["reachable"] for n in listed["nodes"]} == {
        leader.node_id: True,
        stopped.node_id: False,
        killed.node_id: True,
    }

    # kill -9: its election node outlives it until its session expires; still unreachable.
    killed.kill()
    done = subprocess.run(
        [sys.executable, "-m", "quorumlog", "db", "nodes", "--addr", leader.addr],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)
    assert {n: v["reachable"] for n, v in nodes.items()} == {
        leader.node_id: True,
        stopped.node_id: False,
        killed.node_id: False,
    }

    # rqlite's DELETE /remove forgets a replica gone for good; a running one is refused.
    def remove(node_id: str) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://{leader.addr}/remove",
            data=json.dumps({"id": node_id}).encode(),
            method="DELETE",
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, answer = remove(leader.node_id)
    assert status == 400 and "running" in answer["error"], answer
    assert remove(stopped.node_id)[0] == 200
    assert remove(stopped.node_id)[0] == 404
    status, nodes = http(leader.addr, "/nodes")
    assert set(nodes) == {leader.node_id, killed.node_id}, nodes


def test_db_two_databases_share_one_cluster(cluster3: LocalCluster, tmp_path: Path) -> None:
    groups = {
        name: [
            DbProcess(cluster3.metadata_uri, f"{name}{i}", tmp_path / name, name=name)
            for i in range(2)
        ]
        for name in ("north", "south")
    }
    try:
        leaders = {name: wait_ready(group) for name, group in groups.items()}
        for name, leader in leaders.items():
            body = ["CREATE TABLE place (name TEXT)", ["INSERT INTO place VALUES (?)", name]]
            assert http(leader.addr, "/db/execute", body)[0] == 200
        for name, group in groups.items():
            for replica in group:
                answer = http(replica.addr, "/db/query?level=strong&q=SELECT+name+FROM+place")[1]
                assert answer["results"][0]["values"] == [[name]], answer
            nodes = http(group[0].addr, "/nodes")[1]
            assert set(nodes) == {r.node_id for r in group}
    finally:
        for group in groups.values():
            for replica in group:
                replica.stop()


RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.mark.parametrize("metadata_uri", ["sqlite"], indirect=True)
def test_r19_poison_records_leave_every_replica_serving_and_a_replay_equal(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    """Statements SQLite fails with the codes of a failing disk, that would change one
    replica's connection or the schema under the data, that read the clock or a random
    source under any spelling, or that run away: each is logged and answered, every
    replica stays up, and a replica rebuilt from the log alone ends equal to the others."""
    base = tmp_path / "db"
    steps = ("--statement-steps", "2000000")
    replicas = [DbProcess(cluster3.metadata_uri, f"p{i}", base, extra_args=steps) for i in range(3)]
    try:
        leader = wait_ready(replicas)
        followers = [r for r in replicas if r is not leader]
        requests: list[tuple[list[Any], str | None]] = [
            (
                [
                    "CREATE TABLE ai(id INTEGER PRIMARY KEY AUTOINCREMENT, x)",
                    "INSERT INTO ai VALUES(9223372036854775807, 1)",
                    "CREATE TABLE seen(what TEXT, v)",
                ],
                None,
            ),
            (["INSERT INTO ai(x) VALUES(2)"], "full"),
            (["PRAGMA wal_checkpoint(TRUNCATE)"], "not authorized"),
            (["PRAGMA query_only=1"], "not authorized"),
            (["PRAGMA max_page_count=1"], "not authorized"),
            (["PRAGMA case_sensitive_like=ON"], "not authorized"),
            (["PRAGMA writable_schema=ON"], "not authorized"),
            (
                ["UPDATE sqlite_master SET sql = 'CREATE TABLE ai(x)' WHERE name = 'ai'"],
                "sqlite_master",
            ),
            (["CREATE TEMP TABLE scratch(x)"], "not authorized"),
            (["INSERT INTO seen VALUES ('quoted', \"random\"())"], None),
            ([["INSERT INTO seen VALUES ('param', strftime('%H:%M:%f', ?))", "now"]], None),
            ([RUNAWAY], "budget"),
            (
                [
                    "INSERT INTO ai(id, x) VALUES (1, 1)",
                    "INSERT INTO seen SELECT 'like', count(*) FROM ai WHERE 'A' LIKE 'a'",
                ],
                None,
            ),
        ]
        last = ""
        for body, error in requests:
            status, answer = http(followers[0].addr, "/db/execute", body)
            assert status == 200, (body, answer)
            got = answer["results"][-1].get("error")
            assert (got is None) if error is None else (error in str(got)), (body, answer)
            last = answer["position"]
        for replica in replicas:
            assert http(replica.addr, "/readyz")[0] == 200, replica.err_path.read_text()[-2000:]
            status, answer = http(
                replica.addr, f"/db/query?min_position={last}&q=SELECT+count(*)+FROM+seen"
            )
            assert status == 200 and answer["results"][0]["values"] == [[3]], answer
        # A replica rebuilt from the log alone (its file wiped) replays every record.
        rebuilt = followers[1]
        rebuilt.kill()
        shutil.rmtree(rebuilt.data_dir)
        replicas[replicas.index(rebuilt)] = DbProcess(
            cluster3.metadata_uri, rebuilt.node_id, base, port=rebuilt.port, extra_args=steps
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                status, answer = http(rebuilt.addr, f"/db/query?min_position={last}&q=SELECT+1")
                if status == 200:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the rebuilt replica did not catch up to {last}")
        for replica in replicas:
            replica.stop()
        dumps = [dump(r.sqlite_path) for r in replicas]
        assert dumps[0] == dumps[1] == dumps[2]
    finally:
        for replica in replicas:
            replica.stop()


def test_d7_a_replica_whose_copy_diverged_stops_serving_and_names_the_record(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    """A follower's file is changed behind its back (one row deleted while it was
    stopped). The next write changes one row fewer there: the leader's next VERIFY
    record shows it, and that follower stops serving, naming the record, while the
    others keep serving and report the position they verified."""
    base = tmp_path / "db"
    replicas = [DbProcess(cluster3.metadata_uri, f"v{i}", base) for i in range(3)]
    try:
        leader = wait_ready(replicas)
        created = http(
            leader.addr,
            "/db/execute",
            ["CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"]
            + [f"INSERT INTO t(v) VALUES ('{v}')" for v in "abcde"],
        )
        assert created[0] == 200, created
        first = created[1]["position"]
        tampered = next(r for r in replicas if r is not leader)
        status, answer = http(tampered.addr, f"/db/query?min_position={first}&q=SELECT+1")
        assert status == 200, answer
        tampered.stop()
        with sqlite3.connect(tampered.sqlite_path) as raw:
            raw.execute("DELETE FROM t WHERE v = 'c'")
        raw.close()
        index = replicas.index(tampered)
        tampered = replicas[index] = DbProcess(
            cluster3.metadata_uri, tampered.node_id, base, port=tampered.port
        )
        status, answer = http(leader.addr, "/db/execute", ["UPDATE t SET v = v || '!'"])
        assert status == 200 and answer["results"][0]["rows_affected"] == 5, answer
        changed = answer["position"]
        deadline = time.monotonic() + 60
        store: dict[str, Any] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                store = http(tampered.addr, "/status")[1]["store"]
                if store["diverged"]:
                    break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the changed copy was not noticed: {store}")
        assert f"the record at {changed} had another outcome" in store["failure"], store
        assert not store["ready"]
        status, answer = http(tampered.addr, "/db/query?level=none&q=SELECT+count(*)+FROM+t")
        assert status != 200 and "diverged" in json.dumps(answer), (status, answer)
        for replica in replicas:
            if replica is tampered:
                continue
            status, answer = http(
                replica.addr, f"/db/query?min_position={changed}&level=none&q=SELECT+v+FROM+t"
            )
            assert status == 200 and len(answer["results"][0]["values"]) == 5, answer
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                verified = http(replica.addr, "/status")[1]["store"]["verified_position"]
                if verified is not None and verified == changed:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"{replica.node_id} verified only up to {verified}")
            assert http(replica.addr, "/readyz")[0] == 200
    finally:
        for replica in replicas:
            replica.stop()


def _changes(addr: str, query: str) -> tuple[int, list[dict[str, Any]]]:
    request = urllib.request.Request(f"http://{addr}/db/changes?{query}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, [json.loads(line) for line in answer.read().splitlines()]
    except urllib.error.HTTPError as exc:
        return exc.code, [json.loads(exc.read())]


def test_db_change_stream_resumes_exactly_across_a_leader_change(
    cluster3: LocalCluster, tmp_path: Path
) -> None:
    """GET /db/changes gives each write with its log position and where to resume. A
    consumer that reads some, loses its replica and the leader to a kill, and resumes
    from another replica at the position it was given, gets every write once, in the
    order the log holds them."""
    base = tmp_path / "db"
    replicas = [DbProcess(cluster3.metadata_uri, f"c{i}", base) for i in range(3)]
    try:
        leader = wait_ready(replicas)
        writes = ["CREATE TABLE t (n INTEGER)"] + [f"INSERT INTO t VALUES ({n})" for n in range(5)]
        for sql in writes:
            assert http(leader.addr, "/db/execute", [sql])[0] == 200
        status, lines = _changes(leader.addr, "limit=3")
        assert status == 200 and len(lines) <= 4 and "next" in lines[-1], lines
        seen = [line["record"]["stmts"][0][0] for line in lines[:-1]]
        resume = lines[-1]["next"]
        leader.kill()
        survivors = [r for r in replicas if r is not leader]
        new_leader = wait_ready(survivors)
        for n in range(5, 8):
            status, answer = http(new_leader.addr, "/db/execute", [f"INSERT INTO t VALUES ({n})"])
            assert status == 200, answer
        reader = next(r for r in survivors if r is not new_leader)
        for _ in range(20):  # the rest, page after page
            status, lines = _changes(reader.addr, f"from={resume}&limit=4")
            assert status == 200, lines
            seen += [line["record"]["stmts"][0][0] for line in lines[:-1]]
            positions = [_position(line["position"]) for line in lines[:-1]]
            assert positions == sorted(positions) and all(p >= _position(resume) for p in positions)
            if lines[-1]["next"] == resume:
                break
            resume = lines[-1]["next"]
        expected = writes + [f"INSERT INTO t VALUES ({n})" for n in range(5, 8)]
        assert seen == expected
        # No write since: a long poll of 0.3 s answers only where to resume (past a
        # verification record the leader may have logged meanwhile).
        status, lines = _changes(reader.addr, f"from={resume}&wait=300ms")
        assert status == 200 and len(lines) == 1, lines
        assert _position(lines[0]["next"]) >= _position(resume)
        # The command line reads the same stream, page after page, to its end.
        printed = subprocess.run(
            [sys.executable, "-m", "quorumlog", "db", "changes", "--addr", reader.addr],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": _ROOT},
        )
        assert printed.returncode == 0, printed.stderr
        *cli_writes, cli_last = [json.loads(line) for line in printed.stdout.splitlines()]
        assert [w["record"]["stmts"][0][0] for w in cli_writes] == expected
        assert "next" in cli_last
        assert _changes(reader.addr, "from=nonsense")[0] == 400
        assert _changes(reader.addr, "limit=0")[0] == 400
    finally:
        for replica in replicas:
            replica.stop()


def _position(text: str) -> tuple[int, int]:
    ledger_id, entry_id = text.split(":")
    return int(ledger_id), int(entry_id)
