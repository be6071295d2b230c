"""``quorumlog dice``: the replicated dice application of the BookKeeper tutorial.

Run it in several terminals against the same metadata store and bookies: every
instance prints the same sequence of rolls. Kill or freeze (Ctrl-Z) the leader and
another instance takes over after the session timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from quorumlog.apps.dice import Dice, DiceConfig, Roll
from quorumlog.client.config import ClientConfig
from quorumlog.client.sync import new_event_loop
from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, positive_int
from quorumlog.errors import BKError
from quorumlog.log.config import LogConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "dice",
        help="the replicated dice application (leader election + a log stream)",
        description=(
            "Every instance joins a leader election; the leader rolls a die every interval "
            "and appends the value to a log, followers tail the log. All instances print "
            "the same sequence. Stop with Ctrl-C."
        ),
    )
    parser.add_argument(
        "--metadata",
        default=None,
        help="metadata store URI (default: $QUORUMLOG_METADATA, else ./.quorumlog/metadata.db)",
    )
    parser.add_argument("--log", default="dice", help="name of the log stream (default: dice)")
    parser.add_argument(
        "--interval-ms", type=positive_int, default=1000, help="time between rolls (default 1000)"
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"value", "ledger", "entry", "role"} lines'
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=positive_int,
        default=2000,
        help="election session timeout: how long a frozen leader keeps its place (default 2000)",
    )
    parser.add_argument("--ensemble", type=positive_int, default=3, help="bookies per ledger (3)")
    parser.add_argument("--write-quorum", type=positive_int, default=3, help="copies per roll (3)")
    parser.add_argument("--ack-quorum", type=positive_int, default=2, help="acks per roll (2)")
    parser.add_argument(
        "--count", type=int, default=0, help="exit after printing this many values (0: never)"
    )
    parser.add_argument("--id", default=None, help="name of this instance in the election")
    parser.add_argument("--verbose", action="store_true", help="print role changes on stderr")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        log_config = LogConfig(
            ensemble=args.ensemble, write_quorum=args.write_quorum, ack_quorum=args.ack_quorum
        )
    except BKError as exc:
        print(f"quorumlog dice: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    config = DiceConfig(
        log_name=args.log,
        interval_ms=args.interval_ms,
        session_timeout_ms=args.session_timeout_ms,
        log_config=log_config,
        max_values=max(0, args.count),
    )
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            return runner.run(_main(args, config))
        except BKError as exc:
            print(f"quorumlog dice: {exc.message}", file=sys.stderr)
            return EXIT_FAILURE


async def _main(args: argparse.Namespace, config: DiceConfig) -> int:
    from quorumlog.client.bookkeeper import BookKeeper

    def emit(roll: Roll) -> None:
        sys.stdout.write((roll.json() if args.json else roll.text()) + "\n")
        sys.stdout.flush()

    def status(message: str) -> None:
        if args.verbose:
            print(message, file=sys.stderr, flush=True)

    def notice(message: str) -> None:  # what it waits for: said with or without --verbose
        print(message, file=sys.stderr, flush=True)

    bk = await BookKeeper.connect(args.metadata, config=ClientConfig())
    identifier = args.id or f"{socket.gethostname()}:{os.getpid()}"
    dice = Dice(bk, config, emit, identifier=identifier, status=status, notice=notice)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, dice.stop)
    try:
        await dice.run()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await bk.close()
    return EXIT_OK
