"""A quorumlog cluster across network namespaces: ZooKeeper servers, bookies (each
behind its fault proxy), database replicas and clients, one namespace each.

Per bookie ``bN``: the bookie listens on the namespace's first address (its bind
address), port 3181; the proxy (:mod:`tests.harness.netns.proxy`) listens on a
second address of the same namespace, same port, and forwards to it; the bookie
advertises the proxy's address, so every client reaches it through the proxy, while
a cut of the namespace's links cuts both. The metadata store is a ZooKeeper ensemble
in namespaces (``zk``) or a SQLite file that every namespace opens through the shared
filesystem (``sqlite``: it has no network to cut, so the metadata nemeses need ``zk``).

Example::

    with NetnsCluster("zk", base_dir=Path("/tmp/run")) as cluster:
        cluster.start()
        writer = cluster.client("writer")
        process = cluster.run_python(writer, "tests.harness.netns.workload", [...])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quorumlog.server.child_process import RestartedChildProcess, kill_now
from tests.harness.netns.network import Host, Network
from tests.harness.netns.proxy import LinkFaults
from tests.harness.netns.zookeeper import ZooKeeperEnsemble

BOOKIE_PORT = 3181
DB_HTTP_PORT = 4001
_READY = re.compile(r"^bookie (\S+) ready", re.MULTILINE)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


@dataclass
class ServerProcess(RestartedChildProcess):
    """A process of the cluster in its namespace, restartable with the same arguments."""

    name: str
    host: Host
    home: Path
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    paused: bool = False

    def stderr_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@dataclass
class BookieNode:
    index: int
    server: ServerProcess
    proxy: ServerProcess
    bind_address: str
    advertised_address: str
    control_path: Path
    faults: LinkFaults = field(default_factory=LinkFaults)

    @property
    def address(self) -> str:
        """What the bookie registers and clients connect to (the proxy)."""
        return f"{self.advertised_address}:{BOOKIE_PORT}"


class ClusterStartError(RuntimeError):
    """A process of the namespace cluster did not start."""


class NetnsCluster:
    """Builds, faults and removes one cluster (``driver``: ``sqlite`` or ``zk``)."""

    def __init__(
        self,
        driver: str,
        base_dir: Path,
        *,
        bookies: int = 4,
        zookeeper_servers: int = 3,
        bookie_session_timeout_ms: int = 2000,
        start_timeout_s: float = 60.0,
        network: Network | None = None,
        racks: Sequence[str] = (),
    ) -> None:
        if driver not in ("sqlite", "zk"):
            raise ValueError(f"driver {driver!r}: expected sqlite or zk")
        self.driver = driver
        self.base_dir = Path(base_dir).absolute()
        if self.base_dir.is_dir() and any(self.base_dir.iterdir()):
            # Bookie data, a metadata store, histories of an earlier run: never mixed.
            raise ClusterStartError(f"{self.base_dir} holds an earlier run: give another")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.num_bookies = bookies
        if racks and len(racks) != bookies:
            raise ValueError(f"{len(racks)} racks for {bookies} bookies: give one per bookie")
        # Bookie N (from 1) registers racks[N - 1] (/REGION/RACK); none: the default place.
        self.racks = list(racks)
        self.zookeeper_servers = zookeeper_servers
        self.bookie_session_timeout_ms = bookie_session_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.network = network or Network.create()
        self.zookeeper: ZooKeeperEnsemble | None = None
        self.bookies: list[BookieNode] = []
        self.db_replicas: list[ServerProcess] = []
        self.clients: dict[str, Host] = {}
        self._others: list[subprocess.Popen[bytes]] = []
        self.metadata_uri = ""
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, self.env.get("PYTHONPATH", "")) if p
        )
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env.pop("QUORUMLOG_METADATA", None)

    # ------------------------------------------------------------ building

    def start(self) -> NetnsCluster:
        """The metadata store, then the bookies (in parallel), each registered."""
        try:
            if self.driver == "zk":
                self.zookeeper = ZooKeeperEnsemble(
                    self.network, size=self.zookeeper_servers, base_dir=self.base_dir / "zk"
                ).start()
                self.metadata_uri = self.zookeeper.uri("/quorumlog")
            else:
                self.metadata_uri = f"sqlite://{self.base_dir / 'metadata.db'}"
            for index in range(1, self.num_bookies + 1):
                self.bookies.append(self._new_bookie(index))
            # The first bookie creates the store; the others start once it is ready.
            self._launch(self.bookies[0].proxy)
            self._launch(self.bookies[0].server)
            self.wait_bookie_ready(self.bookies[0])
            for bookie in self.bookies[1:]:
                self._launch(bookie.proxy)
                self._launch(bookie.server)
            for bookie in self.bookies[1:]:
                self.wait_bookie_ready(bookie)
        except BaseException:
            self.close()
            raise
        return self

    def _new_bookie(self, index: int) -> BookieNode:
        host = self.network.add_host(f"b{index}")
        advertised = self.network.add_address(host)
        home = self.base_dir / f"bookie-{index}"
        home.mkdir(parents=True, exist_ok=True)
        control = home / "link-faults.json"
        control.write_text(LinkFaults().to_json())
        bookie_argv = [
            sys.executable, "-m", "quorumlog", "bookie",
            "--metadata", self.metadata_uri,
            "--data-dir", str(home / "data"),
            "--port", str(BOOKIE_PORT),
            "--bind-address", host.address,
            "--advertised-address", advertised,
            "--metadata-session-timeout-ms", str(self.bookie_session_timeout_ms),
            "--journal-max-group-wait-ms", "1",
        ]  # fmt: skip
        if self.racks:
            bookie_argv += ["--rack", self.racks[index - 1]]
        proxy_argv = [
            sys.executable, "-m", "tests.harness.netns.proxy",
            "--listen", f"{advertised}:{BOOKIE_PORT}",
            "--target", f"{host.address}:{BOOKIE_PORT}",
            "--control", str(control),
            "--seed", str(index),
        ]  # fmt: skip
        return BookieNode(
            index=index,
            server=ServerProcess(f"b{index}", host, home, bookie_argv),
            proxy=ServerProcess(f"b{index}-proxy", host, home / "proxy", proxy_argv),
            bind_address=host.address,
            advertised_address=advertised,
            control_path=control,
        )

    def _launch(self, server: ServerProcess) -> None:
        server.home.mkdir(parents=True, exist_ok=True)
        server.starts += 1
        with open(server.stdout_path, "ab") as out, open(server.stderr_path, "ab") as err:
            server.process = server.host.popen(
                server.argv, stdout=out, stderr=err, env=self.env, cwd=server.home
            )
        server.paused = False

    def wait_bookie_ready(self, bookie: BookieNode) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        server = bookie.server
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if _READY.search(server.stdout_path.read_text(errors="replace")):
                    return
            if not server.alive():
                break
            time.sleep(0.05)
        raise ClusterStartError(
            f"bookie {bookie.address} did not become ready (exit status "
            f"{server.returncode}):\n{server.stderr_tail()}"
        )

    def client(self, name: str) -> Host:
        """A client namespace (made on first use)."""
        if name not in self.clients:
            self.clients[name] = self.network.add_host(name)
        return self.clients[name]

    def run_python(
        self, host: Host, module: str, args: Sequence[str], *, log_dir: Path, name: str
    ) -> subprocess.Popen[bytes]:
        """``python -m module args`` in ``host``'s namespace; output under ``log_dir``."""
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{name}.out", "ab") as out, open(log_dir / f"{name}.err", "ab") as err:
            process = host.popen(
                [sys.executable, "-m", module, *args], stdout=out, stderr=err, env=self.env
            )
        self._others.append(process)
        return process

    # ------------------------------------------------------------ database replicas

    def start_db(self, name: str, replicas: int = 3, session_timeout_ms: int = 1500) -> None:
        for index in range(1, replicas + 1):
            host = self.network.add_host(f"d{index}")
            home = self.base_dir / f"db-{index}"
            argv = [
                sys.executable, "-m", "quorumlog", "db", "serve",
                "--metadata", self.metadata_uri,
                "--name", name,
                "--data-dir", str(home / "data"),
                "--http-addr", f"{host.address}:{DB_HTTP_PORT}",
                "--session-timeout-ms", str(session_timeout_ms),
                "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2",
            ]  # fmt: skip
            replica = ServerProcess(f"d{index}", host, home, argv)
            self.db_replicas.append(replica)
            self._launch(replica)

    def db_address(self, replica: ServerProcess) -> str:
        return f"{replica.host.address}:{DB_HTTP_PORT}"

    def db_status(self, replica: ServerProcess) -> dict[str, object] | None:
        """The replica's ``/status`` (asked from inside its namespace), or None."""
        with contextlib.suppress(OSError, ValueError):
            request = b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n"
            answer = replica.host.exchange(replica.host.address, DB_HTTP_PORT, request, 1.0)
            body = answer.split(b"\r\n\r\n", 1)[1]
            status = json.loads(body)
            return status if isinstance(status, dict) else None
        return None

    def db_leader(self) -> ServerProcess | None:
        for replica in self.db_replicas:
            status = self.db_status(replica)
            store = status.get("store") if status else None
            if isinstance(store, dict) and store.get("role") == "leader":
                return replica
        return None

    # ------------------------------------------------------------ process faults

    def kill(self, server: ServerProcess) -> None:
        """kill -9 by pid (resumed first if paused, so it dies at once)."""
        if server.process is not None:
            kill_now(server.process)
        server.paused = False

    def restart(self, server: ServerProcess) -> None:
        self.kill(server)
        self._launch(server)

    def pause(self, server: ServerProcess) -> None:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGSTOP)
            server.paused = True

    def resume(self, server: ServerProcess) -> None:
        if server.process is not None and server.paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.process.pid, signal.SIGCONT)
            server.paused = False

    def set_link_faults(self, bookie: BookieNode, faults: LinkFaults) -> None:
        """What the bookie's proxy does to its traffic from now on (atomic rewrite)."""
        temporary = bookie.control_path.with_suffix(".tmp")
        temporary.write_text(faults.to_json())
        os.replace(temporary, bookie.control_path)
        bookie.faults = faults

    # ------------------------------------------------------------ removal

    def servers(self) -> list[ServerProcess]:
        found = [s for b in self.bookies for s in (b.server, b.proxy)]
        return found + self.db_replicas

    def close(self) -> None:
        """Stop every process by pid, then remove the namespaces."""
        for process in self._others:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        for server in self.servers():
            with contextlib.suppress(Exception):
                self.kill(server)
        if self.zookeeper is not None:
            with contextlib.suppress(Exception):
                self.zookeeper.stop()
        self.network.remove()

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
