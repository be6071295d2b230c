"""A log through Spark: batch read, exactly-once write, and a streaming copy.

Run it against a local cluster (``quorumlog localbookie 3``) with the spark extra
installed (``pip install -e '.[spark]'``); the metadata URI comes from
$QUORUMLOG_METADATA, else ./.quorumlog/metadata.db::

    python examples/spark_pipeline.py
"""

import tempfile

from pyspark.sql import functions as F

from quorumlog import BookKeeper
from quorumlog.spark.session import local_session


def main() -> None:
    with BookKeeper() as bk:
        # A log of 1,000 orders over two ledgers.
        for name in ("orders", "orders-upper", "orders-copy"):
            if name in bk.list_logs():
                bk.delete_log(name)
        writer = bk.open_log("orders").open_writer()
        for i in range(1_000):
            writer.append(b"order %d" % i)
            if i == 499:
                writer.rollover()
        writer.close()

        spark = local_session("local[2]", "quorumlog-example")
        try:
            orders = spark.read.format("quorumlog").option("log", "orders").load()
            print("per ledger:")
            orders.groupBy("ledger_id").count().orderBy("ledger_id").show()

            # Batch sink: all rows in the log, once, in partition order; or none.
            upper = orders.select(F.upper(F.col("data").cast("string")).alias("data"))
            upper.write.format("quorumlog").option("log", "orders-upper").mode("append").save()
            print("orders-upper:", len(bk.open_log("orders-upper").read_all()), "records")

            # Streaming copy, exactly once; availableNow stops at the end of the log.
            with tempfile.TemporaryDirectory() as checkpoint:
                query = (
                    spark.readStream.format("quorumlog")
                    .option("log", "orders")
                    .option("maxRecordsPerTrigger", 300)
                    .load()
                    .select("data")
                    .writeStream.format("quorumlog")
                    .option("log", "orders-copy")
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
            copied = bk.open_log("orders-copy").read_all()
            print(
                "orders-copy:",
                len(copied),
                "records, first",
                copied[0].data,
                "last",
                copied[-1].data,
            )
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
