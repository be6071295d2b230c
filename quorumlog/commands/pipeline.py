"""``quorumlog pipeline NAME [options]``: run a shipped Spark pipeline.

    quorumlog pipeline dice-stats --metadata URI [--log dice] [--out DIR]
    quorumlog pipeline log-to-parquet --metadata URI --log NAME --out DIR [--from P] [--to P]
    quorumlog pipeline ledger-audit --metadata URI [--out DIR]
    quorumlog pipeline db-changes --metadata URI --log db/NAME --out DIR [--from P] [--to P]

Also a script for ``spark-submit`` (same arguments, without ``pipeline``)::

    spark-submit --master spark://127.0.0.1:7077 quorumlog/commands/pipeline.py \\
        dice-stats --metadata sqlite:///tmp/q/metadata.db --out /tmp/dice-stats

The options of every pipeline are declared here; the pipelines themselves
(:mod:`quorumlog.spark.pipelines`) get the parsed namespace. The session binds the
driver to 127.0.0.1 (:func:`quorumlog.spark.session.local_session`); ``--conf
KEY=VALUE`` settings are applied after its own. A failure is one line on stderr and
exit status 1 (2 for bad arguments), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from quorumlog.commands import (
    EXIT_FAILURE,
    EXIT_USAGE,
    OneLineArgumentParser,
    positive_int,
    run_parsed,
)
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.meta.factory import resolve_metadata_uri
from quorumlog.spark.options import parse_bound
from quorumlog.spark.pipelines import PIPELINE_MODULES, pipeline_module
from quorumlog.spark.pipelines.common import DEFAULT_MASTER, check_outputs_free, error_line
from quorumlog.spark.pipelines.ledger_audit import DEFAULT_LEDGERS_IN_FLIGHT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark settings of the pipelines' sessions (before the user's --conf): no console
# progress bars interleaved with the stage lines.
PIPELINE_CONF = {"spark.ui.showConsoleProgress": "false"}

_OUT_HELP = {
    "dice-stats": "write the faces and epochs tables as Parquet under DIR (DIR/faces, DIR/epochs)",
    "log-to-parquet": "the Parquet table to write (a directory)",
    "ledger-audit": "write the report under DIR (DIR/ledgers.parquet, DIR/ledgers.json)",
    "db-changes": "the Parquet change table to write (a directory)",
}
_OUT_REQUIRED = {"log-to-parquet", "db-changes"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "pipeline",
        help="run a Spark pipeline: " + ", ".join(PIPELINE_MODULES),
        description="Run one of the shipped Spark pipelines (needs pyspark and pyarrow: "
        "pip install 'quorumlog[spark]'). See docs/PIPELINES.md.",
    )
    add_pipelines(parser)


def add_pipelines(parser: argparse.ArgumentParser) -> None:
    """One subcommand per pipeline, each with the common options and its own."""
    names = parser.add_subparsers(dest="pipeline", metavar="PIPELINE", required=True)
    for name in PIPELINE_MODULES:
        module = pipeline_module(name)
        sub = names.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        add_common_options(sub, out_required=name in _OUT_REQUIRED, out_help=_OUT_HELP[name])
        _PIPELINE_OPTIONS[name](sub)
        sub.set_defaults(func=run)


# ---------------------------------------------------------------- options


def add_common_options(
    parser: argparse.ArgumentParser, *, out_required: bool, out_help: str
) -> None:
    """--metadata, --master, --out, --overwrite, --password, --conf."""
    parser.add_argument(
        "--metadata",
        default=None,
        metavar="URI",
        help="metadata store URI (default: $QUORUMLOG_METADATA, else ./.quorumlog/metadata.db)",
    )
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help=(
            f"Spark master: local[N], spark://HOST:PORT, ... (default {DEFAULT_MASTER}; "
            "under spark-submit, the master spark-submit was given)"
        ),
    )
    parser.add_argument("--out", required=out_required, default=None, metavar="DIR", help=out_help)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace output tables that exist already (default: fail before reading)",
    )
    parser.add_argument(
        "--password", default="", metavar="TEXT", help="the ledgers' password (text; default empty)"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=conf_pair,
        help="a Spark setting for the session (repeatable)",
    )


def conf_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)`` (an argparse type)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def position_bound(label: str) -> Callable[[str], str]:
    """An argparse type checking a bound as the source's start/end options accept it
    (``earliest``, ``latest``, ``L:E``, ``{"ledger": L, "entry": E}``); keeps the text."""

    def check(text: str) -> str:
        try:
            parse_bound(label, text, "earliest")
        except BKError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    check.__name__ = "position"  # what argparse names in its error message
    return check


def _position_range_options(
    parser: argparse.ArgumentParser, *, start_help: str, end_help: str
) -> None:
    """``--from`` and ``--to``: the range of a log a pipeline reads, as ``args.start`` and
    ``args.end`` (None: the source's defaults, earliest and latest)."""
    parser.add_argument(
        "--from",
        dest="start",
        default=None,
        metavar="POSITION",
        type=position_bound("--from"),
        help=start_help,
    )
    parser.add_argument(
        "--to",
        dest="end",
        default=None,
        metavar="POSITION",
        type=position_bound("--to"),
        help=end_help,
    )


def _dice_stats_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log", default="dice", metavar="NAME", help="the dice log's name (default: dice)"
    )


