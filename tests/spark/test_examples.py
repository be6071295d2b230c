"""The examples a newcomer runs: they touch only logs of their own."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

import quorumlog
from quorumlog import LogNamespace

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spark_example_leaves_the_readmes_orders_log_alone(
    spark: SparkSession, bk: quorumlog.BookKeeper
) -> None:
    """The README's log-stream example creates ``orders``; the Spark example once deleted
    a log of that name before writing its own."""
    writer = LogNamespace(bk).open_log("orders").open_writer()
    writer.append(b"order #1 of the README")
    writer.close()
    before = set(LogNamespace(bk).list_logs())

    load_example("spark_pipeline").run(bk, spark, orders_count=20)

    assert set(LogNamespace(bk).list_logs()) == before  # its own logs deleted, nobody else's
    assert [r.data for r in LogNamespace(bk).open_log("orders").read_all()] == [
        b"order #1 of the README"
    ]
