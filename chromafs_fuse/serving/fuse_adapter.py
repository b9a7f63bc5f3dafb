"""The pyfuse3 Operations adapter: translates kernel requests into DocsFilesystem calls.

Every handler goes through `_request`, which counts the request, times it, maps FsError to
its errno and turns any other exception into EIO with a log line: a bug costs one request,
never the mount. Attributes are built here (they are pyfuse3 objects), once per node.

In no-open mode `open` and `opendir` answer ENOSYS once; from then on the kernel sends
neither open nor release, keeps file pages cached across opens and caches directory
listings, so a warm `grep -r` never reaches this process. Reads then carry the inode in
place of a file handle, which needs the pyfuse3 build made by scripts/build_pyfuse3.py;
with a stock pyfuse3 the mount stays in open mode.
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pyfuse3
import trio

from chromafs_fuse.filesystem import BLOCK_SIZE, DocsFilesystem, FsError
from chromafs_fuse.inodes import ROOT_INODE, InodeTable
from chromafs_fuse.serving.kernel_push import KernelPusher
from chromafs_fuse.serving.search_dir import SEARCH_INODE, SearchDir
from chromafs_fuse.stats import LatencyHistogram
from chromafs_fuse.tree import PathEntry

log = logging.getLogger(__name__)
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
_OWNER = (os.getuid(), os.getgid())  # every node shows the daemon's real uid and gid
R = TypeVar("R")


def pyfuse3_passes_inode() -> bool:
    """True when pyfuse3 hands read/readdir the inode once the kernel skips open."""
    return importlib.util.find_spec("pyfuse3.chromafs_inode_fallback") is not None


def node_attributes(
    table: InodeTable, index: int, size: int | None, default_time_ns: int, timeout_s: float
) -> pyfuse3.EntryAttributes:
    """What stat shows for the node at `index`. `size` None (a file whose size the tree does
    not give): 0 with no attribute caching, so the kernel never keeps a size that cuts the file."""
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = table.inode_at(index)
    attrs.generation = 0
    attrs.entry_timeout = timeout_s
    attrs.attr_timeout = timeout_s
    attrs.st_uid, attrs.st_gid = _OWNER
    attrs.st_rdev = 0
    attrs.st_blksize = BLOCK_SIZE
    mtime_ns = default_time_ns
    if table.is_dir_at(index):
        attrs.st_mode = DIR_MODE
        attrs.st_nlink = 2 + table.subdir_count(index)
        attrs.st_size = 0
    else:
        attrs.st_mode = FILE_MODE
        attrs.st_nlink = 1
        if size is None:
            attrs.st_size = 0
            attrs.attr_timeout = 0
        else:
            attrs.st_size = size
        mtime = table.mtime_at(index)
        if mtime is not None:
            mtime_ns = int(mtime * 1e9)
    attrs.st_blocks = (attrs.st_size + 511) // 512
    attrs.st_atime_ns = mtime_ns
    attrs.st_mtime_ns = mtime_ns
    attrs.st_ctime_ns = mtime_ns
    return attrs


def replaced_attributes(inode: int, entry: PathEntry, default_time_ns: int) -> pyfuse3.EntryAttributes:
    """What fstat shows for a file's old version, held by a reader after a re-ingest replaced it."""
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = inode
    attrs.st_mode = FILE_MODE
    attrs.st_nlink = 1
    attrs.st_uid, attrs.st_gid = _OWNER
    attrs.st_blksize = BLOCK_SIZE
    attrs.st_size = entry.size or 0
    attrs.st_blocks = (attrs.st_size + 511) // 512
    attrs.attr_timeout = 0
    mtime_ns = default_time_ns if entry.mtime is None else int(entry.mtime * 1e9)
    attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = mtime_ns
    return attrs


Attributes = list[pyfuse3.EntryAttributes | None]  # by node index


def table_attributes(table: InodeTable, default_time_ns: int, timeout_s: float) -> Attributes:
    """The attributes of every node whose size the tree gives, built ahead of the first
    listing: the mount server does this once per table, and forked mounts share it."""
    attributes: Attributes = []
    for index in range(len(table)):
        size = table.size_at(index)
        known = size is not None or table.is_dir_at(index)
        attributes.append(node_attributes(table, index, size, default_time_ns, timeout_s) if known else None)
    return attributes