def _log_to_parquet_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, metavar="NAME", help="the log's name")
    _position_range_options(
        parser,
        start_help="first position copied: earliest (default), latest, L:E or JSON",
        end_help="position where copying stops (not copied): latest (default), earliest, L:E",
    )
    parser.add_argument(
        "--entries-per-partition",
        type=positive_int,
        default=None,
        metavar="N",
        help="entries one Spark task reads (the source's entriesPerPartition)",
    )


def _db_changes_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", required=True, metavar="NAME", help="the database's log (db/NAME)")
    _position_range_options(
        parser,
        start_help="first record read: earliest (default), latest, L:E or JSON",
        end_help="position where reading stops (not read): latest (default), earliest, L:E",
    )


def _ledger_audit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        metavar="N",
        help="Spark tasks the ledgers are split into (default: the default parallelism)",
    )
    parser.add_argument(
        "--ledgers-in-flight",
        type=positive_int,
        default=DEFAULT_LEDGERS_IN_FLIGHT,
        metavar="N",
        help=f"ledgers one task audits at once (default {DEFAULT_LEDGERS_IN_FLIGHT})",
    )
    parser.add_argument(
        "--request-timeout-ms",
        type=positive_int,
        default=None,
        metavar="MS",
        help="how long a bookie may take to answer a read before it counts as unreachable "
        "(default: the client's read timeout)",
    )


# Each pipeline's own options, after the common ones.
_PIPELINE_OPTIONS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "dice-stats": _dice_stats_options,
    "log-to-parquet": _log_to_parquet_options,
    "ledger-audit": _ledger_audit_options,
    "db-changes": _db_changes_options,
}


# ---------------------------------------------------------------- running a pipeline


