"""ZooKeeper servers in network namespaces: a standalone server or an ensemble.

Each server runs in its own namespace and listens on that namespace's address only
(client port 2181, quorum ports 2888 and 3888), so a partition of the network is a
partition of the ensemble. Java and the jars come from Debian's ``zookeeper``
package, as for :class:`quorumlog.server.local_zookeeper.ZooKeeperServer`; sessions are as
short as 200 ms (tickTime 100 ms).

Example::

    ensemble = ZooKeeperEnsemble(network, size=3, base_dir=run_dir).start()
    uri = ensemble.uri("/my-test")      # zk://10.213.0.2:2181,10.213.0.3:2181,.../my-test
    leader = ensemble.leader()          # the server whose ``srvr`` says "Mode: leader"
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from quorumlog.server.child_process import ChildProcess, kill_now
from quorumlog.server.local_zookeeper import (
    ZooKeeperUnavailableError,
    missing_zookeeper_message,
    zookeeper_classpath,
)
from tests.harness.netns.network import Host, Network

CLIENT_PORT = 2181
QUORUM_PORT = 2888
ELECTION_PORT = 3888
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
_JVM_FLAGS = (
    "-Xms16m",
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",  # starts faster; a test server needs no peak throughput
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)


@dataclass
class ZooKeeperNode(ChildProcess):
    """One server of the ensemble: its id (``myid``), host and process."""

    server_id: int
    host: Host
    home: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log_paths: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host.address}:{CLIENT_PORT}"


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers, one per namespace (``zk1``, ``zk2``, ...)."""

    def __init__(
        self,
        network: Network,
        *,
        size: int = 3,
        base_dir: Path,
        tick_time_ms: int = 100,
        start_timeout_s: float = 60.0,
    ) -> None:
        self.network = network
        self.tick_time_ms = tick_time_ms
        self.start_timeout_s = start_timeout_s
        self.base_dir = Path(base_dir)
        self.nodes = [
            ZooKeeperNode(i, network.add_host(f"zk{i}"), self.base_dir / f"zk{i}")
            for i in range(1, size + 1)
        ]

    @property
    def hosts(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def uri(self, root: str = "") -> str:
        root = root.strip("/")
        return f"zk://{self.hosts}/{root}" if root else f"zk://{self.hosts}"

    def _write_config(self, node: ZooKeeperNode) -> Path:
        data_dir = node.home / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={data_dir}",
            f"clientPort={CLIENT_PORT}",
            f"clientPortAddress={node.host.address}",
            # Followers connect and sync within 5 s, and are dropped after 2 s of silence.
            "initLimit=50",
            "syncLimit=20",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            "maxSessionTimeout=60000",
            "forceSync=no",  # a test ensemble: no fsync per transaction
            "autopurge.purgeInterval=0",
        ]
        if len(self.nodes) > 1:
            (data_dir / "myid").write_text(f"{node.server_id}\n")
            lines += [
                f"server.{other.server_id}={other.host.address}:{QUORUM_PORT}:{ELECTION_PORT}"
                for other in self.nodes
            ]
        config = node.home / "zoo.cfg"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self) -> ZooKeeperEnsemble:
        """Start every server (in parallel) and wait until each serves as leader,
        follower or standalone."""
        for node in self.nodes:
            self.start_node(node, wait=False)
        deadline = time.monotonic() + self.start_timeout_s
        for node in self.nodes:
            self.wait_serving(node, deadline)
        return self

    def start_node(self, node: ZooKeeperNode, *, wait: bool = True) -> None:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailableError(missing_zookeeper_message())
        config = self._write_config(node)
        node.starts += 1
        log_path = node.home / f"zookeeper-{node.starts}.log"
        node.log_paths.append(log_path)
        with open(log_path, "ab") as log_file:
            node.process = node.host.popen(
                [java, *_JVM_FLAGS, "-cp", zookeeper_classpath(), QUORUM_MAIN, str(config)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=node.home,
            )
        if wait:
            self.wait_serving(node, time.monotonic() + self.start_timeout_s)

    def mode(self, node: ZooKeeperNode) -> str | None:
        """``leader``, ``follower`` or ``standalone`` from ``srvr``; None if it does not
        answer (not serving, cut off, paused)."""
        with contextlib.suppress(OSError):
            answer = node.host.exchange(node.host.address, CLIENT_PORT, b"srvr", 0.5)
            for line in answer.decode("utf-8", "replace").splitlines():
                if line.startswith("Mode:"):
                    return line.split(":", 1)[1].strip()
        return None

    def wait_serving(self, node: ZooKeeperNode, deadline: float) -> None:
        while time.monotonic() < deadline:
            if node.process is not None and node.process.poll() is not None:
                break
            if self.mode(node) is not None:
                return
            time.sleep(0.1)
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(node.log_paths[-1].read_text(errors="replace").splitlines()[-20:])
        raise ZooKeeperUnavailableError(
            f"ZooKeeper server {node.server_id} at {node.address} is not serving:\n{tail}"
        )

    def leader(self) -> ZooKeeperNode | None:
        for node in self.nodes:
            if self.mode(node) in ("leader", "standalone"):
                return node
        return None

    def kill(self, node: ZooKeeperNode) -> None:
        """kill -9 by pid."""
        if node.process is not None:
            kill_now(node.process)

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node)
