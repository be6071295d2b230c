"""The shipped Spark pipelines, run as ``quorumlog pipeline NAME [options]``.

=================  ===============================================================
``dice-stats``     reads the dice log, counts each face and the values per leader
                   epoch (the ledger a leader wrote), writes Parquet, prints both
``log-to-parquet`` copies a log, or a position range of it, into Parquet
``ledger-audit``   audits every ledger of the metadata store on the executors,
                   writes the report, exit status 1 if any ledger is not healthy
``db-changes``     a quorumlog db database's log as a Parquet change table, one row
                   per statement logged
=================  ===============================================================

Each pipeline is a module with ``HELP``, ``DESCRIPTION``, ``output_paths(args)`` and
``run(spark, args) -> int`` (the exit status), plus the pure helpers its computation
rests on; ``args`` holds the options of its command line, which
:mod:`quorumlog.commands.pipeline` declares and parses. That command also runs under
``spark-submit``::

    spark-submit quorumlog/commands/pipeline.py dice-stats --metadata URI --out DIR

Nothing here imports pyspark until a pipeline runs, so ``quorumlog --help`` works
without it. See docs/PIPELINES.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Pipeline name -> module, in the order ``quorumlog pipeline --help`` lists them.
PIPELINE_MODULES: dict[str, str] = {
    "dice-stats": "quorumlog.spark.pipelines.dice_stats",
    "log-to-parquet": "quorumlog.spark.pipelines.log_to_parquet",
    "ledger-audit": "quorumlog.spark.pipelines.ledger_audit",
    "db-changes": "quorumlog.spark.pipelines.db_changes",
}


def pipeline_module(name: str) -> ModuleType:
    """The module of pipeline ``name`` (KeyError for an unknown name)."""
    return importlib.import_module(PIPELINE_MODULES[name])


__all__ = ["PIPELINE_MODULES", "pipeline_module"]
