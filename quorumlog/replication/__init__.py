"""BookKeeper's replication module: checking that every replica of a ledger is there,
and copying a lost bookie's entries to other bookies.

- :func:`audit_ledger` reads every copy of a ledger's entries from its bookies and
  reports what is missing or damaged (:class:`LedgerAudit`); it never fences.
- :func:`recover_bookie` and :func:`replicate_ledger` re-replicate what a lost
  bookie held (BookKeeper's ``bookkeeper shell recover``) and report it
  (:class:`RecoveryReport`, :class:`LedgerReplication`).

The modules, one job each: ``audit`` (the replica check), ``plan`` (which entries
a bookie holds, from the metadata), ``copy`` (reading intact copies and writing
them to a replacement), ``metadata`` (the compare-and-set of the new ensemble),
``rereplicate`` (a run over ledgers and fragments) and ``report`` (results and
their text). The names exported here are the package's API; the modules are its
parts. A bookie that fails or does not answer is part of a result, never an
exception, so that one audit or run always ends with a report.
"""

from quorumlog.replication.audit import (
    ENTRIES_PER_READ_DEFAULT,
    READS_IN_FLIGHT_DEFAULT,
    audit_ledger,
)
from quorumlog.replication.copy import (
    CHUNK_BYTES_DEFAULT,
    COPIES_IN_FLIGHT_DEFAULT,
    ENTRIES_PER_CHUNK_DEFAULT,
    RereplicationError,
)
from quorumlog.replication.report import (
    REPORT_LIST_LIMIT,
    FragmentReplication,
    FragmentStatus,
    LedgerAudit,
    LedgerOutcome,
    LedgerReplication,
    RecoveryReport,
)
from quorumlog.replication.rereplicate import (
    LEDGERS_IN_FLIGHT_DEFAULT,
    REPLACEMENT_ATTEMPTS_DEFAULT,
    recover_bookie,
    replicate_ledger,
)

__all__ = [
    "CHUNK_BYTES_DEFAULT",
    "COPIES_IN_FLIGHT_DEFAULT",
    "ENTRIES_PER_CHUNK_DEFAULT",
    "ENTRIES_PER_READ_DEFAULT",
    "LEDGERS_IN_FLIGHT_DEFAULT",
    "READS_IN_FLIGHT_DEFAULT",
    "REPLACEMENT_ATTEMPTS_DEFAULT",
    "REPORT_LIST_LIMIT",
    "FragmentReplication",
    "FragmentStatus",
    "LedgerAudit",
    "LedgerOutcome",
    "LedgerReplication",
    "RecoveryReport",
    "RereplicationError",
    "audit_ledger",
    "recover_bookie",
    "replicate_ledger",
]
