"""A metadata store from its URI: the one place that knows every driver.

``sqlite:///absolute/path.db`` opens the embedded store (:mod:`quorumlog.meta.sqlite_store`),
``zk://host:port[,host:port...][/root]`` ZooKeeper through kazoo
(:mod:`quorumlog.meta.zk_store`). Without a URI, ``$QUORUMLOG_METADATA`` is used, else
``./.quorumlog/metadata.db``.

Each driver is imported only when a URI names it, so that opening an SQLite store does
not load kazoo.
"""

from __future__ import annotations

import os

from quorumlog.errors import InvalidArgumentError
from quorumlog.meta.store import MetadataStore

ENV_METADATA_URI = "QUORUMLOG_METADATA"


def default_metadata_uri() -> str:
    """Explicit argument first, else ``QUORUMLOG_METADATA``, else ``./.quorumlog/metadata.db``."""
    from_env = os.environ.get(ENV_METADATA_URI)
    if from_env:
        return from_env
    return "sqlite://" + os.path.abspath(os.path.join(".quorumlog", "metadata.db"))


def resolve_metadata_uri(uri: str | None) -> str:
    """``uri``, else :func:`default_metadata_uri`; InvalidArgumentError if no driver takes it."""
    chosen = uri or default_metadata_uri()
    if not (chosen.startswith("sqlite:///") or chosen.startswith("zk://")):
        raise InvalidArgumentError(
            f"metadata URI {chosen!r}: expected sqlite:///absolute/path or zk://host:port[/root]"
        )
    return chosen


async def open_store(
    uri: str | None = None, *, session_timeout_ms: int = 10_000, create: bool = True
) -> MetadataStore:
    """Open the store named by ``uri`` (see :func:`resolve_metadata_uri`) on the running loop.

    ``create``: make the store if it does not exist (the SQLite file and its directory,
    ZooKeeper's root node). Bookies do. Clients pass False (``BookKeeper.connect``, the
    leader election) and get a MetadataError naming the missing store instead: a
    mistyped URI must not give a new, empty cluster that answers "no bookies".
    """
    chosen = resolve_metadata_uri(uri)
    if chosen.startswith("sqlite://"):
        from quorumlog.meta.sqlite_store import SqliteStore

        return await SqliteStore.open(chosen, session_timeout_ms=session_timeout_ms, create=create)
    from quorumlog.meta.zk_store import ZkStore

    return await ZkStore.open(chosen, session_timeout_ms=session_timeout_ms, create=create)
