"""How the explorer keeps, copies and tells apart the states of the core's machines.

A state machine is kept as the bytes of its pickle (:func:`snapshot`): the bytes tell
states apart, and :func:`restore` makes the private copy a step changes, which is
``copy.deepcopy`` at a fifth of the cost (pickling runs in C). Both read every field of
every object, so a field the core adds later is part of the state without a change
here. :func:`freeze` turns the small values beside them (an effect under way, with the
partial that decides it) into a hashable form, field by field.
"""

from __future__ import annotations

import enum
import pickle
import types
from collections.abc import Iterable
from functools import partial
from typing import Any

_ATOMIC = frozenset({int, str, bytes, bool, float, type(None)})
_ATTRS: dict[type, tuple[str, ...]] = {}


def attributes(cls: type) -> tuple[str, ...]:
    """The slot names of ``cls`` and its bases, bases first."""
    names = _ATTRS.get(cls)
    if names is None:
        found: list[str] = []
        for klass in reversed(cls.__mro__):
            slots = klass.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in found and name not in ("__dict__", "__weakref__"):
                    found.append(name)
        names = _ATTRS[cls] = tuple(found)
    return names


def snapshot(value: object) -> bytes:
    """The state of a state machine as bytes: what the explorer keeps to copy it
    (:func:`restore`) and to tell states apart. Equal bytes mean equal states; equal
    states give equal bytes but for the order of dicts and sets (then a state is
    explored twice, which costs time, not coverage)."""
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def restore(state: bytes) -> Any:
    """A fresh copy of the state machine :func:`snapshot` took."""
    return pickle.loads(state)


def _sorted(items: Iterable[Any]) -> tuple[Any, ...]:
    values = list(items)
    try:
        return tuple(sorted(values))
    except TypeError:
        return tuple(sorted(values, key=repr))


def freeze(value: Any) -> Any:
    """A hashable value, equal for equal states: containers become tuples (sets and
    dicts sorted), objects a tuple of their type's name and their fields, functions and
    partials their names and arguments, errors their type's name (the message says
    nothing the state does not)."""
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is tuple or kind is list:
        return tuple(freeze(v) for v in value)
    if kind is set or kind is frozenset:
        return _sorted(freeze(v) for v in value)
    if kind is dict:
        return _sorted((freeze(k), freeze(v)) for k, v in value.items())
    if isinstance(value, enum.Enum):
        return (kind.__name__, value.value)
    if isinstance(value, BaseException):
        return kind.__name__
    if isinstance(value, partial):
        return ("partial", freeze(value.func), freeze(value.args), freeze(value.keywords))
    if isinstance(value, types.FunctionType | types.BuiltinFunctionType | types.MethodType):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, tuple):  # a named tuple
        return (kind.__name__, *(freeze(v) for v in value))
    parts: list[Any] = [kind.__name__]
    for name in attributes(kind):
        parts.append(freeze(getattr(value, name, None)))
    state = getattr(value, "__dict__", None)
    if state is not None:
        parts.append(_sorted((k, freeze(v)) for k, v in state.items()))
    return tuple(parts)