def _request(name: str) -> Callable[[Callable[..., Awaitable[R]]], Callable[..., Awaitable[R]]]:
    """Count, time and guard one handler; the only place errors become errnos."""

    def decorate(handler: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
        @functools.wraps(handler)
        async def guarded(self: FuseAdapter, *args: Any) -> R:
            self.requests[name] += 1
            started = time.perf_counter()
            try:
                return await handler(self, *args)
            except FsError as exc:
                raise pyfuse3.FUSEError(exc.errno) from None
            except pyfuse3.FUSEError:
                raise
            except Exception:
                log.exception("%s%r failed", name, args[:2])
                raise pyfuse3.FUSEError(errno.EIO) from None
            finally:
                self.latency[name].observe(time.perf_counter() - started)

        return guarded

    return decorate


class FuseAdapter(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(
        self,
        fs: DocsFilesystem,
        cache_timeout_s: float = 3600.0,
        attributes: tuple[int, Attributes] | None = None,
        push_pages: bool = False,
        search_dir: SearchDir | None = None,
    ) -> None:
        super().__init__()
        self.search_dir = search_dir
        self.fs = fs
        self.table = fs.table
        self.no_open = fs.no_open
        self.cache_timeout_s = cache_timeout_s
        # Directories and files the tree gives no mtime show the mount time; with attributes
        # built ahead (by the mount server), the time they were built.
        self.mount_time_ns, self._attrs = (
            attributes if attributes is not None else (time.time_ns(), [None] * len(fs.table))
        )
        # Pushing pages needs the kernel to keep them across opens (no-open mode only), and the
        # batched store of chromafs's pyfuse3 build (scripts/build_pyfuse3.py).
        self.push_pages = push_pages and self.no_open and hasattr(pyfuse3, "store_pages")
        self._pusher: KernelPusher | None = None
        self._negative = pyfuse3.EntryAttributes()
        self._negative.st_ino = 0
        self._negative.entry_timeout = cache_timeout_s
        self.requests: Counter[str] = Counter()
        self.latency: dict[str, LatencyHistogram] = {name: LatencyHistogram() for name in _HANDLERS}
        self.read_latency = self.latency["read"]

    def _attributes(self, index: int) -> pyfuse3.EntryAttributes:
        attrs = self._attrs[index]
        if attrs is not None:
            return attrs
        size = self.fs.file_size(index)
        attrs = node_attributes(self.table, index, size, self.mount_time_ns, self.cache_timeout_s)
        if attrs.attr_timeout:  # only final attributes are kept
            self._attrs[index] = attrs
        return attrs

    # -- requests ---------------------------------------------------------------------

    @_request("lookup")
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        index = self.fs.lookup(parent_inode, name)
        if index is None and self.search_dir is not None:
            if parent_inode == ROOT_INODE and name == self.search_dir.name:
                return self._search_attributes(SEARCH_INODE)
            if parent_inode == SEARCH_INODE:
                return await self.search_dir.lookup(name)
        return self._negative if index is None else self._attributes(index)  # absent: cached too

    @_request("getattr")
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        old_version = self.fs.replaced_entry(inode)
        if old_version is not None:
            return replaced_attributes(inode, old_version, self.mount_time_ns)
        if SearchDir.owns(inode):
            return self._search_attributes(inode)
        return self._attributes(self.fs.index(inode))

    def _search_attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        attrs = self.search_dir.attributes(inode) if self.search_dir is not None else None
        if attrs is None:
            raise FsError(errno.ENOENT)
        return attrs

    @_request("forget")
    async def forget(self, inode_list: list[tuple[int, int]]) -> None:
        self.fs.forget([inode for inode, _ in inode_list])  # inodes of the tree live as long as it
        if self.search_dir is not None:
            for inode, _ in inode_list:
                self.search_dir.forget(inode)

    @_request("statfs")
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        stats = self.fs.stats()
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = stats.block_size
        data.f_blocks = stats.blocks
        data.f_bfree = data.f_bavail = 0
        data.f_files = stats.files
        data.f_ffree = data.f_favail = 0
        data.f_namemax = stats.name_max
        return data

    @_request("opendir")
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode == SEARCH_INODE and self.search_dir is not None:
            if self.no_open:
                raise FsError(errno.ENOSYS)
            return inode
        self.fs.open_dir(inode)
        return inode

    @_request("readdir")
    async def readdir(self, inode: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if SearchDir.owns(inode):
            return  # the search directory lists nothing: its files are queries
        index, children = self.fs.children(inode)
        known, name_at, reply = self._attrs, self.table.name_at, pyfuse3.readdir_reply
        for position in range(start_id, len(children)):
            child = children[position]
            if not reply(token, name_at(child), known[child] or self._attributes(child), position + 1):
                return
        self.fs.listed(index)

    @_request("releasedir")
    async def releasedir(self, inode: int) -> None:
        return None

    @_request("open")
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if SearchDir.owns(inode):
            self._search_attributes(inode)
            if flags & os.O_ACCMODE != os.O_RDONLY:
                raise FsError(errno.EROFS)
            if self.no_open:
                raise FsError(errno.ENOSYS)
            return pyfuse3.FileInfo(fh=inode, keep_cache=False)
        reply = self.fs.open_file(inode, flags)
        return pyfuse3.FileInfo(fh=inode, keep_cache=reply.keep_cache, direct_io=reply.direct_io)

    @_request("read")
    async def read(self, inode: int, off: int, size: int) -> bytes:
        if SearchDir.owns(inode):
            content = self.search_dir.content(inode) if self.search_dir is not None else None
            if content is None:
                raise FsError(errno.ENOENT)
            return content[off : off + size]
        return await self.fs.read(inode, off, size)

    @_request("release")
    async def release(self, inode: int) -> None:
        return None

    @_request("access")
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        if SearchDir.owns(inode):
            return not mode & os.W_OK
        return self.fs.may_access(inode, mode)

    # Extended attributes: ENOSYS makes the kernel answer EOPNOTSUPP itself from then on, so
    # `ls -l` (which asks for ACLs and labels on every file) never reaches the daemon for them.

    @_request("getxattr")
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        raise FsError(errno.ENOSYS)

    @_request("listxattr")
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        raise FsError(errno.ENOSYS)

    # Everything that would change the tree. Unreachable while the mount is `ro` (the kernel
    # answers EROFS itself, and the daemon drops `-o rw`); they stay so that, should `ro` ever
    # be lost (another mount helper), a write gets EROFS rather than pyfuse3's default ENOSYS,
    # which callers read as "not implemented, try another way".

    async def setxattr(self, inode, name, value, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def removexattr(self, inode, name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(self, parent_inode, name, mode, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(self, parent_inode, name, target, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(self, parent_old, name_old, parent_new, name_new, flags, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, inode, new_parent_inode, new_name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(self, parent_inode, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    def switch(self, fs: DocsFilesystem) -> KernelPusher | None:
        """Serve a new tree from now on (one step on the loop: a request sees one tree or the
        other). Returns the pusher of the old tree, which the caller stops off the loop."""
        if fs.no_open != self.no_open:
            # The kernel's open mode is set for the mount's life; a tree that gives no sizes
            # after one that did is served as well as it can be.
            log.warning("the new tree %s sizes for every file", "gives" if fs.no_open else "does not give")
            fs.no_open = self.no_open
        pusher, self._pusher = self._pusher, None
        self.fs = fs
        self.table = fs.table
        self._attrs = [None] * len(fs.table)
        return pusher

    # -- pushing pages into the kernel's cache --------------------------------------------

    def start_pushing(self, token: trio.lowlevel.TrioToken) -> None:
        if self.push_pages and self._pusher is None:
            scheduler = self.fs.scheduler
            self._pusher = KernelPusher(
                pyfuse3.store_pages,
                lambda: token.run_sync_soon(scheduler.take_outcomes, idempotent=True),
                len(self.table.file_order),
            )
            scheduler.push_through(self._pusher)
            self._pusher.start()

    def pushed_counts(self) -> dict[str, int]:
        """Pages the kernel took ahead of a read, and pages it refused (not listed yet)."""
        pusher = self._pusher
        if pusher is None:
            return {}
        return {"stored": pusher.stored, "refused": pusher.refused, "skipped": pusher.skipped}

    def stop_pushing(self) -> None:
        if self._pusher is not None:
            self._pusher.stop()


_HANDLERS = [
    name
    for name, member in vars(FuseAdapter).items()
    if callable(member) and getattr(member, "__wrapped__", None) is not None
]
