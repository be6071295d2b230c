"""Which entries a Spark read covers, and how it splits into partitions.

Pure arithmetic over :class:`LedgerExtent` snapshots (gathered by
:mod:`quorumlog.spark.scan`), so it is tested without a cluster.

A *bound* is the position of the next record to read: a read covers every
readable record at or after its start bound and before its end bound. The
readable part of a log is its ledgers in list order, each from its first kept
entry (the truncation point may cut into the first ledger) up to its last
confirmed entry, and it stops after the first ledger that is still open: a
ledger after an open one exists only while a writer rolls over or after a
writer died before anyone recovered its ledger, and the open ledger may still
grow, so nothing after it can be given a place in the log yet (R4, R11).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quorumlog.errors import InvalidArgumentError
from quorumlog.log.position import Position


@dataclass(frozen=True, slots=True)
class LedgerExtent:
    """What can be read of one ledger now: entries ``first..last`` (last -1: none)."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    closed: bool
    length: int = -1  # a closed ledger's payload bytes, all entries (-1: not known)


@dataclass(frozen=True, slots=True)
class EntryRange:
    """Entries ``first..last`` (inclusive) of one ledger: one Spark partition's work."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1


def readable(extents: Sequence[LedgerExtent]) -> list[LedgerExtent]:
    """The extents that have a place in the log now: up to and including the first open one."""
    out: list[LedgerExtent] = []
    for extent in extents:
        out.append(extent)
        if not extent.closed:
            break
    return out


def earliest(extents: Sequence[LedgerExtent]) -> Position:
    """The bound before the first readable record."""
    if not extents:
        return Position(0, 0)
    first = extents[0]
    return Position(first.ledger_id, first.first_entry_id)


def latest(extents: Sequence[LedgerExtent]) -> Position:
    """The bound after the last readable record."""
    kept = readable(extents)
    if not kept:
        return Position(0, 0)
    last = kept[-1]
    return Position(last.ledger_id, max(last.first_entry_id, last.last_entry_id + 1))


def ranges_between(
    extents: Sequence[LedgerExtent], start: Position, end: Position
) -> list[tuple[LedgerExtent, int, int]]:
    """``(extent, first, last)`` for each ledger with readable records in ``[start, end)``."""
    out: list[tuple[LedgerExtent, int, int]] = []
    for extent in readable(extents):
        ledger_id = extent.ledger_id
        if ledger_id < start.ledger_id:
            continue
        if ledger_id > end.ledger_id:
            break
        low = extent.first_entry_id
        if ledger_id == start.ledger_id:
            low = max(low, start.entry_id)
        high = extent.last_entry_id
        if ledger_id == end.ledger_id:
            high = min(high, end.entry_id - 1)
        if low <= high:
            out.append((extent, low, high))
    return out


def count_between(extents: Sequence[LedgerExtent], start: Position, end: Position) -> int:
    """How many readable records lie in ``[start, end)``."""
    return sum(high - low + 1 for _, low, high in ranges_between(extents, start, end))


def split(
    extents: Sequence[LedgerExtent], start: Position, end: Position, entries_per_partition: int
) -> list[EntryRange]:
    """The records of ``[start, end)`` as ranges of at most ``entries_per_partition``
    entries, in log order (executors then read them side by side)."""
    if entries_per_partition < 1:
        raise InvalidArgumentError(f"entries per partition must be >= 1: {entries_per_partition}")
    out: list[EntryRange] = []
    for extent, low, high in ranges_between(extents, start, end):
        for first in range(low, high + 1, entries_per_partition):
            last = min(high, first + entries_per_partition - 1)
            out.append(EntryRange(extent.ledger_id, first, last))
    return out


def split_planned(
    extents: Sequence[LedgerExtent], start: Position, end: Position, entries_per_partition: int
) -> list[EntryRange]:
    """The records of a micro-batch ``[start, end)`` whose ``end`` an earlier snapshot
    saw confirmed, cut into ranges as :func:`split` does, from ``extents`` taken now.

    The end ledger is read up to ``end`` whatever LAC the new snapshot learnt: a LAC
    read takes the largest answer of a covering set of bookies, and another set may
    answer lower (a writer died before its last LAC reached every bookie), yet what
    any reader saw confirmed is on Qa bookies for good (R4). Cutting at the lower LAC
    would skip records for good, since the next batch starts at ``end``. Every ledger
    before the end ledger was closed when ``end`` was planned (nothing after an open
    ledger is readable), so its extent now is its final one; one that is open means
    the offsets were not planned on this log, an error rather than a silent cut.
    """
    if entries_per_partition < 1:
        raise InvalidArgumentError(f"entries per partition must be >= 1: {entries_per_partition}")
    out: list[EntryRange] = []
    for extent in extents:
        ledger_id = extent.ledger_id
        if ledger_id < start.ledger_id:
            continue
        if ledger_id > end.ledger_id:
            break
        low = extent.first_entry_id
        if ledger_id == start.ledger_id:
            low = max(low, start.entry_id)
        if ledger_id == end.ledger_id:
            high = end.entry_id - 1
            if extent.closed and high > extent.last_entry_id:
                raise InvalidArgumentError(
                    f"ledger {ledger_id} is closed at entry {extent.last_entry_id}, but the "
                    f"batch [{start}, {end}) was planned up to entry {high}: its offsets "
                    "were not planned on this log"
                )
        elif extent.closed:
            high = extent.last_entry_id
        else:
            raise InvalidArgumentError(
                f"ledger {ledger_id} is still open, but the batch [{start}, {end}) was "
                "planned past it: its offsets were not planned on this log"
            )
        for first in range(low, high + 1, entries_per_partition):
            out.append(EntryRange(ledger_id, first, min(high, first + entries_per_partition - 1)))
    return out


def advance(extents: Sequence[LedgerExtent], start: Position, max_records: int | None) -> Position:
    """The end bound of a micro-batch from ``start``: everything readable, or only the
    next ``max_records`` records. Never moves backwards."""
    top = latest(extents)
    if top < start:
        return start
    if max_records is None:
        return top
    remaining = max_records
    for extent, low, high in ranges_between(extents, start, top):
        available = high - low + 1
        if available >= remaining:
            return Position(extent.ledger_id, low + remaining)
        remaining -= available
    return top


def search_by_time(
    extents: Sequence[LedgerExtent], timestamp_ms: int
) -> Generator[Position, int, Position]:
    """The bound before the first readable record whose append time is at least
    ``timestamp_ms`` (Kafka's offsetsForTimes), or :func:`latest` when there is none.

    A generator, so that the search stays pure: it yields the position of each record
    whose append time it needs and is sent that time back; it returns the bound.
    A binary search over the ledgers (by their last record's time), then over the
    entries of the ledger found: about log2(ledgers) + log2(entries) record headers
    read. Exact when the times are in order along the log, which holds while one
    writer writes (it never stamps a record earlier than the one before). A later
    writer whose clock is behind may stamp records earlier than those before them:
    the bound found is then still at a record at or after the time, with every record
    the search probed before it earlier, but an earlier-stamped record may follow it
    (Kafka's time index has the same limit across producers' clocks)."""
    kept = [e for e in readable(extents) if e.last_entry_id >= e.first_entry_id]
    low, high = 0, len(kept)
    while low < high:  # the first ledger whose last record is at or after the time
        middle = (low + high) // 2
        extent = kept[middle]
        if (yield Position(extent.ledger_id, extent.last_entry_id)) >= timestamp_ms:
            high = middle
        else:
            low = middle + 1
    if low == len(kept):
        return latest(extents)
    extent = kept[low]
    first, last = extent.first_entry_id, extent.last_entry_id  # last is at or after it
    while first < last:
        middle = (first + last) // 2
        if (yield Position(extent.ledger_id, middle)) >= timestamp_ms:
            last = middle
        else:
            first = middle + 1
    return Position(extent.ledger_id, first)


def offset_of(position: Position) -> dict[str, int]:
    """A bound as Spark stores it in the checkpoint (plain JSON)."""
    return {"ledger": position.ledger_id, "entry": position.entry_id}


def position_of(offset: object) -> Position:
    """A bound back from a checkpointed offset."""
    if not isinstance(offset, dict) or set(offset) != {"ledger", "entry"}:
        raise InvalidArgumentError(
            f"not a quorumlog streaming offset: {offset!r} (expected ledger and entry)"
        )
    return Position(int(offset["ledger"]), int(offset["entry"]))


def prorate(budget: int, available: Mapping[str, int]) -> dict[str, int]:
    """``budget`` shared among logs in proportion to what each has waiting, as Kafka's
    source shares maxOffsetsPerTrigger among partitions: a share below one is rounded
    up (every log with something waiting moves), others down."""
    total = sum(available.values())
    if total <= budget:
        return dict(available)
    out: dict[str, int] = {}
    for name, count in available.items():
        share = budget * count / total
        out[name] = min(count, math.ceil(share) if share < 1 else math.floor(share))
    return out


def lag_report(
    latest: Mapping[str, Position],
    behind: Mapping[str, int],
    skipped: Mapping[str, int] | None,
    one_log: str | None,
) -> dict[str, Any]:
    """The source's latestOffset in the query's progress: each log's end in the shape of
    the query's offsets, with Kafka's lag metrics counted in records.

    ``behind`` is, per log, the records between the end of the batch just planned and
    the log's end; ``skipped`` (failOnDataLoss=false only) the records skipped so far.
    A read of ``one_log`` gives ``{"ledger", "entry", "recordsBehindLatest", ...}``; a read
    of several logs gives each log's bound with its own ``recordsBehindLatest`` (and
    ``recordsSkipped``), and beside them ``minRecordsBehindLatest``,
    ``maxRecordsBehindLatest``, ``avgRecordsBehindLatest`` over the logs and the total
    ``recordsSkipped`` (a log named like one of these keeps its place: the number is
    left out). Only progress reporting reads it: Spark plans and checkpoints from
    latestOffset's answer alone."""
    if one_log is not None:
        latest = {one_log: latest[one_log]}
    counts = [behind[name] for name in latest]
    summary: dict[str, Any] = {}
    if counts:
        summary = {
            "minRecordsBehindLatest": min(counts),
            "maxRecordsBehindLatest": max(counts),
            "avgRecordsBehindLatest": sum(counts) / len(counts),
        }
    if skipped is not None:
        summary["recordsSkipped"] = sum(skipped.get(name, 0) for name in latest)

    def one(name: str) -> dict[str, Any]:
        out: dict[str, Any] = {**offset_of(latest[name]), "recordsBehindLatest": behind[name]}
        if skipped is not None:
            out["recordsSkipped"] = skipped.get(name, 0)
        return out

    if one_log is not None:
        return {**one(one_log), **summary}
    report: dict[str, Any] = {name: one(name) for name in sorted(latest)}
    for key, value in summary.items():
        report.setdefault(key, value)
    return report


def log_offsets_of(positions: Mapping[str, Position]) -> dict[str, dict[str, int]]:
    """The offset of a read of several logs: a bound per log, by name."""
    return {name: offset_of(positions[name]) for name in sorted(positions)}


def log_positions_of(offset: object) -> dict[str, Position]:
    """Bounds per log back from a checkpointed offset of several logs."""
    if not isinstance(offset, dict) or not all(isinstance(v, dict) for v in offset.values()):
        raise InvalidArgumentError(
            f"not a quorumlog streaming offset of several logs: {offset!r} "
            '(expected {"<log>": {"ledger": L, "entry": E}, ...})'
        )
    return {str(name): position_of(value) for name, value in offset.items()}
