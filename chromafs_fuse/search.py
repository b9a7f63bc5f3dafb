"""Search inside a reader's view of a site: vectors, BM25 (lexical.py), and both fused.

Only chunks of the current version of pages the reader may see are read (a `where` filter in
Chroma), so hidden pages are never ranked at all: a filter after a fixed top-k would let them
crowd out what the reader may see, and their count would leak. Their embeddings are compared
with the query's exactly; each page is ranked by its nearest chunk, and that chunk's lines in
the page are given. The query is embedded as the collection's pages were: chromafs-ingest records its
embedder in the collection's metadata.

Hybrid ranking (the default) fuses the vector ranking and the BM25 ranking of the same visible
pages by reciprocal rank fusion (`fuse`): a page's score is the sum over the rankings of
weight / (RRF_K + its rank). A site whose embedder also gives each page a vector (`wordllama+pages`,
`wordllama+e5`) adds a third ranking, the pages by that vector (`PageVectorIndex`), and its vector ranking fuses
chunks and pages; a site whose lexicon holds title terms adds a fourth, BM25 over each page's title,
headings and path (`page_fusion` picks the weights). Every ranking holds only visible pages, and
both BM25 indexes count their statistics over the visible pages alone (lexical.py), so nothing
the reader cannot see moves a rank or a score.

Pure: the search that reads Chroma and embeds the query is site/view.py's `search_view`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chromafs_fuse.errors import Refused
from chromafs_fuse.lexical import reads_as_other_language
from chromafs_fuse.names import EMBEDDER_FIELD, FORMAT_FIELD, PAGE_SHA_FIELD
from chromafs_fuse.tree import PathEntry


class SearchError(Refused):
    """A search that cannot run; the message says why."""


# batches of one view's chunks: (ids, embeddings, metadatas)
ChunkBatches = Iterable[tuple[Sequence[str], Sequence[Sequence[float]], Sequence[Mapping[str, Any] | None]]]
MODES = ("hybrid", "vector", "lexical")
# Reciprocal rank fusion's constant and the BM25 ranking's weight (the vectors' is 1), chosen on
# tuning queries kept apart from the benchmark's (docs/PERFORMANCE.md, "Search"): a small k lets
# the first places of each ranking decide; BM25 is the stronger ranking on docs, so it weighs more.
RRF_K = 3
LEXICAL_WEIGHT = 1.5


@dataclass(frozen=True)
class Fusion:
    """Reciprocal rank fusion's constant and each ranking's weight (a ranking not named: 0)."""

    k: int
    weights: Mapping[str, float]


# With page vectors (embedders `wordllama+pages`, `wordllama+e5`) up to four rankings are fused:
# chunks (vectors), lexical (BM25 over the pages), pages (page vectors) and titles (BM25 over
# titles, headings and paths); k and the weights per page model, chosen on tuning queries (every
# description of both trees outside the benchmark's sample: 810 and 673). wordllama's vectors are
# an English model's: a query in French or Spanish (`reads_as_other_language`) weighs them less.
# Sites ingested before the title terms were stored keep the fusion they were tuned with.
PAGE_FUSIONS: dict[str, Fusion] = {
    "wordllama": Fusion(3, {"chunks": 1.5, "lexical": 2.0, "pages": 0.5, "titles": 0.75}),
    "wordllama, other language": Fusion(5, {"chunks": 0.25, "lexical": 2.0, "titles": 0.75}),
    "wordllama, no titles": Fusion(2, {"chunks": 1.0, "lexical": 2.0, "pages": 0.5}),
    "e5": Fusion(5, {"chunks": 0.5, "lexical": 3.0, "pages": 2.0}),
}


def page_fusion(page_model: str, query: str, has_titles: bool) -> Fusion:
    """The fusion for a site whose pages have vectors of `page_model`."""
    if page_model != "wordllama":
        return PAGE_FUSIONS[page_model]
    if not has_titles:
        return PAGE_FUSIONS["wordllama, no titles"]
    return PAGE_FUSIONS["wordllama, other language" if reads_as_other_language(query) else "wordllama"]


@dataclass(frozen=True)
class Hit:
    path: str
    distance: float | None  # squared L2 distance of the page's nearest chunk (None: no vectors used)
    chunk: str  # the page's best chunk
    first_line: int = 0  # its lines in the page, 1-based (0: not located)
    last_line: int = 0
    score: float = 0.0  # the ranking's score, higher is better (fused, BM25, or -distance)


@dataclass
class SearchResult:
    hits: list[Hit]
    mode: str  # how they were ranked: hybrid, vector or lexical
    embedder: str | None  # the embedder of the query, None when no vectors were used
    notes: list[str] = field(default_factory=list)  # why a ranking was left out
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage


def fuse(
    rankings: Sequence[Sequence[str]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> list[tuple[str, float]]:
    """Reciprocal rank fusion: paths by the sum of weight / (k + rank) over the rankings (rank 1
    first; every weight 1 unless given), best first, ties by path."""
    scores: dict[str, float] = {}
    for at, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[at]
        for rank, path in enumerate(ranking, start=1):
            scores[path] = scores.get(path, 0.0) + weight / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True)
class VectorIndex:
    """One view's chunk vectors in one matrix: every query compares them all, exactly."""

    paths: tuple[str, ...]
    owners: np.ndarray  # chunk row -> page number
    ids: tuple[str, ...]  # chunk row -> record id
    matrix: np.ndarray  # (chunks, dimensions) float32

    @classmethod
    def build(cls, batches: ChunkBatches, by_slug: Mapping[str, str], page_field: str) -> VectorIndex:
        numbers: dict[str, int] = {}
        owners: list[int] = []
        ids: list[str] = []
        blocks: list[np.ndarray] = []
        for batch_ids, embeddings, metadatas in batches:
            keep = []
            for at, (record_id, metadata) in enumerate(zip(batch_ids, metadatas, strict=True)):
                path = by_slug.get(str((metadata or {}).get(page_field)))
                if path is None:  # the filter admits only the view's pages; anything else is never shown
                    continue
                keep.append(at)
                owners.append(numbers.setdefault(path, len(numbers)))
                ids.append(record_id)
            if keep:
                blocks.append(np.asarray(embeddings, dtype=np.float32)[keep])
        matrix = np.concatenate(blocks) if blocks else np.zeros((0, 1), dtype=np.float32)
        return cls(tuple(numbers), np.asarray(owners, dtype=np.int64), tuple(ids), matrix)

    def rank(self, query: Sequence[float]) -> list[tuple[str, float, str]]:
        """Every page, nearest first, by its nearest chunk: (path, squared L2 distance, chunk id)."""
        if not self.paths:
            return []
        target = np.asarray(query, dtype=np.float32)
        distances = ((self.matrix - target) ** 2).sum(axis=1)
        order = np.lexsort((self.owners, distances))  # nearest chunk first, then by page
        first = np.unique(self.owners[order], return_index=True)[1]  # each page's first row in that order
        rows = order[first]
        out = [(self.paths[self.owners[r]], float(distances[r]), self.ids[r]) for r in rows.tolist()]
        return sorted(out, key=lambda hit: (hit[1], hit[0]))


