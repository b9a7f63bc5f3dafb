"""Binary files kept in Chroma itself, when a site has no blob store (the records: blob_pieces.py).

Which files: binary files, and text files with a line too long for one upsert (a chunk is never
cut inside a line), up to --chroma-blob-limit; a larger one is named and not ingested.
Pieces are written as the files come, before the tree that points at them, in upserts bounded
both in records (the server's batch bound) and in bytes (PIECE_UPSERT_BYTES), so no file, however
large within --chroma-blob-limit, makes one request the server refuses. A piece's id names the
file's sha256 and its index: one already stored (a re-ingest, a file with the same bytes, an
ingest that stopped half way) is not written again. Pieces of files that no tree keeps any more are
deleted once retired longer than the grace period, as replaced chunks are (retention.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from chromafs_fuse.blob_pieces import PIECE_BYTES, piece_count, piece_metadata
from chromafs_fuse.ingest.chroma_writes import RetryingCollection
from chromafs_fuse.ingest.scan import INGESTED, NOT_INGESTED, Problem, SourceFile
from chromafs_fuse.names import BLOB_PIECE_PREFIX, BLOB_SHA_FIELD, blob_piece_id

MAX_UPSERT_BYTES = 8 * 1024 * 1024  # of text in one upsert of chunks (Chroma takes 40 MiB)
# of file bytes in one upsert of pieces: ~2.8 MB of base64, which the client encodes into JSON a
# few times over before it is sent (the ingest's memory, and the wait of a neighbour's read)
PIECE_UPSERT_BYTES = 2 * 1024 * 1024
KEYS_PER_LOOKUP = 200

Piece = tuple[str, str, int]  # (key of a file that holds it, the file's sha256, piece index)


PAGE, IN_CHROMA, TOO_LARGE = "page", "in_chroma", "too_large"


def chroma_blob_plan(source: SourceFile, limit: int) -> tuple[str, Problem | None]:
    """For a site with no blob store, what becomes of `source`: a page of chunks (PAGE), a binary
    file kept in Chroma (IN_CHROMA), or one too large for it, not ingested (TOO_LARGE); and the
    problem to report, if any."""
    if source.text is not None and not _has_line_over(source.data, MAX_UPSERT_BYTES):
        return PAGE, None
    if len(source.data) > limit:
        reason = (
            f"binary file of {len(source.data)} bytes, above --chroma-blob-limit ({limit} bytes) for a "
            "file kept in Chroma: set --blob-store to serve it"
        )
        return TOO_LARGE, Problem(source.key, reason, NOT_INGESTED)
    if source.text is not None:
        reason = f"a line longer than {MAX_UPSERT_BYTES} bytes: kept as a binary file, served byte for byte"
        return IN_CHROMA, Problem(source.key, reason, INGESTED)
    return IN_CHROMA, None


def _has_line_over(data: bytes, limit: int) -> bool:
    if len(data) <= limit:
        return False
    start = 0
    while (end := data.find(b"\n", start)) >= 0:
        if end - start > limit:
            return True
        start = end + 1
    return len(data) - start > limit


class BlobWriter:
    """Binary files written to Chroma as they come, a bounded batch at a time (at most
    `batch_size` pieces and PIECE_UPSERT_BYTES bytes): the pieces not stored yet. It holds one
    batch, never the site's files. A file the site's current tree already keeps in Chroma
    (`stored`, by sha256) costs nothing: a tree is only written once its pieces are, and they
    are deleted only once no tree has kept them for the grace period."""

    def __init__(
        self, collection: RetryingCollection, batch_size: int, zero_vector: list[float], stored: Iterable[str] = ()
    ) -> None:
        self.collection = collection
        self.batch_size = batch_size
        self.zero_vector = zero_vector
        self.written = 0  # pieces written
        self._seen: set[str] = set(stored)  # sha256s of the files taken already, or stored
        self._batch: list[tuple[str, str, int, bytes]] = []  # (a key, sha256, index, the piece)
        self._bytes = 0

    def add(self, key: str, sha256: str, data: bytes) -> None:
        if sha256 in self._seen:
            return
        self._seen.add(sha256)
        for index in range(piece_count(len(data))):
            piece = data[index * PIECE_BYTES : (index + 1) * PIECE_BYTES]
            if self._batch and (len(self._batch) >= self.batch_size or self._bytes + len(piece) > PIECE_UPSERT_BYTES):
                self.flush()
            self._batch.append((key, sha256, index, piece))
            self._bytes += len(piece)

    def flush(self) -> None:
        """Write the pieces of the batch that are not stored yet."""
        batch, self._batch, self._bytes = self._batch, [], 0
        if not batch:
            return
        ids = [blob_piece_id(sha, index) for _, sha, index, _ in batch]
        what = f"{len(batch)} blob pieces ({batch[0][0]} to {batch[-1][0]})"
        present = set(self.collection.get(f"check of {what}", ids=ids, include=[])["ids"])
        todo = [(piece, record_id) for piece, record_id in zip(batch, ids, strict=True) if record_id not in present]
        if not todo:
            return
        self.collection.upsert(
            f"upsert of {what}",
            ids=[record_id for _, record_id in todo],
            metadatas=[piece_metadata(sha, index, data) for (_, sha, index, data), _ in todo],
            embeddings=[self.zero_vector] * len(todo),
        )
        self.written += len(todo)


def delete_blob_pieces(collection: RetryingCollection, shas: Sequence[str], batch_size: int) -> int:
    """Delete every piece of the files with these sha256s; how many pieces were deleted."""
    deleted = 0
    ordered = sorted(shas)
    for start in range(0, len(ordered), KEYS_PER_LOOKUP):
        some = ordered[start : start + KEYS_PER_LOOKUP]
        found = collection.get(
            f"read of {len(some)} old binary files' pieces", where={BLOB_SHA_FIELD: {"$in": some}}, include=[]
        )
        doomed = [record_id for record_id in found["ids"] if record_id.startswith(BLOB_PIECE_PREFIX)]
        for first in range(0, len(doomed), batch_size):
            ids = doomed[first : first + batch_size]
            collection.delete(f"delete of {len(ids)} old blob pieces", ids=ids)
        deleted += len(doomed)
    return deleted
