"""Tools to test your own application on quorumlog (docs/TESTING.md has the table).

- Real processes: :func:`local_cluster` (N bookie processes and a metadata store, as a
  context manager; its :class:`LocalCluster` kills, stops, pauses, resumes and restarts
  bookies by pid) and :class:`ZooKeeperServer` (a real standalone ZooKeeper).
- In one process: :class:`MemoryStore` (ZooKeeper's semantics in memory, with
  :class:`MetadataFaults`) and the seeded simulator's engine (:class:`VirtualTimeLoop`,
  :class:`Cluster`, :class:`SimDisk`, :class:`SimNetwork`, :class:`NetworkFaults`).
- The history checkers (:func:`check_run`, :mod:`quorumlog.testing.checkers`) and a raw
  protocol client (:class:`RawClient`, :func:`make_entry`, :func:`master_key`).

Your own processes take the same faults from the standard library, by pid:
``os.kill(pid, signal.SIGKILL)`` (a crash), ``SIGSTOP`` (a pause), ``SIGCONT``.
Nothing shipped imports this package: it is for tests.
"""

from quorumlog.server.local_cluster import BookieProcess, ClusterError, LocalCluster
from quorumlog.server.local_zookeeper import (
    ZooKeeperServer,
    ZooKeeperUnavailableError,
    zookeeper_installed,
)
from quorumlog.testing.checkers import RunHistory, check_run
from quorumlog.testing.fixtures import local_cluster
from quorumlog.testing.memory_store import MemoryStore, MemoryTree, MetadataFaults
from quorumlog.testing.raw_client import RawClient, make_entry, master_key
from quorumlog.testing.sim import (
    SIM_CONFIG,
    Cluster,
    NetworkFaults,
    SimDisk,
    SimNetwork,
    SimulationDeadlock,
    VirtualTimeLoop,
)

__all__ = [
    "SIM_CONFIG",
    "BookieProcess",
    "Cluster",
    "ClusterError",
    "LocalCluster",
    "MemoryStore",
    "MemoryTree",
    "MetadataFaults",
    "NetworkFaults",
    "RawClient",
    "RunHistory",
    "SimDisk",
    "SimNetwork",
    "SimulationDeadlock",
    "VirtualTimeLoop",
    "ZooKeeperServer",
    "ZooKeeperUnavailableError",
    "check_run",
    "local_cluster",
    "make_entry",
    "master_key",
    "zookeeper_installed",
]
