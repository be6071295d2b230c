"""The benchmarks ``quorumlog bench`` runs, outside the core packages: the ledger and
log workloads (:mod:`quorumlog.bench.workloads`), where they run
(:mod:`quorumlog.bench.runner`: a given cluster or a temporary local one), their
figures (:mod:`quorumlog.bench.plot`), and the replicated database beside PostgreSQL
(:mod:`quorumlog.bench.db`). The command only parses and prints; the comparison with
other systems (``bench/`` at the repository root) imports these modules.
"""
