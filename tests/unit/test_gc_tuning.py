"""Serving processes (bookie, db replica) freeze their start-up objects out of the cyclic
collector and collect the youngest generation less often."""

from __future__ import annotations

import subprocess
import sys

from quorumlog.server.gc_tuning import YOUNG_THRESHOLD

PROBE = """
import gc
from quorumlog.server.gc_tuning import tune_for_serving
before = gc.get_threshold()
tune_for_serving()
print(gc.get_freeze_count(), *gc.get_threshold(), *before[1:])
"""


def test_tune_for_serving_freezes_start_up_objects_and_raises_the_young_threshold():
    # In a child: freezing this test process's objects would outlive the test.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    frozen, young, middle, old, middle_before, old_before = map(int, out)
    assert frozen > 1000  # the modules and functions imported so far
    assert young == YOUNG_THRESHOLD and young > 700
    assert (middle, old) == (middle_before, old_before)
