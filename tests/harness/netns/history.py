"""Histories in Jepsen's manner: every operation as an invocation and a completion.

An operation is invoked (``invoke``) and then completes as ``ok`` (it happened),
``fail`` (it certainly did not happen) or ``info`` (unknown: it may have happened, at
any time after its invocation, or never). Times are ``time.monotonic_ns()``: every
process of one machine reads the same CLOCK_MONOTONIC (network namespaces do not
change it), so histories that several processes record merge onto one timeline.

A history is kept as JSON lines, one event per line, so a run killed half-way still
leaves everything recorded up to its end::

    {"process": "writer-0", "type": "invoke", "f": "append", "key": "log-a",
     "value": "w0-17", "op_id": "writer-0:17", "time_ns": 123456789}

``op_id`` pairs an invocation with its completion (a process may have many operations
in flight, as a pipelining writer does).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

OpType = Literal["invoke", "ok", "fail", "info"]
COMPLETIONS: tuple[OpType, ...] = ("ok", "fail", "info")


@dataclass(frozen=True)
class Event:
    """One line of a history."""

    process: str
    type: OpType
    f: str
    key: str
    value: Any
    op_id: str
    time_ns: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(line: str) -> Event:
        raw = json.loads(line)
        return Event(
            process=str(raw["process"]),
            type=raw["type"],
            f=str(raw["f"]),
            key=str(raw["key"]),
            value=raw["value"],
            op_id=str(raw["op_id"]),
            time_ns=int(raw["time_ns"]),
        )


@dataclass(frozen=True)
class Operation:
    """An invocation joined with its completion. ``completion`` is ``info`` when the
    history ends with the operation still in flight; ``end_ns`` is then None."""

    process: str
    f: str
    key: str
    value: Any
    op_id: str
    start_ns: int
    end_ns: int | None
    completion: OpType
    result: Any  # the completion's value (a read's answer), None for writes

    @property
    def ok(self) -> bool:
        return self.completion == "ok"


class HistoryRecorder:
    """Appends events to a JSON-lines file, one flushed line each (thread-safe)."""

    def __init__(self, path: Path | str, process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._next_id = 0

    def invoke(self, f: str, key: str, value: Any) -> str:
        """Record an invocation; the op id to complete it with."""
        with self._lock:
            op_id = f"{self.process}:{self._next_id}"
            self._next_id += 1
        self._write(Event(self.process, "invoke", f, key, value, op_id, time.monotonic_ns()))
        return op_id

    def complete(self, op_id: str, kind: OpType, f: str, key: str, value: Any = None) -> None:
        if kind not in COMPLETIONS:
            raise ValueError(f"{kind!r} is not a completion")
        self._write(Event(self.process, kind, f, key, value, op_id, time.monotonic_ns()))

    def _write(self, event: Event) -> None:
        line = event.to_json() + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(paths: Iterable[Path | str]) -> list[Event]:
    """Every event of the files, merged in time order (a torn last line is skipped)."""
    events: list[Event] = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                events.append(Event.from_json(line))
            except (ValueError, KeyError):
                continue  # the writer was killed mid-line
    events.sort(key=lambda event: event.time_ns)
    return events


def pair_operations(events: Sequence[Event]) -> list[Operation]:
    """Invocations joined with their completions, in invocation order. An invocation
    without a completion is ``info`` (its outcome unknown); a completion without an
    invocation is a broken history and raises ValueError."""
    invocations: dict[str, Event] = {}
    completions: dict[str, Event] = {}
    for event in events:
        if event.type == "invoke":
            if event.op_id in invocations:
                raise ValueError(f"operation {event.op_id} invoked twice")
            invocations[event.op_id] = event
        else:
            if event.op_id not in invocations:
                raise ValueError(f"operation {event.op_id} completed before it was invoked")
            if event.op_id in completions:
                raise ValueError(f"operation {event.op_id} completed twice")
            completions[event.op_id] = event
    operations = []
    for op_id, call in invocations.items():
        done = completions.get(op_id)
        operations.append(
            Operation(
                process=call.process,
                f=call.f,
                key=call.key,
                value=call.value,
                op_id=op_id,
                start_ns=call.time_ns,
                end_ns=done.time_ns if done else None,
                completion=done.type if done else "info",
                result=done.value if done else None,
            )
        )
    operations.sort(key=lambda op: op.start_ns)
    return operations


def iter_lines(events: Iterable[Event]) -> Iterator[str]:
    for event in events:
        yield event.to_json()
