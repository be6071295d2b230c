"""``quorumlog autorecovery``: the autorecovery daemon (an auditor candidate and a
replication worker) in the foreground.

Prints ``autorecovery IDENTIFIER running`` once it has joined the auditor election;
SIGTERM or SIGINT stop it (exit status 0). With ``--http-port`` it serves the admin
API without the bookie endpoints (heartbeat, bookies, ledgers, under-replicated
ledgers, the auditor) and ``/metrics`` with its own counts
(:mod:`quorumlog.replication.metrics`), announced by ``autorecovery IDENTIFIER admin
URL`` before the running line. ``quorumlog bookie --autorecovery`` runs
the same daemon inside a bookie process, with the same options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from quorumlog.commands.config_file import enable_config_file
from quorumlog.core.placement import POLICIES, PlacementPolicy
from quorumlog.errors import BKError
from quorumlog.replication.auditor import AUDIT_INTERVAL_S_DEFAULT, BOOKIE_CHECK_INTERVAL_S_DEFAULT
from quorumlog.replication.autorecovery import AutoRecovery, AutoRecoveryConfig
from quorumlog.replication.rereplicate import LEDGERS_IN_FLIGHT_DEFAULT
from quorumlog.replication.throttle import RATE_BYTES_PER_S_DEFAULT
from quorumlog.replication.worker import OPEN_LEDGER_GRACE_S_DEFAULT, RETRY_BACKOFF_S_DEFAULT
from quorumlog.security import options as security_options
from quorumlog.security.tls import TlsReloader
from quorumlog.security.tokens import TokenVerifier
from quorumlog.server.addresses import LOCAL_HOST, resolve_addresses
from quorumlog.server.options import configure_logging

if TYPE_CHECKING:
    from quorumlog.server.admin_http import AdminServer

_PROG = "quorumlog autorecovery"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "autorecovery",
        help="run the autorecovery daemon (auditor candidate and replication worker)",
        description="Run an auditor candidate and a replication worker until SIGTERM or SIGINT.",
    )
    p.add_argument(
        "--metadata",
        metavar="URI",
        help="metadata store (default: $QUORUMLOG_METADATA, else sqlite:// ./.quorumlog)",
    )
    p.add_argument(
        "--bind-address",
        metavar="ADDR",
        default=None,
        help="local interface the admin API listens on; 0.0.0.0 for every interface, which "
        "needs --advertised-address (default: 127.0.0.1)",
    )
    p.add_argument(
        "--advertised-address",
        metavar="HOST",
        default=None,
        help="this machine's name as other machines know it: the daemon's identifier is "
        "HOST:PID (shown by whoisauditor and in the workers' claims) and the admin API's "
        "printed address (default: the host name, and the bind address for the API)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the HTTP admin API and /metrics on the bind address, port PORT (0: a "
        "free port, printed on stdout; default: not served)",
    )
    add_options(p)
    security_options.add_client_tls_options(p)
    security_options.add_http_security_options(p)  # its admin API (--http-port)
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level on stderr (default: %(default)s)",
    )
    p.set_defaults(func=run)
    enable_config_file(p, "autorecovery")


def add_options(p: argparse.ArgumentParser) -> None:
    """The daemon's options, shared with ``quorumlog bookie --autorecovery``."""
    p.add_argument(
        "--audit-interval-s",
        type=float,
        default=AUDIT_INTERVAL_S_DEFAULT,
        help="seconds between periodic audits of the closed ledgers (default: %(default)s)",
    )
    p.add_argument(
        "--audit-sample",
        type=float,
        default=1.0,
        help="fraction of the closed ledgers each periodic audit checks, 0..1 "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--bookie-check-interval-s",
        type=float,
        default=BOOKIE_CHECK_INTERVAL_S_DEFAULT,
        help="seconds between the auditor's full reads of which bookies ledgers name, "
        "besides bookie events (default: %(default)s)",
    )
    p.add_argument(
        "--open-ledger-grace-s",
        type=float,
        default=OPEN_LEDGER_GRACE_S_DEFAULT,
        help="how long an open ledger's writer may replace a lost bookie itself before "
        "the ledger is fenced and closed (default: %(default)s)",
    )
    p.add_argument(
        "--retry-backoff-s",
        type=float,
        default=RETRY_BACKOFF_S_DEFAULT,
        help="pause before retrying a ledger that could not be repaired (default: %(default)s)",
    )
    p.add_argument(
        "--ledgers-in-flight",
        type=int,
        default=LEDGERS_IN_FLIGHT_DEFAULT,
        help="ledgers a worker repairs at once (default: %(default)s)",
    )
    p.add_argument(
        "--replication-rate-bytes-per-s",
        type=int,
        default=RATE_BYTES_PER_S_DEFAULT,
        help="bound on the bytes a worker copies per second, so that repairs leave the "
        "bookies to their writers; 0: no bound (default: %(default)s)",
    )
    p.add_argument(
        "--autorecovery-session-timeout-ms",
        type=int,
        default=AutoRecoveryConfig().metadata_session_timeout_ms,
        help="metadata session timeout of the daemon: how long a dead worker's claims and "
        "a dead auditor's place outlive it (default: %(default)s)",
    )
    p.add_argument(
        "--placement",
        choices=list(POLICIES),
        default="random",
        help="placement policy the auditor checks closed ledgers by and workers place "
        "copies by (default: %(default)s)",
    )
    p.add_argument(
        "--min-racks-per-write-quorum",
        type=int,
        default=PlacementPolicy().min_racks_per_write_quorum,
        help="racks each write set should span under rack-aware and region-aware "
        "placement (default: %(default)s)",
    )
    p.add_argument("--password", default="", help="the ledgers' password (text)")
    p.add_argument(
        "--no-auditor", action="store_true", help="run a replication worker only, never audit"
    )
    security_options.add_token_file_option(p)  # a token with the bookie role


