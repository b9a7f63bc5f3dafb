"""Binary files kept in Chroma itself, when a site has no blob store (the records: blob_pieces.py).

Which files: binary files, and text files with a line too long for one upsert (a chunk is never
cut inside a line), up to --chroma-blob-limit; a larger one is named and not ingested.
Pieces are written after the chunks and before the tree that points at them, in upserts bounded
both in records (the server's batch bound) and in bytes (MAX_UPSERT_BYTES), so no file, however
large within --chroma-blob-limit, makes one request the server refuses. A piece's id names the
file's sha256 and its index: one already stored (a re-ingest, a file with the same bytes, an
ingest that stopped half way) is not written again. Pieces of files that no tree keeps any more are
deleted once retired longer than the grace period, as replaced chunks are (retention.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from chromafs_fuse.blob_pieces import PIECE_BYTES, piece_count, piece_metadata
from chromafs_fuse.ingest.chroma_writes import RetryingCollection
from chromafs_fuse.ingest.scan import INGESTED, NOT_INGESTED, Problem, SourceFile
from chromafs_fuse.names import BLOB_PIECE_PREFIX, BLOB_SHA_FIELD, blob_piece_id

MAX_UPSERT_BYTES = 8 * 1024 * 1024  # of file bytes in one upsert (~11 MB of base64; Chroma takes 40 MiB)
KEYS_PER_LOOKUP = 200

Piece = tuple[str, str, int]  # (key of a file that holds it, the file's sha256, piece index)


def plan_chroma_blobs(files: Sequence[SourceFile], limit: int) -> tuple[set[str], set[str], list[Problem]]:
    """For a site with no blob store: the keys of the files to keep in Chroma, the keys of those
    too large for it (not ingested), and the problems to report."""
    in_chroma, too_large, problems = set(), set(), []
    for source in files:
        if source.text is not None and not _has_line_over(source.data, MAX_UPSERT_BYTES):
            continue
        if len(source.data) > limit:
            too_large.add(source.key)
            reason = (
                f"binary file of {len(source.data)} bytes, above --chroma-blob-limit ({limit} bytes) for a "
                "file kept in Chroma: set --blob-store to serve it"
            )
            problems.append(Problem(source.key, reason, NOT_INGESTED))
            continue
        if source.text is not None:
            reason = f"a line longer than {MAX_UPSERT_BYTES} bytes: kept as a binary file, served byte for byte"
            problems.append(Problem(source.key, reason, INGESTED))
        in_chroma.add(source.key)
    return in_chroma, too_large, problems


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
    """Binary files queued for Chroma; `write` stores the pieces that are not there yet."""

    def __init__(self, collection: RetryingCollection, batch_size: int) -> None:
        self.collection = collection
        self.batch_size = batch_size
        self._files: dict[str, tuple[str, bytes]] = {}  # sha256 -> (a key, bytes)

    def add(self, key: str, sha256: str, data: bytes) -> None:
        self._files.setdefault(sha256, (key, data))

    def write(self, zero_vector: list[float]) -> int:
        """Write every missing piece; how many were written."""
        written = 0
        for batch in self._batches():
            ids = [blob_piece_id(sha, index) for _, sha, index in batch]
            what = f"{len(batch)} blob pieces ({batch[0][0]} to {batch[-1][0]})"
            present = set(self.collection.get(f"check of {what}", ids=ids, include=[])["ids"])
            todo = [(piece, record_id) for piece, record_id in zip(batch, ids, strict=True) if record_id not in present]
            if not todo:
                continue
            metadatas = []
            for (_, sha, index), _ in todo:
                data = self._files[sha][1]
                metadatas.append(piece_metadata(sha, index, data[index * PIECE_BYTES : (index + 1) * PIECE_BYTES]))
            self.collection.upsert(
                f"upsert of {what}",
                ids=[record_id for _, record_id in todo],
                metadatas=metadatas,
                embeddings=[zero_vector] * len(todo),
            )
            written += len(todo)
        return written

    def _batches(self) -> Iterator[list[Piece]]:
        """The pieces, in batches of at most `batch_size` records and MAX_UPSERT_BYTES bytes (a
        piece larger than that alone: PIECE_BYTES is far smaller)."""
        batch: list[Piece] = []
        size = 0
        for sha, (key, data) in self._files.items():
            for index in range(piece_count(len(data))):
                length = min(PIECE_BYTES, len(data) - index * PIECE_BYTES)
                if batch and (len(batch) >= self.batch_size or size + length > MAX_UPSERT_BYTES):
                    yield batch
                    batch, size = [], 0
                batch.append((key, sha, index))
                size += length
        if batch:
            yield batch


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
