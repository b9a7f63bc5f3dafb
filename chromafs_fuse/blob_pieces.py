"""Binary files kept in Chroma itself, when a site has no blob store (pure: no I/O).

A binary file (an image, a file with a NUL byte, a Markdown page that is not UTF-8) ingested with
no --blob-store is kept in records of its own, apart from the chunks:

- pieces of at most PIECE_BYTES, each one record whose bytes are base64 in a metadata field: no
  document, so no full-text index holds them and no `$contains` or `$regex` ever sees them;
- no page field, so no grep or search filter (both select by page) ever selects them;
- a zero vector, as the tree record has: never embedded;
- ids naming the file's sha256 and the piece's index (names.blob_piece_id): files with the same
  bytes share their pieces, and a re-ingest finds them already written.

The tree entry's `blob` points at them with the URL `chroma:<sha256>`. A file of one piece is
checked against the entry's sha256; a file of more pieces lists each piece's sha256 in the blob
object (`pieces`), so every piece, read alone as a range is, is checked against the tree.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from chromafs_fuse.errors import Corrupt
from chromafs_fuse.names import (
    BLOB_DATA_FIELD,
    BLOB_PIECE_FIELD,
    BLOB_PIECE_KIND,
    BLOB_SHA_FIELD,
    FORMAT_FIELD,
    FORMAT_VERSION,
    RECORD_KIND_FIELD,
)

PIECE_BYTES = 1 << 20  # 1 MiB of the file per record: 1.4 MB of base64, far below a request's bound
SCHEME = "chroma:"
_URL = re.compile(r"chroma:([0-9a-f]{64})")


class CorruptPiece(Corrupt, ValueError):
    """A stored piece is missing or does not hold the bytes the tree names."""


def blob_url(sha256: str) -> str:
    return SCHEME + sha256


def is_chroma_url(url: str) -> bool:
    return url.startswith(SCHEME)


def url_sha256(url: str) -> str | None:
    """The sha256 a `chroma:` URL names, or None when the URL is not one."""
    match = _URL.fullmatch(url)
    return match.group(1) if match else None


def piece_count(size: int) -> int:
    return -(-size // PIECE_BYTES)


def piece_length(size: int, index: int) -> int:
    """How many bytes piece `index` of a file of `size` bytes holds."""
    return max(0, min(PIECE_BYTES, size - index * PIECE_BYTES))


def pieces_of(data: bytes) -> list[bytes]:
    return [data[start : start + PIECE_BYTES] for start in range(0, len(data), PIECE_BYTES)]


def blob_fields(data: bytes, sha256: str) -> dict[str, Any]:
    """The tree entry's `blob` object for a file kept in Chroma."""
    fields: dict[str, Any] = {"url": blob_url(sha256), "size": len(data), "sha256": sha256}
    pieces = pieces_of(data)
    if len(pieces) > 1:
        fields["pieces"] = [hashlib.sha256(piece).hexdigest() for piece in pieces]
    return fields


def piece_metadata(sha256: str, index: int, piece: bytes) -> dict[str, Any]:
    return {
        RECORD_KIND_FIELD: BLOB_PIECE_KIND,
        FORMAT_FIELD: FORMAT_VERSION,
        BLOB_SHA_FIELD: sha256,
        BLOB_PIECE_FIELD: index,
        BLOB_DATA_FIELD: base64.b64encode(piece).decode("ascii"),
    }


def check_pointer(url: str, size: int, sha256: str | None, pieces: object) -> tuple[str, tuple[str, ...] | None]:
    """A `chroma:` blob object's sha256 and piece hashes, checked when the tree is read;
    ValueError with the reason when the entry cannot be served."""
    named = url_sha256(url)
    if named is None:
        raise ValueError("'blob.url' is not chroma:<64 lower-case hex digits>")
    if sha256 is not None and sha256 != named:
        raise ValueError("'blob.sha256' is not the sha256 its chroma: URL names")
    count = piece_count(size)
    if count <= 1:
        return named, None
    if not isinstance(pieces, list) or len(pieces) != count:
        raise ValueError(f"'blob.pieces' does not list the sha256 of each of its {count} pieces")
    hashes = []
    for value in pieces:
        if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise ValueError("'blob.pieces' holds something that is not a 64-digit hex string")
        hashes.append(value.lower())
    return named, tuple(hashes)


def piece_sha256(sha256: str, pieces: Sequence[str] | None, index: int) -> str:
    """What piece `index` must hash to: the file's own sha256 when it is one piece."""
    return pieces[index] if pieces else sha256


def decode_piece(metadata: Mapping[str, Any] | None, sha256: str, index: int, length: int, expected: str) -> bytes:
    """The bytes of a piece record as read, checked: the file and index it says it holds, strict
    base64, `length` bytes, and the sha256 the tree names for it."""
    if metadata is None:
        raise CorruptPiece(f"piece {index} is missing")
    if metadata.get(BLOB_SHA_FIELD) != sha256 or metadata.get(BLOB_PIECE_FIELD) != index:
        raise CorruptPiece(f"piece {index} is labelled as another file's or another piece")
    text = metadata.get(BLOB_DATA_FIELD)
    if not isinstance(text, str):
        raise CorruptPiece(f"piece {index} has no data")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CorruptPiece(f"piece {index} is not valid base64") from exc
    if len(data) != length:
        raise CorruptPiece(f"piece {index} is {len(data)} bytes, the tree says {length}")
    if hashlib.sha256(data).hexdigest() != expected:
        raise CorruptPiece(f"piece {index} does not match the tree's sha256")
    return data