def config_from_args(args: argparse.Namespace) -> AutoRecoveryConfig:
    """ValueError with a one-line reason for bad values."""
    if args.audit_interval_s <= 0:
        raise ValueError("--audit-interval-s must be positive")
    if not 0.0 < args.audit_sample <= 1.0:
        raise ValueError("--audit-sample must be in (0, 1]")
    if args.bookie_check_interval_s <= 0:
        raise ValueError("--bookie-check-interval-s must be positive")
    if args.open_ledger_grace_s < 0 or args.retry_backoff_s < 0:
        raise ValueError("--open-ledger-grace-s and --retry-backoff-s must not be negative")
    if args.ledgers_in_flight < 1:
        raise ValueError("--ledgers-in-flight must be at least 1")
    if args.replication_rate_bytes_per_s < 0:
        raise ValueError("--replication-rate-bytes-per-s must not be negative (0: no bound)")
    if args.autorecovery_session_timeout_ms <= 0:
        raise ValueError("--autorecovery-session-timeout-ms must be positive")
    if args.min_racks_per_write_quorum < 1:
        raise ValueError("--min-racks-per-write-quorum must be at least 1")
    config = AutoRecoveryConfig(
        election_session_timeout_ms=args.autorecovery_session_timeout_ms,
        metadata_session_timeout_ms=args.autorecovery_session_timeout_ms,
        run_auditor=not args.no_auditor,
    )
    password = args.password.encode()
    config.auditor.audit_interval_s = args.audit_interval_s
    config.auditor.audit_sample_fraction = args.audit_sample
    config.auditor.bookie_check_interval_s = args.bookie_check_interval_s
    config.auditor.password = password
    config.auditor.placement = args.placement
    config.auditor.min_racks_per_write_quorum = args.min_racks_per_write_quorum
    config.worker.open_ledger_grace_s = args.open_ledger_grace_s
    config.worker.retry_backoff_s = args.retry_backoff_s
    config.worker.ledgers_in_flight = args.ledgers_in_flight
    config.worker.rate_bytes_per_s = args.replication_rate_bytes_per_s
    config.worker.password = password
    # In a bookie process, the bookie's own TLS files: its CA verifies the other bookies,
    # its certificate is the client certificate.
    config.tls = security_options.client_tls(args)
    config.token_file = security_options.token_file(args)
    return config


