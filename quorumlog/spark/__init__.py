"""quorumlog on Apache Spark: the ``quorumlog`` data source and the shipped pipelines.

Needs the ``spark`` extra (``pip install 'quorumlog[spark]'``: pyspark 4, pyarrow)::

    import quorumlog.spark
    quorumlog.spark.register(spark)
    df = spark.read.format("quorumlog").option("log", "dice").load()

With quorumlog installed, PySpark also finds the source by itself (the
``pyspark_quorumlog`` package), so ``register`` is only needed where that lookup
is turned off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the ``quorumlog`` data source with ``spark``."""
    from quorumlog.spark.datasource import QuorumlogDataSource

    spark.dataSource.register(QuorumlogDataSource)


def __getattr__(name: str) -> Any:
    if name == "QuorumlogDataSource":
        from quorumlog.spark.datasource import QuorumlogDataSource

        return QuorumlogDataSource
    raise AttributeError(name)


__all__ = ["QuorumlogDataSource", "register"]
