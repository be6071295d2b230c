"""Helpers shared by the test directories: ``from support import run``.

tests/ has no ``__init__.py``: pytest imports tests/conftest.py with tests/ put on
``sys.path`` (its default "prepend" import mode), before any test module, so this
module imports by its bare name from every test directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from quorumlog.bookie.entry_log import EntryLogger, format_records
from quorumlog.bookie.fileops import FileOps
from quorumlog.core.quorum import write_set
from quorumlog.meta.ledger_metadata import LedgerMetadata
from quorumlog.proto.entry import DigestType, EntryCodec, master_key
from quorumlog.testing.raw_client import RawClient
from quorumlog.testing.sim import VirtualTimeLoop

if TYPE_CHECKING:
    import quorumlog

T = TypeVar("T")

# A LocalCluster entry point for bookies that need the command's additions (co-hosted
# autorecovery, --config): ``python -m quorumlog bookie`` instead of the server's own.
BOOKIE_COMMAND = ("-m", "quorumlog", "bookie")


def run(coro: Awaitable[T], timeout_s: float = 60) -> T:
    """``coro`` on a new event loop; TimeoutError after ``timeout_s``."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


def run_virtual(
    main: Callable[[asyncio.AbstractEventLoop], Awaitable[T]], timeout_s: float = 600
) -> T:
    """``main(loop)`` on a new simulator loop in virtual time (timeouts and sleeps take
    no real time); TimeoutError after ``timeout_s`` virtual seconds."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(asyncio.wait_for(main(loop), timeout=timeout_s))
    finally:
        loop.close()


def poll_until(
    condition: Callable[[], object], *, timeout_s: float, what: str, interval_s: float = 0.01
) -> None:
    """Wait until ``condition()`` is true, checking every ``interval_s``; AssertionError
    naming ``what`` if it is still false after ``timeout_s`` (a bound for the event to
    happen at all, never a latency target)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(interval_s)


