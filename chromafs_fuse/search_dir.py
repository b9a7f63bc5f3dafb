"""The mount's optional search directory (`--search-dir .search`): reading `.search/<query>`
gives `chromafs search <query>`'s ranked list for the mount's reader.

The directory is found by name only: it never shows in a listing, so `ls`, `find` and
`grep -r` never see or descend into it. Every lookup of a query runs the search afresh and
answers with a new inode whose attributes the kernel may not cache, so a result is never
stale; the bytes of recent results are kept until the kernel forgets their inode.
Its inodes lie above every inode of the tree (those are below 2**63). `DocsFilesystem`
dispatches to it; the search itself is handed in (serving/daemon/mount.py runs it off the loop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cachetools import LRUCache

from chromafs_fuse.inodes import ROOT_INODE

SEARCH_INODE = 1 << 63  # the directory; results follow it
KEPT_RESULTS = 256


class SearchDir:
    def __init__(self, name: str, search: Callable[[str], Awaitable[bytes]]) -> None:
        self.name = name.encode("utf-8")
        self.search = search  # the query's ranked list as the file's bytes
        self._results: LRUCache[int, bytes] = LRUCache(KEPT_RESULTS)
        self._next = SEARCH_INODE + 1

    @staticmethod
    def owns(inode: int) -> bool:
        return inode >= SEARCH_INODE

    def is_directory(self, parent_inode: int, name: bytes) -> bool:
        """Whether the name is the directory's own, in the root."""
        return parent_inode == ROOT_INODE and name == self.name

    async def query(self, name: bytes) -> int:
        """Run the query a name in the directory spells; returns the new inode holding its answer."""
        content = await self.search(name.decode("utf-8", "surrogateescape"))
        inode = self._next
        self._next += 1
        self._results[inode] = content
        return inode

    def content(self, inode: int) -> bytes | None:
        return self._results.get(inode)

    def forget(self, inode: int) -> None:
        self._results.pop(inode, None)
