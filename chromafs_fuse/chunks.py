"""Cutting pages into chunks at ingest and putting them back together at read (pure).

Chunks are cut at newlines and the newline at each cut is dropped, so that
`"\\n".join(chunks)` gives back the page byte for byte: the convention the
reference design and the tools built after it use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from chromafs_fuse.errors import Corrupt
from chromafs_fuse.options import DEFAULTS, INGEST_DEFAULTS

JOINER: str = DEFAULTS["--chunk-joiner"]
MAX_CHUNK_CHARS: int = INGEST_DEFAULTS["--max-chunk-chars"]


class CorruptPage(Corrupt, ValueError):
    """The stored chunks of a page do not make a whole page."""


def _is_soft_boundary(line: str) -> bool:
    stripped = line.lstrip()
    return stripped.startswith("#") or stripped == "" or stripped.startswith("```")


def split_page(text: str, max_chars: int = MAX_CHUNK_CHARS) -> list[str]:
    """Cut `text` into chunks of about `max_chars` at line ends, preferring to
    cut before a heading, a blank line or a code fence once a chunk is half full.
    A line longer than `max_chars` stays whole in one chunk."""
    lines = text.split("\n")
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        added = len(line) + (1 if current else 0)
        if current and (size + added > max_chars or (size >= max_chars // 2 and _is_soft_boundary(line))):
            chunks.append("\n".join(current))
            current, size = [], 0
            added = len(line)
        current.append(line)
        size += added
    chunks.append("\n".join(current))
    return chunks


def _as_index(value: object) -> int:
    if isinstance(value, bool):
        raise CorruptPage(f"chunk index {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise CorruptPage(f"chunk index {value!r} is not an integer")


@dataclass(frozen=True, slots=True)
class Expected:
    """What the tree says about a page, checked after reassembly when known."""

    size: int | None = None
    sha256: str | None = None


def reassemble(
    chunks: Iterable[tuple[object, object]],
    joiner: str = JOINER,
    expected: Expected = Expected(),
) -> bytes:
    """Join (chunk_index, document) pairs into the page's bytes.

    The indexes must be exactly 0..n-1; anything else (a gap, a duplicate, a
    negative or non-integer index, a chunk with no text) raises CorruptPage,
    as does a result that differs from the size or checksum the tree records.
    """
    by_index: dict[int, str] = {}
    for raw_index, document in chunks:
        index = _as_index(raw_index)
        if index < 0:
            raise CorruptPage(f"negative chunk index {index}")
        if index in by_index:
            raise CorruptPage(f"duplicate chunk index {index}")
        if not isinstance(document, str):
            raise CorruptPage(f"chunk {index} has no text")
        by_index[index] = document
    if not by_index:
        raise CorruptPage("page has no chunks")
    count = len(by_index)
    if max(by_index) != count - 1:
        first_missing = next(i for i in range(count) if i not in by_index)
        raise CorruptPage(f"chunk indexes have gaps (first missing: {first_missing})")
    try:
        data = joiner.join(by_index[i] for i in range(count)).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CorruptPage("chunk text is not valid Unicode") from exc
    check_bytes(data, expected)
    return data


def check_bytes(data: bytes, expected: Expected) -> None:
    if expected.size is not None and len(data) != expected.size:
        raise CorruptPage(f"page is {len(data)} bytes, the tree says {expected.size}")
    if expected.sha256 is not None and hashlib.sha256(data).hexdigest() != expected.sha256:
        raise CorruptPage("page content does not match the tree's sha256")
