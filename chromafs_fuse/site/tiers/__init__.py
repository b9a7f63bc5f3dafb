"""The page tiers, each a small class behind one small interface, and what they share.

A page is asked of memory, then of the stores in order (Redis, then Chroma); a lazy file's
blocks of memory, then of the blob store. The composer (site/page_source.py) does the asking,
fills the faster tiers on the way back and holds the one deadline of a read; a tier only
answers for itself. Store tiers block (the composer runs them on worker threads); memory does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from chromafs_fuse.tree import PathEntry

BLOB_BLOCK = 128 * 1024  # a lazy file in a blob store is fetched in ranged requests of this size


class PageTier(Protocol):
    """A store of whole pages, asked after memory."""

    name: str  # the backend's name in the error and seconds counters

    def fetch(self, entries: Sequence[PathEntry], tree_version: str) -> dict[str, bytes]:
        """The pages this tier holds, by entry key, each checked against the tree; pages it does
        not have are left out. Raises when the tier cannot be asked at all."""
        ...

    def fill(self, pages: Sequence[tuple[PathEntry, bytes]], tree_version: str) -> None:
        """Keep pages a slower tier gave (nothing, for the store of record)."""
        ...


class BlobTier(Protocol):
    """Where lazy files' bytes are: read by range, one request each."""

    name: str

    def block_size(self, entry: PathEntry) -> int:
        """The entry's blocks: what one request fetches and memory keeps."""
        ...

    def read_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        """Exactly `length` bytes at `offset` of the entry's blob, or BlobError."""
        ...


def content_version(entry: PathEntry, tree_version: str) -> str:
    """What a page's cached copy is kept under: its sha256, so an unchanged page stays cached
    across re-ingests; for a tree without sha256s, the tree's version."""
    return entry.sha256 or tree_version
