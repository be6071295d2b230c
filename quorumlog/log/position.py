"""Positions and records of a log stream.

A position is ``(ledger_id, entry_id)``. Ledgers of one log are listed in the
order they were created, and ledger ids only grow, so comparing positions as
tuples orders them as the log does.
"""

from __future__ import annotations

from typing import NamedTuple

from quorumlog.errors import InvalidArgumentError


class Position(NamedTuple):
    """Where a record sits in a log: its ledger and its entry in that ledger.

    Ordered, hashable and JSON-able (``json.dumps(p)`` gives ``[12, 7]``)::

        >>> p = Position(12, 7)
        >>> str(p), p < Position(13, 0), Position.parse("12:7") == p
        ('12:7', True, True)
    """

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    def next(self) -> Position:
        """The position right after this one in the same ledger."""
        return Position(self.ledger_id, self.entry_id + 1)

    def to_dict(self) -> dict[str, int]:
        return {"ledger": self.ledger_id, "entry": self.entry_id}

    @classmethod
    def parse(cls, text: str) -> Position:
        """``"12:7"`` (as printed) or ``"12,7"`` -> ``Position(12, 7)``."""
        for separator in (":", ","):
            if separator in text:
                head, _, tail = text.partition(separator)
                try:
                    position = cls(int(head), int(tail))
                except ValueError:
                    break
                if position.ledger_id < 0 or position.entry_id < 0:
                    break
                return position
        raise InvalidArgumentError(f"bad log position {text!r}: expected LEDGER:ENTRY")

    @classmethod
    def of(cls, value: object) -> Position:
        """A position from a Position, a ``(ledger, entry)`` pair, a dict or a string."""
        if isinstance(value, Position):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        # Whole numbers only: a fraction or an unknown key is a mistake, not something
        # to round or leave out.
        if isinstance(value, dict) and set(value) == {"ledger", "entry"}:
            numbers = [value["ledger"], value["entry"]]
        elif isinstance(value, tuple | list) and len(value) == 2:
            numbers = list(value)
        else:
            numbers = []
        if numbers and all(type(n) is int for n in numbers):
            return cls(numbers[0], numbers[1])
        raise InvalidArgumentError(f"not a log position: {value!r}")


class Record(NamedTuple):
    """One record of a log: where it is, the bytes appended, and when.

    ``timestamp_ms`` is the append time the writer put in the record's header
    (milliseconds since the Unix epoch; see :mod:`quorumlog.log.record_format`)."""

    position: Position
    data: bytes
    timestamp_ms: int


class LogPositions(NamedTuple):
    """What :meth:`Log.positions` reports.

    ``first`` and ``last`` are None for an empty log. ``record_count`` counts the
    records from ``first`` to ``last``; it is exact when ``count_exact`` (every ledger
    but possibly an empty last one is closed), else a lower bound: a ledger still
    being written counts up to the last add confirmed that its bookies reported.
    """

    first: Position | None
    last: Position | None
    record_count: int
    count_exact: bool
    ledgers: tuple[int, ...]


__all__ = ["LogPositions", "Position", "Record"]
