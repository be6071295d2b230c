"""Settings of a log stream's ledgers, writers and readers. Names carry their units."""

from __future__ import annotations

from dataclasses import dataclass

from quorumlog.core.quorum import check_quorum_shape
from quorumlog.errors import InvalidArgumentError
from quorumlog.proto.entry import DigestType


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How a client writes and reads one log.

    Every ledger a writer creates uses ``ensemble`` / ``write_quorum`` / ``ack_quorum``,
    ``digest_type`` and ``password``; readers need the same password. A writer starts
    a new ledger once the current one holds ``rollover_size_bytes`` of payloads (the
    record headers of record_format.py not counted) or is
    ``rollover_age_ms`` old (0 turns a limit off); the check runs on each append.
    """

    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    digest_type: DigestType = DigestType.CRC32C
    password: bytes = b""
    rollover_size_bytes: int = 256 << 20
    rollover_age_ms: int = 0
    # A rollover that could not create its ledger (no bookies) is tried again after this.
    rollover_retry_ms: int = 1_000
    # Readers: entries asked per read, and the longest one long poll waits before the
    # reader looks at the ledger list and the ledger's state again.
    read_batch_entries: int = 256
    long_poll_ms: int = 1_000
    # Compare-and-set attempts on the ledger list when only truncations got in the way.
    list_cas_retries: int = 20
    # A truncation whose cut follows a ledger still open (a rollover under way: the new
    # ledger listed, the old one not yet closed) waits this long for it to close, to
    # learn where its records end (``removed_end``); 0 does not wait.
    truncate_close_wait_ms: int = 5_000

    def __post_init__(self) -> None:
        check_quorum_shape(self.ensemble, self.write_quorum, self.ack_quorum)
        for name in ("rollover_size_bytes", "rollover_age_ms", "truncate_close_wait_ms"):
            if getattr(self, name) < 0:
                raise InvalidArgumentError(f"LogConfig.{name} must be >= 0")
        for name in ("read_batch_entries", "long_poll_ms", "list_cas_retries", "rollover_retry_ms"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"LogConfig.{name} must be >= 1")
