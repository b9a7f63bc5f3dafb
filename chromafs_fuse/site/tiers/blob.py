"""The blob store tier: lazy (binary or large) files, read by range (backends/blobstore.py)."""

from __future__ import annotations

from chromafs_fuse.backends.blobstore import BlobError, BlobReader
from chromafs_fuse.tree import PathEntry


class BlobStoreTier:
    name = "blob"

    def __init__(self, reader: BlobReader) -> None:
        self.reader = reader

    def read_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        assert entry.blob is not None
        data = self.reader.read_range(entry.blob.url, offset, length)
        if len(data) != length:
            raise BlobError(f"{entry.blob.url} is shorter than the tree says")
        return data
