"""``quorumlog pipeline NAME [options]``: run a shipped Spark pipeline.

    quorumlog pipeline dice-stats --metadata URI [--log dice] [--out DIR]
    quorumlog pipeline log-to-parquet --metadata URI --log NAME --out DIR [--from P] [--to P]
    quorumlog pipeline ledger-audit --metadata URI [--out DIR]

Also a script for ``spark-submit`` (same arguments, without ``pipeline``)::

    spark-submit --master spark://127.0.0.1:7077 quorumlog/spark/pipelines/command.py \\
        dice-stats --metadata sqlite:///tmp/q/metadata.db --out /tmp/dice-stats

The session binds the driver to 127.0.0.1 (:func:`quorumlog.spark.session.local_session`);
``--conf KEY=VALUE`` settings are applied after its own. A failure is one line on stderr
and exit status 1 (2 for bad arguments), never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.meta.store import resolve_metadata_uri
from quorumlog.spark.pipelines import PIPELINE_MODULES, pipeline_module
from quorumlog.spark.pipelines.common import (
    DEFAULT_MASTER,
    add_common_options,
    check_outputs_free,
    error_line,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXIT_FAILURE = 1
EXIT_USAGE = 2

# Spark settings of the pipelines' sessions (before the user's --conf): no console
# progress bars interleaved with the stage lines.
PIPELINE_CONF = {"spark.ui.showConsoleProgress": "false"}

_OUT_HELP = {
    "dice-stats": "write the faces and epochs tables as Parquet under DIR (DIR/faces, DIR/epochs)",
    "log-to-parquet": "the Parquet table to write (a directory)",
    "ledger-audit": "write the report under DIR (DIR/ledgers.parquet, DIR/ledgers.json)",
}
_OUT_REQUIRED = {"log-to-parquet"}


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
        module.add_arguments(sub)
        sub.set_defaults(func=run)


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
    """``spark-submit .../command.py PIPELINE [options]`` (and ``python -m``)."""
    from quorumlog.cli import OneLineArgumentParser

    parser = OneLineArgumentParser(
        prog="pipeline", description="Run one of quorumlog's Spark pipelines."
    )
    add_pipelines(parser)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
