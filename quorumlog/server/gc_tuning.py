"""The cyclic garbage collector's settings for a long-running server process."""

from __future__ import annotations

import gc

# Objects allocated (and not freed) between two collections of the youngest generation.
# Python's 700 ran one every few requests: a bookie's add request, a replica's decoded
# record make dozens to hundreds of objects, and with every start-up object (modules,
# functions, the metadata client) in the oldest generation each full collection walked
# them all again.
YOUNG_THRESHOLD = 20_000


def tune_for_serving() -> None:
    """Fewer, cheaper cyclic collections for a process that has finished starting: the
    objects of start-up are frozen out of every collection, and the youngest generation
    is collected every :data:`YOUNG_THRESHOLD` allocations. Reference counting frees a
    request's objects as before; only cycles wait longer."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
