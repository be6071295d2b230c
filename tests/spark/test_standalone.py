"""The same data source on a real Spark cluster: a standalone master and a worker
started from the pip package on loopback, a driver in its own process.

Run as a script, this file is that driver: it reads a log through the master and
copies it into another log with the exactly-once sink, then prints a JSON summary. Its
session registers nothing: the ``quorumlog`` format is found by PySpark's automatic
lookup of installed ``pyspark_*`` packages.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import quorumlog
from quorumlog import LogNamespace
from quorumlog.server.local_cluster import running_cluster

pytestmark = pytest.mark.spark

START_TIMEOUT_S = 90


def free_ports(count: int) -> list[int]:
    """``count`` different ports for the daemons to listen on (see port_for_a_child)."""
    from support import port_for_a_child  # tests/ is on the path under pytest, not in the script

    ports: list[int] = []
    while len(ports) < count:
        port = port_for_a_child()
        if port not in ports:
            ports.append(port)
    return ports


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


class SparkDaemon:
    """A master or worker JVM from ``bin/spark-class``, stopped by its pid."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": spark_home(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.process = subprocess.Popen(
                [os.path.join(spark_home(), "bin", "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # spark-class execs java in its group
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def wait_for_workers(ui_port: int, count: int, daemons: list[SparkDaemon]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for daemon in daemons:
            if daemon.process.poll() is not None:
                raise AssertionError(f"spark daemon exited: {daemon.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as reply:
                state = json.load(reply)
            if state.get("aliveworkers", 0) >= count:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no {count} worker(s) registered within {START_TIMEOUT_S} s")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A master and one worker (2 cores, 1 GiB) on 127.0.0.1; yields the master URL."""
    port, ui_port, worker_ui = free_ports(3)
    master = SparkDaemon(
        [
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--webui-port", str(ui_port),
        ],
        tmp_path / "master.log",
    )  # fmt: skip
    daemons = [master]
    try:
        worker = SparkDaemon(
            [
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--host", "127.0.0.1",
                "--webui-port", str(worker_ui),
                "--cores", "2",
                "--memory", "1g",
                "--work-dir", str(tmp_path / "work"),
            ],
            tmp_path / "worker.log",
        )  # fmt: skip
        daemons.append(worker)
        wait_for_workers(ui_port, 1, daemons)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def test_a_job_on_a_standalone_master_and_worker(standalone, tmp_path):
    base = tmp_path / "quorumlog"
    uri = f"sqlite://{base}/metadata.db"
    for _ in running_cluster(uri, base / "cluster", 3):
        with quorumlog.BookKeeper(uri) as bk:
            writer = LogNamespace(bk).open_log("events").open_writer()
            for i in range(500):
                writer.append(b"event-%d" % i)
                if i == 249:
                    writer.rollover()
            writer.close()
            driver = subprocess.run(
                [sys.executable, __file__, standalone, uri],
                capture_output=True,
                text=True,
                timeout=240,
                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            )
            assert driver.returncode == 0, driver.stderr[-4000:]
            summary = json.loads(driver.stdout.strip().splitlines()[-1])
            assert summary["master"] == standalone
            assert summary["rows"] == 500 and summary["partitions"] >= 2
            assert summary["executors"] >= 1  # the work ran in the worker's executor JVM
            copied = [r.data for r in LogNamespace(bk).open_log("events-copy").read_all()]
            assert copied == [b"event-%d" % i for i in range(500)]


def drive(master: str, uri: str) -> None:
    # A plain session: no quorumlog.spark.register(), so the format resolves through
    # PySpark's own lookup of installed pyspark_* packages (pyspark_quorumlog).
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("quorumlog-standalone-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        df = (
            spark.read.format("quorumlog")
            .option("metadata", uri)
            .option("log", "events")
            .option("entriesPerPartition", "100")
            .load()
        )
        rows = df.count()
        df.select("data").write.format("quorumlog").option("metadata", uri).option(
            "log", "events-copy"
        ).mode("append").save()
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        print(
            json.dumps(
                {
                    "master": spark.sparkContext.master,
                    "rows": rows,
                    "partitions": df.rdd.getNumPartitions(),
                    "executors": executors,
                }
            )
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    drive(sys.argv[1], sys.argv[2])
