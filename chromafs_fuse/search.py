"""Semantic search inside a reader's view of a site.

Only chunks of the current version of pages the reader may see are read (a `where` filter in
Chroma), so hidden pages are never ranked at all: a filter after a fixed top-k would let them
crowd out what the reader may see, and their count would leak. Their embeddings are compared
with the query's exactly; each page is ranked by its nearest chunk, and that chunk's lines in
the page are given. The query is embedded as the collection's pages were: chromafs-ingest records its
embedder in the collection's metadata.

Pure: the search that reads Chroma and embeds the query is site/view.py's `search_view`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chromafs_fuse.errors import Refused
from chromafs_fuse.names import EMBEDDER_FIELD, FORMAT_FIELD, PAGE_SHA_FIELD
from chromafs_fuse.tree import PathEntry


class SearchError(Refused):
    """A search that cannot run; the message says why."""


@dataclass(frozen=True)
class Hit:
    path: str
    distance: float
    chunk: str  # the page's best chunk
    first_line: int = 0  # its lines in the page, 1-based (0: not located)
    last_line: int = 0


def embedder_name(collection_metadata: Mapping[str, Any] | None, override: str | None = None) -> str:
    """How the collection's chunks were embedded: `override`, else what chromafs-ingest
    recorded; collections it wrote before recording it used the hashing embedder."""
    if override:
        return override
    metadata = collection_metadata or {}
    name = metadata.get(EMBEDDER_FIELD)
    if isinstance(name, str) and name:
        return name
    if FORMAT_FIELD in metadata:
        return "hashing"
    raise SearchError(
        "the collection does not say how its chunks were embedded (it was not written by chromafs-ingest): "
        "name the embedding function with --embedder"
    )


def view_filter(entries: Sequence[PathEntry], page_field: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The `where` filter admitting only chunks of these pages' current versions, and the map
    from the page field's values back to paths."""
    by_slug: dict[str, str] = {}
    for entry in entries:
        if entry.blob is None:
            by_slug[entry.source_key] = entry.key
    shas = sorted({e.sha256 for e in entries if e.blob is None and e.sha256})
    page_clause: dict[str, Any] = {page_field: {"$in": sorted(by_slug)}}
    if shas and len(shas) == len(by_slug):  # every page names its version: old ones are left out
        return {"$and": [page_clause, {PAGE_SHA_FIELD: {"$in": shas}}]}, by_slug
    return page_clause, by_slug


# batches of one view's chunks: (ids, embeddings, metadatas)
ChunkBatches = Iterable[tuple[Sequence[str], Sequence[Sequence[float]], Sequence[Mapping[str, Any] | None]]]


def rank_pages(
    batches: ChunkBatches, query: Sequence[float], by_slug: Mapping[str, str], page_field: str, limit: int
) -> list[tuple[str, float, str]]:
    """The `limit` pages nearest the query, each by its nearest chunk: (path, squared L2
    distance, that chunk's id). Exact: every chunk of the view is compared, none is missed
    the way an approximate index can miss one (HNSW does, among many equal vectors)."""
    target = np.asarray(query, dtype=np.float32)
    best: dict[str, tuple[float, str]] = {}
    for ids, embeddings, metadatas in batches:
        if not len(ids):
            continue
        vectors = np.asarray(embeddings, dtype=np.float32)
        distances = ((vectors - target) ** 2).sum(axis=1)
        for record_id, metadata, distance in zip(ids, metadatas, distances.tolist(), strict=True):
            path = by_slug.get(str((metadata or {}).get(page_field)))
            if path is None:  # the filter admits only the view's pages; anything else is never shown
                continue
            if path not in best or distance < best[path][0]:
                best[path] = (distance, record_id)
    ranked = sorted(best.items(), key=lambda item: (item[1][0], item[0]))[:limit]
    return [(path, distance, record_id) for path, (distance, record_id) in ranked]


def locate(hit: Hit, page: bytes) -> Hit:
    """The hit with its chunk's line numbers in the page (chunks are cut at line ends)."""
    chunk = hit.chunk.encode("utf-8")
    at = page.find(chunk) if chunk else -1
    if at < 0:
        return hit
    first = page.count(b"\n", 0, at) + 1
    return Hit(hit.path, hit.distance, hit.chunk, first, first + chunk.rstrip(b"\n").count(b"\n"))


def hit_line(hit: Hit) -> str:
    """`path:first-last: snippet`, as `chromafs search` prints a hit."""
    return f"{hit.path}:{hit.first_line}-{hit.last_line}: {snippet(hit)}"


def hit_record(hit: Hit) -> dict[str, Any]:
    """A hit as `chromafs search --json` and the MCP tool give it."""
    lines = [hit.first_line, hit.last_line]
    return {"path": hit.path, "lines": lines, "distance": round(hit.distance, 6), "snippet": snippet(hit)}


def snippet(hit: Hit) -> str:
    return hit.chunk.strip().splitlines()[0][:160] if hit.chunk.strip() else ""
