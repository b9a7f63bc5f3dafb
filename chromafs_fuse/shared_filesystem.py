"""Many views answering as one mount (issue 30): the filesystem of the shared mount.

`SharedFilesystem` answers the requests the pyfuse3 adapter forwards, as a `DocsFilesystem`
does, for a `SharedNamespace` of views: each view is a reader class of a site with its own
`DocsFilesystem` (its pruned table numbered in the view's `InodeScope`). A request on an inode
goes to a view that holds it; a page that several views of a site show has one inode, and any
of them answers for it alike (one page source and one attribute maker per site). The top two
levels, the root and one directory per site, are answered here; only root reaches them (the
shared mount sits in the mount server's root-only directory, a session is a bind of one view).

Nothing a session sees depends on the other views: a view's directories and files are its own
table's, `statfs` gives fixed numbers, and the top levels are never timed in the kernel (views
come and go). The kernel's open mode is set per connection, so it is one for every view: with
chromafs's pyfuse3 build the mount runs in no-open mode (the kernel sends no open, release,
opendir or releasedir, and keeps pages and listings), and a file whose size its tree does not give
is read when the kernel asks its attributes (DocsFilesystem.stat). The top directories' mtime is
the time a view last came or went, so the kernel lists them again after a change.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from chromafs_fuse.attributes import BLOCK_SIZE, DAEMON_OWNER, DIR_MODE, Attributes
from chromafs_fuse.errors import FsError
from chromafs_fuse.filesystem import DocsFilesystem, FsStats, OpenReply
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.shared_views import SharedNamespace

A = TypeVar("A")
SHARED_STATS = FsStats(BLOCK_SIZE, 0, 0)  # the same for every session, whatever the views


class ViewEntry(Generic[A]):
    """A view in the namespace: its filesystem now, and the requests it answered (kept across
    the filesystems a re-ingest switches it to)."""

    __slots__ = ("fs", "requests")

    def __init__(self, fs: DocsFilesystem[A], requests: int = 0) -> None:
        self.fs = fs
        self.requests = requests

    @property
    def table(self) -> InodeTable:
        return self.fs.table


class SharedFilesystem(Generic[A]):
    def __init__(self, convert: Callable[[Attributes], A], time_ns: int, no_open: bool = False) -> None:
        """`convert` turns an attribute record into what the mount answers with (as
        AttributeMaker's); `time_ns` is the time the top directories show until a view comes or
        goes; `no_open`: the kernel's open mode (every view's DocsFilesystem is built with it)."""
        self.namespace: SharedNamespace[ViewEntry[A]] = SharedNamespace()
        self.convert = convert
        self.time_ns = time_ns
        self.no_open = no_open
        self.absent = convert(Attributes(0, 0, 0, 0, 0, 0.0, 0.0, 0, 0))  # never cached: views come

    # -- views joining and leaving ---------------------------------------------------------

    def add(self, site: str, name: str, fs: DocsFilesystem[A], extra_inodes: Iterable[int] = ()) -> None:
        """Serve `fs` as the view `name` of `site` from now on (replacing the view's filesystem,
        if any). `extra_inodes`: the old versions it still serves (DocsFilesystem.replaced).
        InodeClash when its inodes clash with another view's."""
        old = self.namespace.view(site, name)
        self.namespace.add(site, name, ViewEntry(fs, old.requests if old else 0), extra_inodes)
        if old is None:
            self._changed()

    def remove(self, site: str, name: str) -> DocsFilesystem[A] | None:
        entry = self.namespace.remove(site, name)
        if entry is None:
            return None
        self._changed()
        return entry.fs

    def _changed(self) -> None:
        """A view came or went. In no-open mode the kernel caches the top directories' listings
        too, and takes one again when the directory's mtime moves (it asks their attributes
        before every listing: they are never cached, and libfuse turns on auto_inval_data)."""
        self.time_ns = max(time.time_ns(), self.time_ns + 1)

    def view(self, site: str, name: str) -> ViewEntry[A] | None:
        return self.namespace.view(site, name)

    # -- routing ---------------------------------------------------------------------------

    def _fs(self, inode: int) -> DocsFilesystem[A]:
        entry = self.namespace.route(inode)
        if entry is None:
            raise FsError(errno.ENOENT)
        entry.requests += 1
        return entry.fs

    def _top(self, inode: int) -> A:
        subdirs = len(self.namespace.top_children(inode))
        uid, gid = DAEMON_OWNER
        return self.convert(Attributes(inode, DIR_MODE, 2 + subdirs, 0, self.time_ns, 0.0, 0.0, uid, gid))

    def _view_root(self, inode: int) -> A:
        """A view's root as its site directory lists it: the name is not timed, since the view may
        go; the attributes are timed as the view's own getattr times them (an untimed root would
        cost a getattr on every permission check of a walk from it, a session's included)."""
        entry = self.namespace.route(inode)
        assert entry is not None
        fs = entry.fs
        record = fs.attributes.node_record(fs.table, 0, None)
        return self.convert(dataclasses.replace(record, entry_timeout=0.0))

    # -- requests (as DocsFilesystem's) ----------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes) -> A:
        namespace = self.namespace
        if not namespace.is_top(parent_inode):
            return await self._fs(parent_inode).lookup(parent_inode, name)
        inode = namespace.top_lookup(parent_inode, name)
        if inode is None:
            return self.absent
        return self._top(inode) if namespace.is_top(inode) else self._view_root(inode)

    def getattr(self, inode: int) -> A:
        if self.namespace.is_top(inode):
            return self._top(inode)
        return self._fs(inode).getattr(inode)

    async def stat(self, inode: int) -> A:
        if self.namespace.is_top(inode):
            return self._top(inode)
        return await self._fs(inode).stat(inode)

    def open_dir(self, inode: int) -> None:
        if not self.namespace.is_top(inode):
            self._fs(inode).open_dir(inode)
        elif self.no_open:
            raise FsError(errno.ENOSYS)  # as every view's: one open mode per connection

    def listing(self, inode: int, start: int) -> Iterator[tuple[bytes, A, int]]:
        namespace = self.namespace
        if not namespace.is_top(inode):
            yield from self._fs(inode).listing(inode, start)
            return
        children = namespace.top_children(inode)
        for position in range(start, len(children)):
            name, child = children[position]
            attributes = self._top(child) if namespace.is_top(child) else self._view_root(child)
            yield name, attributes, position + 1

    def open_file(self, inode: int, flags: int) -> OpenReply:
        if self.namespace.is_top(inode):
            raise FsError(errno.EISDIR)
        return self._fs(inode).open_file(inode, flags)

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        if self.namespace.is_top(inode):
            raise FsError(errno.EISDIR)
        return await self._fs(inode).read(inode, offset, size)

    def forget(self, inodes: Sequence[int]) -> None:
        """An old version is held per view: every view holding the inode lets it go."""
        for inode in inodes:
            for entry in self.namespace.holders(inode):
                if entry.fs.replaced:
                    entry.fs.forget([inode])

    def may_access(self, inode: int, mode: int) -> bool:
        if self.namespace.is_top(inode):
            return not mode & os.W_OK
        return self._fs(inode).may_access(inode, mode)

    def stats(self) -> FsStats:
        return SHARED_STATS

    def requests_by_view(self) -> Counter[tuple[str, str]]:
        """(site directory, view name) -> requests its view answered."""
        return Counter({(site, name): entry.requests for site, name, entry in self.namespace.views()})
