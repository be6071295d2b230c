"""Helpers of ``bench/compare.py``: one module per system it measures.

Each module starts its system on 127.0.0.1 in a temporary directory, runs the
common workload (appends of 100-byte records, three replicas, one client) one at a
time and pipelined, and stops every process it started by its pid. ``common`` holds
what they share: process bookkeeping, installation of missing packages, and the two
measurement loops with their HDR histograms.
"""
