"""The filesystem's answers, independent of FUSE: what a name resolves to, what a directory
lists, whether a file may be opened, what a read returns, and with which errno it fails.

`DocsFilesystem` works on the reader's pruned inode table, so a hidden name and a missing
one take the same path and get the same answer. Reads go through a `PageReader` (the page
tiers) and tell the `ReadScheduler` what happened. It answers with attributes too (built once
per node by an `AttributeMaker`, and kept), and for the old versions a re-ingest replaced and
the `--search-dir` directory. The pyfuse3 adapter (serving/fuse_adapter.py) only forwards; the
semantics are tested in-process against a fake page source (tests/unit/test_filesystem.py) as well
as through real mounts.
See docs/SEMANTICS.md for the user-visible contract.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from chromafs_fuse.attributes import BLOCK_SIZE, AttributeMaker
from chromafs_fuse.errors import FsError, Unavailable
from chromafs_fuse.inodes import InodeTable, Node
from chromafs_fuse.readahead import ReadScheduler
from chromafs_fuse.search_dir import SEARCH_INODE, SearchDir
from chromafs_fuse.tree import PathEntry

A = TypeVar("A")  # the attributes the filesystem answers with (see AttributeMaker)


class PageUnavailable(Unavailable):
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


class DocsFilesystem(Generic[A]):
    def __init__(
        self,
        table: InodeTable,
        pages: PageReader,
        scheduler: ReadScheduler,
        no_open: bool,
        attributes: AttributeMaker[A],
        replaced: Mapping[int, PathEntry] | None = None,
        search_dir: SearchDir | None = None,
        built: list[A | None] | None = None,
    ) -> None:
        """`built`: the table's attributes built ahead (AttributeMaker.table, by the mount server)."""
        self.table = table
        self.pages = pages
        self.scheduler = scheduler
        self.attributes = attributes
        # By node index: the final attributes of each node, built on its first lookup or listing
        # (a file whose size is not known yet has none), so a warm lookup costs a list index.
        self._built: list[A | None] = built if built is not None else [None] * len(table)
        # Inodes of files a re-ingest replaced by a new version (under a new inode) -> the old
        # version. A reader that opened the old inode keeps reading it whole; nobody can look
        # it up any more, and the kernel's forget drops it. Only versions of paths this reader
        # may still see are kept (see carry_replaced): a removed or hidden page is gone.
        self.replaced: dict[int, PathEntry] = dict(replaced or {})
        self.search_dir = search_dir
        # In no-open mode the kernel keeps pages across opens and clamps every read to the size
        # it holds: a file of unknown size is read when the kernel asks its attributes (`stat`).
        self.no_open = no_open

    # -- names, attributes and directories ----------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes) -> A:
        """The attributes of `name` in that directory; the negative entry when absent or hidden
        (the same). In the search directory, a name is a query: it runs now."""
        index = self.table.lookup_index(parent_inode, name)
        if index >= 0:
            return self._built[index] or self._node_attributes(index)
        search_dir = self.search_dir
        if search_dir is not None:
            if search_dir.is_directory(parent_inode, name):
                return self.attributes.search_directory(SEARCH_INODE)
            if parent_inode == SEARCH_INODE:
                return self._search_attributes(await search_dir.query(name))
        return self.attributes.absent

    def getattr(self, inode: int) -> A:
        index = self.table.index_of(inode)
        if index >= 0:
            return self._built[index] or self._node_attributes(index)
        old_version = self.replaced.get(inode)
        if old_version is not None:
            return self.attributes.replaced(inode, old_version)
        if SearchDir.owns(inode):
            return self._search_attributes(inode)
        raise FsError(errno.ENOENT)

    async def stat(self, inode: int) -> A:
        """The attributes as the kernel asks for them (getattr). In no-open mode the kernel
        clamps reads to the size it holds, and asks again before reading past it: a file whose
        size the tree does not give is read now to learn it (EIO when it cannot be read, never
        an empty file). In open mode such a file is opened direct_io instead."""
        attributes = self.getattr(inode)
        if not self.no_open:
            return attributes
        index = self.table.index_of(inode)
        if index < 0 or self._built[index] is not None or self.table.is_dir_at(index):
            return attributes
        entry = self.table.node(index).entry
        assert entry is not None
        if self.pages.size_of(entry) is None:
            await self._read_entry(entry, 0, 0)
        return self.getattr(inode)

    def _node_attributes(self, index: int) -> A:
        size = self.file_size(index)
        attributes = self.attributes.node(self.table, index, size)
        if size is not None or self.table.is_dir_at(index):  # only final attributes are kept
            self._built[index] = attributes
        return attributes

    def _search_attributes(self, inode: int) -> A:
        if inode == SEARCH_INODE and self.search_dir is not None:
            return self.attributes.search_directory(inode)
        return self.attributes.search_result(inode, len(self._search_content(inode)))

    def _search_content(self, inode: int) -> bytes:
        """The answer a search-directory inode holds (ENOENT once the kernel forgot it)."""
        if self.search_dir is None:
            raise FsError(errno.ENOENT)
        if inode == SEARCH_INODE:
            raise FsError(errno.EISDIR)
        content = self.search_dir.content(inode)
        if content is None:
            raise FsError(errno.ENOENT)
        return content

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
        is_search_dir = inode == SEARCH_INODE and self.search_dir is not None
        if not is_search_dir and not self.table.is_dir_at(self.index(inode)):
            raise FsError(errno.ENOTDIR)
        if self.no_open:
            raise FsError(errno.ENOSYS)  # the kernel stops asking, and caches listings

    def listing(
        self, inode: int, start: int, directory: Callable[[int], A] | None = None
    ) -> Iterator[tuple[bytes, A, int]]:
        """The directory's entries from position `start`: (name, attributes, next position).
        Once the listing has been taken to its end, the read-ahead hears that it was listed.
        The search directory lists nothing: its files are queries. `directory`: what a
        subdirectory (by index) is listed with instead of its own attributes (a session's)."""
        if SearchDir.owns(inode):
            return
        table = self.table
        index = self.index(inode)
        children, built, name_at = table.children_at(index), self._built, table.name_at
        for position in range(start, len(children)):
            child = children[position]
            if directory is not None and table.is_dir_at(child):
                yield name_at(child), directory(child), position + 1
                continue
            yield name_at(child), built[child] or self._node_attributes(child), position + 1
        self.scheduler.listed(index)

    # -- files ----------------------------------------------------------------------

    def open_file(self, inode: int, flags: int) -> OpenReply:
        entry = None
        if SearchDir.owns(inode):
            self._search_content(inode)  # a query's answer: it exists, and is final
        else:
            entry = self.replaced.get(inode) or self._node(inode).entry
            if entry is None:
                raise FsError(errno.EISDIR)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EROFS)
        if self.no_open:
            raise FsError(errno.ENOSYS)  # the kernel stops sending open and release
        if entry is None:
            return OpenReply(keep_cache=False, direct_io=False)
        size_known = self.pages.size_of(entry) is not None
        return OpenReply(keep_cache=size_known, direct_io=not size_known)

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """`inode` is the file handle in both modes (open mode hands out the inode)."""
        if SearchDir.owns(inode):
            return self._search_content(inode)[offset : offset + size]
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

    def forget(self, inodes: Sequence[int]) -> None:
        """The kernel dropped these inodes: replaced versions and search answers among them are
        not needed now (the tree's own inodes live as long as the tree)."""
        if self.replaced:
            for inode in inodes:
                self.replaced.pop(inode, None)
        if self.search_dir is not None:
            for inode in inodes:
                self.search_dir.forget(inode)

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
        if inode not in self.replaced and not SearchDir.owns(inode):
            self.index(inode)
        return not mode & os.W_OK

    def stats(self) -> FsStats:
        table = self.table
        return FsStats(BLOCK_SIZE, (table.total_bytes + BLOCK_SIZE - 1) // BLOCK_SIZE, len(table))

    def stats_of(self, inode: int) -> FsStats:
        return self.stats()

    def _node(self, inode: int) -> Node:
        node = self.table.get(inode)
        if node is None:
            raise FsError(errno.ENOENT)
        return node
