"""The in-process page cache: reassembled pages, bounded by bytes."""

from __future__ import annotations

from cachetools import LRUCache

from chromafs_fuse.options import DEFAULTS

OVERSIZE_PAGES = 2


class PageCache:
    def __init__(self, max_bytes: int = DEFAULTS["--cache-bytes"]) -> None:
        self._lru: LRUCache[str, bytes] = LRUCache(maxsize=max_bytes, getsizeof=len)
        self._oversize: dict[str, bytes] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> bytes | None:
        data = self._lru.get(key)
        if data is None:
            data = self._oversize.get(key)
        if data is None:
            self.misses += 1
        else:
            self.hits += 1
        return data

    def put(self, key: str, data: bytes) -> None:
        if len(data) <= self._lru.maxsize:
            self._lru[key] = data
        else:
            # Too big for the bound: keep only the most recent few, so that reading one
            # huge page does not fetch it again for every read request.
            self._oversize[key] = data
            while len(self._oversize) > OVERSIZE_PAGES:
                del self._oversize[next(iter(self._oversize))]

    def pop(self, key: str) -> None:
        self._lru.pop(key, None)
        self._oversize.pop(key, None)

    def peek(self, key: str) -> bytes | None:
        """Like get, without counting a hit or a miss."""
        data = self._lru.get(key)
        return self._oversize.get(key) if data is None else data

    def __contains__(self, key: str) -> bool:
        """A peek that does not count as a hit or a miss."""
        return key in self._lru or key in self._oversize

    @property
    def current_bytes(self) -> int:
        return int(self._lru.currsize)

    def __len__(self) -> int:
        return len(self._lru)
