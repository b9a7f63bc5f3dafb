"""The pyfuse3 Operations adapter: forwards kernel requests to a ServingFilesystem (a serving
process's views, or a mount of its own's one view at its root), which hands each to a view's
DocsFilesystem.

Every handler goes through `_request`, which counts the request, times it, maps a
ChromafsError to its errno (logged at its level) and turns any other exception into EIO with its
traceback: a bug costs one request, never the mount. What a request answers, attributes included, is the filesystem's
(chromafs_fuse/filesystem.py); attributes become pyfuse3 objects here (`entry_attributes`),
once per node, and the filesystem keeps them.

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
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

import pyfuse3

from chromafs_fuse.attributes import AttributeMaker, Attributes
from chromafs_fuse.errors import ChromafsError, FsError
from chromafs_fuse.filesystem import FsStats
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.serving_filesystem import ServingFilesystem
from chromafs_fuse.stats import LatencyHistogram

log = logging.getLogger(__name__)
R = TypeVar("R")
P = ParamSpec("P")
S = TypeVar("S", bound="FuseAdapter")


def pyfuse3_passes_inode() -> bool:
    """True when pyfuse3 hands read/readdir the inode once the kernel skips open."""
    return importlib.util.find_spec("pyfuse3.chromafs_inode_fallback") is not None


def entry_attributes(record: Attributes) -> pyfuse3.EntryAttributes:
    """The record as pyfuse3 answers the kernel with it."""
    attrs = pyfuse3.EntryAttributes()
    attrs.st_ino = record.inode
    attrs.generation = 0
    attrs.entry_timeout = record.entry_timeout
    attrs.attr_timeout = record.attr_timeout
    attrs.st_mode = record.mode
    attrs.st_nlink = record.nlink
    attrs.st_uid = record.uid
    attrs.st_gid = record.gid
    attrs.st_rdev = 0
    attrs.st_size = record.size
    attrs.st_blksize = record.block_size
    attrs.st_blocks = record.blocks
    attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = record.time_ns
    return attrs


def attribute_maker(timeout_s: float, time_ns: int) -> AttributeMaker[pyfuse3.EntryAttributes]:
    return AttributeMaker(timeout_s, time_ns, entry_attributes)


def table_attributes(table: InodeTable, time_ns: int, timeout_s: float) -> list[pyfuse3.EntryAttributes | None]:
    """The attributes of every node whose size the tree gives, built ahead of the first
    listing: the mount server does this once per table, and forked mounts share it."""
    return attribute_maker(timeout_s, time_ns).table(table)


Handler = Callable[Concatenate[S, P], Coroutine[Any, Any, R]]  # a request handler of FuseAdapter


def _request(name: str) -> Callable[[Handler[S, P, R]], Handler[S, P, R]]:
    """Count, time and guard one handler; the only place errors become errnos."""

    def decorate(handler: Handler[S, P, R]) -> Handler[S, P, R]:
        @functools.wraps(handler)
        async def guarded(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
            self.requests[name] += 1
            if self.refusing and name != "forget":
                raise pyfuse3.FUSEError(errno.EACCES)
            started = time.perf_counter()
            try:
                return await handler(self, *args, **kwargs)
            except pyfuse3.FUSEError:
                raise
            except ChromafsError as exc:
                if log.isEnabledFor(exc.level):
                    log.log(exc.level, "%s of inode %s: %s", name, args[0] if args else "-", exc.message)
                raise pyfuse3.FUSEError(exc.errno) from None
            except Exception:  # a bug: its traceback, and EIO for the caller
                log.exception("%s%r failed", name, args[:2])
                raise pyfuse3.FUSEError(errno.EIO) from None
            finally:
                self.latency[name].observe(time.perf_counter() - started)

        return guarded

    return decorate


class FuseAdapter(pyfuse3.Operations):
    """The pyfuse3 operations over `fs`: a serving process's, or a mount of its own's."""

    supports_dot_lookup = True
    enable_writeback_cache = False

    def __init__(self, fs: ServingFilesystem[pyfuse3.EntryAttributes]) -> None:
        super().__init__()
        self.fs = fs
        self.refusing = False  # every request answers EACCES (a mount whose token expired, on its way out)
        self.requests: Counter[str] = Counter()
        self.latency: dict[str, LatencyHistogram] = {name: LatencyHistogram() for name in _HANDLERS}
        self.read_latency = self.latency["read"]

    # -- requests ---------------------------------------------------------------------

    @_request("lookup")
    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self.fs.lookup(parent_inode, name)

    @_request("getattr")
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return await self.fs.stat(inode)

    @_request("forget")
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.fs.forget([inode for inode, _ in inode_list])

    @_request("statfs")
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        return self._statvfs(self.fs.stats())

    @_request("statfs")
    async def statfs_of(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        """chromafs's pyfuse3 build asks this instead, with the inode the statfs is for."""
        return self._statvfs(self.fs.stats_of(inode))

    @staticmethod
    def _statvfs(stats: FsStats) -> pyfuse3.StatvfsData:
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
        self.fs.open_dir(inode)
        return inode

    @_request("readdir")
    async def readdir(self, inode: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        reply = pyfuse3.readdir_reply
        for name, attrs, next_id in self.fs.listing(inode, start_id):
            if not reply(token, name, attrs, next_id):
                return  # the kernel's buffer is full: the listing is not taken to its end

    @_request("releasedir")
    async def releasedir(self, inode: int) -> None:
        return None

    @_request("open")
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        reply = self.fs.open_file(inode, flags)
        return pyfuse3.FileInfo(fh=inode, keep_cache=reply.keep_cache, direct_io=reply.direct_io)

    @_request("read")
    async def read(self, inode: int, off: int, size: int) -> bytes:
        return await self.fs.read(inode, off, size)

    @_request("release")
    async def release(self, inode: int) -> None:
        return None

    @_request("access")
    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        return self.fs.may_access(inode, mode)

    # Extended attributes: ENOSYS makes the kernel answer EOPNOTSUPP itself from then on, so
    # `ls -l` (which asks for ACLs and labels on every file) never reaches the daemon for them.

    @_request("getxattr")
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        raise FsError(errno.ENOSYS)

    @_request("listxattr")
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        raise FsError(errno.ENOSYS)

    # Everything that would change the tree. Unreachable while the mount is `ro` (the kernel
    # answers EROFS itself, and the daemon drops `-o rw`); they stay so that, should `ro` ever
    # be lost (another mount helper), a write gets EROFS rather than pyfuse3's default ENOSYS,
    # which callers read as "not implemented, try another way".

    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, fh: int, off: int, buf: bytes) -> NoReturn:
        raise pyfuse3.FUSEError(errno.EROFS)


_HANDLERS = [
    name
    for name, member in vars(FuseAdapter).items()
    if callable(member) and getattr(member, "__wrapped__", None) is not None
]
