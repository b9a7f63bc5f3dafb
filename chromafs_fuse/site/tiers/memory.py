"""The in-process tier: reassembled pages and lazy files' blocks in a bytes-bounded cache.

Used on the trio loop only (or under a front end's lock): it never blocks.
"""

from __future__ import annotations

from collections.abc import Sequence

from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.tree import PathEntry


def memory_key(page_key: str, sha256: str | None, tree_version: str) -> str:
    return f"{sha256 or tree_version}:{page_key}"


def block_key(url: str, block: int) -> str:
    return f"blob:{url}:{block}"


class MemoryTier:
    name = "memory"

    def __init__(self, cache: PageCache) -> None:
        self.cache = cache

    def key_of(self, entry: PathEntry, tree_version: str) -> str:
        return memory_key(entry.key, entry.sha256, tree_version)

    def fetch(self, entries: Sequence[PathEntry], tree_version: str) -> dict[str, bytes]:
        """Counts a hit or a miss for each page."""
        found: dict[str, bytes] = {}
        for entry in entries:
            data = self.cache.get(self.key_of(entry, tree_version))
            if data is not None:
                found[entry.key] = data
        return found

    def fill(self, pages: Sequence[tuple[PathEntry, bytes]], tree_version: str) -> None:
        for entry, data in pages:
            self.cache.put(self.key_of(entry, tree_version), data)

    # -- by key, for the composer's in-flight bookkeeping and the kernel push -----------

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key)

    def peek(self, key: str) -> bytes | None:
        """As `get`, counting nothing."""
        return self.cache.peek(key)

    def put(self, key: str, data: bytes) -> None:
        self.cache.put(key, data)

    def pop(self, key: str) -> None:
        self.cache.pop(key)

    def __contains__(self, key: str) -> bool:
        return key in self.cache
