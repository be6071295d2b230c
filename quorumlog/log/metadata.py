"""How a log stream is kept in the metadata store.

Layout (see docs/LOGS.md)::

    /logs/<name>    JSON: {"format": 1, "ledgers": [12, 15, 19],
                           "truncated_before": [15, 0] or null, "created_ms": ...,
                           "removed_end": [12, 8],                           (optional)
                           "fences": 2,                                      (optional)
                           "closed_through": 15,                             (optional)
                           "sink_batches": {"<sink id>": <last batch id>}}   (optional)

The node's version is what writers compare-and-set on (R11): appending a ledger,
sealing, truncating and a Spark sink's commit are each a ``set`` with the version that
was read, made through ``log/metadata_updates.py`` (the one update path).
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from quorumlog.errors import MetadataError, NodeExistsError, NoNodeError
from quorumlog.log.errors import InvalidLogNameError, NoSuchLogError
from quorumlog.log.position import Position
from quorumlog.meta.store import MetadataStore

LOGS_PATH = "/logs"
FORMAT = 1
_PART = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NAME = re.compile(rf"{_PART}(?:/{_PART})*")
_MAX_NAME_CHARS = 200
# A log is one node of /logs whatever its name: the '/' between the parts of a name
# (db/shop) is written '%2F' there. No name holds '%', so the escape is unambiguous.
_SLASH, _SLASH_ESCAPED = "/", "%2F"


def check_log_name(name: str) -> str:
    """``name`` if it can name a log: 1-200 characters, parts separated by '/' (as in
    ``db/shop``), each of ``A-Z a-z 0-9 . _ -`` and not starting with '.' or '-'."""
    if not isinstance(name, str) or len(name) > _MAX_NAME_CHARS or not _NAME.fullmatch(name):
        raise InvalidLogNameError(
            f"bad log name {name!r}: use 1 to 200 letters, digits, '.', '_' or '-', in "
            "parts separated by '/' (none empty, none starting with '.' or '-')"
        )
    return name


def log_node_name(name: str) -> str:
    """The log's node under /logs (and under any other path keyed by log): its name
    with each '/' escaped, so that it stays one path component."""
    return check_log_name(name).replace(_SLASH, _SLASH_ESCAPED)


def log_path(name: str) -> str:
    """The metadata path of a log."""
    return f"{LOGS_PATH}/{log_node_name(name)}"


@dataclass(frozen=True, slots=True)
class LogMetadata:
    """The ledger list of one log, oldest first, and where it was truncated."""

    name: str
    ledgers: tuple[int, ...] = ()
    truncated_before: Position | None = None
    created_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # The last batch each streaming sink appended (see quorumlog.spark.commit): kept
    # in the node the ledger list is in, so one compare-and-set moves both.
    sink_batches: Mapping[str, int] = field(default_factory=dict)
    # Where the removed records end, when below truncated_before: no record lies in
    # [removed_end, truncated_before) (the cut is a ledger's first entry and the ledgers
    # just before it were closed, or empty). A reader checkpointed at the end of the
    # last removed ledger lost nothing and may resume there.
    removed_end: Position | None = None
    # How many times Log.fence() sealed the list. A fence changes nothing else, so a
    # writer whose compare-and-set lost to one would otherwise retry and go on writing.
    fences: int = 0
    # Every listed ledger with an id up to this one is closed (-1: none known). Written by
    # writers, which know it when they compare-and-set the list, so that fencing the log
    # reads the metadata of the ledgers after it only, not of the whole history.
    closed_through: int = -1

    def is_truncated(self, position: Position) -> bool:
        """Whether records at or after ``position`` were removed by a truncation."""
        if self.truncated_before is None:
            return False
        end = self.truncated_before if self.removed_end is None else self.removed_end
        return position < end

    def to_bytes(self) -> bytes:
        raw: dict[str, object] = {
            "format": FORMAT,
            "ledgers": list(self.ledgers),
            "truncated_before": (
                None if self.truncated_before is None else list(self.truncated_before)
            ),
            "created_ms": self.created_ms,
        }
        if self.sink_batches:
            raw["sink_batches"] = dict(self.sink_batches)
        if self.removed_end is not None:
            raw["removed_end"] = list(self.removed_end)
        if self.fences:
            raw["fences"] = self.fences
        if self.closed_through >= 0:
            raw["closed_through"] = self.closed_through
        return json.dumps(
            raw,
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, name: str, data: bytes) -> LogMetadata:
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format') if isinstance(raw, dict) else '?'}")
            ledgers = tuple(int(x) for x in raw["ledgers"])
            cut = raw.get("truncated_before")
            truncated = None if cut is None else Position(int(cut[0]), int(cut[1]))
            created_ms = int(raw.get("created_ms", 0))
            sinks = {str(k): int(v) for k, v in dict(raw.get("sink_batches") or {}).items()}
            end = raw.get("removed_end")
            removed_end = None if end is None else Position(int(end[0]), int(end[1]))
            fences = int(raw.get("fences", 0))
            closed_through = int(raw.get("closed_through", -1))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise MetadataError(
                f"log {name}: metadata at {log_path(name)} is damaged: {exc}"
            ) from None
        if any(b <= a for a, b in itertools.pairwise(ledgers)):
            raise MetadataError(f"log {name}: ledger list is not increasing: {list(ledgers)}")
        if removed_end is not None and (truncated is None or removed_end >= truncated):
            raise MetadataError(
                f"log {name}: removed_end {removed_end} is not below the truncation point "
                f"{truncated}"
            )
        return cls(name, ledgers, truncated, created_ms, sinks, removed_end, fences, closed_through)

    def with_ledger(self, ledger_id: int) -> LogMetadata:
        return self.with_ledgers((ledger_id,))

    def with_ledgers(self, ledger_ids: Sequence[int]) -> LogMetadata:
        """The list with ``ledger_ids`` appended, in that order (ids must keep growing)."""
        previous = self.ledgers[-1] if self.ledgers else 0
        for ledger_id in ledger_ids:
            if ledger_id <= previous:
                raise MetadataError(
                    f"log {self.name}: ledger {ledger_id} would not come after ledger {previous}"
                )
            previous = ledger_id
        return replace(self, ledgers=(*self.ledgers, *ledger_ids))

    def with_closed_through(self, ledger_id: int) -> LogMetadata:
        """The metadata noting that every listed ledger up to ``ledger_id`` is closed."""
        if ledger_id <= self.closed_through:
            return self
        return replace(self, closed_through=ledger_id)

    def with_all_closed(self) -> LogMetadata:
        """The metadata noting that every ledger listed now is closed (after fencing)."""
        return self.with_closed_through(self.ledgers[-1]) if self.ledgers else self

    def fenced(self) -> LogMetadata:
        """The metadata of a list sealed once more by Log.fence()."""
        return replace(self, fences=self.fences + 1)

    def with_sink_batch(self, sink_id: str, batch_id: int) -> LogMetadata:
        """The metadata recording that streaming sink ``sink_id`` appended ``batch_id``."""
        return replace(self, sink_batches={**self.sink_batches, sink_id: batch_id})

    def truncated(self, before: Position, removed_end: Position | None = None) -> LogMetadata:
        """The list without the ledgers wholly before ``before``, truncated before it.

        ``removed_end``: where the records before ``before`` end, if below it (no record
        lies in ``[removed_end, before)``); None if unknown or ``before`` itself.
        """
        kept = tuple(x for x in self.ledgers if x >= before.ledger_id)
        old = self.truncated_before
        if old is not None and before <= old:
            return replace(self, ledgers=kept)  # truncated there already
        end = removed_end if removed_end is not None and removed_end < before else None
        if end is not None and old is not None and end <= old:
            # Nothing between the old cut and the new one: the old cut's own empty stretch
            # below it joins this one.
            end = min(end, old if self.removed_end is None else self.removed_end)
        return replace(self, ledgers=kept, truncated_before=before, removed_end=end)

    def only_truncated_since(self, older: LogMetadata) -> bool:
        """Whether this list is ``older``'s with some of its first ledgers removed (a
        truncation happened, but no ledger was appended)."""
        drop = len(older.ledgers) - len(self.ledgers)
        return drop >= 0 and tuple(older.ledgers[drop:]) == self.ledgers

    def next_ledger(self, after: int) -> int | None:
        """The first ledger of the list with an id above ``after``."""
        for ledger_id in self.ledgers:
            if ledger_id > after:
                return ledger_id
        return None

    def first_ledger_from(self, ledger_id: int) -> int | None:
        """The first ledger of the list with an id at or above ``ledger_id``."""
        for candidate in self.ledgers:
            if candidate >= ledger_id:
                return candidate
        return None


async def read_log(
    store: MetadataStore, name: str, *, sync: bool = False
) -> tuple[LogMetadata, int]:
    """The log's metadata and its version; NoSuchLogError if absent. With ``sync``, the
    store catches up with the quorum first (R18): for a caller that acts on absence."""
    path = log_path(name)
    if sync:
        await store.sync(path)
    try:
        found = await store.get(path)
    except NoNodeError:
        raise NoSuchLogError(f"log {name} does not exist ({path})") from None
    return LogMetadata.from_bytes(name, found.data), found.version


async def create_log_if_absent(store: MetadataStore, name: str) -> tuple[LogMetadata, int]:
    """Create an empty log unless it exists; returns its metadata and version."""
    path = log_path(name)
    for _ in range(10):  # bounded: a create racing a delete at worst repeats a few times
        try:
            return await read_log(store, name)
        except NoSuchLogError:
            pass
        metadata = LogMetadata(name)
        try:
            await store.create(path, metadata.to_bytes())
        except NodeExistsError:
            continue
        return metadata, 0
    raise MetadataError(f"log {name}: created and deleted concurrently too many times ({path})")


async def list_log_names(store: MetadataStore) -> list[str]:
    try:
        children = await store.children(LOGS_PATH)
    except NoNodeError:
        return []
    return sorted(child.replace(_SLASH_ESCAPED, _SLASH) for child in children)


def ledger_ids_text(ledgers: Sequence[int]) -> str:
    return "[" + ", ".join(str(x) for x in ledgers) + "]"
