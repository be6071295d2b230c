"""rqlite's HTTP API over a :class:`~quorumlog.db.replica.Replica` (aiohttp).

Endpoints: ``/db/execute``, ``/db/query``, ``/db/request``, ``/db/backup``, ``/status``,
``/nodes``, ``/readyz``, ``/remove``, ``/leader``. Every query parameter an endpoint does
not take, and every rqlite endpoint not offered, is answered 400 naming it (docs/DB.md
has the table of rqlite's, one by one). A follower sends writes (and weak/strong
reads) on to the leader as a proxy, as rqlite 8 does by default; with ``?redirect`` it
answers 301 with the leader's address instead. docs/DB.md has the details and the
status codes.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import os
import re
import socket
import ssl
import sys
import time
from importlib import metadata
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from quorumlog.db import decltypes
from quorumlog.db.machine import EXECUTE, StatementResult, loads_json
from quorumlog.db.replica import NotLeaderError, Replica
from quorumlog.db.snapshot import copy_file, dump_sql, vacuumed
from quorumlog.db.sql import (
    BadRequestError,
    Statement,
    parse_statements,
    several_statements_refusal,
)
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.log.errors import LogTruncatedError
from quorumlog.log.position import Position
from quorumlog.security.http import bearer_middleware, db_api_roles
from quorumlog.security.tokens import TokenVerifier

__all__ = ["DEFAULT_MAX_BODY_BYTES", "DbHttpApi"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 4 << 20  # below a log entry's frame limit (8 MiB)
FORWARDED_HEADER = "X-Quorumlog-Forwarded"
POSITION_HEADER = "X-Quorumlog-Position"  # the applied position a backup holds
# Headers of the leader's answer a follower relays with it: what the answer is (a
# backup is a SQLite file or SQL text, not JSON) and the position it holds.
_RELAYED_HEADERS = ("Content-Type", POSITION_HEADER)
_MIN_POSITION_WAIT_S_DEFAULT = 10.0
_LEVELS = ("none", "weak", "strong", "linearizable")
_LEADER_CACHE_S = 1.0
# Beyond a forwarded request's own timeout, time for the leader's answer to travel.
_FORWARD_SLACK_S = 1.0
# How long a follower waits for a leader to forward a request to before it answers 503.
_LEADER_WAIT_S = 2.0
_LEADER_POLL_S = 0.05
try:
    _VERSION = metadata.version("quorumlog")
except metadata.PackageNotFoundError:  # run from a checkout that was never installed
    _VERSION = "unknown"
_PROBE_S = 2.0  # how long /nodes waits for each replica's answer
_SYNC_S_DEFAULT = 5.0  # how long /readyz?sync waits
_WRITE_TIMEOUT_S_DEFAULT = 30.0
_READ = "read"
_WRITE = "write"


# Every query parameter each endpoint takes (docs/DB.md, "rqlite's parameters and
# endpoints"): any other is answered 400 naming it, never silently ignored.
_OUTPUT_PARAMS = frozenset({"pretty", "timings", "associative", "blob_array", "raft_index"})
_WRITE_PARAMS = _OUTPUT_PARAMS | {"transaction", "timeout", "redirect", "queue", "wait"}
_READ_PARAMS = _OUTPUT_PARAMS | {
    "q",
    "level",
    "min_position",
    "redirect",
    "timeout",
    "linearizable_timeout",
    "freshness",
    "freshness_strict",
    "qualify_columns",
    "db_timeout",
}
_ACCEPTED_PARAMS: dict[str, frozenset[str]] = {
    "/db/execute": _WRITE_PARAMS,
    "/db/query": _READ_PARAMS,
    "/db/request": _WRITE_PARAMS | _READ_PARAMS,
    "/db/backup": frozenset({"fmt", "level", "redirect", "compress", "vacuum", "tables"}),
    "/status": frozenset({"pretty"}),
    "/nodes": frozenset({"pretty", "ver", "nonvoters", "timeout"}),
    "/readyz": frozenset({"noleader", "sync", "timeout"}),
    "/remove": frozenset({"pretty"}),
    "/leader": frozenset({"pretty"}),
    "/snapshot": frozenset({"pretty", "redirect"}),
    "/db/changes": frozenset({"from", "limit", "wait"}),
}
# rqlite's parameters this API does not offer, and why: answered 400 naming them.
REFUSED_PARAMS: dict[str, str] = {
    "db_timeout": (
        "writes are bounded by a budget of SQLite's steps (--statement-steps), the "
        "same verdict on every replica, not by a clock (db_timeout bounds reads)"
    ),
}
_NO_LOAD = (
    "loading is done through the leader and the log by `quorumlog db restore` "
    "(a SQLite file sent as SQL write requests)"
)
_NO_MEMBERSHIP = (
    "a replica joins by starting `quorumlog db serve` with the database's --metadata and "
    "--name (the election), not through this API"
)
# rqlite's endpoints this API does not offer, and why: answered 400 naming them.
REFUSED_ENDPOINTS: dict[str, str] = {
    "/db/load": _NO_LOAD,
    "/boot": _NO_LOAD,
    "/join": _NO_MEMBERSHIP,
    "/notify": _NO_MEMBERSHIP,
    "/debug/vars": "Go's expvar: see /status",
    "/debug/pprof": "Go's profiler: profile the Python process with py-spy",
}


def _param_refusal(path: str, names: Any) -> str:
    """Why a request to ``path`` with these query parameter names is refused ("" when
    it is not)."""
    accepted = _ACCEPTED_PARAMS.get(path)
    if accepted is None:
        return ""
    for name in names:
        if name in accepted:
            continue
        if name in REFUSED_PARAMS:
            return f"parameter {name} is not supported: {REFUSED_PARAMS[name]}"
        return f"unknown parameter {name} for {path}"
    return ""


_CHANGES_LIMIT_DEFAULT = 1_000
_CHANGES_LIMIT_MAX = 10_000


def _change_line(position: Position, data: bytes) -> bytes | None:
    """One write record of the change stream as a JSON line, or None for a record that
    changes nothing (a barrier, a verification, one of no known format)."""
    try:
        record = loads_json(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or record.get("kind") != EXECUTE:
        return None
    return orjson.dumps({"position": str(position), "record": record})


def _flag(request: web.Request, name: str) -> bool:
    """rqlite's flags are present (``?pretty``) or given a value (``?pretty=true``)."""
    if name not in request.query:
        return False
    return request.query[name].lower() not in ("false", "0", "no")


