"""``quorumlog db``: a replicated SQL database served over rqlite's HTTP API.

``serve`` runs one replica; ``status``, ``nodes`` and ``shell`` talk to a running
replica over HTTP (``--addr``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from quorumlog.commands import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, positive_int
from quorumlog.commands.config_file import enable_config_file
from quorumlog.errors import BKError
from quorumlog.security import options as security_options
from quorumlog.server.memory_tuning import tune_for_serving

_ADDR_HELP = "a replica's HOST:PORT (https://HOST:PORT if it serves HTTPS)"
# quorumlog.db.machine's defaults, not imported: every command builds this parser, and
# quorumlog.db takes 0.2 s to import (tests/local/test_db_determinism.py holds them equal).
DEFAULT_STATEMENT_STEPS = 200_000_000
DEFAULT_READERS = 4
DEFAULT_READ_STEPS = 200_000_000


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "db",
        help="a replicated SQL database (rqlite's HTTP API) on a log stream",
        description="Run or talk to the replicas of a database kept in the log db/NAME.",
    )
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)

    serve = sub.add_parser("serve", help="run one replica of a database")
    serve.add_argument("--metadata", default=None, help="metadata store URI")
    serve.add_argument("--name", required=True, help="database name (its log is db/NAME)")
    serve.add_argument("--data-dir", required=True, help="where this replica's SQLite file lives")
    serve.add_argument(
        "--http-addr",
        default="127.0.0.1:4001",
        help="HOST:PORT the HTTP API listens on; HOST 0.0.0.0 for every interface, which "
        "needs --http-adv-addr (default: %(default)s)",
    )
    serve.add_argument(
        "--http-adv-addr",
        "--advertised-address",
        dest="http_adv_addr",
        metavar="HOST[:PORT]",
        default=None,
        help="where other replicas and clients reach this one's HTTP API, as published in "
        "the election (default: --http-addr; the port defaults to its port)",
    )
    serve.add_argument(
        "--node-id", default=None, help="this replica's id (default: the advertised HOST:PORT)"
    )
    serve.add_argument(
        "--session-timeout-ms", type=positive_int, default=3000, help="election session (3000)"
    )
    serve.add_argument(
        "--max-body-bytes", type=positive_int, default=4 << 20, help="request body limit (4 MiB)"
    )
    serve.add_argument(
        "--snapshot-every",
        type=int,
        default=10_000,
        help="records between snapshots taken by the leader; the log is truncated behind "
        "them (0: never; default 10000)",
    )
    serve.add_argument(
        "--snapshot-every-bytes",
        type=int,
        default=64 << 20,
        help="or after this many bytes of records (0: no size trigger; default 64 MiB)",
    )
    serve.add_argument(
        "--snapshot-every-s",
        type=float,
        default=3600.0,
        help="or this many seconds after the previous snapshot, if anything was written "
        "since (0: no time trigger; default 3600)",
    )
    serve.add_argument(
        "--follower-read-interval-ms",
        type=float,
        default=10.0,
        help="a follower reads the log at most this often, every record written meanwhile "
        "at once (0: each as it is confirmed; default 10)",
    )
    serve.add_argument(
        "--statement-steps",
        type=positive_int,
        default=DEFAULT_STATEMENT_STEPS,
        help="the budget of each statement of a write, in steps of SQLite's virtual machine "
        "(70-100 million a second); one over it fails, the same on every replica: the "
        "leader writes its budget into each record (default %(default)s)",
    )
    serve.add_argument(
        "--verify-every-records",
        type=int,
        default=1_000,
        help="the leader logs its outcome of the records applied since the last check once "
        "this many wait, and every replica compares its own (docs/DB.md, 'Replicas "
        "compared'; 0 with --verify-every-s 0: never; default %(default)s)",
    )
    serve.add_argument(
        "--verify-every-s",
        type=float,
        default=1.0,
        help="... or this long after the last check, when any record waits (default %(default)s)",
    )
    serve.add_argument(
        "--read-threads",
        type=positive_int,
        default=DEFAULT_READERS,
        help="reads run on this many threads, each with a connection of its own (default "
        "%(default)s)",
    )
    serve.add_argument(
        "--read-steps",
        type=positive_int,
        default=DEFAULT_READ_STEPS,
        help="the budget of each read statement, in steps of SQLite's virtual machine "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--rollover-bytes",
        type=positive_int,
        default=256 << 20,
        help="start a new ledger of the log after this many bytes (256 MiB); truncation "
        "drops whole ledgers",
    )
    serve.add_argument("--ensemble", type=positive_int, default=3)
    serve.add_argument("--write-quorum", type=positive_int, default=3)
    serve.add_argument("--ack-quorum", type=positive_int, default=2)
    serve.add_argument("--verbose", action="store_true", help="log role changes on stderr")
    # Security (docs/SECURITY.md): HTTPS and Bearer tokens on the API; TLS and a token
    # towards the bookies, as any client.
    serve.add_argument("--http-tls-cert", default=None, metavar="PEM", help="serve HTTPS")
    serve.add_argument("--http-tls-key", default=None, metavar="PEM", help="its key")
    security_options.add_token_key_option(serve)
    security_options.add_client_tls_options(serve)
    security_options.add_token_file_option(serve)
    serve.set_defaults(func=run_serve)
    enable_config_file(serve, "db")

    for action, text in (("status", "a replica's /status"), ("nodes", "the group's /nodes")):
        p = sub.add_parser(action, help=f"print {text}")
        p.add_argument("--addr", default="127.0.0.1:4001", help=_ADDR_HELP)
        p.set_defaults(func=run_get, path=f"/{action}")

    changes = sub.add_parser(
        "changes", help="print the change stream: each write with its log position (JSON lines)"
    )
    changes.add_argument("--addr", default="127.0.0.1:4001", help=_ADDR_HELP)
    changes.add_argument(
        "--from", dest="start", default=None, metavar="POSITION",
        help="the log position to start at (LEDGER:ENTRY, as a 'next' line gave it)",
    )  # fmt: skip
    changes.add_argument(
        "--follow", action="store_true", help="keep waiting for new writes (until Ctrl-C)"
    )
    changes.set_defaults(func=run_changes)

    backup = sub.add_parser("backup", help="save the database (the leader's copy) to a file")
    backup.add_argument("--addr", default="127.0.0.1:4001", help=_ADDR_HELP)
    backup.add_argument("--fmt", choices=("binary", "sql"), default="binary")
    backup.add_argument("out", help="file to write (a SQLite file, or SQL text with --fmt sql)")
    backup.set_defaults(func=run_backup)

    restore = sub.add_parser(
        "restore", help="load a SQLite file into a database, through its leader and log"
    )
    restore.add_argument("--addr", default="127.0.0.1:4001", help=_ADDR_HELP)
    restore.add_argument("file", help="a SQLite file (as written by backup)")
    restore.set_defaults(func=run_restore)

    add_bench_parser(sub, "bench")

    shell = sub.add_parser("shell", help="run SQL against a group, one result table each")
    shell.add_argument("--addr", default="127.0.0.1:4001", help=_ADDR_HELP)
    shell.add_argument("--level", default="weak", help="read consistency (none|weak|strong)")
    shell.add_argument("sql", nargs="*", help="statements to run (none: read lines from stdin)")
    shell.set_defaults(func=run_shell)


def add_bench_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
) -> None:
    """The benchmark's parser, as ``quorumlog db bench`` and ``quorumlog bench db``."""
    bench = sub.add_parser(
        name, help="durable replicated INSERTs over HTTP, beside PostgreSQL with a sync standby"
    )
    bench.add_argument(
        "--count",
        type=positive_int,
        default=1000,
        help="serial inserts per round (1000; 16 clients: 4 times as many)",
    )
    bench.add_argument(
        "--batches", type=positive_int, default=100, help="100-row batches per round (100)"
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="rounds, the two systems taking turns; figures are medians (3)",
    )
    bench.add_argument("--no-postgres", action="store_true", help="quorumlog db only")
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.set_defaults(func=run_bench)


