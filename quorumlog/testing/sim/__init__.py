"""The whole-system simulator's engine: the real client and the real bookie, in virtual
time, one seed one run (:mod:`.loop`: the clock and the bookie's threads; :mod:`.disk`:
a disk that loses unsynced writes, fails syncs, fills up and flips bits, and the index;
:mod:`.cluster`: machines, network and clients). The project's own workloads and
seeded runs live with its tests: ``python -m tests.harness.sim --seed N --trace``
replays one seed (docs/TESTING.md).
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
