"""A linearizability checker: Wing and Gong's search with Lowe's memoization (the
algorithm of Porcupine and Knossos's ``linear``), for small histories of one object.

A model is a pure sequential specification: ``step(state, op) -> (allowed, new_state)``.
The search tries to place each operation at one instant between its invocation and
its completion so that the sequence the model runs allows every answer. Operations
whose outcome is unknown (``info``) may take effect at any time after their
invocation, or never; failed ones (``fail``) never happened and are left out.

Histories of several independent objects (database rows by key) are checked one key
at a time (linearizability is compositional), which keeps each search small.

Example::

    result = check_linearizable(ListAppendModel(), operations)
    assert result.linearizable, result.explanation
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tests.harness.netns.history import Operation

_NEVER_NS = 1 << 62  # the end of time: when an unknown outcome "completes"


class Model(Protocol):
    """A sequential specification; states must be hashable (the search caches them)."""

    def initial(self) -> Hashable: ...

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]: ...


class ListAppendModel:
    """A list per key: ``append`` adds ``op.value`` at the end; ``read`` answers the
    whole list (``op.result``, a sequence), which must equal the state."""

    def initial(self) -> Hashable:
        return ()

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        assert isinstance(state, tuple)
        if op.f == "append":
            return True, (*state, op.value)
        if op.f == "read":
            if op.completion != "ok":
                return True, state  # a read that never answered constrains nothing
            return tuple(op.result) == state, state
        raise ValueError(f"ListAppendModel has no operation {op.f!r}")


class OrderedListAppendModel:
    """:class:`ListAppendModel` for unique values whose order is known: the list as the
    last read found it (``order``). Appends only add at the end, so every state is a
    prefix of that list and appends take effect in its order; the state is the prefix
    length. This prunes the search from every interleaving of the unknown outcomes to
    the one order the system claims, so long histories check quickly. An append whose
    value is not in ``order`` can never take effect (so an acknowledged one makes the
    history fail), and the last read itself is checked like any other."""

    def __init__(self, order: Sequence[object]) -> None:
        self.order = tuple(order)

    def initial(self) -> Hashable:
        return 0

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        assert isinstance(state, int)
        if op.f == "append":
            allowed = state < len(self.order) and self.order[state] == op.value
            return allowed, state + 1 if allowed else state
        if op.f == "read":
            if op.completion != "ok":
                return True, state
            return tuple(op.result) == self.order[:state], state
        raise ValueError(f"OrderedListAppendModel has no operation {op.f!r}")


class RegisterModel:
    """A register: ``write`` sets ``op.value``; ``read`` answers it (None at first)."""

    def initial(self) -> Hashable:
        return None

    def step(self, state: Hashable, op: Operation) -> tuple[bool, Hashable]:
        if op.f == "write":
            return True, op.value
        if op.f == "read":
            return (op.completion != "ok" or op.result == state), state
        raise ValueError(f"RegisterModel has no operation {op.f!r}")


@dataclass
class LinearizabilityResult:
    linearizable: bool
    operations: int
    explanation: str = ""
    states_explored: int = 0


@dataclass
class _Entry:
    """A call or a return in the doubly linked list the search lifts entries out of."""

    op_index: int
    is_call: bool
    time_ns: int
    match: _Entry | None = None
    prev: _Entry | None = None
    next: _Entry | None = None


def check_linearizable(
    model: Model, operations: Sequence[Operation], *, max_states: int = 2_000_000
) -> LinearizabilityResult:
    """Whether the operations (one object) are linearizable under ``model``.

    ``max_states`` bounds the search; past it the answer is "not shown linearizable"
    with an explanation saying the bound was hit (a bounded check never passes a
    history it did not finish checking)."""
    ops = [op for op in operations if op.completion != "fail"]
    if not ops:
        return LinearizabilityResult(True, 0)
    head = _entry_list(ops)
    state: Hashable = model.initial()
    linearized = 0  # a bitset of op indexes
    cache: set[tuple[int, Hashable]] = {(linearized, state)}
    stack: list[tuple[_Entry, Hashable]] = []
    cursor: _Entry | None = head.next
    explored = 0
    deepest = 0
    while True:
        if cursor is None or (not cursor.is_call and ops[cursor.op_index].completion != "ok"):
            # Only returns of unknown outcomes remain: every completed op is placed.
            return LinearizabilityResult(True, len(ops), states_explored=explored)
        if cursor.is_call:
            op = ops[cursor.op_index]
            allowed, new_state = model.step(state, op)
            explored += 1
            if explored > max_states:
                return LinearizabilityResult(
                    False,
                    len(ops),
                    f"search bound of {max_states} states reached: not shown linearizable",
                    explored,
                )
            if allowed:
                key = (linearized | (1 << cursor.op_index), new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((cursor, state))
                    deepest = max(deepest, len(stack))
                    state = new_state
                    linearized |= 1 << cursor.op_index
                    _lift(cursor)
                    cursor = head.next
                    continue
            cursor = cursor.next
        else:
            # A completed operation's return with its call not yet placed: backtrack.
            if not stack:
                return LinearizabilityResult(
                    False,
                    len(ops),
                    f"no order fits: at most {deepest} of {len(ops)} operations placed; "
                    f"first unplaceable return: {_describe(ops[cursor.op_index])}",
                    explored,
                )
            call, state = stack.pop()
            linearized &= ~(1 << call.op_index)
            _unlift(call)
            cursor = call.next


def _entry_list(ops: Sequence[Operation]) -> _Entry:
    """The head of a doubly linked list of every call and return of ``ops`` in time order,
    each call linked to its return (an operation of unknown outcome returns never)."""
    events: list[tuple[int, int, int]] = []  # (time, 0 for call / 1 for return, index)
    for index, op in enumerate(ops):
        end = op.end_ns if op.completion == "ok" and op.end_ns is not None else _NEVER_NS
        events.append((op.start_ns, 0, index))
        events.append((end, 1, index))
    # Returns before calls at equal times would order more than the history shows:
    # calls first, so simultaneous operations count as concurrent.
    events.sort(key=lambda item: (item[0], item[1]))
    head = _Entry(-1, False, -1)
    calls: dict[int, _Entry] = {}
    tail: _Entry = head
    for time_ns, kind, index in events:
        made = _Entry(index, kind == 0, time_ns)
        if kind == 0:
            calls[index] = made
        else:
            made.match = calls[index]
            calls[index].match = made
        tail.next = made
        made.prev = tail
        tail = made
    return head


def _lift(call: _Entry) -> None:
    """Take a call placed in the order, and its return, out of the list."""
    assert call.match is not None and call.prev is not None
    call.prev.next = call.next
    if call.next is not None:
        call.next.prev = call.prev
    ret = call.match
    assert ret.prev is not None
    ret.prev.next = ret.next
    if ret.next is not None:
        ret.next.prev = ret.prev


def _unlift(call: _Entry) -> None:
    """Put a lifted call and its return back where they were (backtracking)."""
    ret = call.match
    assert ret is not None and ret.prev is not None and call.prev is not None
    ret.prev.next = ret
    if ret.next is not None:
        ret.next.prev = ret
    call.prev.next = call
    if call.next is not None:
        call.next.prev = call


def _describe(op: Operation) -> str:
    answer = f" -> {op.result!r}" if op.f == "read" else ""
    return f"{op.process} {op.f}({op.value!r}){answer} [{op.op_id}]"


def check_by_key(
    model: Model, operations: Sequence[Operation], *, max_states: int = 2_000_000
) -> dict[str, LinearizabilityResult]:
    """:func:`check_linearizable` for each key's operations on its own."""
    by_key: dict[str, list[Operation]] = defaultdict(list)
    for op in operations:
        by_key[op.key].append(op)
    return {
        key: check_linearizable(model, ops, max_states=max_states)
        for key, ops in sorted(by_key.items())
    }


def describe_results(results: dict[str, LinearizabilityResult]) -> list[str]:
    """A line per key that is not linearizable."""
    return [f"{key}: {r.explanation}" for key, r in results.items() if not r.linearizable]


__all__ = [
    "LinearizabilityResult",
    "ListAppendModel",
    "Model",
    "OrderedListAppendModel",
    "RegisterModel",
    "check_by_key",
    "check_linearizable",
    "describe_results",
]
