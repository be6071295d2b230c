"""``quorumlog shell gc``: garbage collection and compaction now, on every bookie named.

As with BookKeeper (``curl -XPUT http://bookie:8000/api/v1/bookie/gc``), a forced
collection goes through each bookie's HTTP admin API, not the data protocol: an
operator's action, on the port an operator reaches, answering JSON. Each bookie
started with ``--http-port`` publishes its admin address in its registration
(``/bookies/available/<address>``), where the command finds it; ``--http`` names
admin addresses by hand instead. Each bookie answers who it is
(``/api/v1/bookie/info``), and every registered bookie that was not reached (no
admin API published, or none of the ``--http`` given) is listed, with a non-zero
exit status.

For each bookie: ``PUT /api/v1/bookie/gc`` with ``{"major": true|false}``, then
``GET /api/v1/bookie/gc`` until it is done; the result is printed (entry logs
rewritten, bytes copied and freed, why a log was kept).

On secured bookies (docs/SECURITY.md) the requests carry the shell's token as
``Authorization: Bearer`` (a collection needs the ``admin`` role) and ``https://``
admin addresses are verified with the shell's TLS settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from quorumlog.security import options as security_options
from quorumlog.security.tls import client_context
from quorumlog.security.tokens import TokenFile

_POLL_S = 0.2


def add_http_argument(p: argparse.ArgumentParser) -> None:
    """``--http HOST:PORT``, repeatable: the bookies' admin APIs to ask (the commands
    that reach bookies through them share it)."""
    p.add_argument(
        "--http",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a bookie's admin API (its --http-port), repeatable; default: the address "
        "each registered bookie publishes",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_http_argument(p)
    p.add_argument("--minor", action="store_true", help="a minor compaction instead of a major one")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait per bookie")
    p.add_argument("--json", action="store_true", help="one JSON object per bookie")


@dataclass(frozen=True)
class _Credentials:
    """What the admin API asks of a caller on secured bookies: a token, a TLS context."""

    # The Authorization header holds the token: never in a repr (an error, a log line).
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    context: ssl.SSLContext | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> _Credentials:
        token = TokenFile(getattr(args, "token_file", None))()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        tls = security_options.client_tls(args) if hasattr(args, "tls_ca") else None
        return cls(headers, client_context(tls) if tls is not None else None)


def _call(
    method: str,
    url: str,
    body: dict[str, Any] | None,
    timeout_s: float,
    credentials: _Credentials = _Credentials(),
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for name, value in credentials.headers.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(
            request, timeout=timeout_s, context=credentials.context
        ) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise OSError(f"{method} {url}: HTTP {exc.code} {detail}") from None
    except urllib.error.URLError as exc:
        raise OSError(f"{method} {url}: {exc.reason}") from None


async def _one(
    http: str, major: bool, timeout_s: float, credentials: _Credentials
) -> dict[str, Any]:
    base = http if http.startswith("http") else f"http://{http}"
    info_url = f"{base}/api/v1/bookie/info"
    info = await asyncio.to_thread(_call, "GET", info_url, None, 10, credentials)
    url = f"{base}/api/v1/bookie/gc"
    started = await asyncio.to_thread(_call, "PUT", url, {"major": major}, 10, credentials)
    deadline = time.monotonic() + timeout_s
    while True:
        state = await asyncio.to_thread(_call, "GET", url, None, 10, credentials)
        last = state.get("last") or {}
        # A gc already running when asked is waited for, then reported.
        if not state.get("is_in_force_gc") and (last or not started.get("started")):
            return {"bookie": info.get("bookieId", http), "http": http, **last}
        if time.monotonic() > deadline:
            raise OSError(f"{url}: still collecting after {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_S)


async def _published_admin_addresses(registry: Any, bookies: set[str]) -> dict[str, str]:
    """Bookie address -> the admin API address it published in its registration."""
    published = {}
    for bookie in sorted(bookies):
        info = await registry.read_service_info(bookie)
        if info and info.get("http"):
            published[bookie] = info["http"]
    return published


async def run_gc(bk: Any, args: argparse.Namespace) -> int:
    registered = set(await bk.registry.writable_bookies())
    registered |= set(await bk.registry.readonly_bookies())
    if args.http:
        targets = list(args.http)
        tried: set[str] = set()
        unreached_why = "registered, but no --http reached it"
    else:
        published = await _published_admin_addresses(bk.registry, registered)
        targets = list(published.values())
        tried = set(published)  # a failure of these is printed with its admin address
        unreached_why = "registered without an admin API (start it with --http-port)"
    credentials = _Credentials.from_args(args)
    outcomes = await asyncio.gather(
        *(_one(h, not args.minor, args.timeout, credentials) for h in targets),
        return_exceptions=True,
    )
    status = 0
    reached = set()
    for http, outcome in zip(targets, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            print(f"{http}: {outcome}", file=sys.stderr)
            status = 1
            continue
        reached.add(outcome["bookie"])
        if "error" in outcome:
            status = 1
        if args.json:
            print(json.dumps(outcome, sort_keys=True))
        else:
            print(_summary(outcome))
    for missing in sorted(registered - reached - tried):
        print(f"{missing}: {unreached_why}", file=sys.stderr)
        status = 1
    return status


def _summary(outcome: dict[str, Any]) -> str:
    who = outcome["bookie"]
    if "error" in outcome:
        return f"{who}: failed: {outcome['error']}"
    result = outcome.get("result")
    if not isinstance(result, dict):
        return f"{who}: done ({result})"
    line = (
        f"{who}: {'major' if outcome.get('major') else 'minor'} compaction rewrote "
        f"{len(result.get('logs_compacted', []))} entry logs, copied "
        f"{result.get('entries_copied', 0)} entries ({result.get('bytes_copied', 0)} bytes), "
        f"freed {result.get('bytes_freed', 0)} bytes in {outcome.get('duration_s', 0)} s"
    )
    for why in result.get("skipped", []):
        line += f"\n  kept: {why}"
    return line
