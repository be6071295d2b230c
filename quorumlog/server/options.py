"""The bookie's flags, shared by ``python -m quorumlog.server`` and ``quorumlog bookie``
(which adds its configuration file and the co-hosted autorecovery's flags), and the
configurations they make."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from quorumlog.bookie.config import BookieConfig
from quorumlog.core.placement import DEFAULT_LOCATION, check_location
from quorumlog.errors import InvalidArgumentError
from quorumlog.security import options as security_options
from quorumlog.server.addresses import add_address_options, resolve_addresses
from quorumlog.server.config import ServerConfig
from quorumlog.server.process import Listen

_DEFAULTS = BookieConfig(data_dir=Path("."))
_SERVER_DEFAULTS = ServerConfig()


def add_bookie_options(p: argparse.ArgumentParser) -> None:
    """Every flag of a bookie but ``--log-level`` (:func:`add_log_level_option`)."""
    p.add_argument(
        "--metadata",
        metavar="URI",
        help="metadata store: sqlite:///abs/path.db or zk://host:port[/root] "
        "(default: $QUORUMLOG_METADATA, else sqlite:// ./.quorumlog/metadata.db)",
    )
    p.add_argument("--data-dir", required=True, type=Path, help="entry logs, index, cookie")
    p.add_argument(
        "--journal-dir", type=Path, default=None, help="journal (default: DATA_DIR/journal)"
    )
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="TCP port (default: the port the cookie records, else a free one)",
    )
    add_address_options(p, "the bookie (and its admin API)")
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="serve the HTTP admin API and /metrics on the bind address, port PORT (0: a "
        "free port, printed on stdout; default: not served)",
    )
    p.add_argument(
        "--rack",
        default=DEFAULT_LOCATION,
        metavar="/REGION/RACK",
        help="where this bookie stands, recorded in its registration for rack- and "
        "region-aware placement (default: %(default)s)",
    )
    security_options.add_server_tls_options(p, "the bookie port and the admin API")
    security_options.add_token_key_option(p)
    p.add_argument(
        "--no-journal-sync",
        action="store_true",
        help="acknowledge adds before they are fsynced (unsafe: benchmarks only)",
    )
    p.add_argument(
        "--journal-keep-pages-in-cache",
        action="store_true",
        help="leave the journal's synced pages in the page cache (default: dropped, as "
        "the journal is read only at replay)",
    )
    p.add_argument(
        "--entry-log-page-cache-max-bytes",
        type=int,
        default=_DEFAULTS.entry_log_page_cache_max_bytes,
        help="bytes of the current entry log, back from its end, left in the page cache; "
        "older written pages are dropped (0: all left to the kernel; default: %(default)s)",
    )
    p.add_argument(
        "--no-journal-direct-io",
        action="store_true",
        help="write the journal through the page cache (default: around it, with O_DIRECT, "
        "where the filesystem allows it)",
    )
    p.add_argument(
        "--no-entry-log-direct-io",
        action="store_true",
        help="write entry logs through the page cache (default: around it, with O_DIRECT, "
        "where the filesystem allows it)",
    )
    p.add_argument(
        "--journal-max-group-wait-ms",
        type=float,
        default=_DEFAULTS.journal_max_group_wait_ms,
        help="longest wait to group adds into one fsync (default: %(default)s)",
    )
    p.add_argument(
        "--disk-usage-threshold",
        type=float,
        default=_DEFAULTS.disk_usage_threshold,
        help="go read-only above this fraction of the data disk in use (default: %(default)s)",
    )
    p.add_argument(
        "--reserved-space-bytes",
        type=int,
        default=_DEFAULTS.reserved_space_bytes,
        help="space set aside in a file on each disk the bookie writes, released at start "
        "so that a bookie that filled its disk can start; less free is a full disk "
        "(0: none; default: %(default)s)",
    )
    p.add_argument(
        "--journal-file-max-bytes",
        type=int,
        default=_DEFAULTS.journal_file_max_bytes,
        help="size at which the journal goes on in a new file (default: %(default)s)",
    )
    p.add_argument(
        "--journal-prealloc-bytes",
        type=int,
        default=_DEFAULTS.journal_prealloc_bytes,
        help="zeros written ahead of the journal's batches, so that their syncs need "
        "not grow the file (0: none; default: %(default)s)",
    )
    p.add_argument(
        "--checkpoint-interval-ms",
        type=int,
        default=_DEFAULTS.checkpoint_interval_ms,
        help="time between checkpoints, which make entry logs and the index durable so "
        "that the journal before them can go (default: %(default)s)",
    )
    p.add_argument(
        "--index-map-size-bytes",
        type=int,
        default=_DEFAULTS.index_map_size_bytes,
        help="most the index (LMDB map) may grow to; a full one makes the bookie "
        "read-only and grows at the next start (default: %(default)s)",
    )
    p.add_argument(
        "--gc-interval-ms",
        type=int,
        default=_SERVER_DEFAULTS.gc_interval_ms,
        help="garbage collection interval (default: %(default)s)",
    )
    p.add_argument(
        "--gc-metadata-reads-per-s",
        type=float,
        default=_SERVER_DEFAULTS.gc_metadata_reads_per_s,
        help="most metadata reads a second of a garbage collection round's walk of the "
        "ledgers; 0: no limit (default: %(default)s)",
    )
    _add_compaction_options(p)
    p.add_argument(
        "--max-connections",
        type=int,
        default=_SERVER_DEFAULTS.max_connections,
        help="connections held at once; one more is closed at once (default: %(default)s)",
    )
    p.add_argument(
        "--auth-timeout-ms",
        type=int,
        default=_SERVER_DEFAULTS.auth_timeout_ms,
        help="with --token-key-file: a connection that presents no valid token within "
        "this time is closed (default: %(default)s)",
    )
    p.add_argument(
        "--tls-handshake-timeout-ms",
        type=int,
        default=_SERVER_DEFAULTS.tls_handshake_timeout_ms,
        help="with --tls-cert: a TLS handshake not done within this time is given up and "
        "its connection closed (default: %(default)s)",
    )
    p.add_argument(
        "--max-in-flight-bytes",
        type=int,
        default=_SERVER_DEFAULTS.max_in_flight_bytes,
        help="bytes the requests in flight of all connections may hold, shared equally; a "
        "connection over its share is not read until answered (default: %(default)s)",
    )
    p.add_argument(
        "--skip-journal-corruption",
        action="store_true",
        help="start even if the journal has a damaged record before its tail (skips the "
        "damaged part; the records in it are lost)",
    )
    p.add_argument(
        "--metadata-session-timeout-ms",
        type=int,
        default=_SERVER_DEFAULTS.metadata_session_timeout_ms,
        help="metadata session timeout (default: %(default)s)",
    )


def add_log_level_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level on stderr (default: %(default)s)",
    )


def _add_compaction_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--entry-log-max-bytes",
        type=int,
        default=_DEFAULTS.entry_log_max_bytes,
        help="size at which a new entry log is started (default: %(default)s)",
    )
    for kind in ("minor", "major"):
        p.add_argument(
            f"--{kind}-compaction-threshold",
            type=float,
            default=getattr(_DEFAULTS, f"{kind}_compaction_threshold"),
            help=f"{kind} compaction rewrites entry logs with less than this fraction "
            f"live; 0 turns it off (default: %(default)s)",
        )
        p.add_argument(
            f"--{kind}-compaction-interval-ms",
            type=int,
            default=getattr(_DEFAULTS, f"{kind}_compaction_interval_ms"),
            help=f"time between {kind} compactions; 0 turns it off (default: %(default)s)",
        )
    p.add_argument(
        "--compaction-rate-bytes-per-s",
        type=float,
        default=_DEFAULTS.compaction_rate_bytes_per_s,
        help="most entry bytes compaction copies per second; 0: no limit (default: %(default)s)",
    )
    p.add_argument(
        "--compaction-rate-entries-per-s",
        type=float,
        default=_DEFAULTS.compaction_rate_entries_per_s,
        help="most entries compaction copies per second; 0: no limit (default: %(default)s)",
    )
    p.add_argument(
        "--compaction-allowed-when-disk-full",
        action="store_true",
        help="compact as usual while the disk is over its usage threshold (default: "
        "one log at a time, within the room left beyond the reserved space)",
    )


def configs_from_args(args: argparse.Namespace) -> tuple[BookieConfig, ServerConfig, str]:
    """Check arguments and build the configurations; ValueError with a one-line reason."""
    from quorumlog.meta.factory import resolve_metadata_uri

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: expected 0..65535")
    if not 0.0 <= args.disk_usage_threshold <= 1.0:
        raise ValueError(f"--disk-usage-threshold {args.disk_usage_threshold}: expected 0..1")
    if args.journal_max_group_wait_ms < 0:
        raise ValueError("--journal-max-group-wait-ms must not be negative")
    if args.gc_interval_ms <= 0:
        raise ValueError("--gc-interval-ms must be positive")
    if args.gc_metadata_reads_per_s < 0:
        raise ValueError("--gc-metadata-reads-per-s must not be negative")
    if args.metadata_session_timeout_ms <= 0:
        raise ValueError("--metadata-session-timeout-ms must be positive")
    if args.max_connections <= 0:
        raise ValueError("--max-connections must be positive")
    if args.auth_timeout_ms <= 0:
        raise ValueError("--auth-timeout-ms must be positive")
    if args.tls_handshake_timeout_ms <= 0:
        raise ValueError("--tls-handshake-timeout-ms must be positive")
    if args.max_in_flight_bytes <= 0:
        raise ValueError("--max-in-flight-bytes must be positive")
    if args.http_port is not None and not 0 <= args.http_port <= 65535:
        raise ValueError(f"--http-port {args.http_port}: expected 0..65535")
    try:
        check_location(args.rack)
    except InvalidArgumentError as exc:
        raise ValueError(f"--rack: {exc.message}") from None
    data_dir = args.data_dir.absolute()
    journal_dir = args.journal_dir.absolute() if args.journal_dir is not None else None
    config = BookieConfig(
        data_dir=data_dir,
        journal_dir=journal_dir,
        journal_sync=not args.no_journal_sync,
        journal_max_group_wait_ms=args.journal_max_group_wait_ms,
        journal_remove_pages_from_cache=not args.journal_keep_pages_in_cache,
        entry_log_page_cache_max_bytes=args.entry_log_page_cache_max_bytes,
        entry_log_direct_io=not args.no_entry_log_direct_io,
        journal_direct_io=not args.no_journal_direct_io,
        journal_skip_corruption=args.skip_journal_corruption,
        disk_usage_threshold=args.disk_usage_threshold,
        # The low mark must not be above the high one (0.0 means: read-only from the start).
        disk_usage_lwm_threshold=min(_DEFAULTS.disk_usage_lwm_threshold, args.disk_usage_threshold),
        reserved_space_bytes=args.reserved_space_bytes,
        entry_log_max_bytes=args.entry_log_max_bytes,
        checkpoint_interval_ms=args.checkpoint_interval_ms,
        journal_file_max_bytes=args.journal_file_max_bytes,
        journal_prealloc_bytes=args.journal_prealloc_bytes,
        index_map_size_bytes=args.index_map_size_bytes,
        minor_compaction_threshold=args.minor_compaction_threshold,
        minor_compaction_interval_ms=args.minor_compaction_interval_ms,
        major_compaction_threshold=args.major_compaction_threshold,
        major_compaction_interval_ms=args.major_compaction_interval_ms,
        compaction_rate_bytes_per_s=args.compaction_rate_bytes_per_s,
        compaction_rate_entries_per_s=args.compaction_rate_entries_per_s,
        compaction_allowed_when_disk_full=args.compaction_allowed_when_disk_full,
    )
    problems = config.problems()
    if problems:
        raise ValueError("; ".join(problems))
    server_config = ServerConfig(
        gc_interval_ms=args.gc_interval_ms,
        gc_metadata_reads_per_s=args.gc_metadata_reads_per_s or None,
        metadata_session_timeout_ms=args.metadata_session_timeout_ms,
        max_connections=args.max_connections,
        auth_timeout_ms=args.auth_timeout_ms,
        tls_handshake_timeout_ms=args.tls_handshake_timeout_ms,
        max_in_flight_bytes=args.max_in_flight_bytes,
        http_port=args.http_port,
        location=args.rack,
        tls=security_options.server_tls(args),
        token_verifier=security_options.token_verifier(args),
    )
    return config, server_config, resolve_metadata_uri(args.metadata)


def listen_from_args(args: argparse.Namespace) -> Listen:
    """Where the bookie listens and what it registers; ValueError with a one-line reason."""
    bind_host, advertised_host = resolve_addresses(args.bind_address, args.advertised_address)
    return Listen(port=args.port, bind_host=bind_host, advertised_host=advertised_host)


def configure_logging(args: argparse.Namespace) -> None:
    """Log on stderr at ``--log-level``, secrets redacted."""
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.log_level != "DEBUG":
        # kazoo warns on every failed connection attempt; the store reports what matters
        # (session suspended, lost, or unreachable) in one line.
        logging.getLogger("kazoo").setLevel(logging.ERROR)
    security_options.redact_logs(args)
