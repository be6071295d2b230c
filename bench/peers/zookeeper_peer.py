"""Apache ZooKeeper 3.8 (Debian's ``zookeeper``) as a 3-server ensemble, written with kazoo.

Each server is a ``QuorumPeerMain`` JVM with its own data directory, client port and
quorum/election ports on 127.0.0.1. ``forceSync=yes`` (ZooKeeper's default, written
out here) makes every transaction log write fsynced before a server acknowledges it,
and a write is confirmed once a majority (2 of 3) has logged it. The client connects
to the leader (a follower would forward writes to it: one hop more) and creates
persistent sequential znodes of ``--entry-size`` bytes under ``/bench``:

- one at a time: ``create(path, value, sequence=True)``;
- pipelined: ``create_async`` with at most ``--window`` requests in flight.

    python bench/peers/zookeeper_peer.py client --hosts 127.0.0.1:PORT --mode pipelined ...
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ``peers`` when run as a script
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # ``quorumlog``

from peers.common import (
    PeerCluster,
    add_client_arguments,
    ensure_binary,
    ensure_debian,
    ensure_modules,
    free_ports,
    log,
    print_json,
    run_modes,
    run_one_at_a_time,
    run_windowed,
)

SERVERS = 3
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# Full JIT (no TieredStopAtLevel) and a heap that never has to grow during a run.
JVM_FLAGS = (
    "-Xms256m",
    "-Xmx512m",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)


class ZooKeeperEnsemble(PeerCluster):
    """Three ZooKeeper servers on 127.0.0.1 in a temporary directory."""

    NAME = "zookeeper"
    READY_WHAT = "ZooKeeper ensemble"
    FIRST_LOG = "zk1/server.log"
    START_TIMEOUT_S = 90.0

    def __init__(self, base_dir: Path | None = None) -> None:
        super().__init__(base_dir)
        self.client_ports: list[int] = []

    def launch(self) -> None:
        from quorumlog.server.local_zookeeper import (
            missing_zookeeper_message,
            zookeeper_classpath,
            zookeeper_installed,
            zookeeper_jar,
        )

        ensure_binary("java", "default-jre-headless")
        ensure_debian("zookeeper", lambda: zookeeper_jar() is not None)
        if not zookeeper_installed():
            raise RuntimeError(missing_zookeeper_message())
        java = shutil.which("java")
        assert java is not None
        ports = free_ports(3 * SERVERS)
        self.client_ports = ports[:SERVERS]
        servers = [
            f"server.{i + 1}=127.0.0.1:{ports[SERVERS + i]}:{ports[2 * SERVERS + i]}"
            for i in range(SERVERS)
        ]
        for i in range(SERVERS):
            home = self.base_dir / f"zk{i + 1}"
            (home / "data").mkdir(parents=True, exist_ok=True)
            (home / "data" / "myid").write_text(f"{i + 1}\n")
            config = home / "zoo.cfg"
            config.write_text(
                "\n".join(
                    [
                        "tickTime=2000",
                        "initLimit=10",
                        "syncLimit=5",
                        f"dataDir={home / 'data'}",
                        f"clientPort={self.client_ports[i]}",
                        "clientPortAddress=127.0.0.1",
                        "maxClientCnxns=0",
                        "forceSync=yes",  # fsync the transaction log before acknowledging
                        "admin.enableServer=false",
                        "4lw.commands.whitelist=srvr,stat,mntr,ruok",
                        "autopurge.purgeInterval=0",
                        *servers,
                        "",
                    ]
                )
            )
            self.procs.start(
                [java, *JVM_FLAGS, "-cp", zookeeper_classpath(), QUORUM_MAIN, str(config)],
                home / "server.log",
                cwd=home,
            )

    def ready(self) -> bool:
        return self.leader_port() is not None

    def started(self) -> None:
        self.version = self._srvr(self.client_ports[0]).split("\n", 1)[0].strip()

    @staticmethod
    def _srvr(port: int) -> str:
        from quorumlog.server.local_zookeeper import four_letter_word

        return four_letter_word(port, "srvr", timeout_s=1.0)

    def leader_port(self) -> int | None:
        """The client port of the current leader, once all three serve requests."""
        modes = {}
        for port in self.client_ports:
            text = self._srvr(port)
            for line in text.splitlines():
                if line.startswith("Mode:"):
                    modes[port] = line.split(":", 1)[1].strip()
        if len(modes) < SERVERS:
            return None
        leaders = [port for port, mode in modes.items() if mode == "leader"]
        return leaders[0] if leaders else None


def measure(
    modes: dict[str, dict[str, Any]], time_limit_s: float = 60.0
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Start an ensemble, run each mode's client (``{mode: {entries, warmup, window}}``),
    stop it. Returns ({mode: summary}, facts about the setup)."""
    ensure_modules([("kazoo", "kazoo>=2.10,<3")])
    with ZooKeeperEnsemble() as ensemble:
        leader = ensemble.leader_port()
        log(f"ZooKeeper ensemble up ({ensemble.version}); leader on port {leader}")
        target = ["--hosts", f"127.0.0.1:{leader}"]
        results = run_modes("ZooKeeper", Path(__file__), target, modes, time_limit_s)
    setup = {
        "version": ensemble.version,
        "servers": SERVERS,
        "config": "forceSync=yes (fsync per log write), majority ack 2/3",
        "client": "kazoo, connected to the leader",
    }
    return results, setup


def client_main(args: argparse.Namespace) -> None:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=args.hosts, timeout=30.0)
    zk.start(timeout=30)
    try:
        parent = f"/bench-{os.getpid()}"
        zk.create(parent)
        value = os.urandom(args.entry_size)
        prefix = f"{parent}/e-"
        if args.mode == "one-at-a-time":

            def op(_i: int) -> None:
                zk.create(prefix, value, sequence=True)

            result = run_one_at_a_time(op, args.entries, args.warmup, args.time_limit_s)
        else:

            def start(_i: int, done: Any) -> None:
                zk.create_async(prefix, value, sequence=True).rawlink(
                    lambda res: done(res.exception)
                )

            result = run_windowed(start, args.entries, args.warmup, args.window, args.time_limit_s)
        result["client_version"] = "kazoo " + importlib.metadata.version("kazoo")
        print_json(result)
    finally:
        zk.stop()
        zk.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    client = sub.add_parser(
        "client", help="run one measurement against running servers", allow_abbrev=False
    )
    client.add_argument("--hosts", required=True)
    add_client_arguments(client)
    args = parser.parse_args()
    client_main(args)


if __name__ == "__main__":
    main()
