"""``quorumlog bookie``: run one bookie in the foreground.

The bookie's flags, ready line and exit statuses are those of ``python -m
quorumlog.server`` (:mod:`quorumlog.server.process`); this command adds the
configuration file (``--config``) and the co-hosted autorecovery (``--autorecovery``),
which needs the client and so is passed to the server's lifecycle as a companion.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from quorumlog.commands import EXIT_USAGE
from quorumlog.commands import autorecovery as _autorecovery_command
from quorumlog.commands.config_file import enable_config_file
from quorumlog.server.options import (
    add_bookie_options,
    add_log_level_option,
    configs_from_args,
    configure_logging,
    listen_from_args,
)
from quorumlog.server.process import CompanionFactory, run_bookie

if TYPE_CHECKING:
    from quorumlog.replication.autorecovery import AutoRecovery, AutoRecoveryConfig
    from quorumlog.server.server import BookieServer

_PROG = "quorumlog bookie"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "bookie",
        help="run one bookie (storage server) in the foreground",
        description="Run one bookie in the foreground until SIGTERM or SIGINT.",
        allow_abbrev=False,
    )
    add_bookie_options(p)
    p.add_argument(
        "--autorecovery",
        action="store_true",
        help="also run the autorecovery daemon (auditor candidate and replication worker) "
        "in this process; its options are those of quorumlog autorecovery",
    )
    _autorecovery_command.add_options(p)
    add_log_level_option(p)
    p.set_defaults(func=run)
    enable_config_file(p, "bookie")


def run(args: argparse.Namespace) -> int:
    configure_logging(args)
    try:
        config, server_config, uri = configs_from_args(args)
        listen = listen_from_args(args)
        recovery = _autorecovery_command.config_from_args(args) if args.autorecovery else None
    except ValueError as exc:  # InvalidArgumentError is a ValueError too
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if recovery is None:
        ignored = _autorecovery_options_given(args)
        if ignored:
            print(
                f"{_PROG}: warning: {', '.join(ignored)}: option(s) of the autorecovery "
                "daemon, of no effect without --autorecovery",
                file=sys.stderr,
            )
    companion = _autorecovery_beside(recovery) if recovery is not None else None
    return run_bookie(config, server_config, uri, listen, companion=companion, prog=_PROG)


def _autorecovery_options_given(args: argparse.Namespace) -> list[str]:
    """The autorecovery options set to other than their defaults (on the command line
    or in the config file), as their flags."""
    defaults = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _autorecovery_command.add_options(defaults)
    return [
        action.option_strings[-1]
        for action in defaults._actions
        if action.option_strings and getattr(args, action.dest, action.default) != action.default
    ]


def _autorecovery_beside(recovery: AutoRecoveryConfig) -> CompanionFactory:
    """The autorecovery daemon as the bookie's companion: identified by the bookie's
    address (whoisauditor then names a bookie), its metrics on the bookie's /metrics."""

    def start(server: BookieServer, uri: str) -> AutoRecovery:
        from quorumlog.replication.autorecovery import AutoRecovery

        daemon = AutoRecovery(uri, recovery, identifier=server.address)
        _serve_autorecovery_metrics(server, daemon)
        return daemon

    return start


def _serve_autorecovery_metrics(server: BookieServer, daemon: AutoRecovery) -> None:
    """The daemon's metrics on the bookie's /metrics, when it serves one."""
    from quorumlog.replication.metrics import AutoRecoveryMetrics

    ctx = server.admin_context
    if ctx is None or ctx.registry is None:
        return
    metrics = AutoRecoveryMetrics(daemon)
    ctx.registry.register(metrics.collector)
    ctx.before_scrape = metrics.refresh