def run(args: argparse.Namespace) -> int:
    """Start a session, run pipeline ``args.pipeline`` on it, stop the session; returns
    the pipeline's exit status."""
    name = args.pipeline
    module = pipeline_module(name)
    prefix = f"quorumlog pipeline {name}"
    try:
        check_arguments(args, module)
    except BKError as exc:
        print(f"{prefix}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_store(args)
    except BKError as exc:
        print(f"{prefix}: {exc.message}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        spark = session_for(args)
    except ImportError as exc:
        print(f"{prefix}: needs pyspark and pyarrow ({exc})", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # a JVM that does not start: one line, not its traceback
        print(f"{prefix}: cannot start Spark: {error_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        print(
            f"[{name}] Spark {spark.version} on {spark.sparkContext.master}, "
            f"metadata {resolve_metadata_uri(args.metadata)}",
            flush=True,
        )
        return int(module.run(spark, args))
    except BKError as exc:
        print(f"{prefix}: {exc.message}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, InvalidArgumentError) else EXIT_FAILURE
    except Exception as exc:
        if not _is_spark_error(exc):
            raise
        print(f"{prefix}: {error_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        _stop(spark)


def check_arguments(args: argparse.Namespace, module: ModuleType) -> None:
    """What can be checked before a JVM starts (that takes seconds): the metadata URI,
    the log name, output that exists already. Raises InvalidArgumentError."""
    from quorumlog.log.metadata import check_log_name

    resolve_metadata_uri(args.metadata)
    if getattr(args, "log", None) is not None:
        check_log_name(args.log)
    check_outputs_free(module.output_paths(args), args.overwrite)


def check_store(args: argparse.Namespace) -> None:
    """What the metadata store can tell before a JVM starts: that it exists, and that
    the log a pipeline reads (``--log``) is in it. Raises BKError: MetadataError for a
    store that is missing or unreachable, NoSuchLogError naming the logs there."""
    name = getattr(args, "log", None)
    if name is None:
        return
    from quorumlog.client.sync import new_event_loop

    loop = new_event_loop()
    try:
        loop.run_until_complete(_check_log(resolve_metadata_uri(args.metadata), name))
    finally:
        loop.close()


# How long the check of the store may take (a ZooKeeper that does not answer).
_STORE_CHECK_TIMEOUT_S = 30.0
# Log names a "does not exist" message lists at most.
_LOGS_LISTED = 10


async def _check_log(uri: str, name: str) -> None:
    import asyncio

    from quorumlog.errors import MetadataError
    from quorumlog.log.errors import NoSuchLogError
    from quorumlog.log.metadata import list_log_names, read_log
    from quorumlog.meta.factory import open_store

    try:
        async with asyncio.timeout(_STORE_CHECK_TIMEOUT_S):
            store = await open_store(uri, create=False)
            try:
                try:
                    # R18: absence read from an up-to-date view
                    await read_log(store, name, sync=True)
                    return
                except NoSuchLogError:
                    names = await list_log_names(store)
            finally:
                await store.close()
    except TimeoutError:
        raise MetadataError(
            f"metadata store {uri}: no answer within {_STORE_CHECK_TIMEOUT_S:.0f} s"
        ) from None
    listed = ", ".join(names[:_LOGS_LISTED]) + (", ..." if len(names) > _LOGS_LISTED else "")
    raise NoSuchLogError(f"log {name} does not exist in {uri} (its logs: {listed or 'none'})")


def _is_spark_error(exc: BaseException) -> bool:
    from pyspark.errors import PySparkException

    try:
        from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - py4j ships with pyspark
        return isinstance(exc, PySparkException)
    return isinstance(exc, PySparkException | Py4JError)


def session_for(args: argparse.Namespace) -> SparkSession:
    """The pipeline's SparkSession: on ``--master``, else spark-submit's master, else
    local[2]; with :data:`PIPELINE_CONF` and the ``--conf`` settings."""
    from quorumlog.spark.session import local_session

    master = args.master or _submitted_master() or DEFAULT_MASTER
    conf = dict(PIPELINE_CONF)
    conf.update(dict(args.conf))
    spark = local_session(master, app_name=f"quorumlog-{args.pipeline}", conf=conf)
    spark.sparkContext.setLogLevel(conf.get("spark.log.level", "ERROR"))
    return spark


def _submitted_master() -> str | None:
    """The master spark-submit was given, when this process was started by it (it then
    passes its JVM's gateway in PYSPARK_GATEWAY_PORT); None otherwise."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    # Connects to spark-submit's JVM (no context is created): its SparkConf holds --master.
    SparkContext._ensure_initialized()
    master = SparkConf().get("spark.master", None)
    return master or None


def _stop(spark: SparkSession) -> None:
    from quorumlog.spark import scan

    try:
        spark.stop()
    finally:
        scan.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """``spark-submit .../pipeline.py PIPELINE [options]`` (and ``python -m``)."""
    parser = OneLineArgumentParser(
        prog="pipeline", description="Run one of quorumlog's Spark pipelines."
    )
    add_pipelines(parser)
    return run_parsed(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