async def poll_until_async(
    condition: Callable[[], object | Awaitable[object]],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.01,
) -> None:
    """:func:`poll_until` on the running loop; ``condition`` may be a coroutine function.
    Timed by the loop's clock, so under :func:`run_virtual` it takes no real time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(interval_s)


def holds_for(
    condition: Callable[[], object], *, duration_s: float, what: str, interval_s: float = 0.01
) -> None:
    """Check ``condition()`` throughout ``duration_s`` (a window the scenario lasts, such as
    a fault held in place); AssertionError naming ``what`` the moment it is false. Stronger
    than one check after a sleep: a state that flips and flips back is caught too."""
    deadline = time.monotonic() + duration_s
    while True:
        if not condition():
            raise AssertionError(f"{what}: no longer true")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval_s)


async def holds_for_async(
    condition: Callable[[], object], *, duration_s: float, what: str, interval_s: float = 0.01
) -> None:
    """:func:`holds_for` on the running loop (timed by the loop's clock)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration_s
    while True:
        if not condition():
            raise AssertionError(f"{what}: no longer true")
        if loop.time() >= deadline:
            return
        await asyncio.sleep(interval_s)


# The environment of a ``quorumlog`` child process: it imports this checkout wherever it
# runs, and takes its metadata URI from its flags, never from the caller's environment.
QUORUMLOG_ENV = {k: v for k, v in os.environ.items() if k != "QUORUMLOG_METADATA"}
QUORUMLOG_ENV["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])


def start_quorumlog(log_dir: Path, name: str, args: Sequence[str]) -> subprocess.Popen[bytes]:
    """``python -m quorumlog ARGS`` as a child process (a server: a database replica, an
    autorecovery daemon), its output in ``log_dir/NAME.out`` and ``log_dir/NAME.err``;
    stop it with :func:`stop_process`."""
    with open(log_dir / f"{name}.out", "wb") as out, open(log_dir / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "quorumlog", *args], stdout=out, stderr=err, env=QUORUMLOG_ENV
        )


def stop_process(process: subprocess.Popen[bytes], term_wait_s: float = 15) -> None:
    """SIGTERM by pid, SIGKILL if it has not exited within ``term_wait_s``; reaped."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(term_wait_s)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)


def port_for_a_child() -> int:
    """A TCP port of 127.0.0.1, free now, for a child process to listen on later.

    Drawn below the kernel's ephemeral range: the ports the kernel hands out itself
    (outgoing connections, binds to port 0) come from that range, so none of them can
    take this one before the child binds it; a port from ``bind(0)`` can be, on a machine
    where other tests open connections all the time."""
    low_ephemeral = 32_768
    with contextlib.suppress(OSError, ValueError):
        low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):  # bounded: nearly every port of the range is free
        port = rng.randrange(10_000, max(low_ephemeral, 10_001))
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port between 10000 and {low_ephemeral}")


def shell(
    metadata_uri: str | None, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """``quorumlog shell [--metadata URI] ARGS`` in a child process (QUORUMLOG_METADATA
    unset), its output captured as text."""
    command = [sys.executable, "-m", "quorumlog", "shell"]
    if metadata_uri:
        command += ["--metadata", metadata_uri]
    env = {k: v for k, v in os.environ.items() if k != "QUORUMLOG_METADATA"}
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout_s, env=env
    )


def holders(md: LedgerMetadata, entry_id: int) -> list[str]:
    """The bookies of ``entry_id``'s write set (R1)."""
    ensemble = md.ensemble_for(entry_id)
    return [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]


async def plant_copy(address: str, ledger_id: int, blob: bytes, password: bytes) -> int:
    """Store ``blob`` on the bookie at ``address`` through a recovery add (which overwrites
    a copy); the answer's status."""
    raw = await RawClient.connect(address)
    try:
        answer = await raw.add(ledger_id, master_key(password), [blob], recovery=True)
        return answer.status
    finally:
        await raw.close()


async def plant_forged_entry(address: str, ledger_id: int, entry_id: int, password: bytes) -> int:
    """Overwrite one copy of the entry with a blob whose storage checksum is fine and whose
    entry digest is not (a lying replica); the answer's status."""
    good = EntryCodec(DigestType.CRC32C, password).encode(ledger_id, entry_id, 0, 10, b"original")
    forged = good[:-8] + b"tampered"
    return await plant_copy(address, ledger_id, forged, password)


class DirectRecordingFiles(FileOps):
    """Real files; notes every write made through a direct (``O_DIRECT``) descriptor.
    With ``direct=False``, a filesystem without direct I/O (tmpfs refuses it so)."""

    def __init__(self, direct: bool = True) -> None:
        self.direct = direct
        self.direct_fds: set[int] = set()
        self.direct_writes: list[tuple[int, int]] = []  # offset, length

    def open_direct_write(self, path: Path) -> int:
        if not self.direct:
            raise OSError(errno.EINVAL, "Invalid argument (test: no O_DIRECT)", str(path))
        fd = super().open_direct_write(path)
        self.direct_fds.add(fd)
        return fd

    def pwrite(self, fd: int, data: memoryview, offset: int) -> int:
        if fd in self.direct_fds:
            self.direct_writes.append((offset, len(data)))
        return super().pwrite(fd, data, offset)


def append_blobs(
    logger: EntryLogger, sizes: Sequence[int], flush_every: int = 0
) -> list[tuple[int, int, bytes]]:
    """Append one record per size (blob ``n`` is byte ``n % 251`` repeated), each read
    back at once, from memory or its file; with ``flush_every``, the buffer is flushed
    after every that many records and at the end, as checkpoints do at any fill.
    Returns (log id, offset, blob) of each."""
    where = []
    for n, size in enumerate(sizes):
        blob = bytes([n % 251]) * size
        log_id, offset = logger.append(format_records([blob], [size]))
        assert logger.read(log_id, offset, size) == blob
        where.append((log_id, offset, blob))
        if flush_every and n % flush_every == flush_every - 1:
            logger.flush()
    if flush_every:
        logger.flush()
    return where


class CuttableLink:
    """A TCP forwarder from a local port to ``target`` that can be cut and healed.

    A cut is a partition: nothing crosses in either direction (bytes in flight are
    dropped), connections stay open but silent, new ones are accepted and hear nothing.
    A heal lets new connections through; the silent ones are reset, as the peers'
    timeouts would have ended them.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._silent: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self._silent, self._open = self._open, set()

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            silent, self._silent = self._silent, set()
        for sock in silent:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            doomed = self._open | self._silent
        for sock in doomed:
            _close(sock)
        _close(self._listener)
        self._accepting.join(5)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:  # accepted, then silence
                    self._silent.add(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                with self._lock:
                    if self._cut:
                        continue  # lost in the partition
                sink.sendall(chunk)
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def staging_left(bk: quorumlog.BookKeeper) -> list[str]:
    """The Spark sink's stagings still in the metadata store (none: every write's
    clean-up ran)."""
    from quorumlog.errors import BKError

    async def children() -> list[str]:
        try:
            return await bk.aio.store.children("/spark-staging")
        except BKError:
            return []

    return bk.run(children())
