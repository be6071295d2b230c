"""Client settings. Names carry their units."""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.client.connection import MAX_QUEUED_BYTES_DEFAULT
from quorumlog.proto.codec import (
    ADD_ENTRY_OVERHEAD_BYTES,
    ADD_FRAME_OVERHEAD_BYTES,
    MAX_FRAME_SIZE_BYTES_DEFAULT,
)
from quorumlog.proto.entry import ENTRY_HEADER_SIZE, DigestType
from quorumlog.security.tls import TlsFiles


def entry_size_limit(max_frame_size_bytes: int) -> int:
    """The largest payload that fits, with the largest digest, alone in one ADD frame of
    ``max_frame_size_bytes``: a larger frame makes the bookie close the connection (R12)."""
    largest_digest = max(digest.digest_size for digest in DigestType)
    overhead = ADD_FRAME_OVERHEAD_BYTES + ADD_ENTRY_OVERHEAD_BYTES + ENTRY_HEADER_SIZE
    return max_frame_size_bytes - overhead - largest_digest


MAX_ENTRY_SIZE_BYTES_DEFAULT = entry_size_limit(MAX_FRAME_SIZE_BYTES_DEFAULT)  # 8 MiB - 99


@dataclass(slots=True)
class ClientConfig:
    connect_timeout_ms: int = 3_000
    # An add unanswered this long counts as a bookie failure: the writer replaces the
    # bookie (R5) instead of waiting forever on a hung one.
    add_timeout_ms: int = 5_000
    read_timeout_ms: int = 5_000
    # A read unanswered this long is also sent to the next replica; first answer wins.
    speculative_read_timeout_ms: int = 300
    # After the LAC moves and no further add carries it within this delay, the writer
    # sends it to the ensemble as an explicit LAC so that tailing readers see the last
    # confirmed entry without waiting for the next add (R4).
    explicit_lac_delay_ms: float = 2.0
    # ... unless the writer is idle after a confirmation (no add outstanding or queued,
    # and no synchronous caller waiting on it, which would add again at once): then the
    # explicit LAC goes out on the next loop turn, so a reader tailing a slow writer
    # gets each entry about one round trip after its confirmation.
    explicit_lac_at_once_when_idle: bool = True
    # Bound on adds sent but not yet confirmed, per ledger handle (back-pressure).
    max_outstanding_adds: int = 20_000
    # Entries per ADD frame to one bookie (a batch also stops at add_batch_max_bytes).
    add_batch_max_entries: int = 2_000
    add_batch_max_bytes: int = 1 << 20
    # Sequential reads: entries asked in one READ request, and how many such requests
    # a read keeps in flight.
    read_batch_entries: int = 1_000
    read_batch_max_bytes: int = 1 << 20
    reads_in_flight: int = 4
    recovery_reads_in_flight: int = 16
    fence_timeout_ms: int = 5_000
    # Recovery writes each entry it found until Qa bookies acknowledged it.
    recovery_add_attempts: int = 3
    metadata_session_timeout_ms: int = 10_000
    max_frame_size_bytes: int = MAX_FRAME_SIZE_BYTES_DEFAULT
    # The largest entry payload: an add of more fails at once with InvalidArgumentError
    # (R16). Never more than one ADD frame of max_frame_size_bytes holds, which is the
    # bookies' limit too unless their operator changed it.
    max_entry_size_bytes: int = MAX_ENTRY_SIZE_BYTES_DEFAULT
    # Per bookie connection: bytes sent but not yet taken by the bookie (the client's
    # queue and the socket's write buffer). Past it, requests to that bookie fail at once
    # with TooManyRequestsError (a writer replaces the bookie) instead of queueing more:
    # a bookie that stopped reading must not grow the client's memory (R16).
    max_queued_bytes_per_connection: int = MAX_QUEUED_BYTES_DEFAULT
    # Sessions to the metadata store retry a compare-and-set this many times when a
    # concurrent change (not a state change) made it lose.
    metadata_cas_retries: int = 20
    # Security (docs/SECURITY.md). TLS to bookies: None plain TCP; TlsFiles() verifies
    # bookies against the system's CAs, ca_file against that CA, cert/key for mutual TLS.
    tls: TlsFiles | None = None
    # The token presented to bookies, read from this file (again when it changes); None:
    # from QUORUMLOG_TOKEN when set, else no token (bookies without auth need none).
    token_file: str | None = None
    # Where new ensembles and replacements go (core/placement.py): random, rack-aware
    # (each write set spans min_racks_per_write_quorum racks) or region-aware; enforced:
    # a choice that cannot meet it fails (NotEnoughBookiesError), else best effort.
    placement: str = "random"
    min_racks_per_write_quorum: int = 2
    enforce_placement: bool = False
