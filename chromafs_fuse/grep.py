"""Two-stage grep over a site: Chroma narrows the candidates, exact matching decides.

Stage one asks Chroma which of the reader's visible pages have a chunk that
could match (`$contains` for a literal, `$regex` otherwise). Chunks are cut at
newlines, so a line never spans two chunks and no match is lost. Stage two
loads the candidates (cache, Redis, Chroma) and matches line by line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chromafs_fuse.tree import PathEntry

if TYPE_CHECKING:
    from chromafs_fuse.backends.chroma_store import ChromaPages

log = logging.getLogger(__name__)
SLUG_BATCH = 500


@dataclass(frozen=True)
class GrepQuery:
    pattern: str
    fixed: bool = False
    ignore_case: bool = False

    def compiled(self) -> re.Pattern[bytes]:
        source = re.escape(self.pattern) if self.fixed else self.pattern
        flags = re.MULTILINE | (re.IGNORECASE if self.ignore_case else 0)
        return re.compile(source.encode("utf-8"), flags)

    def document_filter(self) -> dict[str, str]:
        if self.fixed and not self.ignore_case:
            return {"$contains": self.pattern}
        source = re.escape(self.pattern) if self.fixed else self.pattern
        # Multi-line: ^ and $ anchor at line ends inside a chunk, as grep's do.
        return {"$regex": f"(?im){source}" if self.ignore_case else f"(?m){source}"}


def candidate_pages(pages: ChromaPages, entries: Sequence[PathEntry], query: GrepQuery) -> set[str] | None:
    """Keys of the entries that have a chunk matching the query; None if Chroma
    cannot evaluate the pattern (the caller then checks every entry)."""
    by_slug: dict[str, str] = {}
    for entry in entries:
        by_slug[entry.key] = entry.key
        by_slug["/" + entry.key] = entry.key
        by_slug[entry.source_key] = entry.key
    slugs = sorted(by_slug)
    found: set[str] = set()
    for start in range(0, len(slugs), SLUG_BATCH):
        batch = slugs[start : start + SLUG_BATCH]
        try:
            result: dict[str, Any] = pages.collection.get(
                where={pages.page_field: {"$in": batch}},
                where_document=query.document_filter(),
                include=["metadatas"],
            )
        except Exception as exc:  # e.g. a regex Chroma's engine does not accept
            log.info("stage one skipped, Chroma cannot evaluate the pattern: %s", exc)
            return None
        for metadata in result.get("metadatas") or []:
            slug = (metadata or {}).get(pages.page_field)
            if isinstance(slug, str) and slug in by_slug:
                found.add(by_slug[slug])
    return found


def matching_lines(data: bytes, pattern: re.Pattern[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every line that matches, as `grep -n` numbers them."""
    if not pattern.search(data):
        return
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if pattern.search(line):
            yield number, line


def grep_page(
    data: bytes, pattern: re.Pattern[bytes], name: bytes, files_only: bool = False, context: int = 0
) -> Iterator[bytes]:
    """One file's output lines of `grep -rn` (no line ends): `name:n:line` for a match,
    `name-n-line` for up to `context` lines around one, `--` between groups of one file;
    `name` alone with `files_only`; `Binary file name matches` for a binary file."""
    if is_binary(data):
        if pattern.search(data):
            yield b"Binary file " + name + b" matches"
        return
    if files_only:
        if pattern.search(data) and next(matching_lines(data, pattern), None) is not None:
            yield name
        return
    if not context:
        for number, line in matching_lines(data, pattern):
            yield name + b":" + str(number).encode() + b":" + line
        return
    matches = {number for number, _ in matching_lines(data, pattern)}
    if not matches:
        return
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    shown = sorted({n for m in matches for n in range(max(1, m - context), min(len(lines), m + context) + 1)})
    previous = 0
    for number in shown:
        if previous and number > previous + 1:
            yield b"--"
        mark = b":" if number in matches else b"-"
        yield name + mark + str(number).encode() + mark + lines[number - 1]
        previous = number


def is_binary(data: bytes) -> bool:
    return b"\x00" in data[:65536]
