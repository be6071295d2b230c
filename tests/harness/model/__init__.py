"""A bounded, exhaustive model checker over the pure core (``core/``).

It drives the real state machines (``LedgerWriter``, ``LedgerRecoveryMachine`` and the
metadata update policy they share) through every interleaving of a small world: a few
bookies and spares, a few entries, one writer, one recovery started at any point,
messages delivered in any order or dropped, bookies that crash, metadata replies lost
after or before the write. In every state it checks the rules of the design guide
(``invariants.py``). A violation comes with the list of steps that led to it, which
:func:`replay` plays again and :func:`explain` prints.

    python -m tests.harness.model --entries 3 --depth 40

``world.py`` is the world, ``explore.py`` the search, ``invariants.py`` the rules.
"""

from tests.harness.model.explore import (
    Counterexample,
    Result,
    TraceCheck,
    check_trace,
    explain,
    explore,
)
from tests.harness.model.invariants import Violation, check, check_end
from tests.harness.model.world import ModelError, World, WorldConfig, replay

__all__ = [
    "Counterexample",
    "ModelError",
    "Result",
    "TraceCheck",
    "Violation",
    "World",
    "WorldConfig",
    "check",
    "check_end",
    "check_trace",
    "explain",
    "explore",
    "replay",
]
