"""What stat shows for each node of a mount, as plain records (no pyfuse3).

`AttributeMaker` builds an `Attributes` record for a node of the tree, an old version a
re-ingest replaced, the search directory and its results, and the negative entry of a name
that is absent; and converts it once into what the mount answers with (the adapter hands in
its conversion to pyfuse3.EntryAttributes; in-process tests keep the records).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.tree import PathEntry

BLOCK_SIZE = 4096
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444
DAEMON_OWNER = (os.getuid(), os.getgid())  # every node of the tree shows the daemon's real uid and gid
A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class Attributes:
    inode: int  # 0: the name is absent (a negative entry the kernel caches for entry_timeout)
    mode: int
    nlink: int
    size: int
    time_ns: int  # atime, mtime and ctime alike
    entry_timeout: float
    attr_timeout: float  # 0: the kernel asks again every time (a size not final yet)
    uid: int
    gid: int
    block_size: int = BLOCK_SIZE

    @property
    def blocks(self) -> int:
        return (self.size + 511) // 512


def keep_record(attributes: Attributes) -> Attributes:
    return attributes


class AttributeMaker(Generic[A]):
    """Attributes with one mount's owner, time and cache timeout. `time_ns` is what directories
    and files the tree gives no mtime show (the mount's start, or when the mount server built the
    table's attributes); `timeout_s` how long the kernel may keep entries and attributes."""

    def __init__(
        self,
        timeout_s: float,
        time_ns: int,
        convert: Callable[[Attributes], A],
        owner: tuple[int, int] = DAEMON_OWNER,
    ) -> None:
        self.timeout_s = timeout_s
        self.time_ns = time_ns
        self.convert = convert
        self.owner = owner
        self.absent = convert(Attributes(0, 0, 0, 0, 0, timeout_s, timeout_s, 0, 0))

    def node(self, table: InodeTable, index: int, size: int | None) -> A:
        """The node at `index`. `size` None (a file whose size the tree does not give): 0 with no
        attribute caching, so the kernel never keeps a size that cuts the file."""
        return self.convert(self.node_record(table, index, size))

    def node_record(self, table: InodeTable, index: int, size: int | None) -> Attributes:
        uid, gid = self.owner
        inode, timeout_s = table.inode_at(index), self.timeout_s
        if table.is_dir_at(index):
            return Attributes(
                inode, DIR_MODE, 2 + table.subdir_count(index), 0, self.time_ns, timeout_s, timeout_s, uid, gid
            )
        mtime = table.mtime_at(index)
        time_ns = self.time_ns if mtime is None else int(mtime * 1e9)
        attr_timeout = 0.0 if size is None else timeout_s
        return Attributes(inode, FILE_MODE, 1, size or 0, time_ns, timeout_s, attr_timeout, uid, gid)

    def table(self, table: InodeTable) -> list[A | None]:
        """Every node whose size the tree gives (None for the others), built ahead of the first
        listing: the mount server does this once per table, and the mounts it forks share it."""
        built: list[A | None] = []
        for index in range(len(table)):
            size = table.size_at(index)
            known = size is not None or table.is_dir_at(index)
            built.append(self.node(table, index, size) if known else None)
        return built

    def replaced(self, inode: int, entry: PathEntry) -> A:
        """A file's old version, held by a reader after a re-ingest replaced it."""
        uid, gid = self.owner
        time_ns = self.time_ns if entry.mtime is None else int(entry.mtime * 1e9)
        return self.convert(Attributes(inode, FILE_MODE, 1, entry.size or 0, time_ns, self.timeout_s, 0.0, uid, gid))

    def search_directory(self, inode: int) -> A:
        timeout_s = self.timeout_s
        return self.convert(Attributes(inode, DIR_MODE, 2, 0, self.time_ns, timeout_s, timeout_s, 0, 0))

    def search_result(self, inode: int, size: int) -> A:
        """A query's answer: never cached, each lookup searches again."""
        return self.convert(Attributes(inode, FILE_MODE, 1, size, self.time_ns, 0.0, 0.0, 0, 0))
