"""Where a ``quorumlog bench`` workload runs: the cluster of a given metadata URI, or a
temporary local cluster started for the run and removed after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from quorumlog.bench.workloads import BenchSettings, ProgressCallback, Result, run_workload


@contextlib.contextmanager
def bench_cluster(
    metadata_uri: str | None,
    bookies: int,
    *,
    journal_sync: bool = True,
    bookie_options: Sequence[str] = (),
) -> Iterator[tuple[str, list[str]]]:
    """The metadata URI to run on and the addresses of the bookies started for it: the
    given URI and none, or ``bookies`` local bookie processes (with ``bookie_options``)
    in a temporary directory, stopped and removed on exit."""
    if metadata_uri:
        yield metadata_uri, []
        return
    from quorumlog.server.local_cluster import temporary_cluster

    with temporary_cluster(
        bookies,
        prefix="quorumlog-bench-",
        journal_sync=journal_sync,
        extra_args=bookie_options,
    ) as cluster:
        yield cluster.metadata_uri, cluster.addresses


def run_workload_blocking(
    workload: str,
    settings: BenchSettings,
    metadata_uri: str,
    *,
    progress: ProgressCallback | None = None,
) -> Result:
    """:func:`quorumlog.bench.workloads.run_workload` on an event loop of its own (uvloop
    when present), closed at the end."""
    from quorumlog.client.sync import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(
            run_workload(workload, settings, metadata_uri, progress=progress)
        )
    finally:
        loop.close()
