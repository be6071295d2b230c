"""A real standalone ZooKeeper on this machine, from Debian's ``zookeeper`` package, for
tests and benchmarks (beside :mod:`quorumlog.server.local_cluster`'s bookies).

Example::

    with ZooKeeperServer() as zk:
        store = await open_store(zk.uri("/my-test"), session_timeout_ms=2000)

The server listens on 127.0.0.1 on a free port, keeps its data in a temporary
directory, has the admin server off and a short ``tickTime`` (100 ms) so that
sessions can be as short as 200 ms. It is stopped by its process id.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from quorumlog.errors import BKError

DEBIAN_PACKAGE = "zookeeper"
JAVA_DIR = Path("/usr/share/java")
ZOOKEEPER_HOME = Path("/usr/share/zookeeper")
SERVER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
# The Debian jar's manifest lists its dependencies; these are the ones that are
# also needed explicitly (a logging backend, and the jars the server loads by name).
_EXTRA_JARS = ("zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar")
_JVM_FLAGS = (
    "-Xms32m",
    "-XX:+UseSerialGC",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)


class ZooKeeperUnavailableError(BKError):
    """ZooKeeper (the Debian package, or Java) is not installed or would not start."""


def zookeeper_jar() -> Path | None:
    """The server jar of the Debian package, or None if the package is not installed."""
    for candidate in (JAVA_DIR / "zookeeper.jar", *sorted(JAVA_DIR.glob("zookeeper-3*.jar"))):
        if candidate.is_file():
            return candidate
    return None


def zookeeper_installed() -> bool:
    """Whether Debian's ``zookeeper`` package and a Java runtime are installed."""
    return zookeeper_jar() is not None and shutil.which("java") is not None


def missing_zookeeper_message() -> str:
    """Why :class:`ZooKeeperServer` cannot start here, for a test failure message."""
    if zookeeper_jar() is None:
        return (
            f"ZooKeeper tests need Debian's {DEBIAN_PACKAGE!r} package "
            f"(no zookeeper.jar under {JAVA_DIR}): apt-get install {DEBIAN_PACKAGE}"
        )
    if shutil.which("java") is None:
        return "ZooKeeper tests need a Java runtime (java not on PATH): apt-get install default-jre"
    return ""


def zookeeper_classpath() -> str:
    jar = zookeeper_jar()
    if jar is None:
        raise ZooKeeperUnavailableError(missing_zookeeper_message())
    parts = [str(jar)]
    parts += [str(JAVA_DIR / name) for name in _EXTRA_JARS if (JAVA_DIR / name).is_file()]
    return ":".join(parts)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def four_letter_word(port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ``stat``) and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer:
    """One standalone ZooKeeper process on 127.0.0.1."""

    def __init__(
        self,
        *,
        tick_time_ms: int = 100,
        port: int | None = None,
        data_dir: str | None = None,
        start_timeout_s: float = 30.0,
        heap_mb: int = 256,
        peak_throughput: bool = False,
    ) -> None:
        self.tick_time_ms = tick_time_ms
        # A test server starts faster with the first JIT tier only and needs little heap;
        # a benchmark of a large tree asks for more of both.
        self.jvm_flags = [*_JVM_FLAGS, f"-Xmx{heap_mb}m"]
        if not peak_throughput:
            self.jvm_flags.append("-XX:TieredStopAtLevel=1")
        self.port = port or 0
        self._port_fixed = port is not None
        self.start_timeout_s = start_timeout_s
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="quorumlog-zk-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    def uri(self, root: str = "") -> str:
        """``zk://127.0.0.1:PORT/root`` for :func:`quorumlog.meta.factory.open_store`."""
        root = root.strip("/")
        return f"zk://{self.hosts}/{root}" if root else f"zk://{self.hosts}"

    def _write_config(self) -> Path:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_time_ms}",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    "maxClientCnxns=0",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,srvr,stat,cons,mntr",
                    f"minSessionTimeout={2 * self.tick_time_ms}",
                    "maxSessionTimeout=120000",
                    "forceSync=no",  # a test server: no fsync per transaction
                    "autopurge.purgeInterval=0",
                    "",
                ]
            )
        )
        return config

    def start(self) -> ZooKeeperServer:
        """Start the server and wait until it serves requests (bounded by ``start_timeout_s``)."""
        if self.process is not None:
            return self
        classpath = zookeeper_classpath()
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailableError(missing_zookeeper_message())
        started = time.monotonic()
        last_error = ""
        for attempt in range(3):  # a free port can be taken between the probe and the bind
            if not self.port or (attempt and not self._port_fixed):
                self.port = free_port()
            config = self._write_config()
            with open(self.log_path, "ab") as log_file:
                self.process = subprocess.Popen(
                    [java, *self.jvm_flags, "-cp", classpath, SERVER_MAIN, str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                )
            error = self._wait_serving(started + self.start_timeout_s)
            if error is None:
                self.startup_s = time.monotonic() - started
                self._port_fixed = True  # a restart comes back on the same port
                atexit.register(self.stop)
                return self
            last_error = error
            self._kill()
            if time.monotonic() > started + self.start_timeout_s:
                break
        raise ZooKeeperUnavailableError(
            f"ZooKeeper did not start on 127.0.0.1:{self.port}: {last_error}\n{self._log_tail()}"
        )

    def _wait_serving(self, deadline: float) -> str | None:
        """None once ``srvr`` reports a mode, else why it did not (process exited, timeout)."""
        assert self.process is not None
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                return f"java exited with status {code}"
            with contextlib.suppress(OSError):
                if "Mode:" in four_letter_word(self.port, "srvr", timeout_s=0.5):
                    return None
            time.sleep(0.05)
        return f"not serving after {self.start_timeout_s} s"

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _kill(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        self.process = None

    def restart(self) -> None:
        """Stop the process and start it again on the same port and data (sessions survive
        if the client reconnects within its session timeout)."""
        self._kill()
        self.start()

    def stop(self) -> None:
        """Stop the server by its pid and remove its temporary directory."""
        self._kill()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
