"""Path rules shared by the metadata drivers (the subset of ZooKeeper's that we rely on).

A path is absolute, ``/``-separated, has no trailing slash, no empty, ``.`` or
``..`` component and no NUL character. Both drivers check paths the same way so
that a path accepted by one is accepted by the other.
"""

from __future__ import annotations

from quorumlog.errors import MetadataError

ROOT = "/"


def check_path(path: str) -> str:
    """``path`` itself if it is a valid absolute metadata path, else MetadataError."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise MetadataError(f"bad metadata path {path!r}: must be an absolute path")
    if path == ROOT:
        return path
    if path.endswith("/") or "\x00" in path:
        raise MetadataError(f"bad metadata path {path!r}")
    for part in path[1:].split("/"):
        if part in ("", ".", ".."):
            raise MetadataError(f"bad metadata path {path!r}: empty, '.' or '..' component")
    return path


def parent_of(path: str) -> str:
    """The parent of a checked path (the parent of ``/a`` is ``/``)."""
    head = path.rsplit("/", 1)[0]
    return head or ROOT


def name_of(path: str) -> str:
    """The last component of a checked path."""
    return path.rsplit("/", 1)[1]


def ancestors_of(path: str) -> list[str]:
    """Proper ancestors of ``path`` below the root, outermost first.

    ``/a/b/c`` -> ``["/a", "/a/b"]``.
    """
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def check_counter_name(counter: str) -> str:
    """A counter name for ``next_id``: one non-empty path component."""
    if not counter or "/" in counter or "\x00" in counter or counter in (".", ".."):
        raise MetadataError(f"bad counter name {counter!r}: must be one path component")
    return counter


def check_id_count(counter: str, count: int) -> int:
    """How many ids one ``next_id`` call may reserve: 1 to 2**32."""
    if not isinstance(count, int) or not 1 <= count <= 1 << 32:
        raise MetadataError(f"next_id({counter!r}): count must be 1 to 2**32, got {count!r}")
    return count
