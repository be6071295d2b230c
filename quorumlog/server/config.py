"""Settings of the network side of a bookie. Names carry their units."""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.core.placement import DEFAULT_LOCATION
from quorumlog.proto.codec import MAX_FRAME_SIZE_BYTES_DEFAULT
from quorumlog.security.tls import TlsReloader
from quorumlog.security.tokens import TokenVerifier


@dataclass(slots=True)
class ServerConfig:
    """How a :class:`~quorumlog.server.BookieServer` listens, registers and collects garbage.

    The storage settings live in :class:`~quorumlog.bookie.config.BookieConfig`.
    """

    # A frame longer than this is hostile (R12): the connection is closed.
    max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT
    # Connections held at once; one more is closed at once (R16), the others go on.
    max_connections: int = 512
    # Bytes that the requests in flight of all connections hold together: each request its
    # frame, a read also its max_bytes (the largest answer it may get), until answered.
    # Each connection may hold an equal share (at least one maximum frame); over it, the
    # server stops reading that connection until its answers are out.
    max_in_flight_bytes: int = 256 * 1024 * 1024
    # Per connection: beyond either bound the server stops reading from the socket until
    # answers have been written (back-pressure instead of unbounded queues).
    max_in_flight_requests: int = 10_000
    max_queued_response_bytes: int = 16 * 1024 * 1024
    # Parked long polls of one connection; beyond it a poll is answered TOO_MANY_REQUESTS at
    # once. Polls count only here: they never stop the connection's reading.
    max_long_polls_per_connection: int = 1_000
    # Transport write buffer: above the high mark the peer is not reading its answers, so
    # the server stops reading its requests until the buffer drains below the low mark.
    write_buffer_high_bytes: int = 8 * 1024 * 1024
    write_buffer_low_bytes: int = 2 * 1024 * 1024
    # Garbage collection: how often ledgers deleted from the metadata are dropped.
    gc_interval_ms: int = 60_000
    # Metadata reads per second of a GC round's walk of the ledger layout (BP-66), a
    # listing counting one read per 100 names: a million ledgers take about 100 s, their
    # absence reads come on top. Every bookie walks every round, so the pace is kept low:
    # at 1000, back-to-back walks of 1M ledgers held ZooKeeper writers' p99 at 2.35x.
    gc_metadata_reads_per_s: float | None = 100.0
    # Metadata session: ephemeral registrations vanish this long after the process dies.
    metadata_session_timeout_ms: int = 10_000
    metadata_connect_timeout_ms: int = 30_000
    # A registration left by a previous run of this bookie (killed before its session
    # ended) is replaced; registry operations are retried for at most this long.
    registration_timeout_ms: int = 30_000
    # How often the read-only state is compared with the registration (the bookie's
    # listener, when it has one, makes this only a safety net).
    read_only_poll_interval_ms: int = 1_000
    # Graceful stop: how long in-flight requests get to be answered.
    stop_timeout_ms: int = 10_000
    listen_backlog: int = 1024
    # The HTTP admin API and /metrics on 127.0.0.1 (0: a free port); None: not served.
    http_port: int | None = None
    # The bookie's place, /REGION/RACK, recorded in its registration for the clients'
    # placement policies (core/placement.py).
    location: str = DEFAULT_LOCATION
    # Security (docs/SECURITY.md). TLS on the bookie port (and HTTPS on the admin API):
    # None serves plain TCP. A token verifier: None lets every connection in (the local
    # cluster's zero set-up); with one, only connections that present a valid token.
    tls: TlsReloader | None = None
    token_verifier: TokenVerifier | None = None
    # With a token verifier: a connection that has presented no valid token this long
    # after it was made is closed, so that peers without one cannot hold the
    # max_connections slots (and the memory of a frame each) against the clients.
    auth_timeout_ms: int = 10_000
    # With TLS: a TLS handshake not done this long after the connection was accepted is
    # given up, and its connection slot given back (asyncio tells the connection nothing
    # of a handshake that fails or times out, so the server counts the time itself).
    tls_handshake_timeout_ms: int = 10_000
