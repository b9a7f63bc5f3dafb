"""The blob tier: lazy (binary or large) files, read by range: from the blob store
(backends/blobstore.py), or from Chroma itself for a `chroma:` URL (chroma_blob.py)."""

from __future__ import annotations

from chromafs_fuse.backends.blobstore import BlobError, BlobReader
from chromafs_fuse.blob_pieces import is_chroma_url
from chromafs_fuse.site.tiers import BLOB_BLOCK
from chromafs_fuse.site.tiers.chroma_blob import ChromaBlobTier
from chromafs_fuse.tree import PathEntry


class BlobStoreTier:
    name = "blob"

    def __init__(self, reader: BlobReader, chroma: ChromaBlobTier | None = None) -> None:
        self.reader = reader
        self.chroma = chroma

    def _in_chroma(self, entry: PathEntry) -> bool:
        return entry.blob is not None and is_chroma_url(entry.blob.url) and self.chroma is not None

    def block_size(self, entry: PathEntry) -> int:
        if self._in_chroma(entry):
            assert self.chroma is not None
            return self.chroma.block_size(entry)
        return BLOB_BLOCK

    def read_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        assert entry.blob is not None
        if self._in_chroma(entry):
            assert self.chroma is not None
            return self.chroma.read_range(entry, offset, length)
        data = self.reader.read_range(entry.blob.url, offset, length)
        if len(data) != length:
            raise BlobError(f"{entry.blob.url} is shorter than the tree says")
        return data
