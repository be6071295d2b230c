"""Bearer tokens on the HTTP APIs (the admin API, the database's API), as aiohttp middleware.

The same tokens as the bookie protocol: ``Authorization: Bearer <token>``. A request
without one, or with one that does not verify, gets 401 with ``WWW-Authenticate:
Bearer`` and the reason; a verified token without a role the route needs gets 403. The
caller's table decides which roles a route needs (None: open, e.g. a load balancer's
health check).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from quorumlog.errors import AuthenticationError
from quorumlog.security.roles import Role
from quorumlog.security.tokens import TokenVerifier

log = logging.getLogger(__name__)

RolesFor = Callable[[web.Request], frozenset[Role] | None]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

READERS = frozenset(Role)
ADMIN_ONLY = frozenset({Role.ADMIN})
CLIENTS = frozenset({Role.CLIENT, Role.ADMIN})


def _refusal(status: int, reason: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="quorumlog"'} if status == 401 else {}
    return web.Response(
        status=status,
        text=json.dumps({"error": reason}),
        content_type="application/json",
        headers=headers,
    )


def bearer_middleware(verifier: TokenVerifier, roles_for: RolesFor) -> Middleware:
    """aiohttp middleware that lets through only requests whose token has a role the
    route needs (``roles_for(request)``)."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        needed = roles_for(request)
        if needed is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return _refusal(401, "authentication required: send Authorization: Bearer <token>")
        try:
            identity = verifier.verify(token.strip())
        except AuthenticationError as exc:
            log.warning("HTTP %s %s refused: %s", request.method, _loggable(request), exc.message)
            return _refusal(401, exc.message)
        if needed.isdisjoint(identity.roles):
            wanted = " or ".join(sorted(needed))
            log.warning(
                "HTTP %s %s refused to %s: needs %s",
                request.method,
                _loggable(request),
                identity.describe(),
                wanted,
            )
            return _refusal(403, f"this request needs the role {wanted}")
        return await handler(request)

    return check


def _loggable(request: web.Request) -> str:
    """The path as it came (percent-encoded): its decoded form may hold a line break by
    which a peer without a token would write log lines of its own."""
    return request.raw_path


def db_api_roles(request: web.Request) -> frozenset[Role] | None:
    """The database's API: readiness is open (load balancers), a backup (the whole
    database), forgetting a replica (``/remove``), a leader's step down (``POST
    /leader``) and a snapshot (``/snapshot``) take ``admin``, statements and status
    take ``client`` (or ``admin``)."""
    if request.path == "/readyz":
        return None
    if request.path in ("/leader", "/snapshot") and request.method == "POST":
        return ADMIN_ONLY  # a step down, a snapshot
    return ADMIN_ONLY if request.path in ("/db/backup", "/remove") else CLIENTS


def admin_api_roles(request: web.Request) -> frozenset[Role] | None:
    """The admin API: the heartbeat is open, reading takes any role, changing (read-only
    switch, GC, decommission) takes ``admin``."""
    if request.path == "/heartbeat":
        return None
    return READERS if request.method in ("GET", "HEAD") else ADMIN_ONLY
