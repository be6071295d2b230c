"""Serving processes (bookie, db replica) freeze their start-up objects out of the cyclic
collector and collect the youngest generation less often."""

from __future__ import annotations

import subprocess
import sys

from quorumlog.server.memory_tuning import YOUNG_THRESHOLD

PROBE = """
import gc
from quorumlog.server.memory_tuning import tune_for_serving
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


MALLOC_PROBE = """
import resource
import sys
from quorumlog.server.memory_tuning import keep_freed_memory
taken = keep_freed_memory() if sys.argv[1] == "keep" else False
faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    blocks = [bytearray(1024 * 1024) for _ in range(8)]  # a few big frames at once
    del blocks
print(int(taken), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before)
"""


def _page_faults(mode: str) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", MALLOC_PROBE, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    taken, faults = map(int, out)
    return taken, faults


def test_keep_freed_memory_reuses_big_blocks_instead_of_fresh_pages():
    """With glibc's defaults, blocks of 1 MiB freed together go back to the system and
    the next ones start on fresh pages (256 page faults a block); kept, they are reused."""
    taken, faults_kept = _page_faults("keep")
    _, faults_default = _page_faults("default")
    assert taken == 1  # glibc, as on every machine this runs on
    assert faults_kept < 8 * 256 * 4  # about the first round's pages
    assert faults_default > 10 * faults_kept  # what the setting is for
