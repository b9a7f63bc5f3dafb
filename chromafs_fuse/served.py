"""`ServedFilesystem`: what the pyfuse3 adapter (serving/fuse_adapter.py) forwards each kernel
request to. Two classes stand in for each other there: `DocsFilesystem` (filesystem.py, one
reader's tree) and `ServingFilesystem` (serving_filesystem.py, many views in one inode space).
Both satisfy this Protocol structurally; mypy checks it where an adapter is built."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

from chromafs_fuse.filesystem import FsStats, OpenReply

A_co = TypeVar("A_co", covariant=True)  # the attributes answered with (see AttributeMaker)


class ServedFilesystem(Protocol[A_co]):
    """The requests a mount answers: each raises FsError for an errno."""

    async def lookup(self, parent_inode: int, name: bytes) -> A_co: ...

    async def stat(self, inode: int) -> A_co: ...

    def forget(self, inodes: Sequence[int]) -> None: ...

    def stats(self) -> FsStats: ...

    def stats_of(self, inode: int) -> FsStats: ...

    def open_dir(self, inode: int) -> None: ...

    def listing(self, inode: int, start: int) -> Iterator[tuple[bytes, A_co, int]]: ...

    def open_file(self, inode: int, flags: int) -> OpenReply: ...

    async def read(self, inode: int, offset: int, size: int) -> bytes: ...

    def may_access(self, inode: int, mode: int) -> bool: ...