def run(args: argparse.Namespace) -> int:
    from quorumlog.client.sync import new_event_loop
    from quorumlog.meta.factory import resolve_metadata_uri

    configure_logging(args)
    try:
        config = config_from_args(args)
        admin_security = _AdminSecurity(
            security_options.token_verifier(args), security_options.http_tls(args)
        )
        if args.http_port is not None and not 0 <= args.http_port <= 65535:
            raise ValueError(f"--http-port {args.http_port}: expected 0..65535")
        admin_hosts = resolve_addresses(args.bind_address, args.advertised_address)
        identifier = None
        if args.advertised_address is not None:
            identifier = f"{admin_hosts[1]}:{os.getpid()}"
    except ValueError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    uri = resolve_metadata_uri(args.metadata)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(
            _serve(uri, config, identifier, args.http_port, admin_hosts, admin_security)
        )
    except _AdminPortError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (BKError, OSError) as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        loop.close()


@dataclass(frozen=True)
class _AdminSecurity:
    """The admin API's Bearer tokens and HTTPS (docs/SECURITY.md); None: off."""

    token_verifier: TokenVerifier | None = None
    tls: TlsReloader | None = None


class _AdminPortError(Exception):
    """The admin API's port cannot be served (in use, not permitted)."""


async def _start_admin(
    daemon: AutoRecovery, port: int, bind_host: str, security: _AdminSecurity
) -> AdminServer:
    """The admin API without a bookie: the metadata endpoints through the daemon's
    current session, ``/metrics`` with its counts."""
    from quorumlog.replication.metrics import AutoRecoveryMetrics
    from quorumlog.server.admin_http import AdminContext, AdminServer, build_admin_app

    metrics = AutoRecoveryMetrics(daemon)
    ctx = AdminContext(
        store=lambda: daemon.bk.store if daemon.bk is not None else None,
        bookie=None,
        bookie_id=daemon.identifier,
        registry=metrics.registry,
        before_scrape=metrics.refresh,
        token_verifier=security.token_verifier,
    )
    tls = security.tls
    ssl_context = tls.server_front_context() if tls is not None else None
    admin = AdminServer(build_admin_app(ctx), bind_host, port, ssl_context)
    try:
        await admin.start()
    except OSError as exc:
        raise _AdminPortError(
            f"cannot serve the admin API on {bind_host}:{port}: {exc.strerror or exc}"
        ) from None
    return admin


async def _serve(
    uri: str,
    config: AutoRecoveryConfig,
    identifier: str | None = None,
    http_port: int | None = None,
    admin_hosts: tuple[str, str] = (LOCAL_HOST, LOCAL_HOST),
    admin_security: _AdminSecurity = _AdminSecurity(),
) -> int:
    from quorumlog.client.bookkeeper import BookKeeper

    # Fail at once, in one line, on a store that is not there (a client never makes one).
    probe = await BookKeeper.connect(uri)
    await probe.close()
    daemon = AutoRecovery(uri, config, identifier=identifier)
    bind_host, advertised_host = admin_hosts
    admin = (
        await _start_admin(daemon, http_port, bind_host, admin_security)
        if http_port is not None
        else None
    )
    try:
        if admin is not None:
            scheme = "https" if admin_security.tls is not None else "http"
            url = f"{scheme}://{advertised_host}:{admin.port}"
            print(f"autorecovery {daemon.identifier} admin {url}", flush=True)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, daemon.stop)
        task = loop.create_task(daemon.run())
        started = loop.create_task(daemon.started.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if daemon.started.is_set():
            print(f"autorecovery {daemon.identifier} running", flush=True)
        await task
        started.cancel()
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.stop(), 2.0)
    print(f"autorecovery {daemon.identifier} stopped", flush=True)
    return EXIT_OK
