"""A log through Spark: batch read, exactly-once write, and a streaming copy.

Run it against a local cluster (``quorumlog localbookie 3``) with the spark extra
installed (``pip install -e '.[spark]'``); the metadata URI comes from
$QUORUMLOG_METADATA, else ./.quorumlog/metadata.db::

    python examples/spark_pipeline.py

It works on logs of its own, named ``example-spark-<random>/...`` so that no other
log (the README's ``orders``, a database's, the dice's) is touched, and deletes them
at the end: it deletes only what it created.
"""

import secrets
import tempfile

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from quorumlog import BookKeeper, LogNamespace
from quorumlog.spark.session import local_session


def main() -> None:
    with BookKeeper() as bk:
        spark = local_session("local[2]", "quorumlog-example")
        try:
            run(bk, spark)
        finally:
            spark.stop()


def run(bk: BookKeeper, spark: SparkSession, orders_count: int = 1_000) -> None:
    prefix = f"example-spark-{secrets.token_hex(4)}"
    orders, upper_name, copy_name = (f"{prefix}/{n}" for n in ("orders", "upper", "copy"))
    ours = (orders, upper_name, copy_name)
    if set(LogNamespace(bk).list_logs()) & set(ours):  # never someone else's log
        raise SystemExit(f"logs named {prefix}/... exist already: run the example again")
    try:
        _pipeline(bk, spark, orders, upper_name, copy_name, orders_count)
    finally:
        for name in ours:
            if name in LogNamespace(bk).list_logs():
                LogNamespace(bk).delete_log(name)
        print(f"deleted the example's logs {prefix}/...")


def _pipeline(
    bk: BookKeeper,
    spark: SparkSession,
    orders: str,
    upper_name: str,
    copy_name: str,
    orders_count: int,
) -> None:
    uri = bk.metadata_uri

    # A log of orders (1,000 by default) over two ledgers.
    writer = LogNamespace(bk).open_log(orders).open_writer()
    for i in range(orders_count):
        writer.append(b"order %d" % i)
        if i == orders_count // 2 - 1:
            writer.rollover()
    writer.close()

    source = spark.read.format("quorumlog").option("metadata", uri).option("log", orders).load()
    print("per ledger:")
    source.groupBy("ledger_id").count().orderBy("ledger_id").show()

    # Batch sink: all rows in the log, once, in partition order; or none.
    upper = source.select(F.upper(F.col("data").cast("string")).alias("data"))
    upper.write.format("quorumlog").option("metadata", uri).option("log", upper_name).mode(
        "append"
    ).save()
    print(f"{upper_name}:", len(LogNamespace(bk).open_log(upper_name).read_all()), "records")

    # Streaming copy, exactly once; availableNow stops at the end of the log.
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", orders)
            .option("maxRecordsPerTrigger", max(1, orders_count * 3 // 10))
            .load()
            .select("data")
            .writeStream.format("quorumlog")
            .option("metadata", uri)
            .option("log", copy_name)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    copied = LogNamespace(bk).open_log(copy_name).read_all()
    print(f"{copy_name}:", len(copied), "records, first", copied[0].data, "last", copied[-1].data)


if __name__ == "__main__":
    main()
