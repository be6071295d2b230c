"""The HTTP admin API of a bookie (and of an autorecovery process), BookKeeper's shapes.

Endpoints (JSON answers; errors are ``{"error": message}`` with the status that fits:
400 a bad parameter, named; 404 an unknown ledger or endpoint; 405 another method;
503 the metadata store did not answer):

- ``GET /heartbeat``: ``{"status": "OK"}`` while the process serves.
- ``GET /metrics``: Prometheus's text format (:mod:`quorumlog.server.metrics`).
- ``GET /api/v1/bookie/info``: id, free and total disk space, read-only state.
- ``GET /api/v1/bookie/state``: running, read-only (and why), shutting down.
  ``PUT /api/v1/bookie/state`` (or ``/api/v1/bookie/state/readonly``, BookKeeper's
  path) with ``{"readOnly": true|false}``: an operator's read-only mode.
- ``GET /api/v1/bookie/ledgers``: the ids of the ledgers this bookie holds data or
  state for (deleted ones, kept as tombstones, are not listed): what
  ``quorumlog shell orphans`` compares with the metadata store.
- ``GET /api/v1/bookie/list_bookies?type=rw|ro|all``: registered bookies.
- ``GET /api/v1/ledger/list?print_metadata=true|false``: ledger ids (with metadata).
- ``GET /api/v1/ledger/metadata?ledger_id=N``: one ledger's metadata.
- ``PUT|POST /api/v1/bookie/gc`` (optional ``{"major": false}``): a garbage collection
  (and, where the bookie has one, compaction) now; ``GET``: whether one is running and
  what the last one did.
- ``GET /api/v1/autorecovery/list_under_replicated_ledger?print_missing_replica=``:
  under-replicated ledgers (and the bookies whose copies are lost).
- ``GET /api/v1/autorecovery/who_is_auditor``: the auditor, 404 if none is elected.

:func:`build_admin_app` takes what the endpoints need, each optional, so the
autorecovery daemon reuses it without a bookie (the bookie endpoints then answer 404)
and can add its own routes to the returned application. The server runs it on the
bookie's own event loop: every handler is a few metadata reads or a look at the
bookie's state, never a blocking call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from quorumlog.bookie.bookie import Bookie
from quorumlog.bookie.disk_checker import disk_usage
from quorumlog.errors import BKError, NoNodeError, NoSuchLedgerError
from quorumlog.meta.bookies import BookieRegistry
from quorumlog.meta.ledgers import LedgerManager
from quorumlog.meta.store import MetadataStore
from quorumlog.meta.underreplication import UnderReplicationManager
from quorumlog.security.http import admin_api_roles, bearer_middleware
from quorumlog.security.tokens import TokenVerifier

__all__ = ["AdminContext", "AdminServer", "build_admin_app"]

log = logging.getLogger(__name__)

# How long one metadata call of a handler may take before the answer is 503: a hung
# store must not hold HTTP requests (and their sockets) forever.
METADATA_TIMEOUT_S = 10.0


@dataclass
class AdminContext:
    """What the endpoints read. ``store`` is a function: a bookie replaces its store
    when a session is lost, and the endpoints must use the current one."""

    store: Callable[[], MetadataStore | None]
    bookie: Bookie | None = None
    bookie_id: str = ""
    registry: CollectorRegistry | None = None
    # One garbage-collection round against the metadata store (the server's), used when
    # the bookie has no force_gc (compaction) of its own.
    gc_round: Callable[[], Awaitable[object]] | None = None
    shutting_down: Callable[[], bool] = lambda: False
    # Bearer tokens (docs/SECURITY.md): None serves everyone, as the bookie port does.
    token_verifier: TokenVerifier | None = None
    # Awaited before each /metrics answer: a process whose metrics need the metadata
    # store (an autorecovery daemon's marked ledgers) reads it there, as a collector
    # may not wait.
    before_scrape: Callable[[], Awaitable[None]] | None = None
    gc_task: asyncio.Task[object] | None = field(default=None, init=False)
    gc_last: dict[str, Any] | None = field(default=None, init=False)


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _json(body: object, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, sort_keys=True))


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error as JSON, with its status: aiohttp's own 404 and 405 too."""
    try:
        return await handler(request)
    except HttpError as exc:
        return _json({"error": exc.message}, exc.status)
    except web.HTTPMethodNotAllowed as exc:
        return _json(
            {
                "error": f"{request.method} not allowed on {request.path}; "
                f"allowed: {', '.join(sorted(exc.allowed_methods))}"
            },
            405,
        )
    except web.HTTPNotFound:
        return _json({"error": f"no endpoint {request.path}"}, 404)
    except web.HTTPException as exc:
        return _json({"error": exc.reason}, exc.status)
    except (TimeoutError, BKError, OSError) as exc:
        log.warning("admin %s %s: %s", request.method, request.path, exc)
        return _json({"error": f"metadata store: {exc}"}, 503)


