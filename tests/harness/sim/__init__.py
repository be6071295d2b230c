"""The simulator's scenarios: what the clients do and what they were told
(:mod:`.workloads`), faults drawn from the seed (:mod:`.nemesis`), bookies lost for
good and autorecovery repairing them (:mod:`.autorecovery`), and many seeds at once
(:mod:`.runner`), over the engine of :mod:`quorumlog.testing.sim`.

``python -m tests.harness.sim --seed N --trace`` replays one seed with a readable
trace; ``--seeds A..B`` runs a range (docs/TESTING.md).
"""
