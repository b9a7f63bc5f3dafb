"""The in-process page cache: reassembled pages, bounded by bytes."""

from __future__ import annotations

from cachetools import LRUCache

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class PageCache:
    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._lru: LRUCache[str, bytes] = LRUCache(maxsize=max_bytes, getsizeof=len)
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        data = self._lru.get(key)
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) <= self._lru.maxsize:
            self._lru[key] = data

    @property
    def current_bytes(self) -> int:
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)
