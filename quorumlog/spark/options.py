"""The options of the ``quorumlog`` Spark data source, checked on the driver.

Nothing here imports pyspark: the options are parsed from the plain mapping Spark
hands to ``DataSource.__init__`` (keys arrive lower-cased, values as strings), and
every mistake raises an :class:`~quorumlog.errors.InvalidArgumentError` that names the
option, before any task runs.

Reading::

    metadata              metadata URI (default: as the client, $QUORUMLOG_METADATA or ./.quorumlog)
    log                   a log stream's name (or give it as the load()/save() path)
    logs                  comma-separated log names (instead of log)
    logPattern            a regular expression over log names (instead of log)
    ledgers               comma-separated ledger ids (instead of log; batch reads only)
    startingPosition      earliest | latest | {"ledger": L, "entry": E} | L:E   (inclusive)
    endingPosition        earliest | latest | a position (exclusive; batch reads only)
    startingPositions     earliest | latest | {"<log>": <position or earliest/latest/-2/-1>}
    endingPositions       the same, exclusive (batch reads only)
    startingTimestamp     ms since the epoch: each log from its first record appended at or after
    endingTimestamp       the same as an exclusive end (batch reads only)
    startingPositionsByTimestamp   {"<log>": ms, ...}: per log (logs not named: earliest)
    endingPositionsByTimestamp     the same as exclusive ends (batch reads only; others: latest)
    maxRecordsPerTrigger  streaming: at most this many records per micro-batch
    maxBytesPerTrigger    streaming: at most about this many payload bytes per micro-batch
    minOffsetsPerTrigger  streaming: wait for this many records, at most maxTriggerDelay
    maxTriggerDelay       a duration (15m, 30s, 500ms; default 15m)
    failOnDataLoss        true (default): a truncated position fails; false: skip to the earliest
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
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from quorumlog.core.quorum import check_quorum_shape
from quorumlog.errors import BKError, InvalidArgumentError
from quorumlog.log.metadata import check_log_name
from quorumlog.log.position import Position
from quorumlog.meta.factory import resolve_metadata_uri

SOURCE_NAME = "quorumlog"


class AtTime(NamedTuple):
    """A bound given by time: before the first record appended at or after
    ``timestamp_ms`` (Kafka's offsetsForTimes); the log's end when there is none.
    The driver finds the position (``scan.position_at_time``)."""

    timestamp_ms: int


Bound = Literal["earliest", "latest"] | Position | AtTime

DEFAULT_ENTRIES_PER_PARTITION = 100_000
DEFAULT_MAX_WRITE_PARTITIONS = 1024
DEFAULT_SINK_ID = "spark"
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0  # Kafka's source waits as long

# Spark's own writers put these in a sink's options; they mean nothing to us.
_SPARK_WRITE_OPTIONS = {"path", "checkpointlocation"}

_READ_OPTIONS = {
    "metadata": "metadata",
    "log": "log",
    "path": "path",
    "logs": "logs",
    "logpattern": "logPattern",
    "ledgers": "ledgers",
    "startingposition": "startingPosition",
    "endingposition": "endingPosition",
    "startingpositions": "startingPositions",
    "endingpositions": "endingPositions",
    "startingtimestamp": "startingTimestamp",
    "endingtimestamp": "endingTimestamp",
    "startingpositionsbytimestamp": "startingPositionsByTimestamp",
    "endingpositionsbytimestamp": "endingPositionsByTimestamp",
    "maxrecordspertrigger": "maxRecordsPerTrigger",
    "maxbytespertrigger": "maxBytesPerTrigger",
    "minoffsetspertrigger": "minOffsetsPerTrigger",
    "maxtriggerdelay": "maxTriggerDelay",
    "failondataloss": "failOnDataLoss",
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


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|m|min|h|d)?\s*", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(label: str, raw: str) -> float:
    """Seconds in ``raw``: ``500ms``, ``30s``, ``15m``, ``2h``, ``1d``; a bare number is
    milliseconds, as in Spark's own time options."""
    match = _DURATION.fullmatch(raw)
    if match is None:
        raise _bad(label, raw, "expected a duration such as 500ms, 30s, 15m or 2h")
    unit = (match.group(2) or "ms").lower()
    return float(match.group(1)) * _DURATION_UNITS.get(unit, 86400.0)


def _bool(options: Mapping[str, str], key: str, label: str, default: bool) -> bool:
    raw = _get(options, key)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise _bad(label, raw, "expected true or false")


def _bound_value(label: str, raw: str, log: str, value: object) -> Bound:
    # Kafka's -2 (earliest) and -1 (latest) are understood too.
    if value in (-2, "earliest"):
        return "earliest"
    if value in (-1, "latest"):
        return "latest"
    text = value if isinstance(value, str) else json.dumps(value)
    try:
        return parse_bound(label, text, "earliest")
    except InvalidArgumentError:
        raise _bad(
            label, raw, f'log {log}: expected earliest, latest, {{"ledger": L, "entry": E}} or L:E'
        ) from None


def parse_bounds(
    label: str, raw: str | None
) -> tuple[Literal["earliest", "latest"] | None, dict[str, Bound]]:
    """``earliest``/``latest`` for every log, or a JSON object naming a bound per log."""
    if raw is None or raw.strip() == "":
        return None, {}
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return ("earliest" if text.lower() == "earliest" else "latest"), {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value:
        raise _bad(label, raw, 'expected earliest, latest or {"<log>": <position>, ...}')
    out: dict[str, Bound] = {}
    for name, bound in value.items():
        try:
            check_log_name(str(name))
        except BKError as exc:
            raise _bad(label, raw, exc.message) from None
        out[str(name)] = _bound_value(label, raw, str(name), bound)
    return None, out


def _parse_logs(raw: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            names.append(check_log_name(part))
        except BKError as exc:
            raise _bad("logs", raw, exc.message) from None
    if not names:
        raise _bad("logs", raw, "names no log")
    if len(set(names)) != len(names):
        raise _bad("logs", raw, "names a log twice")
    return tuple(names)


def _parse_pattern(raw: str) -> str:
    try:
        re.compile(raw)
    except re.error as exc:
        raise _bad("logPattern", raw, f"not a regular expression: {exc}") from None
    return raw


def parse_timestamp(label: str, raw: str) -> AtTime:
    """A time in milliseconds since the Unix epoch (a whole number, >= 0)."""
    try:
        value = int(raw.strip())
    except ValueError:
        raise _bad(label, raw, "expected milliseconds since the Unix epoch") from None
    if not 0 <= value < 1 << 63:
        raise _bad(label, raw, "must be >= 0 (milliseconds since the Unix epoch)")
    return AtTime(value)


def parse_timestamps(label: str, raw: str) -> dict[str, Bound]:
    """``{"<log>": ms, ...}``: a time per log."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value:
        raise _bad(label, raw, 'expected {"<log>": <ms since the Unix epoch>, ...}')
    out: dict[str, Bound] = {}
    for name, stamp in value.items():
        try:
            check_log_name(str(name))
        except BKError as exc:
            raise _bad(label, raw, exc.message) from None
        if isinstance(stamp, bool) or not isinstance(stamp, int | str):
            raise _bad(label, raw, f"log {name}: expected milliseconds since the Unix epoch")
        try:
            out[str(name)] = parse_timestamp(label, str(stamp))
        except InvalidArgumentError:
            raise _bad(
                label, raw, f"log {name}: expected milliseconds since the Unix epoch, >= 0"
            ) from None
    return out


def _one_bound(
    options: Mapping[str, str],
    singular: str,
    plural: str,
    default: Literal["earliest", "latest"],
) -> tuple[Bound, dict[str, Bound]]:
    """The start (or end) from whichever one of its four options was given.

    Kafka's source lets a timestamp option silently win over the offset options; here
    giving two is an error naming both, as a bound given twice is a mistake."""
    prefix = singular.removesuffix("Position")  # starting / ending
    by_time, per_log_time = f"{prefix}Timestamp", f"{prefix}PositionsByTimestamp"
    labels = (singular, plural, by_time, per_log_time)
    given = [(label, _get(options, label.lower())) for label in labels]
    present = [(label, raw) for label, raw in given if raw is not None]
    if len(present) > 1:
        (first, _), (second, raw) = present[0], present[1]
        raise _bad(second, raw, f"give {first} or {second}, not both")
    if not present:
        return default, {}
    label, raw = present[0]
    assert raw is not None
    if label == plural:
        every, per_log = parse_bounds(plural, raw)
        return every or default, per_log
    if label == by_time:
        return parse_timestamp(by_time, raw), {}
    if label == per_log_time:
        return default, parse_timestamps(per_log_time, raw)
    return parse_bound(singular, raw, default), {}


def _given(options: Mapping[str, str], *labels: str) -> tuple[str, str] | None:
    """The first of ``labels`` given, with its value."""
    for label in labels:
        raw = _get(options, label.lower())
        if raw is not None:
            return label, raw
    return None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What to read: a log, several logs, or some ledgers, from where to where.

    ``log`` is set for one log given by ``log`` (or the path): its streaming offsets
    keep the one-log form ``{"ledger": L, "entry": E}``. ``logs`` lists the logs given
    by ``log`` or ``logs``; ``log_pattern`` chooses logs by name instead. ``start`` and
    ``end`` hold for every log not named in ``starts`` / ``ends``."""

    metadata_uri: str
    log: str | None
    ledgers: tuple[int, ...] | None
    start: Bound
    end: Bound
    max_records_per_trigger: int | None
    entries_per_partition: int
    password: bytes
    logs: tuple[str, ...] | None = None
    log_pattern: str | None = None
    starts: Mapping[str, Bound] = field(default_factory=dict)
    ends: Mapping[str, Bound] = field(default_factory=dict)
    max_bytes_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    fail_on_data_loss: bool = True

    def start_of(self, log: str) -> Bound:
        return self.starts.get(log, self.start)

    def end_of(self, log: str) -> Bound:
        return self.ends.get(log, self.end)

    def wants(self, log: str) -> bool:
        """Whether ``log`` is one of the logs read."""
        if self.log_pattern is not None:
            return re.fullmatch(self.log_pattern, log) is not None
        return self.logs is not None and log in self.logs

    @classmethod
    def parse(
        cls, options: Mapping[str, str], *, streaming: bool = False, lenient_stream: bool = False
    ) -> ReadOptions:
        """``lenient_stream``: accept the options of either kind of read (the schema is
        asked before Spark says whether the read is a batch or a stream)."""
        _check_known(options, _READ_OPTIONS, "read")
        log = _log_name(options)
        logs_raw = _get(options, "logs")
        pattern_raw = _get(options, "logpattern")
        ledgers_raw = _get(options, "ledgers")
        ledgers = None if ledgers_raw is None else _parse_ledgers(ledgers_raw)
        given = [
            name
            for name, raw in (
                ("log", log),
                ("logs", logs_raw),
                ("logPattern", pattern_raw),
                ("ledgers", ledgers_raw),
            )
            if raw is not None
        ]
        if len(given) != 1:
            got = "neither" if not given else "both" if len(given) == 2 else ", ".join(given)
            raise InvalidArgumentError(
                f"{SOURCE_NAME} source: give exactly one of the options log (a log stream name), "
                f"logs (comma-separated log names), logPattern (a regular expression over log "
                f"names) and ledgers (comma-separated ledger ids); got {got}"
            )
        logs: tuple[str, ...] | None = (log,) if log is not None else None
        if logs_raw is not None:
            logs = _parse_logs(logs_raw)
        pattern = None if pattern_raw is None else _parse_pattern(pattern_raw)
        if streaming and ledgers is not None:
            raise _bad("ledgers", ledgers_raw, "streaming reads need a log (option log)")
        start, starts = _one_bound(options, "startingPosition", "startingPositions", "earliest")
        ending = _given(
            options,
            "endingPosition",
            "endingPositions",
            "endingTimestamp",
            "endingPositionsByTimestamp",
        )
        end_raw = None if ending is None else ending[1]
        if streaming and ending is not None and not lenient_stream:
            raise _bad(ending[0], ending[1], "streaming reads have no end")
        end, ends = _one_bound(options, "endingPosition", "endingPositions", "latest")
        several = pattern is not None or (logs is not None and len(logs) > 1)
        for label, bound in (("startingPosition", start), ("endingPosition", end)):
            if several and isinstance(bound, Position):
                raise _bad(
                    label,
                    str(bound),
                    "a position is in one log's ledger; for several logs give "
                    f"{label}s, JSON per log",
                )
        if ledgers is not None and (starts or ends):
            raise _bad("ledgers", ledgers_raw, "startingPositions/endingPositions name logs")
        for label, bound in (("startingTimestamp", start), ("endingTimestamp", end)):
            if ledgers is not None and isinstance(bound, AtTime):
                raise _bad(
                    label,
                    bound.timestamp_ms,
                    "a read of ledgers has no append times (it reads raw entries); read a log",
                )
        by_time = _get(options, "startingpositionsbytimestamp") is not None
        start_label = "startingPositionsByTimestamp" if by_time else "startingPositions"
        by_time = _get(options, "endingpositionsbytimestamp") is not None
        end_label = "endingPositionsByTimestamp" if by_time else "endingPositions"
        for label, named in ((start_label, starts), (end_label, ends)):
            for name in named:
                chosen = (
                    re.fullmatch(pattern, name) is not None
                    if pattern is not None
                    else logs is not None and name in logs
                )
                if not chosen:
                    raise _bad(label, json.dumps(_plain(named)), f"log {name} is not read")
        for name in sorted(set(starts) | set(ends) | {""}):
            low = starts.get(name, start) if name else start
            high = ends.get(name, end) if name else end
            if isinstance(low, Position) and isinstance(high, Position) and high < low:
                label = "endingPositions" if ends else "endingPosition"
                raise _bad(label, end_raw, f"is before startingPosition {low}")
            if isinstance(low, AtTime) and isinstance(high, AtTime) and high < low:
                label = end_label if ends else "endingTimestamp"
                raise _bad(label, end_raw, f"is before the starting time {low.timestamp_ms}")
        max_records = _positive_int(options, "maxrecordspertrigger", "maxRecordsPerTrigger", None)
        max_bytes = _positive_int(options, "maxbytespertrigger", "maxBytesPerTrigger", None)
        min_records = _positive_int(options, "minoffsetspertrigger", "minOffsetsPerTrigger", None)
        delay_raw = _get(options, "maxtriggerdelay")
        delay = (
            DEFAULT_MAX_TRIGGER_DELAY_S
            if delay_raw is None
            else parse_duration("maxTriggerDelay", delay_raw)
        )
        for label, value in (
            ("maxRecordsPerTrigger", max_records),
            ("maxBytesPerTrigger", max_bytes),
            ("minOffsetsPerTrigger", min_records),
            ("maxTriggerDelay", delay_raw),
        ):
            if value is not None and not streaming and not lenient_stream:
                raise _bad(label, value, "only streaming reads have triggers")
        if min_records is not None and max_records is not None and min_records > max_records:
            raise _bad("minOffsetsPerTrigger", min_records, "is above maxRecordsPerTrigger")
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
            logs=logs,
            log_pattern=pattern,
            starts=starts,
            ends=ends,
            max_bytes_per_trigger=max_bytes,
            min_records_per_trigger=min_records,
            max_trigger_delay_s=delay,
            fail_on_data_loss=_bool(options, "failondataloss", "failOnDataLoss", True),
        )


def _plain(bounds: Mapping[str, Bound]) -> dict[str, object]:
    return {
        k: v
        if isinstance(v, str)
        else v.timestamp_ms
        if isinstance(v, AtTime)
        else [v.ledger_id, v.entry_id]
        for k, v in bounds.items()
    }


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
