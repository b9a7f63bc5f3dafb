"""The mount's optional search directory (`--search-dir .search`): reading `.search/<query>`
gives `chromafs search <query>`'s ranked list for the mount's reader.

The directory is found by name only: it never shows in a listing, so `ls`, `find` and
`grep -r` never see or descend into it. Every lookup of a query runs the search afresh and
answers with a new inode whose attributes the kernel may not cache, so a result is never
stale; the bytes of recent results are kept until the kernel forgets their inode.
Its inodes lie above every inode of the tree (those are below 2**63).
"""

from __future__ import annotations

import stat
from collections.abc import Callable

import pyfuse3
import trio
from cachetools import LRUCache

SEARCH_INODE = 1 << 63  # the directory; results follow it
KEPT_RESULTS = 256


class SearchDir:
    def __init__(self, name: str, search: Callable[[str], bytes], cache_timeout_s: float, time_ns: int) -> None:
        self.name = name.encode("utf-8")
        self.search = search  # blocking: the query's ranked list as the file's bytes
        self.cache_timeout_s = cache_timeout_s
        self.time_ns = time_ns
        self._results: LRUCache[int, bytes] = LRUCache(KEPT_RESULTS)
        self._next = SEARCH_INODE + 1

    @staticmethod
    def owns(inode: int) -> bool:
        return inode >= SEARCH_INODE

    async def lookup(self, name: bytes) -> pyfuse3.EntryAttributes:
        """Run the query a name in the directory spells; a new inode holds its answer."""
        query = name.decode("utf-8", "surrogateescape")
        content = await trio.to_thread.run_sync(self.search, query)
        inode = self._next
        self._next += 1
        self._results[inode] = content
        return self.attributes(inode)

    def content(self, inode: int) -> bytes | None:
        return self._results.get(inode)

    def forget(self, inode: int) -> None:
        self._results.pop(inode, None)

    def attributes(self, inode: int) -> pyfuse3.EntryAttributes | None:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.st_uid, attrs.st_gid = 0, 0
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = self.time_ns
        if inode == SEARCH_INODE:
            attrs.st_mode = stat.S_IFDIR | 0o555
            attrs.st_nlink = 2
            attrs.entry_timeout = attrs.attr_timeout = self.cache_timeout_s
            return attrs
        content = self._results.get(inode)
        if content is None:
            return None
        attrs.st_mode = stat.S_IFREG | 0o444
        attrs.st_nlink = 1
        attrs.st_size = len(content)
        attrs.st_blksize = 4096
        attrs.st_blocks = (len(content) + 511) // 512
        attrs.entry_timeout = attrs.attr_timeout = 0  # each lookup searches again
        return attrs
