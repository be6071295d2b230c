"""The options of the ``quorumlog`` Spark data source, checked on the driver.

Nothing here imports pyspark: the options are parsed from the plain mapping Spark
hands to ``DataSource.__init__`` (keys arrive lower-cased, values as strings), and
every mistake raises an :class:`~quorumlog.errors.InvalidArgumentError` that names the
option, before any task runs.

Reading::

    metadata              metadata URI (default: as the client, $QUORUMLOG_METADATA or ./.quorumlog)
    log                   a log stream's name (or give it as the load()/save() path)
    ledgers               comma-separated ledger ids (instead of log; batch reads only)
    startingPosition      earliest | latest | {"ledger": L, "entry": E} | L:E   (inclusive)
    endingPosition        earliest | latest | a position (exclusive; batch reads only)
    maxRecordsPerTrigger  streaming: at most this many records per micro-batch
    entriesPerPartition   how many entries one Spark partition reads (default 100000)
    password              the ledgers' password (text)

Writing::

    metadata, log, password   as above
    sinkId                streaming: names this query's batch markers in the log (default "spark");
                          it belongs to the first query that commits with it
    ensemble, writeQuorum, ackQuorum   the shape of the ledgers the tasks write
    maxWritePartitions    the most partitions one write may have (default 1024)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from quorumlog.core.quorum import check_quorum_shape
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.log.metadata import check_log_name
from quorumlog.log.position import Position
from quorumlog.meta.factory import resolve_metadata_uri

SOURCE_NAME = "quorumlog"
Bound = Literal["earliest", "latest"] | Position

DEFAULT_ENTRIES_PER_PARTITION = 100_000
DEFAULT_MAX_WRITE_PARTITIONS = 1024
DEFAULT_SINK_ID = "spark"

# Spark's own writers put these in a sink's options; they mean nothing to us.
_SPARK_WRITE_OPTIONS = {"path", "checkpointlocation"}

_READ_OPTIONS = {
    "metadata": "metadata",
    "log": "log",
    "path": "path",
    "ledgers": "ledgers",
    "startingposition": "startingPosition",
    "endingposition": "endingPosition",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
    "entriesperpartition": "entriesPerPartition",
    "password": "password",
}
_WRITE_OPTIONS = {
    "metadata": "metadata",
    "log": "log",
    "path": "path",
    "password": "password",
    "sinkid": "sinkId",
    "ensemble": "ensemble",
    "writequorum": "writeQuorum",
    "ackquorum": "ackQuorum",
    "maxwritepartitions": "maxWritePartitions",
}


def _bad(option: str, value: object, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{SOURCE_NAME} option {option}={value!r}: {why}")


def _check_known(options: Mapping[str, str], known: Mapping[str, str], role: str) -> None:
    ignored = _SPARK_WRITE_OPTIONS
    unknown = sorted(key for key in options if key.lower() not in set(known) | ignored)
    if unknown:
        raise InvalidArgumentError(
            f"unknown {SOURCE_NAME} {role} option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known.values()))}"
        )


def _get(options: Mapping[str, str], key: str) -> str | None:
    for name, value in options.items():
        if name.lower() == key:
            return None if value is None else str(value)
    return None


def _positive_int(
    options: Mapping[str, str], key: str, label: str, default: int | None
) -> int | None:
    raw = _get(options, key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(label, raw, "must be a whole number") from None
    if value < 1:
        raise _bad(label, raw, "must be at least 1")
    return value


def parse_bound(label: str, raw: str | None, default: Literal["earliest", "latest"]) -> Bound:
    """``earliest``, ``latest``, or a position as JSON (``{"ledger": 3, "entry": 0}``,
    ``[3, 0]``) or text (``3:0``)."""
    if raw is None or raw.strip() == "":
        return default
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        value: object = json.loads(text)
    except ValueError:
        value = text
    try:
        position = Position.of(value)
    except (BKError, KeyError, TypeError, ValueError):
        raise _bad(
            label, raw, 'expected earliest, latest, {"ledger": L, "entry": E} or L:E'
        ) from None
    if position.ledger_id < 0 or position.entry_id < 0:
        raise _bad(label, raw, "ledger and entry must be >= 0")
    return position


def _parse_ledgers(raw: str) -> tuple[int, ...]:
    ids: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            ledger_id = int(part)
        except ValueError:
            raise _bad("ledgers", raw, f"{part!r} is not a ledger id") from None
        if ledger_id < 0:
            raise _bad("ledgers", raw, f"ledger id {ledger_id} is negative")
        ids.append(ledger_id)
    if not ids:
        raise _bad("ledgers", raw, "names no ledger")
    if len(set(ids)) != len(ids):
        raise _bad("ledgers", raw, "names a ledger twice")
    return tuple(ids)


def _log_name(options: Mapping[str, str]) -> str | None:
    log = _get(options, "log")
    path = _get(options, "path")
    if log is not None and path is not None and log != path:
        raise _bad("log", log, f"and the load/save path {path!r} name different logs")
    name = log if log is not None else path
    if name is None:
        return None
    try:
        return check_log_name(name)
    except BKError as exc:
        raise _bad("log", name, exc.message) from None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What to read: a log (or some ledgers), from where to where."""

    metadata_uri: str
    log: str | None
    ledgers: tuple[int, ...] | None
    start: Bound
    end: Bound
    max_records_per_trigger: int | None
    entries_per_partition: int
    password: bytes

    @classmethod
    def parse(
        cls, options: Mapping[str, str], *, streaming: bool = False, lenient_stream: bool = False
    ) -> ReadOptions:
        """``lenient_stream``: accept the options of either kind of read (the schema is
        asked before Spark says whether the read is a batch or a stream)."""
        _check_known(options, _READ_OPTIONS, "read")
        log = _log_name(options)
        ledgers_raw = _get(options, "ledgers")
        ledgers = None if ledgers_raw is None else _parse_ledgers(ledgers_raw)
        if (log is None) == (ledgers is None):
            raise InvalidArgumentError(
                f"{SOURCE_NAME} source: give exactly one of the options log (a log stream name) "
                f"and ledgers (comma-separated ledger ids); got "
                f"{'both' if log is not None else 'neither'}"
            )
        if streaming and ledgers is not None:
            raise _bad("ledgers", ledgers_raw, "streaming reads need a log (option log)")
        start = parse_bound("startingPosition", _get(options, "startingposition"), "earliest")
        end_raw = _get(options, "endingposition")
        if streaming and end_raw is not None and not lenient_stream:
            raise _bad("endingPosition", end_raw, "streaming reads have no end")
        end = parse_bound("endingPosition", end_raw, "latest")
        if isinstance(start, Position) and isinstance(end, Position) and end < start:
            raise _bad("endingPosition", end_raw, f"is before startingPosition {start}")
        max_records = _positive_int(options, "maxrecordspertrigger", "maxRecordsPerTrigger", None)
        if max_records is not None and not streaming and not lenient_stream:
            raise _bad("maxRecordsPerTrigger", max_records, "only streaming reads have triggers")
        per_partition = _positive_int(
            options, "entriesperpartition", "entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION
        )
        assert per_partition is not None
        return cls(
            metadata_uri=_metadata_uri(options),
            log=log,
            ledgers=ledgers,
            start=start,
            end=end,
            max_records_per_trigger=max_records,
            entries_per_partition=per_partition,
            password=(_get(options, "password") or "").encode(),
        )


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Where a DataFrame goes: a log, and the shape of the ledgers written for it."""

    metadata_uri: str
    log: str
    sink_id: str
    password: bytes
    ensemble: int
    write_quorum: int
    ack_quorum: int
    max_write_partitions: int

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        _check_known(options, _WRITE_OPTIONS, "write")
        log = _log_name(options)
        if log is None:
            raise InvalidArgumentError(
                f"{SOURCE_NAME} sink: the option log (a log name) is missing"
            )
        sink_id = _get(options, "sinkid") or DEFAULT_SINK_ID
        if not sink_id.replace("-", "").replace("_", "").replace(
            ".", ""
        ).isalnum() or sink_id.startswith("."):
            # It names a metadata node: "." and ".." are not names there.
            raise _bad(
                "sinkId", sink_id, "use letters, digits, '.', '_' or '-', not starting with '.'"
            )
        ensemble = _positive_int(options, "ensemble", "ensemble", 3)
        write_quorum = _positive_int(options, "writequorum", "writeQuorum", min(3, ensemble or 3))
        ack_quorum = _positive_int(options, "ackquorum", "ackQuorum", min(2, write_quorum or 2))
        assert ensemble is not None and write_quorum is not None and ack_quorum is not None
        try:
            check_quorum_shape(ensemble, write_quorum, ack_quorum)
        except BKError as exc:
            raise InvalidArgumentError(f"{SOURCE_NAME} sink options: {exc.message}") from None
        max_partitions = _positive_int(
            options, "maxwritepartitions", "maxWritePartitions", DEFAULT_MAX_WRITE_PARTITIONS
        )
        assert max_partitions is not None
        return cls(
            metadata_uri=_metadata_uri(options),
            log=log,
            sink_id=sink_id,
            password=(_get(options, "password") or "").encode(),
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            max_write_partitions=max_partitions,
        )


def _metadata_uri(options: Mapping[str, str]) -> str:
    raw = _get(options, "metadata")
    try:
        # Resolved here, on the driver, so every executor uses the same store.
        return resolve_metadata_uri(raw)
    except BKError as exc:
        raise _bad("metadata", raw, exc.message) from None