def _json_value(value: object) -> object:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _json_value_blob_array(value: object) -> object:
    if isinstance(value, bytes):
        return list(value)
    return value


def _result_json(
    result: StatementResult, *, associative: bool, timings: bool, blob_array: bool = False
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.error is not None:
        out["error"] = result.error
        return out
    if result.columns is not None:
        convert = _json_value_blob_array if blob_array else _json_value
        values = [[convert(v) for v in row] for row in result.values or []]
        types = result.types or []
        if associative:
            out["types"] = dict(zip(result.columns, types, strict=False))
            out["rows"] = [dict(zip(result.columns, row, strict=False)) for row in values]
        else:
            out["columns"] = result.columns
            out["types"] = types
            if values:
                out["values"] = values
    if result.last_insert_id is not None:
        out["last_insert_id"] = result.last_insert_id
    if result.rows_affected is not None:
        out["rows_affected"] = result.rows_affected
    if timings:
        out["time"] = result.time_s
    return out


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration (``2m``, ``1h30m``, ``1.5s``, ``500ms``, ``0``) as
    rqlite's parameters take them, or a bare number of seconds; BadRequestError for
    anything else (never a default in its place)."""
    raw = text.strip()
    try:
        return float(raw)  # a bare number: seconds
    except ValueError:
        pass
    at, total = 0, 0.0
    for match in _DURATION_PART.finditer(raw):
        if match.start() != at:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        at = match.end()
    if at == 0 or at != len(raw):
        raise BadRequestError(f"bad duration {text!r}: use e.g. 2m, 1s, 500ms or 1h30m")
    return total


def _duration_param(request: web.Request, name: str, default: float | None) -> float | None:
    """The query parameter ``name`` as a positive duration in seconds (``default`` when
    absent)."""
    if name not in request.query:
        return default
    try:
        value = parse_duration(request.query[name])
    except BadRequestError as exc:
        raise BadRequestError(f"parameter {name}: {exc.message}") from None
    if value <= 0:
        raise BadRequestError(f"parameter {name}: {request.query[name]!r} must be positive")
    return value


def _timeout_s(request: web.Request) -> float:
    """rqlite's ``timeout`` (a Go duration, or seconds); 30 s by default."""
    value = _duration_param(request, "timeout", _WRITE_TIMEOUT_S_DEFAULT)
    assert value is not None
    return value


class DbHttpApi:
    """The HTTP server of one replica."""

    def __init__(
        self,
        replica: Replica,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        forward_timeout_s: float = 30.0,
        token_verifier: TokenVerifier | None = None,
        ssl_context: ssl.SSLContext | None = None,
        leader_ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Security (docs/SECURITY.md): ``token_verifier`` asks for Bearer tokens,
        ``ssl_context`` serves HTTPS, ``leader_ssl_context`` verifies the leader's."""
        self._ssl_context = ssl_context
        self._leader_ssl_context = leader_ssl_context
        self.replica = replica
        self.max_body_bytes = max_body_bytes
        self.forward_timeout_s = forward_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._leader_cache: tuple[str, float] | None = None
        self._queued = 0  # rqlite's sequence_number of queued writes
        self._runner: web.AppRunner | None = None
        checks = [] if token_verifier is None else [bearer_middleware(token_verifier, db_api_roles)]
        self.app = web.Application(
            client_max_size=max_body_bytes, middlewares=[*checks, self._errors, self._params]
        )
        self.app.router.add_route("*", "/db/execute", self._execute)
        self.app.router.add_route("*", "/db/query", self._query)
        self.app.router.add_route("*", "/db/request", self._request)
        self.app.router.add_get("/db/backup", self._backup)
        self.app.router.add_get("/status", self._status)
        self.app.router.add_get("/nodes", self._nodes)
        self.app.router.add_route("DELETE", "/remove", self._remove)
        self.app.router.add_get("/readyz", self._readyz)
        self.app.router.add_get("/leader", self._leader)
        self.app.router.add_post("/leader", self._step_down)
        self.app.router.add_post("/snapshot", self._snapshot)
        self.app.router.add_get("/db/changes", self._changes)
        for path in REFUSED_ENDPOINTS:
            self.app.router.add_route("*", path, self._refused_endpoint)

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); the port."""
        connector = (
            None
            if self._leader_ssl_context is None
            else aiohttp.TCPConnector(ssl=self._leader_ssl_context)
        )
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.forward_timeout_s), connector=connector
        )
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------ plumbing

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except web.HTTPRequestEntityTooLarge:
            return self._error(request, 413, f"request body over {self.max_body_bytes} bytes")
        except web.HTTPNotFound:
            return self._error(request, 404, f"unknown endpoint {request.path}")
        except web.HTTPMethodNotAllowed:
            return self._error(request, 405, f"method {request.method} not allowed here")

    @web.middleware
    async def _params(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Every query parameter is one the endpoint takes, or the answer is 400 naming it."""
        refusal = _param_refusal(request.path, request.query.keys())
        if refusal:
            return self._error(request, 400, refusal)
        response: web.StreamResponse = await handler(request)
        return response

    async def _changes(self, request: web.Request) -> web.StreamResponse:
        """The change stream (docs/DB.md, "Change data capture"): the write records from
        ``from`` on, each with its log position, as JSON lines, and a last line naming
        where to resume. Any replica serves it, from the log itself."""
        query = request.query
        try:
            start = Position.parse(query["from"]) if "from" in query else None
            limit = int(query.get("limit", str(_CHANGES_LIMIT_DEFAULT)))
            wait_s = parse_duration(query.get("wait", "0"))
        except (InvalidArgumentError, BadRequestError) as exc:
            return self._error(request, 400, exc.message)
        except ValueError as exc:
            return self._error(request, 400, f"limit: {exc}")
        if not 1 <= limit <= _CHANGES_LIMIT_MAX:
            return self._error(request, 400, f"limit must be 1 to {_CHANGES_LIMIT_MAX}")
        the_log = self.replica.change_log()
        if the_log is None:
            return self._error(request, 503, "the replica has not opened its log yet")
        lines: list[bytes] = []
        try:
            reader = await the_log.open_reader(start)
            try:
                after = reader.position
                deadline = time.monotonic() + wait_s
                for _ in range(limit):
                    # Wait (up to ``wait``) only for the first record; then take what is
                    # readable now.
                    left_s = max(0.0, deadline - time.monotonic()) if not lines else 0.0
                    record = await reader.read_next(timeout_ms=left_s * 1000)
                    if record is None:
                        break
                    after = record.position.next()
                    # A barrier or a verification changes nothing: not a line, but
                    # ``next`` moves past it.
                    change = _change_line(record.position, record.data)
                    if change is not None:
                        lines.append(change)
            finally:
                await reader.close()
        except LogTruncatedError as exc:
            return self._error(request, 410, f"{exc.message}: start from a later position")
        except BKError as exc:
            return self._error(request, 503, f"reading the log failed: {exc.message}")
        lines.append(orjson.dumps({"next": str(after)}))
        return web.Response(
            body=b"\n".join(lines) + b"\n", content_type="application/x-ndjson", status=200
        )

    async def _refused_endpoint(self, request: web.Request) -> web.StreamResponse:
        reason = REFUSED_ENDPOINTS[request.path]
        return self._error(request, 400, f"endpoint {request.path} is not supported: {reason}")

    def _reply(self, request: web.Request, body: object, status: int = 200) -> web.Response:
        if _flag(request, "pretty"):
            data = json.dumps(body, indent=4).encode()
        else:
            try:
                # orjson: a 100-row answer cost json.dumps about 60 µs on the leader.
                data = orjson.dumps(body)
            except TypeError:  # a string orjson refuses (a lone surrogate): json escapes it
                data = json.dumps(body).encode()
        return web.Response(
            body=data, status=status, content_type="application/json", charset="utf-8"
        )

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        return self._reply(request, {"error": message}, status)

    async def _statements(self, request: web.Request) -> list[Statement]:
        """The request's statements: the JSON body, or ``?q=`` on a GET."""
        if request.method == "GET":
            query = request.query.get("q")
            if query is None:
                raise BadRequestError("a GET needs the statement in ?q=")
            return [Statement(query, [])]
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        raw = await request.read()
        if len(raw) > self.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=len(raw))
        if request.content_type == "text/plain":
            # rqlite's other body: the SQL itself, one statement string.
            try:
                text = raw.decode()
            except UnicodeDecodeError as exc:
                raise BadRequestError(f"a text/plain body must be UTF-8: {exc}") from None
            if not text.strip():
                raise BadRequestError("empty statement")
            return [Statement(text, [])]
        try:
            # NaN and integers past 64 bits are read, then refused below with a clearer
            # message; a malformed body gets json's error.
            body = loads_json(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequestError(f"malformed JSON body: {exc}") from None
        return parse_statements(body)

    def _answer(
        self,
        request: web.Request,
        results: list[StatementResult],
        started: float,
        position: Position | None = None,
        applied: Position | None = None,
        **extra: object,
    ) -> web.Response:
        associative = _flag(request, "associative")
        timings = _flag(request, "timings")
        blob_array = _flag(request, "blob_array")
        body: dict[str, Any] = {
            "results": [
                _result_json(r, associative=associative, timings=timings, blob_array=blob_array)
                for r in results
            ]
        }
        if timings:
            body["time"] = time.perf_counter() - started
        if position is not None:
            # Beyond rqlite: where the write was committed and which leader answered it.
            body["position"] = str(position)
            body["node"] = self.replica.config.node_id
        if _flag(request, "raft_index"):
            # rqlite's log index is a number; this log's position is LEDGER:ENTRY: a
            # write's own record, or for a read the last record applied where it ran.
            shown = position if position is not None else applied
            body["raft_index"] = None if shown is None else str(shown)
        body.update(extra)
        return self._reply(request, body)

    # ------------------------------------------------------------ leader

    async def _leader_api(self) -> str | None:
        """The leader's HTTP address; remembered for ``_LEADER_CACHE_S`` so that a
        follower does not read the election for every request it forwards (forgotten
        as soon as the leader cannot be reached or answers that it does not lead)."""
        now = time.monotonic()
        if self._leader_cache is not None and self._leader_cache[1] > now:
            return self._leader_cache[0]
        for node_id, api, leads in await self.replica.members():
            if leads and node_id != self.replica.config.node_id and api:
                self._leader_cache = (api, now + _LEADER_CACHE_S)
                return api
        self._leader_cache = None
        return None

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Send the request on to the leader and relay its answer (rqlite's forwarding),
        or 301 to it with ``?redirect``; 503 when no other replica leads."""
        if request.headers.get(FORWARDED_HEADER):
            return self._error(request, 503, "not leader (forwarded to a replica that is not)")
        try:
            leader = await self._leader_api()
            # A replica just started, or an election under way: wait a little for a
            # leader rather than fail a request a moment would have let through.
            for _ in range(int(_LEADER_WAIT_S / _LEADER_POLL_S)):
                if leader is not None:
                    break
                await asyncio.sleep(_LEADER_POLL_S)
                leader = await self._leader_api()
        except BKError as exc:
            return self._error(request, 503, f"leader not found: {exc}")
        if leader is None:
            return self._error(request, 503, f"leader not found within {_LEADER_WAIT_S:.0f} s")
        target = f"{leader}{request.path_qs}"
        if _flag(request, "redirect"):
            raise web.HTTPMovedPermanently(location=target)
        assert self._session is not None
        # The body goes on as it came: JSON, or text/plain SQL.
        content_type = request.headers.get("Content-Type", "application/json")
        headers = {FORWARDED_HEADER: "1", "Content-Type": content_type}
        if "Authorization" in request.headers:  # the leader checks the same token
            headers["Authorization"] = request.headers["Authorization"]
        # The request's own bound holds here too: a hung leader must not hold the caller
        # past it (the leader, given the same bound, answers within it when it can).
        try:
            asked_s = _duration_param(request, "timeout", None)
        except BadRequestError as exc:
            return self._error(request, 400, exc.message)
        bound_s = self.forward_timeout_s
        if asked_s is not None:
            bound_s = min(bound_s, asked_s + _FORWARD_SLACK_S)
        try:
            async with self._session.request(
                request.method,
                target,
                data=body if request.method == "POST" else None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=bound_s),
            ) as answer:
                text = await answer.read()
                if answer.status == 503:
                    self._leader_cache = None
                relayed = {k: answer.headers[k] for k in _RELAYED_HEADERS if k in answer.headers}
                relayed.setdefault("Content-Type", "application/json")
                return web.Response(body=text, status=answer.status, headers=relayed)
        except TimeoutError:
            self._leader_cache = None
            return self._error(
                request,
                503,
                f"leader {leader} did not answer within {bound_s:.1f} s: what was asked of it "
                "may or may not have been done (a write's outcome is unknown)",
            )
        except aiohttp.ClientError as exc:
            self._leader_cache = None
            return self._error(request, 503, f"leader {leader} unreachable: {exc}")

    # ------------------------------------------------------------ endpoints

    async def _execute(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, _WRITE)

    async def _query(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, _READ)

    async def _request(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, None)

    async def _handle(self, request: web.Request, kind: str | None) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            statements = await self._statements(request)
        except BadRequestError as exc:
            return self._error(request, 400, exc.message)
        for statement in statements:
            refusal = ";" in statement.sql and several_statements_refusal(statement)
            if refusal:
                return self._error(request, 400, refusal)
        if kind is None:
            # SQLite's verdict on this replica's schema, not the statements' words.
            kind = _READ if await self.replica.read_only(statements) else _WRITE
        if kind == _WRITE and request.method != "POST":
            return self._error(request, 405, "writes are POSTed")
        body = await request.read() if request.method == "POST" else b""
        replica = self.replica
        try:
            if kind == _WRITE:
                for name in ("qualify_columns", "db_timeout"):
                    if name in request.query:
                        return self._error(
                            request, 400, f"parameter {name} applies to reads, not writes"
                        )
                if not replica.is_leader:
                    return await self._forward(request, body)
                timeout_s = _timeout_s(request)
                if _flag(request, "queue"):
                    return await self._queue(request, statements, timeout_s, started)
                if "wait" in request.query:
                    return self._error(request, 400, "parameter wait applies to queued writes")
                try:
                    # The replica's own timer: no task (wait_for) nor Timeout object
                    # (asyncio.timeout) per request.
                    answer = await replica.execute(
                        statements, transaction=_flag(request, "transaction"), timeout_s=timeout_s
                    )
                except TimeoutError:
                    # The record stays queued (shielded): it may still commit and be
                    # applied, but this client is told only that the outcome is unknown.
                    return self._error(
                        request,
                        503,
                        f"write not confirmed within {timeout_s} s: it may or may not be applied",
                    )
                return self._answer(request, answer.results, started, answer.position)
            for name in ("queue", "wait"):
                if name in request.query:
                    return self._error(
                        request, 400, f"parameter {name} applies to writes, not reads"
                    )
            freshness_s = _duration_param(request, "freshness", None)
            strict = _flag(request, "freshness_strict")
            if strict and freshness_s is None:
                return self._error(request, 400, "freshness_strict needs freshness (a duration)")
            level = request.query.get("level", "weak").lower()
            if level == "auto":
                level = "weak"  # rqlite's auto: none on a read-only node; every replica here votes
            if level not in _LEVELS:
                # rqlite reads an unknown level as weak; a misspelt strong must not
                # silently become weaker.
                return self._error(request, 400, f"unknown read level {level!r}")
            if "min_position" in request.query:
                try:
                    wanted = Position.parse(request.query["min_position"])
                except InvalidArgumentError as exc:
                    return self._error(request, 400, exc.message)
                wait_s = _MIN_POSITION_WAIT_S_DEFAULT
                if not await replica.wait_applied(wanted, wait_s):
                    return self._error(
                        request, 503, f"position {wanted} not applied here within {wait_s} s"
                    )
                level = "none"  # this replica has applied it: read here
            if level != "none":
                if not replica.is_leader:
                    return await self._forward(request, body)
                if level in ("strong", "linearizable"):
                    timeout_s = _timeout_s(request)
                    if level == "linearizable":
                        timeout_s = (
                            _duration_param(request, "linearizable_timeout", timeout_s) or timeout_s
                        )
                    try:
                        await replica.barrier(timeout_s)
                    except TimeoutError:
                        return self._error(
                            request,
                            503,
                            f"{level} read: the lead not confirmed in {timeout_s} s",
                        )
            elif freshness_s is not None:
                # rqlite's freshness: a read served here, by a follower, only if it
                # was in contact with the log (strict: held all of it) that recently.
                age = replica.staleness_s(strict=strict)
                if age is None or age > freshness_s:
                    what = (
                        "held every confirmed record" if strict else "was in contact with the log"
                    )
                    since = "never" if age is None else f"{age:.3f} s ago"
                    return self._error(
                        request,
                        503,
                        f"stale read: this replica last {what} {since}, "
                        f"over the freshness of {freshness_s} s",
                    )
            applied = replica.applied
            qualify = _flag(request, "qualify_columns")
            if qualify and not decltypes.tables_available():
                return self._error(
                    request,
                    400,
                    "parameter qualify_columns is not available: this SQLite does not "
                    "tell which table a column comes from",
                )
            db_timeout_s = _duration_param(request, "db_timeout", None)
            if qualify or db_timeout_s is not None:
                results = await replica.read(
                    statements, qualify_columns=qualify, timeout_s=db_timeout_s
                )
            else:
                results = await replica.read(statements)
            return self._answer(request, results, started, applied=applied)
        except BadRequestError as exc:
            return self._error(request, 400, exc.message)
        except NotLeaderError as exc:
            return self._error(request, 503, exc.message)
        except BKError as exc:
            return self._error(request, 503, exc.message)

    async def _queue(
        self, request: web.Request, statements: list[Statement], timeout_s: float, started: float
    ) -> web.StreamResponse:
        """rqlite's queued write (``?queue``): answered with a ``sequence_number`` as soon
        as its record is on its way to the log, before it is confirmed; its outcome is
        not reported (lost if the lead is lost first). With ``wait``, answered once the
        record is confirmed and applied, with its results and position."""
        self._queued += 1
        number = self._queued
        write = asyncio.ensure_future(
            self.replica.execute(statements, transaction=_flag(request, "transaction"))
        )
        # One turn of the loop: the write's first step runs, refusing what cannot be
        # logged (400) before the record is appended.
        await asyncio.sleep(0)
        if write.done() and write.exception() is not None:
            failure = write.exception()
            if isinstance(failure, BadRequestError):
                return self._error(request, 400, failure.message)
            return self._error(request, 503, str(failure))
        if not _flag(request, "wait"):
            write.add_done_callback(_forget_queued)
            return self._reply(request, {"results": [], "sequence_number": number})
        try:
            answer = await asyncio.wait_for(asyncio.shield(write), timeout_s)
        except TimeoutError:
            write.add_done_callback(_forget_queued)
            return self._error(
                request,
                503,
                f"queued write {number} not confirmed within {timeout_s} s: "
                "it may or may not be applied",
            )
        except (NotLeaderError, BKError) as exc:
            return self._error(request, 503, exc.message)
        return self._answer(
            request, answer.results, started, answer.position, sequence_number=number
        )

    async def _backup(self, request: web.Request) -> web.StreamResponse:
        """This replica's file (``?fmt=sql``: as SQL text), a consistent copy; the applied
        position it holds is in the ``X-Quorumlog-Position`` header. Forwarded to the
        leader unless ``level=none`` (rqlite backs up on the leader); the follower relays
        the leader's file with its content type and position header."""
        level = request.query.get("level", "weak").lower()
        fmt = request.query.get("fmt", "binary").lower()
        vacuum, compress = _flag(request, "vacuum"), _flag(request, "compress")
        tables = request.query.get("tables")
        refusal = ""
        if level not in ("none", "weak"):
            refusal = f"a backup is read at level weak (the leader's) or none, not {level!r}"
        elif fmt not in ("binary", "sql"):
            refusal = f"unknown backup format {fmt!r}: binary (the default) or sql"
        elif vacuum and fmt == "sql":
            refusal = "parameter vacuum applies to the binary backup, not fmt=sql"
        elif tables is not None and fmt != "sql":
            refusal = "parameter tables applies to fmt=sql"
        if refusal:
            return self._error(request, 400, refusal)
        if level != "none" and not self.replica.is_leader:
            return await self._forward(request, b"")
        # On a thread: a copy of a large file must not hold up the replica's loop.
        data, position = await asyncio.to_thread(copy_file, self.replica.sqlite_path)
        headers = {POSITION_HEADER: "" if position is None else str(position)}
        content_type = "application/octet-stream"
        if fmt == "sql":
            wanted = None if tables is None else [t for t in tables.split(",") if t]
            try:
                lines = await asyncio.to_thread(dump_sql, data, wanted)
            except ValueError as exc:
                return self._error(request, 400, f"parameter tables: {exc}")
            data, content_type = ("\n".join(lines) + "\n").encode(), "application/sql"
        elif vacuum:
            data = await asyncio.to_thread(vacuumed, data)
        if compress:  # rqlite's: the same bytes, gzipped
            data, content_type = await asyncio.to_thread(gzip.compress, data), "application/gzip"
        charset = "utf-8" if content_type == "application/sql" else None
        return web.Response(body=data, headers=headers, content_type=content_type, charset=charset)

    async def _members_json(self) -> list[dict[str, Any]]:
        """The replicas in the election (the leader first), each taken as reachable."""
        try:
            members = await self.replica.members()
        except BKError:
            members = []
        return [
            {
                "id": node_id,
                "api_addr": api,
                "addr": api,
                "reachable": True,
                "leader": leads,
                "voter": True,
            }
            for node_id, api, leads in members
        ]

    async def _probe(self, node: dict[str, Any], probe_s: float = _PROBE_S) -> None:
        """Ask a replica's API whether it answers (any HTTP answer, an authentication
        refusal included, is an answer); set ``reachable``, and ``error`` when not."""
        if node["id"] == self.replica.config.node_id:
            return
        assert self._session is not None
        started = time.perf_counter()
        try:
            if not node["api_addr"]:
                raise ValueError("no API address recorded")
            async with self._session.get(
                f"{node['api_addr']}/readyz", timeout=aiohttp.ClientTimeout(total=probe_s)
            ) as answer:
                await answer.read()
            node["time"] = time.perf_counter() - started
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            node["reachable"] = False
            node["error"] = str(exc) or type(exc).__name__

    async def _nodes_json(self, probe_s: float = _PROBE_S) -> list[dict[str, Any]]:
        """Every replica the database recorded, up or down, as rqlite lists them: those
        in the election first (the leader first), then the others (not in the election:
        stopped, or gone for good); each probed, ``reachable`` false for one that does
        not answer."""
        nodes = await self._members_json()
        try:
            recorded = await self.replica.recorded_nodes()
        except BKError:
            recorded = []
        known = {n["id"] for n in nodes}
        for node_id, api in recorded:
            if node_id not in known:
                nodes.append(
                    {
                        "id": node_id,
                        "api_addr": api,
                        "addr": api,
                        "reachable": True,
                        "leader": False,
                        "voter": True,
                    }
                )
        await asyncio.gather(*(self._probe(n, probe_s) for n in nodes))
        return nodes

    async def _nodes(self, request: web.Request) -> web.StreamResponse:
        try:
            probe_s = _duration_param(request, "timeout", _PROBE_S)
        except BadRequestError as exc:
            return self._error(request, 400, exc.message)
        # ?nonvoters: every replica here votes (in the election), so all are listed.
        nodes = await self._nodes_json(probe_s or _PROBE_S)
        if request.query.get("ver") == "2":
            return self._reply(request, {"nodes": nodes})
        return self._reply(request, {n["id"]: n for n in nodes})

    async def _remove(self, request: web.Request) -> web.StreamResponse:
        """rqlite's ``DELETE /remove`` with ``{"id": NODE}``: forget a replica that is gone
        for good, so that ``/nodes`` stops listing it as unreachable. A replica still in
        the election is refused (stop it first)."""
        try:
            body = loads_json(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            return self._error(request, 400, f"malformed JSON body: {exc}")
        node_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(node_id, str) or not node_id:
            return self._error(request, 400, 'the body must be {"id": "<node id>"}')
        try:
            running = {member[0] for member in await self.replica.members()}
            if node_id in running:
                return self._error(
                    request, 400, f"replica {node_id} is running (in the election): stop it first"
                )
            if not await self.replica.forget_node(node_id):
                return self._error(request, 404, f"no replica {node_id} recorded")
        except BKError as exc:
            return self._error(request, 503, exc.message)
        return self._reply(request, {})

    async def _status(self, request: web.Request) -> web.StreamResponse:
        replica = self.replica
        nodes = await self._members_json()
        leader = next((n for n in nodes if n["leader"]), None)
        applied = replica.applied
        now = time.time()
        body = {
            "store": {
                "node_id": replica.config.node_id,
                "db_name": replica.config.name,
                "log": replica.log_name,
                "role": replica.role,
                "started": replica.started,
                "ready": (
                    replica.started and replica.failure is None and replica.role != "catching-up"
                ),
                "leader": {"node_id": leader["id"], "addr": leader["api_addr"]} if leader else {},
                "applied_position": None if applied is None else str(applied),
                "sqlite3": {
                    "path": str(replica.machine.path),
                    "db_size": replica.machine.size_bytes(),
                },
                "failure": replica.failure,
                # The last record whose outcome here matched the leader's (a VERIFY).
                "verified_position": (
                    None if replica.machine.verified is None else str(replica.machine.verified)
                ),
                "diverged": replica.diverged is not None,
                "snapshots_taken": replica.snapshots_taken,
                "restores": replica.restores,
            },
            # rqlite's names (bind_addr) beside this API's earlier ones (addr).
            "http": {"bind_addr": replica.config.http_addr, "addr": replica.config.http_addr},
            "node": {
                "start_time": replica.started_at,
                "current_time": now,
                "uptime": now - replica.started_at,
            },
            "build": {"version": _VERSION},
            "os": {
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
                "executable": sys.executable,
            },
        }
        return self._reply(request, body)

    async def _leader(self, request: web.Request) -> web.StreamResponse:
        """rqlite's ``GET /leader``: the replica that leads now (503 when none does)."""
        leader = next((n for n in await self._members_json() if n["leader"]), None)
        if leader is None:
            return self._error(request, 503, "leader not found")
        return self._reply(
            request,
            {
                "leader": {
                    "id": leader["id"],
                    "api_addr": leader["api_addr"],
                    "addr": leader["addr"],
                }
            },
        )

    async def _step_down(self, request: web.Request) -> web.StreamResponse:
        """rqlite's ``POST /leader``: the leader gives the lead up to the next replica
        in line (forwarded to it from a follower). Naming the next leader is not
        offered: a body is refused."""
        body = await request.read()
        if body.strip() not in (b"", b"{}"):
            return self._error(
                request,
                400,
                "POST /leader takes no body: the next replica in the election's line "
                "leads (choosing it is not supported)",
            )
        if not self.replica.is_leader:
            return await self._forward(request, body)
        try:
            if not await self.replica.step_down():
                return self._error(request, 503, "this replica no longer leads")
        except BKError as exc:
            return self._error(request, 503, exc.message)
        return self._reply(request, {})

    async def _snapshot(self, request: web.Request) -> web.StreamResponse:
        """rqlite's ``POST /snapshot``: the leader snapshots its file now (into a ledger,
        the log truncated behind the snapshots kept), forwarded from a follower."""
        if not self.replica.is_leader:
            return await self._forward(request, await request.read())
        try:
            taken = await self.replica.snapshot_now()
        except NotLeaderError as exc:
            return self._error(request, 503, exc.message)
        if taken is None:
            return self._error(
                request, 503, "no snapshot taken: nothing applied yet, or it failed (see its log)"
            )
        return self._reply(request, {"position": str(taken.position), "ledger": taken.ledger_id})

    async def _readyz(self, request: web.Request) -> web.StreamResponse:
        try:
            sync_s = _duration_param(request, "timeout", _SYNC_S_DEFAULT) or _SYNC_S_DEFAULT
        except BadRequestError as exc:
            return web.Response(text=exc.message + "\n", status=400)
        nodes = await self._members_json()
        noleader = _flag(request, "noleader")
        leader_ok = noleader or any(n["leader"] for n in nodes)
        # Listening comes first: until its start is done the replica is neither in
        # the election nor recorded among the database's replicas.
        node_ok = self.replica.started
        store_ok = self.replica.failure is None
        lines = [f"[{'+' if node_ok else '-'}]node ok"]
        if not noleader:  # rqlite's ?noleader: ready without a leader
            lines.append(f"[{'+' if leader_ok else '-'}]leader ok")
        lines.append(f"[{'+' if store_ok else '-'}]store ok")
        sync_ok = True
        if _flag(request, "sync"):
            # rqlite's ?sync: this replica's copy caught up with the log since the
            # request came (within ``timeout``, 5 s by default).
            sync_ok = store_ok and await self.replica.wait_synced(sync_s)
            lines.append(f"[{'+' if sync_ok else '-'}]sync ok")
        status = 200 if node_ok and leader_ok and store_ok and sync_ok else 503
        return web.Response(text="\n".join(lines) + "\n", status=status)


def _forget_queued(write: asyncio.Future[Any]) -> None:
    """A queued write's end, which nobody waits for: its failure is logged."""
    if not write.cancelled() and write.exception() is not None:
        log.warning("database: a queued write failed: %s", write.exception())


async def wait_forever(stop: asyncio.Event) -> None:
    await stop.wait()
