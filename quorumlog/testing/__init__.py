"""Tools to test your own application on quorumlog: real clusters, faults, a simulator.

The same tools quorumlog's own tests use, with a small surface:

Real processes on this machine
    :func:`local_cluster` -- N real bookie processes and a metadata store (embedded,
    or a ZooKeeper of yours) as a context manager; yields a :class:`LocalCluster`
    (``metadata_uri``, ``addresses``, ``bookies`` with their pids, and the faults
    ``kill(i)`` (kill -9), ``stop(i)``, ``pause(i)`` (SIGSTOP), ``resume(i)``,
    ``restart(i)``, ``start_new_bookie()``).
    :class:`ZooKeeperServer` -- a real standalone ZooKeeper (Debian's ``zookeeper``
    package and Java) on a free port, for code that must run on ZooKeeper;
    :func:`zookeeper_installed` says whether it can start.
    :func:`kill_process`, :func:`pause_process`, :func:`resume_process` -- the same
    faults for your application's own processes, by pid.

In one process, no I/O
    :class:`MemoryStore` (sessions over a shared :class:`MemoryTree`) -- a metadata
    store with ZooKeeper's semantics (versions, ephemeral and sequential nodes,
    watches, session expiry) in memory.
    :class:`VirtualTimeLoop`, :class:`Cluster`, :class:`SimDisk`, :class:`SimNetwork`,
    :class:`NetworkFaults` -- the seeded whole-system simulator: the real client and the
    real bookie on simulated machines (a disk that loses unsynced writes at a power loss,
    fails syncs, fills up, flips bits), over a network that delays, reorders across
    connections, drops and partitions, on a loop whose clock jumps to the next timer
    (one seed, one run). :class:`MetadataFaults` make a :class:`MemoryStore` lose
    replies, fail, answer late or be cut off.
    :func:`check_run` and :mod:`quorumlog.testing.checkers` -- the history checkers:
    what a run's clients were told, checked against the rules, apart from the system.

The wire protocol, raw
    :class:`RawClient` -- one connection to one bookie, raw requests and answers
    (no retries, no digest checks); :func:`make_entry` and :func:`master_key` build
    what a writer would send.

Example::

    from quorumlog import BookKeeper
    from quorumlog.testing import local_cluster

    with local_cluster(3) as cluster, BookKeeper(cluster.metadata_uri) as bk:
        ledger = bk.create_ledger(3, 3, 3)  # each entry confirmed by all three bookies
        ledger.add_entry(b"hello")
        ledger.close()
        cluster.kill(0)  # kill -9, by pid
        assert bk.open_ledger(ledger.ledger_id).read_entries(0, 0)[0].data == b"hello"
        cluster.restart(0)  # same directories and port: it still has the entry

See docs/TESTING.md, "Testing your application with quorumlog.testing".
Nothing shipped imports this package: it is for tests.
"""

from quorumlog.server.local_cluster import BookieProcess, ClusterError, LocalCluster
from quorumlog.server.local_zookeeper import (
    ZooKeeperServer,
    ZooKeeperUnavailableError,
    zookeeper_installed,
)
from quorumlog.testing.checkers import RunHistory, check_run
from quorumlog.testing.faults import kill_process, pause_process, resume_process
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
    "kill_process",
    "local_cluster",
    "make_entry",
    "master_key",
    "pause_process",
    "resume_process",
    "zookeeper_installed",
]
