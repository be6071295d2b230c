"""``quorumlog localbookie N``: a whole cluster on this machine, for tutorials and trials.

The embedded metadata store (``sqlite:///<data dir>/metadata.db``) plus N bookie
processes, each with its own directories under the data directory (default
``./.quorumlog``). Prints ``metadata: URI`` first, then ``N bookies ready``
once every bookie is registered, and runs until SIGINT or SIGTERM, when it
stops every bookie (SIGTERM by pid, a bounded wait, then SIGKILL) and exits 0.
Each bookie also runs autorecovery (``quorumlog bookie --autorecovery``) unless
``--no-autorecovery``; with ``--http-port BASE`` bookie K serves its HTTP admin API and
``/metrics`` on BASE + K (0: a free port each), printed on its line. The data stays in
the data directory: a second run with the same directory finds the same bookies (same
ports) and ledgers.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

_PROG = "quorumlog localbookie"
_POLL_S = 0.2


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "localbookie",
        help="run a local cluster: the embedded metadata store and N bookies",
        description="Run the embedded metadata store and N bookie processes until Ctrl-C.",
    )
    p.add_argument("num_bookies", type=int, metavar="N", help="how many bookies")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".quorumlog"),
        help="metadata store and bookie directories (default: ./.quorumlog)",
    )
    p.add_argument(
        "--no-journal-sync",
        action="store_true",
        help="bookies acknowledge adds before they are fsynced (unsafe: benchmarks only)",
    )
    p.add_argument(
        "--no-autorecovery",
        action="store_true",
        help="do not run autorecovery in the bookies (by default each bookie runs an "
        "auditor candidate and a replication worker)",
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help="give bookie K an HTTP admin API (/metrics, /api/v1/..., what quorumlog shell "
        "gc uses) on PORT + K; 0: each on a free port (default: none)",
    )
    p.add_argument(
        "--start-timeout-s",
        type=float,
        default=60.0,
        help="how long to wait for every bookie to be ready (default: %(default)s)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from quorumlog.server.local_cluster import SERVER_ENTRY_POINT, ClusterError, LocalCluster

    if not 1 <= args.num_bookies <= 64:
        print(f"{_PROG}: error: N must be 1..64, got {args.num_bookies}", file=sys.stderr)
        return EXIT_USAGE
    if args.http_port is not None and not 0 <= args.http_port <= 65535 - args.num_bookies + 1:
        print(
            f"{_PROG}: error: --http-port must leave room for {args.num_bookies} ports "
            f"below 65536, got {args.http_port}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    data_dir = args.data_dir.absolute()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{_PROG}: cannot create {data_dir}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    uri = f"sqlite://{data_dir / 'metadata.db'}"
    print(f"metadata: {uri}", flush=True)

    stop_signal: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_signal.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    cluster = LocalCluster(
        uri,
        data_dir,
        args.num_bookies,
        journal_sync=not args.no_journal_sync,
        extra_args=() if args.no_autorecovery else ("--autorecovery",),
        # Autorecovery needs the client, which only the command adds to a bookie.
        entry_point=SERVER_ENTRY_POINT if args.no_autorecovery else ("-m", "quorumlog", "bookie"),
        start_timeout_s=args.start_timeout_s,
        http_port=args.http_port,
    )
    try:
        try:
            cluster.start()
        except ClusterError as exc:
            print(f"{_PROG}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        for bookie in cluster.bookies:
            admin = f" admin {bookie.admin_url}" if bookie.admin_url else ""
            print(f"bookie {bookie.address} pid {bookie.pid} data {bookie.home}{admin}", flush=True)
        print(
            f"{args.num_bookies} bookies ready; use QUORUMLOG_METADATA={uri} (Ctrl-C stops them)",
            flush=True,
        )
        return _watch(cluster, stop_signal)
    finally:
        cluster.stop_all()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _watch(cluster: object, stop_signal: list[int]) -> int:
    from quorumlog.server.local_cluster import LocalCluster

    assert isinstance(cluster, LocalCluster)
    reported: set[int] = set()
    while not stop_signal:
        for bookie in cluster.bookies:
            if bookie.index not in reported and not bookie.alive():
                reported.add(bookie.index)
                code = bookie.returncode or 0
                how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
                print(
                    f"{_PROG}: bookie {bookie.address} (pid {bookie.pid}) {how}; "
                    f"see {bookie.stderr_path}",
                    file=sys.stderr,
                    flush=True,
                )
        if len(reported) == len(cluster.bookies):
            print(f"{_PROG}: every bookie has exited", file=sys.stderr)
            return EXIT_FAILURE
        time.sleep(_POLL_S)
    print("stopping bookies", flush=True)
    return EXIT_OK
