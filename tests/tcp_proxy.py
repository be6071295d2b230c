"""A TCP proxy for tests of ZooKeeper clients: connections cut, or accepted and left silent."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable


class CuttableProxy:
    """A TCP proxy to ZooKeeper on 127.0.0.1 whose connections can be cut.

    While cut, it drops every open connection and closes new ones at once, which a
    kazoo client sees as a lost connection (SUSPENDED) with its session still alive
    on the server until the session timeout.
    """

    LIFETIME_S = 120.0  # every loop of the proxy ends after this, whatever happens

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._silent_next = threading.Event()
        self._guard = threading.Lock()
        self._open: list[socket.socket] = []
        self._every: list[socket.socket] = []  # closed by stop(): cut() only shuts them down
        self._threads: list[threading.Thread] = []
        self._deadline = time.monotonic() + self.LIFETIME_S
        self._start(self._accept_loop)

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline

    def _accept_loop(self) -> None:
        while self._running():
            try:
                downstream, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut.is_set():
                downstream.close()
                continue
            if self._silent_next.is_set():
                self._silent_next.clear()
                with self._guard:  # held open, never answered, until stop()
                    self._every.append(downstream)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
            except OSError:
                downstream.close()
                continue
            with self._guard:
                self._open += [downstream, upstream]
                self._every += [downstream, upstream]
            self._start(self._pump, downstream, upstream)
            self._start(self._pump, upstream, downstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.1)
        while self._running():
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut.set()
        with self._guard:
            dropped, self._open = self._open, []
        for sock in dropped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def restore(self, *, first_silent: bool = False) -> None:
        """Forward new connections again; with ``first_silent``, the first one is accepted
        and then never answered, as a ZooKeeper server starting up may do (ZOOKEEPER-5051)."""
        if first_silent:
            self._silent_next.set()
        self._cut.clear()

    def stop(self) -> None:
        self._stop.set()
        self.cut()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()
        for sock in self._every:
            sock.close()
