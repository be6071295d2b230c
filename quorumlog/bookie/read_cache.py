"""A bounded LRU cache of entries read from entry logs.

Keyed by location (log id, offset), not by (ledger, entry): a record never
changes once written, and an entry that a recovery add rewrites gets a new
location, so the cache never serves a stale copy and needs no invalidation.
Entries read out of the entry log's write buffer go through it too, so that
many readers of one entry (tailing readers, a peer repeating a read) share one
bytes object instead of each holding its own copy.
"""

from __future__ import annotations

from collections import OrderedDict


class ReadCache:
    """LRU by bytes held; ``max_bytes`` 0 disables it."""

    __slots__ = ("_items", "hits", "max_bytes", "misses", "size_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size_bytes = 0
        self._items: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[int, int]) -> bytes | None:
        blob = self._items.get(key)
        if blob is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return blob

    def put(self, key: tuple[int, int], blob: bytes) -> None:
        size = len(blob)
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.size_bytes -= len(old)
        self._items[key] = blob
        self.size_bytes += size
        items = self._items
        while self.size_bytes > self.max_bytes:
            _, evicted = items.popitem(last=False)
            self.size_bytes -= len(evicted)

    def drop_log(self, log_id: int) -> None:
        """Forget every entry of a deleted entry log."""
        for key in [k for k in self._items if k[0] == log_id]:
            self.size_bytes -= len(self._items.pop(key))

    def __len__(self) -> int:
        return len(self._items)
