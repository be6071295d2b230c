"""Memory settings for a long-running server process: the cyclic garbage collector's,
and glibc malloc's for the big buffers of large entries."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

# Objects allocated (and not freed) between two collections of the youngest generation.
# Python's 700 ran one every few requests: a bookie's add request, a replica's decoded
# record make dozens to hundreds of objects, and with every start-up object (modules,
# functions, the metadata client) in the oldest generation each full collection walked
# them all again.
YOUNG_THRESHOLD = 20_000

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap, not from a mapping of their own (frames of
# large entries, the entry log's 5 MiB write buffers).
MMAP_THRESHOLD_BYTES = 8 * 1024 * 1024
# Free memory kept at the top of a heap instead of being given back to the system, and
# the extra asked for whenever a heap grows. Kept small enough that what a burst leaves
# behind stays well within a bookie's memory bounds (tests/faults/test_hostile_frames.py:
# 52 MB of growth under a peer that reads no answers, 50 MB with glibc's defaults; 256
# MiB here made it 78 MB).
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024
TOP_PAD_BYTES = 1024 * 1024


def tune_for_serving() -> None:
    """Fewer, cheaper cyclic collections for a process that has finished starting: the
    objects of start-up are frozen out of every collection, and the youngest generation
    is collected every :data:`YOUNG_THRESHOLD` allocations. Reference counting frees a
    request's objects as before; only cycles wait longer."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def keep_freed_memory() -> bool:
    """Make glibc malloc keep and reuse the memory of big blocks instead of mapping and
    unmapping it for each (the frames and buffers of large entries: 64 KiB to several
    MiB). By default a block over 128 KiB gets a mapping of its own, or a heap's free top
    is given back to the system, so the next block of that size starts on fresh pages:
    each first touched again, a page fault per 4 KiB, and on a virtual machine whose host
    backs guest memory only when it is touched, a far costlier fault on the host. Fixed
    thresholds keep up to :data:`TRIM_THRESHOLD_BYTES` of freed memory per heap for
    reuse. Does nothing (returns False) where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (_M_TOP_PAD, TOP_PAD_BYTES),
        )
    )
    if not done:
        log.debug("malloc settings not taken; the C library's defaults stay")
    return done