def _bool_param(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise HttpError(400, f"parameter {name}={raw!r}: expected true or false")


def _ledger_id_param(request: web.Request) -> int:
    raw = request.query.get("ledger_id")
    if raw is None:
        raise HttpError(400, "parameter ledger_id is required")
    try:
        ledger_id = int(raw)
    except ValueError:
        raise HttpError(400, f"parameter ledger_id={raw!r}: expected an integer") from None
    if ledger_id < 0:
        raise HttpError(400, f"parameter ledger_id={raw!r}: expected a non-negative integer")
    return ledger_id


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise HttpError(400, "request body: expected a JSON object") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body: expected a JSON object")
    return body


async def _meta(call: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(call, METADATA_TIMEOUT_S)


class _Handlers:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx

    def _store(self) -> MetadataStore:
        store = self.ctx.store()
        if store is None:
            raise HttpError(503, "no metadata store session")
        return store

    def _bookie(self) -> Bookie:
        if self.ctx.bookie is None:
            raise HttpError(404, "this process runs no bookie")
        return self.ctx.bookie

    async def heartbeat(self, _request: web.Request) -> web.Response:
        return _json({"status": "OK"})

    async def metrics(self, _request: web.Request) -> web.Response:
        if self.ctx.registry is None:
            raise HttpError(404, "this process exports no metrics")
        if self.ctx.before_scrape is not None:
            await self.ctx.before_scrape()
        body = generate_latest(self.ctx.registry)
        response = web.Response(body=body)
        # aiohttp refuses a content type with parameters in content_type=, so set it whole.
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def bookie_info(self, _request: web.Request) -> web.Response:
        bookie = self._bookie()
        usage = await asyncio.to_thread(disk_usage, bookie.data_dir)
        return _json(
            {
                "bookieId": self.ctx.bookie_id,
                "freeSpace": usage.free_bytes,
                "totalSpace": usage.total_bytes,
                "readOnly": bookie.read_only,
                "ledgers": bookie.stats()["ledgers"],
            }
        )

    async def bookie_ledgers(self, _request: web.Request) -> web.Response:
        bookie = self._bookie()
        return _json({"bookieId": self.ctx.bookie_id, "ledgers": sorted(bookie.ledger_ids())})

    def _state(self) -> dict[str, Any]:
        bookie = self._bookie()
        shutting_down = self.ctx.shutting_down()
        return {
            "running": not shutting_down,
            "readOnly": bookie.read_only,
            "readOnlyReason": bookie.read_only_reason,
            "shuttingDown": shutting_down,
            "availableForHighPriorityWrites": not bookie.read_only,
        }

    async def get_state(self, _request: web.Request) -> web.Response:
        return _json(self._state())

    async def put_state(self, request: web.Request) -> web.Response:
        bookie = self._bookie()
        body = await _json_body(request)
        read_only = body.get("readOnly")
        if not isinstance(read_only, bool):
            raise HttpError(400, 'parameter readOnly: expected {"readOnly": true|false}')
        bookie.set_read_only(read_only)
        return _json(self._state())

    async def list_bookies(self, request: web.Request) -> web.Response:
        kind = request.query.get("type", "all")
        if kind not in ("rw", "ro", "all"):
            raise HttpError(400, f"parameter type={kind!r}: expected rw, ro or all")
        registry = BookieRegistry(self._store())
        out: dict[str, str] = {}
        if kind in ("rw", "all"):
            for address in await _meta(registry.writable_bookies()):
                out[address] = "rw"
        if kind in ("ro", "all"):
            for address in await _meta(registry.readonly_bookies()):
                out[address] = "ro"
        return _json(out)

    async def list_ledgers(self, request: web.Request) -> web.Response:
        print_metadata = _bool_param(request, "print_metadata")
        ledgers = LedgerManager(self._store())
        ids = await _meta(ledgers.list_ledger_ids())
        out: dict[str, object] = {}
        for ledger_id in sorted(ids):
            if not print_metadata:
                out[str(ledger_id)] = None
                continue
            try:
                metadata, _version = await _meta(ledgers.read(ledger_id))
            except (NoNodeError, NoSuchLedgerError):
                continue  # deleted while listing
            out[str(ledger_id)] = metadata.to_display()
        return _json(out)

    async def ledger_metadata(self, request: web.Request) -> web.Response:
        ledger_id = _ledger_id_param(request)
        try:
            metadata, version = await _meta(LedgerManager(self._store()).read(ledger_id))
        except (NoNodeError, NoSuchLedgerError):
            raise HttpError(404, f"ledger {ledger_id} does not exist") from None
        doc = metadata.to_display()
        doc["version"] = version
        return _json(doc)

    async def get_gc(self, _request: web.Request) -> web.Response:
        task = self.ctx.gc_task
        return _json(
            {
                "is_in_force_gc": task is not None and not task.done(),
                "last": self.ctx.gc_last,
            }
        )

    async def trigger_gc(self, request: web.Request) -> web.Response:
        bookie = self._bookie()
        body = await _json_body(request)
        major = body.get("major", True)
        if not isinstance(major, bool):
            raise HttpError(400, 'parameter major: expected {"major": true|false}')
        ctx = self.ctx
        if ctx.gc_task is not None and not ctx.gc_task.done():
            return _json({"started": False, "is_in_force_gc": True}, 202)
        force_gc = getattr(bookie, "force_gc", None)

        async def run() -> object:
            started = time.time()
            outcome: dict[str, Any] = {"started_at": started, "major": major}
            try:
                if force_gc is not None:
                    result = await force_gc(major)
                    outcome["result"] = _describe(result)
                elif ctx.gc_round is not None:
                    outcome["result"] = {"ledgers_dropped": await ctx.gc_round()}
                else:
                    outcome["error"] = "no garbage collection available"
            except Exception as exc:  # reported through GET; the bookie goes on
                log.warning("bookie %s: forced gc: %s", ctx.bookie_id, exc)
                outcome["error"] = str(exc)
            outcome["duration_s"] = round(time.time() - started, 3)
            ctx.gc_last = outcome
            return outcome

        ctx.gc_task = asyncio.get_running_loop().create_task(run())
        return _json({"started": True, "is_in_force_gc": True}, 202)

    async def under_replicated(self, request: web.Request) -> web.Response:
        print_missing = _bool_param(request, "print_missing_replica")
        manager = _under_replication(self._store())
        marks = await _meta(manager.list_marks())
        if print_missing:
            return _json({str(m.ledger_id): list(m.bookies) for m in marks})
        return _json([m.ledger_id for m in marks])

    async def who_is_auditor(self, _request: web.Request) -> web.Response:
        auditor = await _meta(_under_replication(self._store()).auditor())
        if not auditor:
            raise HttpError(404, "no auditor is elected")
        return _json({"Auditor": auditor})


def _under_replication(store: MetadataStore) -> UnderReplicationManager:
    return UnderReplicationManager(store)


def _describe(result: object) -> object:
    """A JSON view of what a gc or compaction returned (a dataclass, a number, None)."""
    if result is None or isinstance(result, bool | int | float | str):
        return result
    import dataclasses

    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return json.loads(json.dumps(dataclasses.asdict(result), default=str))
    return str(result)


def build_admin_app(ctx: AdminContext) -> web.Application:
    """The admin API's application; add routes to it before it runs."""
    h = _Handlers(ctx)
    checks = (
        []
        if ctx.token_verifier is None
        else [bearer_middleware(ctx.token_verifier, admin_api_roles)]
    )
    app = web.Application(middlewares=[*checks, _errors])
    app.router.add_get("/heartbeat", h.heartbeat)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_get("/api/v1/bookie/info", h.bookie_info)
    app.router.add_get("/api/v1/bookie/ledgers", h.bookie_ledgers)
    app.router.add_get("/api/v1/bookie/state", h.get_state)
    app.router.add_put("/api/v1/bookie/state", h.put_state)
    app.router.add_put("/api/v1/bookie/state/readonly", h.put_state)
    app.router.add_get("/api/v1/bookie/list_bookies", h.list_bookies)
    app.router.add_get("/api/v1/ledger/list", h.list_ledgers)
    app.router.add_get("/api/v1/ledger/metadata", h.ledger_metadata)
    app.router.add_get("/api/v1/bookie/gc", h.get_gc)
    app.router.add_put("/api/v1/bookie/gc", h.trigger_gc)
    app.router.add_post("/api/v1/bookie/gc", h.trigger_gc)
    app.router.add_get("/api/v1/autorecovery/list_under_replicated_ledger", h.under_replicated)
    app.router.add_get("/api/v1/autorecovery/who_is_auditor", h.who_is_auditor)
    return app


class AdminServer:
    """Runs an admin application on the running event loop, on ``host:port``."""

    def __init__(
        self, app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        """``ssl_context``: serve HTTPS (a reloader's front context takes renewed files)."""
        self._ssl_context = ssl_context
        self._app = app
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(
            runner, self._host, self._port, reuse_address=True, ssl_context=self._ssl_context
        )
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
