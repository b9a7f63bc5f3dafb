"""Binary files kept in Chroma itself (a `chroma:` URL, blob_pieces.py), read by range: the pieces
a range covers, each fetched by id and checked against the tree before a byte of it is served.

As the Chroma tier does for pages, a piece that fails its checks as read from Chroma's SQLite file
directly is read once more through chromadb (a second opinion) before the read fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from chromafs_fuse.backends.blobstore import BlobError
from chromafs_fuse.backends.chroma_store import ChromaPages
from chromafs_fuse.blob_pieces import PIECE_BYTES, CorruptPiece, decode_piece, piece_length, piece_sha256
from chromafs_fuse.tree import BlobPointer, PathEntry

log = logging.getLogger(__name__)


class ChromaBlobTier:
    name = "chroma"

    def __init__(self, client: Callable[[], ChromaPages]) -> None:
        self._client = client  # the site's Chroma client, shared with the Chroma tier

    def block_size(self, entry: PathEntry) -> int:
        return PIECE_BYTES

    def read_range(self, entry: PathEntry, offset: int, length: int) -> bytes:
        """`length` bytes at `offset`; BlobError naming the piece when one is missing or corrupt."""
        blob = entry.blob
        assert blob is not None and blob.sha256 is not None  # the tree checked a chroma: pointer
        if length <= 0:
            return b""
        if offset + length > blob.size:
            raise BlobError(f"{blob.url}: a range past the end of the file")
        first, last = offset // PIECE_BYTES, (offset + length - 1) // PIECE_BYTES
        try:
            pieces = self._read_checked(entry, list(range(first, last + 1)))
        except CorruptPiece as exc:
            raise BlobError(f"{blob.url}: {exc}") from exc
        except Exception as exc:  # BackendError, or the collection vanished
            raise BlobError(f"cannot read {blob.url} from Chroma: {exc}") from exc
        start = offset - first * PIECE_BYTES
        return b"".join(pieces)[start : start + length]

    def _read_checked(self, entry: PathEntry, indexes: list[int]) -> list[bytes]:
        assert entry.blob is not None
        try:
            return self._decoded(self._client(), entry.blob, indexes)
        except CorruptPiece as exc:
            other = self._through_chromadb(entry, exc)
            if other is None:
                raise
            return self._decoded(other, entry.blob, indexes)

    def _decoded(self, pages: ChromaPages, blob: BlobPointer, indexes: list[int]) -> list[bytes]:
        assert blob.sha256 is not None
        found: Mapping[int, Mapping[str, Any] | None] = pages.fetch_blob_pieces(blob.sha256, indexes)
        return [
            decode_piece(
                found.get(index),
                blob.sha256,
                index,
                piece_length(blob.size, index),
                piece_sha256(blob.sha256, blob.pieces, index),
            )
            for index in indexes
        ]

    def _through_chromadb(self, entry: PathEntry, error: CorruptPiece) -> ChromaPages | None:
        """The same collection read by chromadb, when the first reading was of the SQLite file."""
        try:
            other = self._client().through_chromadb()
        except Exception as exc:  # chromadb's errors share no base class: the first reading's outcome stands
            log.error("reading through chromadb failed: %s", exc)
            return None
        if other is not None:
            log.warning("%s failed its checks as read directly (%s): reading it through chromadb", entry.key, error)
        return other
