"""The simulator's seeded runs under their earlier names (kept for existing callers).

``run_scenario(seed)`` is :func:`quorumlog.testing.sim.workloads.run_seed` and
``check_history(history)`` is :func:`quorumlog.testing.checkers.check_run`; see
:mod:`quorumlog.testing.sim`.
"""

from __future__ import annotations

from quorumlog.testing.checkers import RunHistory as History
from quorumlog.testing.checkers import check_run as check_history
from quorumlog.testing.sim.cluster import SIM_CONFIG
from quorumlog.testing.sim.workloads import run_seed as run_scenario

__all__ = ["SIM_CONFIG", "History", "check_history", "run_scenario"]
