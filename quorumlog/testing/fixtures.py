"""A local cluster of real bookie processes for your tests, as a context manager
(docs/TESTING.md shows it in a pytest fixture)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from quorumlog.server.local_cluster import LocalCluster, embedded_metadata_uri, temporary_cluster


@contextlib.contextmanager
def local_cluster(
    num_bookies: int = 3,
    *,
    base_dir: Path | str | None = None,
    metadata_uri: str | None = None,
    journal_sync: bool = True,
    extra_args: Sequence[str] = (),
    start_timeout_s: float = 60.0,
) -> Iterator[LocalCluster]:
    """``num_bookies`` bookie processes on 127.0.0.1 (free ports), started and registered
    when the block begins, all stopped (by pid) when it ends, whatever happened.

    The metadata store is ``metadata_uri`` (for instance a
    :class:`~quorumlog.server.local_zookeeper.ZooKeeperServer`'s ``uri("/my-test")``), else an
    embedded one in the cluster's directory: ``cluster.metadata_uri`` is what clients
    connect to. The directories (data, journal, each bookie's stdout and stderr logs) are
    under ``base_dir``, which is kept for a post-mortem (pytest's ``tmp_path``), else in a
    temporary directory removed at the end. ``extra_args`` go to every bookie's
    command line (``python -m quorumlog.server``: the flags of ``quorumlog bookie`` but
    ``--config`` and ``--autorecovery``); ``journal_sync=False`` makes the bookies
    acknowledge before they fsync (faster, and unsafe: for tests that do not cut the
    power).
    """
    clusters: contextlib.AbstractContextManager[LocalCluster]
    if base_dir is None:
        clusters = temporary_cluster(
            num_bookies,
            metadata_uri=metadata_uri,
            prefix="quorumlog-test-",
            journal_sync=journal_sync,
            extra_args=extra_args,
            start_timeout_s=start_timeout_s,
        )
    else:
        base = Path(base_dir).absolute()
        base.mkdir(parents=True, exist_ok=True)
        clusters = LocalCluster(
            metadata_uri or embedded_metadata_uri(base),
            base,
            num_bookies,
            journal_sync=journal_sync,
            extra_args=extra_args,
            start_timeout_s=start_timeout_s,
        )
    with clusters as cluster:
        yield cluster


__all__ = ["local_cluster"]
