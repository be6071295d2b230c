"""The project's own test harness, beside its tests and not shipped: the simulator's
workloads, nemeses and seeded runs (:mod:`tests.harness.sim`), the model checker over
``quorumlog.core`` (:mod:`tests.harness.model`), and clusters across network namespaces
with nemeses and a Jepsen-style checker (:mod:`tests.harness.netns`, as root).

They build on the public :mod:`quorumlog.testing` (the simulator's engine, the history
checkers, the in-memory store, the local cluster). Run their entry points from the
repository root, where ``tests`` is importable::

    python -m tests.harness.sim --seeds 0..100
    python -m tests.harness.model
    sudo python -m tests.harness.netns --help
"""