def _split_addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {text!r}: expected HOST:PORT")
    return host, int(port)


def _advertised_addr(http_addr: str, advertised: str | None) -> tuple[str, int, str]:
    """(bind host, port, advertised HOST:PORT) from --http-addr and --http-adv-addr."""
    from quorumlog.server.addresses import resolve_addresses

    bind, port = _split_addr(http_addr)
    if advertised is None:
        bind_host, advertised_host = resolve_addresses(bind, None)
        return bind_host, port, f"{advertised_host}:{port}"
    host, colon, advertised_port = advertised.rpartition(":")
    if not colon:
        host, advertised_port = advertised, str(port)
    if not advertised_port.isdigit():
        raise ValueError(f"--http-adv-addr {advertised!r}: expected HOST or HOST:PORT")
    bind_host, advertised_host = resolve_addresses(bind, host)
    return bind_host, port, f"{advertised_host}:{int(advertised_port)}"


def run_serve(args: argparse.Namespace) -> int:
    from quorumlog.client.sync import new_event_loop
    from quorumlog.log.config import LogConfig

    try:
        host, port, advertised = _advertised_addr(args.http_addr, args.http_adv_addr)
        log_config = LogConfig(
            ensemble=args.ensemble,
            write_quorum=args.write_quorum,
            ack_quorum=args.ack_quorum,
            rollover_size_bytes=args.rollover_bytes,
        )
    except (ValueError, BKError) as exc:
        print(f"quorumlog db serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    security_options.redact_logs(args)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        try:
            return runner.run(_serve(args, host, port, advertised, log_config))
        except (BKError, OSError, ValueError) as exc:  # ValueError: TLS or token files
            print(f"quorumlog db serve: {exc}", file=sys.stderr)
            return EXIT_FAILURE


async def _serve(
    args: argparse.Namespace, host: str, port: int, advertised: str, log_config: Any
) -> int:
    from quorumlog.aio import BookKeeper
    from quorumlog.client.config import ClientConfig
    from quorumlog.db.http import DbHttpApi
    from quorumlog.db.replica import Replica, ReplicaConfig
    from quorumlog.security.tls import TlsFiles, TlsReloader, client_context

    client_config = ClientConfig(
        tls=security_options.client_tls(args), token_file=security_options.token_file(args)
    )
    https = None
    if args.http_tls_cert is not None or args.http_tls_key is not None:
        https = TlsReloader(TlsFiles(args.http_tls_cert, args.http_tls_key), server_side=True)
    scheme = "https" if https is not None else "http"
    bk = await BookKeeper.connect(args.metadata, config=client_config)
    config = ReplicaConfig(
        name=args.name,
        data_dir=args.data_dir,
        node_id=args.node_id or advertised,
        http_addr=f"{scheme}://{advertised}",
        session_timeout_ms=args.session_timeout_ms,
        log_config=log_config,
        snapshot_every_records=max(0, args.snapshot_every),
        snapshot_every_bytes=max(0, args.snapshot_every_bytes),
        snapshot_every_s=max(0.0, args.snapshot_every_s),
        follower_read_interval_ms=max(0.0, args.follower_read_interval_ms),
        statement_steps=args.statement_steps,
        read_threads=args.read_threads,
        read_steps=args.read_steps,
        verify_every_records=max(0, args.verify_every_records),
        verify_every_s=max(0.0, args.verify_every_s),
    )
    replica = Replica(bk, config)
    api = DbHttpApi(
        replica,
        max_body_bytes=args.max_body_bytes,
        token_verifier=security_options.token_verifier(args),
        ssl_context=https.server_front_context() if https is not None else None,
        # The leader's certificate: the CA of --tls-ca, else the system's.
        leader_ssl_context=client_context(TlsFiles(ca_file=args.tls_ca)) if https else None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await api.start(host, port)
        await replica.start()
        tune_for_serving()
        print(f"quorumlog db: {args.name} serving on {scheme}://{advertised}", flush=True)
        await stop.wait()
    finally:
        await api.close()
        await replica.close()
        await bk.close()
    return EXIT_OK


def _base_url(addr: str) -> str:
    """A replica's HOST:PORT as a URL; ``https://HOST:PORT`` for one serving HTTPS (its
    certificate checked against the system's CAs, or ``SSL_CERT_FILE``)."""
    return addr if addr.startswith(("http://", "https://")) else f"http://{addr}"


def _auth_headers() -> dict[str, str]:
    """The Bearer token of ``QUORUMLOG_TOKEN`` for a replica that checks tokens."""
    from quorumlog.security.tokens import read_token

    token = read_token(None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _http(addr: str, path: str, body: object | None = None) -> Any:
    url = f"{_base_url(addr)}{path}"
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **_auth_headers()}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read() or b"{}")


def run_get(args: argparse.Namespace) -> int:
    try:
        print(json.dumps(_http(args.addr, args.path), indent=2))
    except (OSError, ValueError) as exc:
        print(f"quorumlog db: {args.addr}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def run_changes(args: argparse.Namespace) -> int:
    """GET /db/changes page after page: each write's line as it comes, then (without
    --follow, once nothing is left) the line saying where to resume."""
    start: str | None = args.start
    for _ in range(1 << 62):  # ends when the stream is read out, or by Ctrl-C
        query = urllib.parse.urlencode(
            {k: v for k, v in (("from", start), ("wait", "5s" if args.follow else "0")) if v}
        )
        try:
            url = f"{_base_url(args.addr)}/db/changes?{query}"
            request = urllib.request.Request(url, headers=_auth_headers())
            with urllib.request.urlopen(request, timeout=60) as answer:
                lines = answer.read().splitlines()
        except (OSError, ValueError) as exc:
            print(f"quorumlog db changes: {args.addr}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        *writes, last = lines
        for line in writes:
            print(line.decode(), flush=True)
        after = json.loads(last)["next"]
        if not writes and after == start and not args.follow:
            print(last.decode())
            return EXIT_OK
        start = after
    return EXIT_OK


def run_bench(args: argparse.Namespace) -> int:
    from quorumlog.bench.db import bench, table

    try:
        figures = bench(args.count, args.batches, not args.no_postgres, args.rounds)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"quorumlog db bench: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(figures, indent=2) if args.json else table(figures))
    return EXIT_OK


def run_backup(args: argparse.Namespace) -> int:
    query = "?fmt=sql" if args.fmt == "sql" else ""
    try:
        url = f"{_base_url(args.addr)}/db/backup{query}"
        request = urllib.request.Request(url, headers=_auth_headers())
        with urllib.request.urlopen(request, timeout=300) as r:
            data = r.read()
            position = r.headers.get("X-Quorumlog-Position")
    except (OSError, ValueError) as exc:
        print(f"quorumlog db backup: {args.addr}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    with open(args.out, "wb") as out:
        out.write(data)
    if position is None:  # a server that does not say
        where = "applied position unknown (the server sent none)"
    else:
        where = f"applied position {position or 'none (nothing applied yet)'}"
    print(f"{args.out}: {len(data)} bytes, {where}")
    return EXIT_OK


# Statements per restore request: each request is one log record, kept well below the
# server's body limit.
_RESTORE_BATCH_BYTES = 512 * 1024


def run_restore(args: argparse.Namespace) -> int:
    from quorumlog.db.snapshot import dump_sql

    try:
        with open(args.file, "rb") as source:
            lines = dump_sql(source.read())
    except (OSError, ValueError) as exc:
        print(f"quorumlog db restore: {args.file}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    batches: list[list[str]] = [[]]
    size = 0
    for line in lines:
        if size + len(line) > _RESTORE_BATCH_BYTES and batches[-1]:
            batches.append([])
            size = 0
        batches[-1].append(line)
        size += len(line)
    for batch in batches:
        if not batch:
            continue
        try:
            answer = _http(args.addr, "/db/execute?transaction", batch)
        except (OSError, ValueError) as exc:
            print(f"quorumlog db restore: {args.addr}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        errors = [r["error"] for r in answer.get("results", []) if "error" in r]
        if "error" in answer or errors:
            print(f"quorumlog db restore: {answer.get('error') or errors[0]}", file=sys.stderr)
            return EXIT_FAILURE
    print(f"{args.file}: {len(lines)} statements restored in {len(batches)} requests")
    return EXIT_OK


def _table(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    if "columns" not in result:
        return f"rows affected: {result.get('rows_affected', 0)}" + (
            f", last insert id: {result['last_insert_id']}" if "last_insert_id" in result else ""
        )
    rows = [[("NULL" if v is None else str(v)) for v in row] for row in result.get("values", [])]
    header = [str(c) for c in result["columns"]]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def run_shell(args: argparse.Namespace) -> int:
    statements = args.sql or [line.strip() for line in sys.stdin if line.strip()]
    query = urllib.parse.urlencode({"level": args.level})
    status = EXIT_OK
    for sql in statements:
        try:
            answer = _http(args.addr, f"/db/request?{query}", [sql])
        except (OSError, ValueError) as exc:
            print(f"quorumlog db shell: {args.addr}: {exc}", file=sys.stderr)
            return EXIT_FAILURE
        if "error" in answer:
            print(f"error: {answer['error']}")
            status = EXIT_FAILURE
            continue
        for result in answer.get("results", []):
            print(_table(result))
            if "error" in result:
                status = EXIT_FAILURE
    return status
