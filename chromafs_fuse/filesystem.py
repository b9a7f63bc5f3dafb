"""The filesystem's answers, independent of FUSE: what a name resolves to, what a directory
lists, whether a file may be opened, what a read returns, and with which errno it fails.

`DocsFilesystem` works on the reader's pruned inode table, so a hidden name and a missing
one take the same path and get the same answer. Reads go through a `PageReader` (the page
tiers) and tell the `ReadScheduler` what happened. The pyfuse3 adapter
(serving/fuse_adapter.py) only translates; the semantics are tested in-process against a fake
page source (tests/test_filesystem.py) as well as through real mounts.
See docs/SEMANTICS.md for the user-visible contract.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from chromafs_fuse.inodes import InodeTable, Node
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.tree import PathEntry

BLOCK_SIZE = 4096


class FsError(Exception):
    """A request fails with this errno."""

    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.errno = code


class PageUnavailable(Exception):
    """The page cannot be served now (corrupt, backend down, timed out): the read fails with EIO."""


class PageTimedOut(PageUnavailable):
    """The backend did not answer within the read's deadline."""


class PageReader(Protocol):
    """What the filesystem needs of the page tiers (site/page_source.PageSource)."""

    async def read(self, entry: PathEntry, offset: int, size: int) -> bytes: ...

    def size_of(self, entry: PathEntry) -> int | None: ...


@dataclass(frozen=True, slots=True)
class OpenReply:
    keep_cache: bool  # the kernel may keep the file's pages across opens
    direct_io: bool  # the kernel must not clamp reads to st_size (size not known yet)


@dataclass(frozen=True, slots=True)
class FsStats:
    block_size: int
    blocks: int
    files: int
    name_max: int = 255


MAX_REPLACED = 100_000  # old versions kept for readers holding them; the oldest go first


class DocsFilesystem:
    def __init__(
        self,
        table: InodeTable,
        pages: PageReader,
        scheduler: ReadScheduler,
        no_open: bool,
        replaced: Mapping[int, PathEntry] | None = None,
    ) -> None:
        self.table = table
        self.pages = pages
        self.scheduler = scheduler
        # Inodes of files a re-ingest replaced by a new version (under a new inode) -> the old
        # version. A reader that opened the old inode keeps reading it whole; nobody can look
        # it up any more, and the kernel's forget drops it. Only versions of paths this reader
        # may still see are kept (see carry_replaced): a removed or hidden page is gone.
        self.replaced: dict[int, PathEntry] = dict(replaced or {})
        # In no-open mode the kernel keeps pages across opens: only when every size is known.
        self.no_open = no_open and table.unknown_sizes == 0

    # -- names and directories ----------------------------------------------------

    def lookup(self, parent_inode: int, name: bytes) -> int | None:
        """The node index of `name` in that directory; None when absent or hidden (the same)."""
        index = self.table.lookup_index(parent_inode, name)
        return index if index >= 0 else None

    def index(self, inode: int) -> int:
        index = self.table.index_of(inode)
        if index < 0:
            raise FsError(errno.ENOENT)
        return index

    def file_size(self, index: int) -> int | None:
        """A file's size: from the tree, else learned by reading it; None until then."""
        size = self.table.size_at(index)
        if size is None and not self.table.is_dir_at(index):
            node = self.table.node(index)
            assert node.entry is not None
            size = self.pages.size_of(node.entry)
        return size

    def open_dir(self, inode: int) -> None:
        if not self.table.is_dir_at(self.index(inode)):
            raise FsError(errno.ENOTDIR)
        if self.no_open:
            raise FsError(errno.ENOSYS)  # the kernel stops asking, and caches listings

    def children(self, inode: int) -> tuple[int, range]:
        """(the directory's index, its children's indexes in listing order)."""
        index = self.index(inode)
        return index, self.table.children_at(index)

    def listed(self, index: int) -> None:
        self.scheduler.listed(index)

    # -- files ----------------------------------------------------------------------

    def open_file(self, inode: int, flags: int) -> OpenReply:
        entry = self.replaced.get(inode) or self._node(inode).entry
        if entry is None:
            raise FsError(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EROFS)
        if self.no_open:
            raise FsError(errno.ENOSYS)  # the kernel stops sending open and release
        size_known = self.pages.size_of(entry) is not None
        return OpenReply(keep_cache=size_known, direct_io=not size_known)

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """`inode` is the file handle in both modes (open mode hands out the inode)."""
        old_version = self.replaced.get(inode)
        if old_version is not None:
            return await self._read_entry(old_version, offset, size)
        node = self._node(inode)
        entry = node.entry
        if entry is None:
            raise FsError(errno.EISDIR)
        self.scheduler.reading(node, offset)
        data = await self._read_entry(entry, offset, size)
        self.scheduler.answered(node, offset + len(data))
        return data

    async def _read_entry(self, entry: PathEntry, offset: int, size: int) -> bytes:
        try:
            return await self.pages.read(entry, offset, size)
        except PageUnavailable:
            raise FsError(errno.EIO) from None

    def replaced_entry(self, inode: int) -> PathEntry | None:
        """The old version an inode replaced by a re-ingest still serves, if any."""
        return self.replaced.get(inode)

    def forget(self, inodes: Sequence[int]) -> None:
        """The kernel dropped these inodes: replaced versions among them are not needed now."""
        if self.replaced:
            for inode in inodes:
                self.replaced.pop(inode, None)

    def carry_replaced(
        self, replaced_now: Mapping[int, PathEntry], new_table: InodeTable
    ) -> tuple[dict[int, PathEntry], list[int]]:
        """The old versions the next tree's filesystem keeps serving: those held until now and
        those this switch replaces, for paths the reader still sees as files in the new tree
        (so a page removed or hidden from the reader is not readable through an old inode);
        and the old inodes no longer served, whose cached bytes the kernel must drop."""
        kept: dict[int, PathEntry] = {}
        dropped: list[int] = []
        for inode, entry in [*self.replaced.items(), *replaced_now.items()]:
            if new_table.index_of(inode) >= 0:
                continue  # the version is the tree's own again
            if entry.key in new_table.entries:
                kept[inode] = entry
            else:
                dropped.append(inode)
        while len(kept) > MAX_REPLACED:
            dropped.append(next(iter(kept)))
            del kept[dropped[-1]]
        return kept, dropped

    def may_access(self, inode: int, mode: int) -> bool:
        if inode not in self.replaced:
            self.index(inode)
        return not mode & os.W_OK

    def stats(self) -> FsStats:
        table = self.table
        return FsStats(BLOCK_SIZE, (table.total_bytes + BLOCK_SIZE - 1) // BLOCK_SIZE, len(table))

    def _node(self, inode: int) -> Node:
        node = self.table.get(inode)
        if node is None:
            raise FsError(errno.ENOENT)
        return node