@dataclass(frozen=True)
class PageVectorIndex:
    """One vector per visible page (its title and headings'), unit length: ranked by cosine, exactly."""

    paths: tuple[str, ...]
    matrix: np.ndarray  # (pages, dimensions) float32

    def rank(self, query: Sequence[float]) -> list[str]:
        """Every page, nearest first (ties by path)."""
        if not self.paths:
            return []
        similarity = self.matrix @ np.asarray(query, dtype=np.float32)
        order = np.lexsort((np.arange(len(self.paths)), -similarity))  # paths are sorted: ties by path
        return [self.paths[i] for i in order.tolist()]


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


def rank_pages(
    batches: ChunkBatches, query: Sequence[float], by_slug: Mapping[str, str], page_field: str, limit: int
) -> list[tuple[str, float, str]]:
    """The `limit` pages nearest the query, each by its nearest chunk: (path, squared L2
    distance, that chunk's id). Exact: every chunk of the view is compared, none is missed
    the way an approximate index can miss one (HNSW does, among many equal vectors)."""
    return VectorIndex.build(batches, by_slug, page_field).rank(query)[:limit]


def locate(hit: Hit, page: bytes) -> Hit:
    """The hit with its chunk's line numbers in the page (chunks are cut at line ends)."""
    chunk = hit.chunk.encode("utf-8")
    at = page.find(chunk) if chunk else -1
    if at < 0:
        return hit
    first = page.count(b"\n", 0, at) + 1
    return replace(hit, first_line=first, last_line=first + chunk.rstrip(b"\n").count(b"\n"))


def hit_line(hit: Hit) -> str:
    """`path:first-last: snippet`, as `chromafs search` prints a hit."""
    return f"{hit.path}:{hit.first_line}-{hit.last_line}: {snippet(hit)}"


def hit_record(hit: Hit) -> dict[str, Any]:
    """A hit as `chromafs search --json` and the MCP tool give it."""
    record: dict[str, Any] = {"path": hit.path, "lines": [hit.first_line, hit.last_line], "score": round(hit.score, 6)}
    if hit.distance is not None:
        record["distance"] = round(hit.distance, 6)
    record["snippet"] = snippet(hit)
    return record


def snippet(hit: Hit) -> str:
    return hit.chunk.strip().splitlines()[0][:160] if hit.chunk.strip() else ""
