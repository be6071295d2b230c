"""A cluster of real bookie processes on this machine, for ``quorumlog localbookie``,
``quorumlog bench``, the project's own tests and :mod:`quorumlog.testing`.

It ships with the server (not under :mod:`quorumlog.testing`) because shipped commands
run it. It starts bookies as processes (``python -m quorumlog.server``,
:mod:`quorumlog.server.process`), never imports the client, and knows nothing of the
commands. A bookie that co-hosts autorecovery needs the client: for it, the command
layer passes ``entry_point=("-m", "quorumlog", "bookie")`` and ``--autorecovery`` in
``extra_args``.

Each bookie is a child process running ``python -m quorumlog.server`` on
127.0.0.1 with its own directories under ``base_dir/bookie-N/`` (``data/``,
``journal/``, and one ``stdout-K.log`` / ``stderr-K.log`` pair per start K, to
diagnose failures). A bookie picks a free port on its first start and prints
its address; a restart passes the same port, so the bookie keeps its identity.
Processes are only ever signalled by pid, and :meth:`LocalCluster.stop_all`
(also run by the context manager, and at interpreter exit as a last resort)
leaves none behind.

Example::

    with LocalCluster("sqlite:///tmp/m.db", Path("/tmp/c"), 3) as cluster:
        addresses = cluster.addresses
        cluster.kill(0)
        cluster.restart(0)

    with temporary_cluster(3) as cluster:  # embedded store in a temporary directory
        uri = cluster.metadata_uri
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quorumlog.server.child_process import RestartedChildProcess

# What follows the interpreter to run a bookie: the server's own entry point (callers
# may pass the ``quorumlog bookie`` command, which adds autorecovery and --config).
SERVER_ENTRY_POINT = ("-m", "quorumlog.server")
READY_LINE = re.compile(rb"^bookie (\S+) ready", re.MULTILINE)
ADMIN_LINE = re.compile(rb"^bookie \S+ admin (\S+)", re.MULTILINE)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

# Every process started here and not yet reaped, killed at interpreter exit if a test
# run is interrupted before its teardown.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _kill_leftovers() -> None:
    for pid, process in list(_LIVE.items()):
        if process.poll() is None:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
                process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _LIVE.pop(pid, None)


atexit.register(_kill_leftovers)


class ClusterError(RuntimeError):
    """A bookie process did not start, or did not stop, as expected."""


@dataclass
class BookieProcess(RestartedChildProcess):
    """One bookie of a :class:`LocalCluster` (its process may be stopped or restarted)."""

    index: int
    home: Path
    data_dir: Path
    journal_dir: Path
    extra_args: list[str] = field(default_factory=list)
    port: int = 0
    address: str = ""
    # Its HTTP admin API (``http://HOST:PORT``) when the cluster gives bookies one.
    admin_url: str = ""
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    paused: bool = False


class LocalCluster:
    """N bookie processes on one metadata store."""

    def __init__(
        self,
        metadata_uri: str,
        base_dir: Path | str,
        num_bookies: int,
        *,
        journal_sync: bool = True,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 20.0,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        http_port: int | None = None,
        entry_point: Sequence[str] = SERVER_ENTRY_POINT,
    ) -> None:
        self.metadata_uri = metadata_uri
        self.entry_point = list(entry_point)
        # Bookie K's admin API listens on http_port + K (0: each on a free port; None: none).
        self.http_port = http_port
        self.base_dir = Path(base_dir).absolute()
        self.journal_sync = journal_sync
        self.extra_args = list(extra_args)
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.python = python
        self.env = dict(os.environ if env is None else env)
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, self.env.get("PYTHONPATH", "")) if p
        )
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.bookies: list[BookieProcess] = []
        self._initial = num_bookies

    # ------------------------------------------------------------ life cycle

    def start(self) -> LocalCluster:
        """Start the initial bookies (in parallel) and wait until every one is registered."""
        try:
            for _ in range(self._initial):
                self._launch(self._new_bookie())
            for bookie in self.bookies:
                self.wait_ready(bookie.index)
        except BaseException:
            self.stop_all()
            raise
        return self

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    @property
    def addresses(self) -> list[str]:
        """Addresses of the bookies that are running now."""
        return [b.address for b in self.bookies if b.alive()]

    def _new_bookie(self, extra_args: Sequence[str] = ()) -> BookieProcess:
        index = len(self.bookies)
        home = self.base_dir / f"bookie-{index}"
        bookie = BookieProcess(
            index=index,
            home=home,
            data_dir=home / "data",
            journal_dir=home / "journal",
            extra_args=list(extra_args),
        )
        self.bookies.append(bookie)
        return bookie

    def command(self, bookie: BookieProcess, extra_args: Sequence[str] = ()) -> list[str]:
        """The command line that runs ``bookie``."""
        args = [
            self.python,
            *self.entry_point,
            "--metadata",
            self.metadata_uri,
            "--data-dir",
            str(bookie.data_dir),
            "--journal-dir",
            str(bookie.journal_dir),
        ]
        if bookie.port:
            args += ["--port", str(bookie.port)]
        if self.http_port is not None:
            args += ["--http-port", str(self.http_port + bookie.index if self.http_port else 0)]
        if not self.journal_sync:
            args.append("--no-journal-sync")
        return args + self.extra_args + bookie.extra_args + list(extra_args)

    def _launch(self, bookie: BookieProcess, extra_args: Sequence[str] = ()) -> None:
        if bookie.alive():
            raise ClusterError(f"bookie {bookie.index} ({bookie.address}) is already running")
        bookie.home.mkdir(parents=True, exist_ok=True)
        bookie.starts += 1
        bookie.paused = False
        with open(bookie.stdout_path, "wb") as out, open(bookie.stderr_path, "wb") as err:
            process = subprocess.Popen(
                self.command(bookie, extra_args),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=self.env,
                # Its own session: a terminal's Ctrl-C reaches only the parent, which
                # then stops the bookies in order.
                start_new_session=True,
            )
        bookie.process = process
        _LIVE[process.pid] = process

    def wait_ready(self, i: int, timeout_s: float | None = None) -> str:
        """Wait for bookie ``i``'s ready line (it is registered by then); returns its address."""
        bookie = self.bookies[i]
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while time.monotonic() < deadline:
            output = bookie.stdout_path.read_bytes()
            match = READY_LINE.search(output)
            if match:
                bookie.address = match.group(1).decode()
                bookie.port = int(bookie.address.rpartition(":")[2])
                admin = ADMIN_LINE.search(output)
                bookie.admin_url = admin.group(1).decode() if admin else ""
                return bookie.address
            if not bookie.alive():
                self._reap(bookie)
                raise ClusterError(
                    f"bookie {i} exited with status {bookie.returncode} before it was ready; "
                    f"stderr ({bookie.stderr_path}):\n{_tail(bookie.stderr_text())}"
                )
            time.sleep(0.02)
        raise ClusterError(
            f"bookie {i} not ready after {timeout_s or self.start_timeout_s:.0f} s; "
            f"stderr ({bookie.stderr_path}):\n{_tail(bookie.stderr_text())}"
        )

    def wait_exit(self, i: int, timeout_s: float = 30.0) -> int:
        """Wait for bookie ``i``'s process to end by itself; returns its exit status."""
        bookie = self.bookies[i]
        if bookie.process is None:
            raise ClusterError(f"bookie {i} was never started")
        try:
            code = bookie.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"bookie {i} still running after {timeout_s:.0f} s") from None
        self._reap(bookie)
        return code

    def _reap(self, bookie: BookieProcess) -> None:
        if bookie.process is not None and bookie.process.poll() is not None:
            _LIVE.pop(bookie.process.pid, None)

    # ------------------------------------------------------------ faults and restarts

    def _signal(self, i: int, signum: int) -> BookieProcess:
        bookie = self.bookies[i]
        if not bookie.alive():
            raise ClusterError(f"bookie {i} ({bookie.address}) is not running")
        assert bookie.process is not None
        os.kill(bookie.process.pid, signum)
        return bookie

    def kill(self, i: int) -> None:
        """SIGKILL bookie ``i`` (a crash: nothing is flushed) and reap it."""
        bookie = self._signal(i, signal.SIGKILL)
        assert bookie.process is not None
        bookie.process.wait(timeout=self.stop_timeout_s)
        bookie.paused = False
        self._reap(bookie)

    def stop(self, i: int, timeout_s: float | None = None) -> int:
        """SIGTERM bookie ``i`` (graceful stop) and wait; returns its exit status.

        If it is still running after ``timeout_s`` it is killed and ClusterError raised.
        """
        bookie = self.bookies[i]
        if not bookie.alive():
            raise ClusterError(f"bookie {i} ({bookie.address}) is not running")
        assert bookie.process is not None
        if bookie.paused:
            self.resume(i)
        os.kill(bookie.process.pid, signal.SIGTERM)
        try:
            code = bookie.process.wait(timeout=timeout_s or self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(bookie.process.pid, signal.SIGKILL)
            bookie.process.wait(timeout=10)
            self._reap(bookie)
            raise ClusterError(f"bookie {i} ignored SIGTERM; killed") from None
        self._reap(bookie)
        return code

    def pause(self, i: int) -> None:
        """SIGSTOP bookie ``i``: it keeps its sockets but answers nothing."""
        self._signal(i, signal.SIGSTOP).paused = True

    def resume(self, i: int) -> None:
        """SIGCONT bookie ``i``."""
        self._signal(i, signal.SIGCONT).paused = False

    def restart(
        self, i: int, *, extra_args: Sequence[str] = (), wait: bool = True, port: int | None = None
    ) -> str:
        """Start bookie ``i`` again on the same directories and port (stopping it first if
        it runs). With ``wait=False`` do not wait for the ready line (for a bookie that is
        expected to refuse to start; see :meth:`wait_exit`). Returns the address."""
        bookie = self.bookies[i]
        if bookie.alive():
            self.stop(i)
        if port is not None:
            bookie.port = port
        self._launch(bookie, extra_args)
        return self.wait_ready(i) if wait else bookie.address

    def start_new_bookie(self, extra_args: Sequence[str] = (), *, wait: bool = True) -> int:
        """Add a bookie with fresh directories; returns its index."""
        bookie = self._new_bookie(extra_args)
        self._launch(bookie)
        if wait:
            self.wait_ready(bookie.index)
        return bookie.index

    def stop_all(self) -> None:
        """Stop every bookie: SIGTERM, a bounded wait, then SIGKILL. Never raises."""
        running = [b for b in self.bookies if b.alive()]
        for bookie in running:
            assert bookie.process is not None
            try:
                if bookie.paused:
                    os.kill(bookie.process.pid, signal.SIGCONT)
                    bookie.paused = False
                os.kill(bookie.process.pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + self.stop_timeout_s
        for bookie in running:
            assert bookie.process is not None
            try:
                bookie.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.kill(bookie.process.pid, signal.SIGKILL)
                    bookie.process.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._reap(bookie)


def running_cluster(
    metadata_uri: str, base_dir: Path | str, num_bookies: int, **options: Any
) -> Iterator[LocalCluster]:
    """A started :class:`LocalCluster`, stopped when the generator is closed (for fixtures:
    ``yield from running_cluster(uri, tmp_path, 3)``)."""
    cluster = LocalCluster(metadata_uri, base_dir, num_bookies, **options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def embedded_metadata_uri(directory: Path | str) -> str:
    """The URI of the embedded (SQLite) metadata store kept in ``directory``."""
    return "sqlite://" + os.path.join(directory, "metadata.db")


@contextlib.contextmanager
def temporary_cluster(
    num_bookies: int,
    *,
    metadata_uri: str | None = None,
    prefix: str = "quorumlog-",
    **options: Any,
) -> Iterator[LocalCluster]:
    """A started :class:`LocalCluster` of ``num_bookies`` in a new temporary directory,
    on ``metadata_uri`` (default: an embedded store in that directory); on exit every
    bookie is stopped and the directory removed. ``options`` go to :class:`LocalCluster`
    (``journal_sync``, ``extra_args``, ``start_timeout_s``, ...)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        uri = metadata_uri or embedded_metadata_uri(tmp)
        # The context manager stops the bookies before the directory goes away.
        with LocalCluster(uri, tmp, num_bookies, **options) as cluster:
            yield cluster


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])
