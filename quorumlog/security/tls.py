"""TLS contexts built from certificate files, swapped for new connections when they change.

A bookie serves TLS with ``--tls-cert`` and ``--tls-key``; with ``--tls-ca`` it also
asks every client for a certificate signed by that CA (mutual TLS). A client verifies
the bookie's certificate against its CA file (else the system's) and checks that it
names the address it dialled (an IP address SAN for ``IP:PORT`` bookie ids).

Certificates are replaced without a restart: :class:`TlsReloader` looks at the files'
modification times at most once per ``check_interval_s`` and builds a new context when
one changed. Connections already open keep the context they started with; new ones get
the new one. A server hands asyncio one fixed *front* context whose SNI callback (run
during every handshake, whether or not the client sent a name) swaps in the current one.
Files caught half-written fail to load: the previous context stays and the next check
tries again.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

CHECK_INTERVAL_S_DEFAULT = 1.0


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the PEM files are. A server needs ``cert_file`` and ``key_file``; a client
    needs neither unless the server asks for its certificate (mutual TLS). ``ca_file``:
    on a server, the CA that client certificates must chain to (mutual TLS on); on a
    client, the CA of bookie certificates (default: the system's)."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TLS: give both the certificate and its key file, or neither")

    def paths(self) -> list[str]:
        return [p for p in (self.cert_file, self.key_file, self.ca_file) if p is not None]


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context from ``files``; ValueError naming the file that does not load."""
    if files.cert_file is None or files.key_file is None:
        raise ValueError("TLS on a server needs a certificate and a key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, files.cert_file, files.key_file)
    if files.ca_file is not None:
        _load_ca(context, files.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED  # mutual TLS
    return context


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A client context from ``files``; ValueError naming the file that does not load."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies and checks the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.ca_file is not None:
        _load_ca(context, files.ca_file)
    else:
        context.load_default_certs()
    if files.cert_file is not None and files.key_file is not None:
        _load_chain(context, files.cert_file, files.key_file)
    return context


def _load_chain(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    for path in (cert_file, key_file):
        if not os.path.exists(path):
            raise ValueError(f"TLS: {path}: no such file")
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        # The reason names the defect (no PEM, key does not match); never key bytes.
        raise ValueError(
            f"TLS: certificate {cert_file} with key {key_file} does not load: "
            f"{getattr(exc, 'reason', None) or exc.strerror or type(exc).__name__}"
        ) from None


def _load_ca(context: ssl.SSLContext, ca_file: str) -> None:
    try:
        context.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise ValueError(f"TLS: {ca_file}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"TLS: CA file {ca_file} does not load: {exc}") from None


class TlsReloader:
    """The current context for ``files``, rebuilt when one of them changes."""

    def __init__(
        self,
        files: TlsFiles,
        *,
        server_side: bool,
        check_interval_s: float = CHECK_INTERVAL_S_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Builds the first context now: a file that does not load is a ValueError."""
        self.files = files
        self.server_side = server_side
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._build = server_context if server_side else client_context
        self._stamps = self._mtimes()
        self._context = self._build(files)
        self._checked_at = clock()
        # The files' times when they last failed to load: a file left half-written is
        # logged once, not at every check (once a second while connections come).
        self._failed_stamps: tuple[int, ...] | None = None
        self.reloads = 0  # contexts built after the first (tests, metrics)

    def _mtimes(self) -> tuple[int, ...]:
        stamps = []
        for path in self.files.paths():
            try:
                stamps.append(os.stat(path).st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection (a stat of each file at most once an interval)."""
        now = self._clock()
        if now - self._checked_at >= self.check_interval_s:
            self._checked_at = now
            self.reload_if_changed()
        return self._context

    def reload_if_changed(self) -> bool:
        """Rebuild now if a file's modification time moved; True if a new context is in use."""
        stamps = self._mtimes()
        if stamps == self._stamps:
            return False
        try:
            context = self._build(self.files)
        except ValueError as exc:
            # Likely caught between the writes of a certificate and its key: keep serving
            # with the previous context; the next check tries again (a file system with
            # coarse times may finish the write without moving them), quietly.
            if stamps != self._failed_stamps:
                self._failed_stamps = stamps
                log.warning(
                    "TLS files changed but do not load (keeping the previous ones; logged "
                    "again when they change): %s",
                    exc,
                )
            return False
        self._failed_stamps = None
        self._stamps = stamps
        self._context = context
        self.reloads += 1
        log.info("TLS: loaded new certificates from %s", ", ".join(self.files.paths()))
        return True

    def server_front_context(self) -> ssl.SSLContext:
        """The fixed context to give a listener: each handshake is switched to
        :meth:`current` (the SNI callback runs for every ClientHello)."""
        if not self.server_side:
            raise ValueError("a front context is for servers")
        front = server_context(self.files)

        def switch(ssl_object: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
            ssl_object.context = self.current()

        front.sni_callback = switch
        return front
