"""Lets PySpark find quorumlog's data source by itself: it imports every installed
``pyspark_*`` package and registers its ``DefaultSource`` under that source's name
(``quorumlog``)."""

from quorumlog.spark.datasource import QuorumlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
