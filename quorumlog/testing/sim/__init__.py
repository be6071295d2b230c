"""The whole-system simulator: the real client and the real bookie, in virtual time.

One seed drives one run, replayable exactly:

- :mod:`.loop`: :class:`VirtualTimeLoop` (the clock jumps to the next timer) and
  :class:`SimExecutor` (a bookie's threads as ordered jobs on the loop);
- :mod:`.disk`: :class:`SimDisk` (unsynced writes lost or torn at a power loss, a
  sync that fails once, ENOSPC, flipped bits, lost directory entries) and
  :class:`MemoryIndex` (the index with LMDB's guarantees);
- :mod:`.cluster`: :class:`BookieNode` (the real :class:`~quorumlog.bookie.bookie.Bookie`
  on a simulated machine: kill, power loss, pause, restart), :class:`SimNetwork`
  (the real codec, per-connection order, delays, drops, partitions) and
  :class:`Cluster` (nodes, network, metadata and clients together);
- :mod:`quorumlog.testing.checkers`: the rules, checked on the history, apart from
  the system.

The project's own workloads, faults drawn from the seed and the seeded runs live with
its tests (``tests/harness/sim``): ``python -m tests.harness.sim --seed N --trace``
from the repository root replays one seed with a readable trace; ``--seeds A..B``
runs a range (docs/TESTING.md).
"""

from quorumlog.testing.sim.cluster import (
    SIM_CONFIG,
    BookieNode,
    ClientPool,
    Cluster,
    NetworkFaults,
    SimNetwork,
    Trace,
)
from quorumlog.testing.sim.disk import DiskFaults, MemoryIndex, PowerLoss, SimDisk, SimFiles
from quorumlog.testing.sim.loop import SimExecutor, SimulationDeadlock, VirtualTimeLoop

__all__ = [
    "SIM_CONFIG",
    "BookieNode",
    "ClientPool",
    "Cluster",
    "DiskFaults",
    "MemoryIndex",
    "NetworkFaults",
    "PowerLoss",
    "SimDisk",
    "SimExecutor",
    "SimFiles",
    "SimNetwork",
    "SimulationDeadlock",
    "Trace",
    "VirtualTimeLoop",
]
