"""Bearer tokens on every route of the bookie's admin API and of the database's API
(quorumlog.security.http), served on 127.0.0.1 by aiohttp's test server: each route,
read from the application's own router, refuses a missing, malformed, forged or expired
token with 401 and a role it does not take with 403, as JSON."""

from __future__ import annotations

import logging
import time
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from support import run
from tls_certs import HMAC_SECRET

from quorumlog.db.http import DbHttpApi
from quorumlog.security import Role, TokenVerifier, issue_token
from quorumlog.security.http import bearer_middleware, db_api_roles
from quorumlog.server.admin_http import AdminContext, build_admin_app

OPEN_PATHS = {"/heartbeat", "/readyz"}


def _token(*roles: Role, expires_in_s: float = 600, key: bytes = HMAC_SECRET) -> str:
    return issue_token(key, roles, subject="tester", expires_at_s=time.time() + expires_in_s)


def _routes(app: web.Application) -> list[tuple[str, str]]:
    """Every (method, path) the application serves, but the open ones ("*": as POST)."""
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path in OPEN_PATHS or route.method == "HEAD":  # HEAD: GET's, with no body to read
            continue
        method = "POST" if route.method == "*" else route.method
        routes.add((method, path))
    return sorted(routes)


BAD_CREDENTIALS: list[tuple[str, dict[str, str]]] = [
    ("missing", {}),
    ("not bearer", {"Authorization": "Basic dXNlcjpwYXNz"}),
    ("empty bearer", {"Authorization": "Bearer "}),
    ("garbage", {"Authorization": "Bearer not-a-token"}),
    ("another key", {"Authorization": "Bearer " + _token(Role.ADMIN, key=b"o" * 40)}),
    ("expired", {"Authorization": "Bearer " + _token(Role.ADMIN, expires_in_s=-10)}),
    (
        "alg none",
        {"Authorization": "Bearer " + jwt.encode({"role": "admin"}, None, algorithm="none")},
    ),
]


async def _refusals(
    app: web.Application, admin_only: set[tuple[str, str]]
) -> list[tuple[str, str, str, int, Any]]:
    """(method, path, credentials, status, body) of every answer that is not as it should."""
    wrong = []
    client_token = {"Authorization": "Bearer " + _token(Role.CLIENT)}
    async with TestClient(TestServer(app)) as http:
        for method, path in _routes(app):
            for name, headers in BAD_CREDENTIALS:
                async with http.request(method, path, headers=headers) as answer:
                    body = await answer.json()
                    challenge = answer.headers.get("WWW-Authenticate", "")
                    if answer.status != 401 or "error" not in body or "Bearer" not in challenge:
                        wrong.append((method, path, name, answer.status, body))
                    credential = headers.get("Authorization", "")[7:]
                    if len(credential) > 8 and credential in str(body):
                        wrong.append((method, path, name + " quoted", answer.status, body))
            if (method, path) in admin_only:
                async with http.request(method, path, headers=client_token) as answer:
                    body = await answer.json()
                    if answer.status != 403 or "admin" not in body.get("error", ""):
                        wrong.append((method, path, "client role", answer.status, body))
    return wrong


def test_auth_every_admin_api_route_refuses_bad_tokens_and_roles():
    verifier = TokenVerifier.from_key_bytes(HMAC_SECRET)
    app = build_admin_app(AdminContext(store=lambda: None, token_verifier=verifier))
    changes = {(m, p) for m, p in _routes(app) if m not in ("GET", "HEAD")}
    assert changes  # the read-only switch and GC
    assert run(_refusals(app, changes)) == []


def test_auth_every_db_api_route_refuses_bad_tokens_and_roles():
    verifier = TokenVerifier.from_key_bytes(HMAC_SECRET)
    # Refusals come before any handler: the replica is never reached.
    server = DbHttpApi(object(), token_verifier=verifier)  # type: ignore[arg-type]
    backup = {(m, p) for m, p in _routes(server.app) if p == "/db/backup"}
    assert backup
    assert run(_refusals(server.app, backup)) == []


def test_auth_a_token_the_key_cannot_check_is_a_401_and_paths_are_logged_escaped(
    caplog: pytest.LogCaptureFixture,
):
    """An ES256 token at a P-384 key (PyJWT's InvalidKeyError) is a refusal, not a 500;
    the refused path is logged escaped, so that a peer without a token cannot write
    lines of its own into the log."""
    bookie_key = ec.generate_private_key(ec.SECP384R1())
    public_pem = bookie_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    verifier = TokenVerifier.from_key_bytes(public_pem)
    app = build_admin_app(AdminContext(store=lambda: None, token_verifier=verifier))
    forged = jwt.encode({"role": "admin"}, ec.generate_private_key(ec.SECP256R1()), "ES256")

    async def scenario() -> tuple[int, int]:
        async with TestClient(TestServer(app)) as http:
            headers = {"Authorization": f"Bearer {forged}"}
            async with http.put("/api/v1/bookie/gc", headers=headers) as answer:
                curve_status = answer.status
            path = "/metrics%0A2026-11-24 00:00:00 INFO forged line"
            async with http.get(path, headers=headers) as answer:
                return curve_status, answer.status

    with caplog.at_level(logging.WARNING, logger="quorumlog.security.http"):
        assert run(scenario()) == (401, 401)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert all("\n" not in message for message in messages), messages


class _Follower:
    """What the database's API reads of a replica that does not lead."""

    is_leader = False


def test_auth_a_follower_forwards_the_callers_token_and_no_other():
    """A write sent to a follower reaches the leader with the caller's own token (the
    leader checks it again): forwarding neither upgrades nor drops the caller's roles."""
    verifier = TokenVerifier.from_key_bytes(HMAC_SECRET)
    seen: list[str | None] = []

    async def leader_execute(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"results": []})

    leader_app = web.Application(middlewares=[bearer_middleware(verifier, db_api_roles)])
    leader_app.router.add_post("/db/execute", leader_execute)
    leader_app.router.add_get("/db/backup", leader_execute)
    follower = DbHttpApi(_Follower(), token_verifier=verifier)  # type: ignore[arg-type]
    client = "Bearer " + _token(Role.CLIENT)

    async def scenario() -> list[int]:
        statuses = []
        async with TestServer(leader_app) as leader:
            leader_url = str(leader.make_url("")).rstrip("/")

            async def leader_api() -> str:
                return leader_url

            follower._leader_api = leader_api  # type: ignore[method-assign]
            port = await follower.start("127.0.0.1", 0)
            try:
                async with aiohttp.ClientSession() as http:
                    url = f"http://127.0.0.1:{port}"
                    for path, method, headers in [
                        ("/db/execute", "POST", {"Authorization": client}),
                        ("/db/backup", "GET", {"Authorization": client}),  # needs admin
                        ("/db/execute", "POST", {}),
                    ]:
                        async with http.request(
                            method, url + path, headers=headers, json=["INSERT INTO t VALUES (1)"]
                        ) as answer:
                            statuses.append(answer.status)
            finally:
                await follower.close()
        return statuses

    assert run(scenario()) == [200, 403, 401]
    assert seen == [client]  # the caller's token, as it came; the refused ones never left
