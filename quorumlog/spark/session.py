"""SparkSessions for the pipelines, the tests and the benchmark: local, on loopback."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


def local_session(
    master: str = "local[2]",
    app_name: str = "quorumlog",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession bound to 127.0.0.1 (driver, block manager, UI off) with the
    ``quorumlog`` source registered. ``master`` may also be ``spark://...``."""
    # Before the JVM starts: otherwise Spark binds to the machine's external address.
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.host", LOOPBACK)
        .config("spark.driver.bindAddress", LOOPBACK)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from quorumlog.spark import register

    register(spark)
    return spark


def _python() -> str:
    import sys

    return sys.executable
