"""History checkers: the rules a run must keep, judged from what the clients were told.

Apart from the system on purpose: nothing here calls quorumlog's client or bookie.
A workload records a history (what was written, what was confirmed and when, what
every reader read, what each recovery closed at, what the checker's own final
recovery read); :func:`check_ledger_history` and :func:`check_log_history` turn it
into :class:`Violation`\\ s, each named after the rule it breaks, so a test can say
which rule a run broke and a person can read why.

The rules, by the names violations carry, are :data:`RULES`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from quorumlog.log.checker import check_observations
from quorumlog.log.position import Position

__all__ = [
    "RULES",
    "LedgerHistory",
    "LogHistory",
    "RunHistory",
    "Violation",
    "check_ledger_history",
    "check_log_history",
    "check_run",
]

# Each rule's name, as violations carry it, and what it demands.
RULES: dict[str, str] = {
    "R3-order": "confirmations come in entry-id order, without gaps (but at adds whose "
    "owner gave up waiting: a cancelled future hears nothing)",
    "R1-shape": "a ledger of a shape other than E >= Qw >= Qa >= 1 is never created",
    "R10-password": "a bookie holding a ledger's key refuses an add or fence with another",
    "R9-absence": "a bookie never answers 'no such entry' (or ledger) for an entry it "
    "acknowledged: damage is an I/O error, never absence (R9, R17)",
    "R4-tail": "a tailing reader reads only at or below a LAC it learnt, and nothing past "
    "the recovered end",
    "R4-lac": "a LAC learnt from an open ledger's bookies was confirmed to the writer "
    "before (or was an add its owner gave up on)",
    "single-value": "never two values at one (ledger, entry), across every read",
    "R7-fencing": "nothing confirmed after a recovery's close lies past its last entry",
    "R8-durability": "every confirmed entry is at or below the recovered last entry and "
    "reads back with its bytes",
    "R8-agreement": "every close of a ledger agrees on its last entry",
    "R8-final": "the checker's own recovery and reads at the end succeed",
    "R8-past-end": "nothing past the recovered last entry is readable",
    "R3-replicas": "every confirmed entry is stored on at least Qa bookies of its write "
    "set as the final metadata records it (read from the bookies' storage)",
    "R11-log": "every record confirmed to a log writer is in the final log once, in order, "
    "after every record confirmed before it was appended; a tailing reader saw a prefix",
    "bookie-restart": "a bookie whose disk lost no synced byte starts again after a crash",
    "core-invariant": "a core/ state machine keeps its own invariants at the end of each "
    "step (quorumlog.core.invariants)",
    "system-error": "the system never raises where it must not (an assertion, a crash)",
    "liveness": "the run finishes within its virtual-time budget",
}


@dataclass(frozen=True)
class Violation:
    """One broken rule, in words."""

    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass
class LedgerHistory:
    """What happened to one ledger, as its clients saw it."""

    ledger_id: int
    shape: tuple[int, int, int]  # ensemble, write quorum, ack quorum
    written: dict[int, bytes] = field(default_factory=dict)  # entry id -> bytes sent
    # (entry id, virtual time, order) of each confirmation, in the order it was told
    confirmed: list[tuple[int, float, int]] = field(default_factory=list)
    # (who, last entry id, virtual time, order) of each close that succeeded
    closes: list[tuple[str, int, float, int]] = field(default_factory=list)
    # (reader, entry id, bytes, the LAC it had learnt, or None when it may read to the end)
    reads: list[tuple[str, int, bytes, int | None]] = field(default_factory=list)
    final_last: int | None = None
    final_entries: dict[int, bytes] = field(default_factory=dict)
    final_error: str = ""
    read_past_end: bool = False
    # confirmed entry id -> bookies of its write set holding it (bookies' storage, at the end)
    replicas: dict[int, int] = field(default_factory=dict)
    # entries whose owner gave up waiting (a cancelled future): their outcome is unknown
    cancelled: set[int] = field(default_factory=set)
    # (reader, LAC, order) of each LAC a reader learnt from the bookies, the ledger open
    lacs: list[tuple[str, int, int]] = field(default_factory=list)


@dataclass
class LogHistory:
    """What happened to one log stream, as its writers and readers saw it."""

    name: str
    confirmed: dict[str, list[tuple[Position, bytes]]] = field(default_factory=dict)
    tailed: list[tuple[Position, bytes]] = field(default_factory=list)
    # record -> order (the run's event sequence) when it was appended / confirmed
    sent: dict[bytes, int] = field(default_factory=dict)
    confirmed_at: dict[bytes, int] = field(default_factory=dict)
    final: list[tuple[Position, bytes]] | None = None
    replicas: dict[Position, tuple[int, int]] = field(default_factory=dict)  # (copies, Qa)
    final_error: str = ""


@dataclass
class RunHistory:
    """One seeded run: its ledgers and logs, and what went wrong outside them."""

    seed: int
    workload: str = ""
    ledgers: list[LedgerHistory] = field(default_factory=list)
    logs: list[LogHistory] = field(default_factory=list)
    system_errors: list[str] = field(default_factory=list)
    refused_starts: list[str] = field(default_factory=list)  # nodes with sound disks
    # (rule, what) seen as it happened: what the system accepted that a rule says it
    # refuses (R1 shapes, R10 keys), an absence a bookie answered for what it
    # acknowledged (R9, R17)
    wrongly_accepted: list[tuple[str, str]] = field(default_factory=list)
    unfinished: str = ""
    virtual_s: float = 0.0  # how long the run took in virtual time
    faults: dict[str, int] = field(default_factory=dict)  # what the nemesis did, counted
    trace: list[str] = field(default_factory=list)


def _first(values: Iterable[Violation], limit: int) -> list[Violation]:
    out = []
    for v in values:
        out.append(v)
        if len(out) >= limit:
            break
    return out


def check_ledger_history(h: LedgerHistory, limit: int = 10) -> list[Violation]:
    """The rules of one ledger (module docstring); at most ``limit`` violations."""
    confirmed_ids = [entry_id for entry_id, _, _ in h.confirmed]
    out = _order_violations(h, confirmed_ids)
    out += _lac_violations(h)
    out += _single_value_violations(h)
    out += _close_violations(h)
    if h.final_error:
        out.append(
            Violation(
                "R8-final",
                f"ledger {h.ledger_id}: the final recovery or read failed: {h.final_error}",
            )
        )
        return _first(out, limit)
    if h.final_last is None:
        return _first(out, limit)
    out += _durability_violations(h, confirmed_ids, h.final_last)
    out += _replica_violations(h)
    if h.read_past_end:
        out.append(
            Violation("R8-past-end", f"ledger {h.ledger_id}: entry {h.final_last + 1} was readable")
        )
    out += _tail_violations(h, h.final_last)
    return _first(out, limit)


def _order_violations(h: LedgerHistory, confirmed_ids: list[int]) -> list[Violation]:
    """R3-order: confirmations came in entry-id order, without gaps but at entries
    whose owner gave up waiting (a cancelled future hears nothing)."""
    if confirmed_ids == list(range(len(confirmed_ids))):
        return []
    if (
        h.cancelled
        and all(a < b for a, b in itertools.pairwise(confirmed_ids))
        and set(range(confirmed_ids[-1] + 1)) - set(confirmed_ids) <= h.cancelled
    ):
        return []
    return [
        Violation(
            "R3-order",
            f"ledger {h.ledger_id}: confirmations out of order: {confirmed_ids[:20]}",
        )
    ]


def _lac_violations(h: LedgerHistory) -> list[Violation]:
    """R4-lac: the writer piggybacks only what it confirmed, so a LAC learnt from the
    bookies of an open ledger was confirmed to the writer before the reader learnt it
    (every entry above the writer's last confirmation then being one whose owner gave
    up waiting: its confirmation, if any, was not told)."""
    if not h.lacs:
        return []
    confirmations = sorted((order, entry_id) for entry_id, _, order in h.confirmed)
    for reader, lac, order in h.lacs:
        known = -1
        for confirmed_order, entry_id in confirmations:
            if confirmed_order > order:
                break
            known = max(known, entry_id)
        if all(e in h.cancelled for e in range(known + 1, lac + 1)):
            continue
        return [
            Violation(
                "R4-lac",
                f"ledger {h.ledger_id}: {reader} learnt LAC {lac} from the bookies when the "
                f"writer had confirmed up to {known}",
            )
        ]
    return []


def _single_value_violations(h: LedgerHistory) -> list[Violation]:
    """Never two values at one entry: every read agrees with what was written."""
    for reader, entry_id, data, _ in h.reads:
        sent = h.written.get(entry_id)
        if data != sent:
            return [
                Violation(
                    "single-value",
                    f"ledger {h.ledger_id} entry {entry_id}: {reader} read {data[:40]!r}, "
                    f"written {(sent or b'(nothing)')[:40]!r}",
                )
            ]
    return []


def _close_violations(h: LedgerHistory) -> list[Violation]:
    """Closes agree (R8-agreement); nothing confirmed lies beyond a close (R7-fencing)."""
    out: list[Violation] = []
    lid = h.ledger_id
    lasts = {last for _, last, _, _ in h.closes}
    if h.final_last is not None:
        lasts.add(h.final_last)
    if len(lasts) > 1:
        out.append(
            Violation(
                "R8-agreement",
                f"ledger {lid}: closed at different last entries: "
                + ", ".join(f"{who} at {last}" for who, last, _, _ in h.closes)
                + (f", the final recovery at {h.final_last}" if h.final_last is not None else ""),
            )
        )
    for who, last, _, close_order in h.closes:
        late = [(e, t) for e, t, order in h.confirmed if e > last and order > close_order]
        if late:
            entry_id, at = late[0]
            out.append(
                Violation(
                    "R7-fencing",
                    f"ledger {lid}: entry {entry_id} was confirmed to the writer at "
                    f"{at * 1000:.3f} ms, after {who} closed the ledger at entry {last}",
                )
            )
            break
    return out


def _durability_violations(
    h: LedgerHistory, confirmed_ids: list[int], final_last: int
) -> list[Violation]:
    """R8-durability: every confirmed entry is in the recovered ledger with its bytes."""
    out: list[Violation] = []
    lid = h.ledger_id
    if confirmed_ids and max(confirmed_ids) > final_last:
        out.append(
            Violation(
                "R8-durability",
                f"ledger {lid}: entry {max(confirmed_ids)} was confirmed but the ledger "
                f"closed at {final_last}",
            )
        )
    for entry_id in range(final_last + 1):
        got = h.final_entries.get(entry_id)
        sent = h.written.get(entry_id)
        if got != sent:
            out.append(
                Violation(
                    "R8-durability",
                    f"ledger {lid} entry {entry_id} reads {(got or b'(nothing)')[:40]!r}, "
                    f"written {(sent or b'(nothing)')[:40]!r}",
                )
            )
            break
    return out


def _replica_violations(h: LedgerHistory) -> list[Violation]:
    """R3-replicas: every confirmed entry is on at least Qa bookies of its write set."""
    ack_quorum = h.shape[2]
    for entry_id, copies in sorted(h.replicas.items()):
        if copies < ack_quorum:
            return [
                Violation(
                    "R3-replicas",
                    f"ledger {h.ledger_id} entry {entry_id} was confirmed but only {copies} "
                    f"bookies of its write set hold it (ack quorum {ack_quorum})",
                )
            ]
    return []


def _tail_violations(h: LedgerHistory, final_last: int) -> list[Violation]:
    """R4-tail: readers read only up to a LAC they learnt, and nothing past the end."""
    for reader, entry_id, _, lac in h.reads:
        if (lac is not None and entry_id > lac) or entry_id > final_last:
            return [
                Violation(
                    "R4-tail",
                    f"ledger {h.ledger_id}: {reader} read entry {entry_id} with LAC {lac}, "
                    f"and the ledger ends at {final_last}",
                )
            ]
    return []


def check_log_history(h: LogHistory, limit: int = 10) -> list[Violation]:
    """R11 for one log stream: confirmed records in the final log once, in order."""
    if h.final is None:
        if not h.final_error:
            return []  # the run ended before it (a liveness violation says so)
        return [Violation("R8-final", f"log {h.name}: the final read failed: {h.final_error}")]
    out: list[Violation] = []
    report = check_observations(
        h.final, prefixes={"tailing reader": h.tailed}, subsets=h.confirmed, max_problems=limit
    )
    out += [Violation("R11-log", f"log {h.name}: {p}") for p in report.problems]
    counts: dict[bytes, int] = {}
    for _, data in h.final:
        counts[data] = counts.get(data, 0) + 1
    out += _real_time_order(h)
    for position, (copies, ack_quorum) in sorted(h.replicas.items()):
        if copies < ack_quorum:
            out.append(
                Violation(
                    "R3-replicas",
                    f"log {h.name}: record at {position} was confirmed but only {copies} "
                    f"bookies of its write set hold it (ack quorum {ack_quorum})",
                )
            )
            break
    for writer, records in h.confirmed.items():
        for position, data in records:
            if counts.get(data, 0) != 1:
                out.append(
                    Violation(
                        "R11-log",
                        f"log {h.name}: record {data[:40]!r} confirmed to {writer} at "
                        f"{position} is in the final log {counts.get(data, 0)} times",
                    )
                )
                break
    return _first(out, limit)


def _real_time_order(h: LogHistory) -> list[Violation]:
    """A record confirmed before another was appended comes first in the log: the log is
    one sequence for all its writers, not one per writer (two writers that both think
    they own the log break this)."""
    assert h.final is not None
    where = {data: position for position, data in h.final}
    confirmed = sorted((order, data) for data, order in h.confirmed_at.items() if data in where)
    appended = sorted((order, data) for data, order in h.sent.items() if data in where)
    latest: tuple[Position, bytes] | None = None
    i = 0
    for order, data in appended:
        while i < len(confirmed) and confirmed[i][0] < order:
            candidate = (where[confirmed[i][1]], confirmed[i][1])
            if latest is None or candidate[0] > latest[0]:
                latest = candidate
            i += 1
        if latest is not None and where[data] < latest[0]:
            return [
                Violation(
                    "R11-log",
                    f"log {h.name}: record {data[:40]!r} at {where[data]} was appended after "
                    f"{latest[1][:40]!r} at {latest[0]} was confirmed, yet comes before it",
                )
            ]
    return []


def check_run(run: RunHistory) -> list[Violation]:
    """Every rule over one run."""
    out: list[Violation] = []
    if run.unfinished:
        out.append(Violation("liveness", run.unfinished))
    for error in run.system_errors[:5]:
        # The core's own checks at the end of each step (quorumlog.core.invariants)
        # name a broken protocol invariant, not merely an exception.
        rule = "core-invariant" if "CoreInvariantError" in error else "system-error"
        out.append(Violation(rule, error))
    out += [Violation("bookie-restart", e) for e in run.refused_starts]
    out += [Violation(rule, what) for rule, what in run.wrongly_accepted[:5]]
    for ledger in run.ledgers:
        out += check_ledger_history(ledger)
    for log in run.logs:
        out += check_log_history(log)
    return out
