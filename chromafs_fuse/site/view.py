"""A reader's view of a site without a mount: what `chromafs grep`, `chromafs search` and the
MCP server answer from. The same pruned table a mount serves, the same page loading (memory,
Redis, Chroma, the blob store), so every front end sees exactly what the reader's mount shows.

Errors carry only what the caller gave: a hidden path fails exactly as a missing one does.
Blocking throughout (worker threads or plain commands); one lock guards the page cache.
"""

from __future__ import annotations

import builtins
import fnmatch
import posixpath
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import Refused
from chromafs_fuse.grep import GrepQuery, candidate_pages, grep_page
from chromafs_fuse.inodes import Node
from chromafs_fuse.tree import PathEntry

if TYPE_CHECKING:
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.search import Hit, SearchResult
    from chromafs_fuse.site.loader import LoadedSite
    from chromafs_fuse.site.searcher import Searcher


class ViewError(Refused):
    """A request the view refuses; the message names only what the caller asked for."""


def no_such(path: str) -> ViewError:
    return ViewError(f"{path or '/'}: No such file or directory")


@dataclass
class ReaderView:
    site: LoadedSite
    config: SessionConfig
    principal: Principal
    memory_cache: bool = True  # False where a loop owns the page cache (a mount's search directory)
    page_lock: threading.Lock = field(default_factory=threading.Lock)  # views sharing a page source share it
    warm: Searcher | None = field(default=None, repr=False)  # another view's of the same table, to share

    # -- paths ---------------------------------------------------------------------------

    def check_live(self) -> None:
        expires_at = self.principal.expires_at
        if expires_at is not None and time.time() >= expires_at:
            raise ViewError("the token expired")

    def node(self, path: str) -> Node:
        """The visible file or directory at `path` ("/", "", "a/b", "/a/./b/" alike)."""
        self.check_live()
        normal = posixpath.normpath("/" + path).lstrip("/")
        node = self.site.table.resolve(normal)
        if node is None:
            raise no_such(path)
        return node

    def files_under(self, path: str) -> list[PathEntry]:
        """The visible files at or under `path`, in the order `grep -r` walks them on a mount."""
        node = self.node(path)
        if not node.is_dir:
            assert node.entry is not None
            return [node.entry]
        return [n.entry for n in self.walk(node) if n.entry is not None]

    def walk(self, top: Node) -> Iterator[Node]:
        """`top` and everything under it, depth first, each directory's entries by name: the
        order `find` and `grep -r` see on a mount (its readdir gives them by name)."""
        table = self.site.table
        stack = [top]
        while stack:
            node = stack.pop()
            yield node
            if node.is_dir:
                children = [table.get(inode) for _, inode in table.children(node.inode)]
                stack.extend(child for child in reversed(children) if child is not None)

    # -- the tools -----------------------------------------------------------------------

    def list(self, path: str = "") -> list[str]:
        """A directory's names as `ls -p` gives them in the C locale (directories end in /)."""
        node = self.node(path)
        if not node.is_dir:
            return [posixpath.basename(node.path)]
        table = self.site.table
        names = []
        for name, inode in table.children(node.inode):
            child = table.get(inode)
            names.append(name.decode("utf-8", "surrogateescape") + ("/" if child and child.is_dir else ""))
        return names

    def read(self, path: str) -> bytes:
        node = self.node(path)
        if node.is_dir:
            raise ViewError(f"{path}: Is a directory")
        assert node.entry is not None
        return self.load([node.entry])[node.entry.key]

    def find(self, name: str = "*", path: str = "", kind: str | None = None) -> builtins.list[str]:
        """Paths under `path` whose last part matches the glob `name`, as `find PATH -name NAME
        [-type f|d]` finds them (PATH itself included), sorted."""
        if kind not in (None, "f", "d"):
            raise ViewError("type must be f or d")
        found = [
            node.path or "."
            for node in self.walk(self.node(path))
            if (kind is None or (kind == "d") == node.is_dir)
            and fnmatch.fnmatchcase(posixpath.basename(node.path) or "/", name)
        ]
        return sorted(found)

    def grep(
        self, query: GrepQuery, path: str = "", files_only: bool = False, context: int = 0,
        errors: builtins.list[str] | None = None,
    ) -> Iterator[bytes]:  # fmt: skip
        """`grep -rn` over the visible files at or under `path`: `path:n:line` for a match,
        `path-n-line` for context, `--` between groups, `Binary file path matches`; or only
        the names with `files_only`. Chroma narrows the candidates first (search.py). A file
        that cannot be read is named in `errors` and skipped, as grep does."""
        pattern = query.compiled()
        entries = self.files_under(path)
        chunked = [e for e in entries if e.blob is None]
        candidates = None
        if self.config.chunk_joiner == "\n" and chunked:
            candidates = candidate_pages(self.site.source.chroma(), chunked, query)
        to_check = [e for e in entries if e.blob is not None or candidates is None or e.key in candidates]
        pages = self.load(to_check, missing_ok=True)
        separated = False
        for entry in to_check:
            data = pages.get(entry.key)
            if data is None:
                if errors is not None:
                    errors.append(f"{entry.key}: Input/output error")
                continue
            lines = list(grep_page(data, pattern, entry.key.encode("utf-8"), files_only, context))
            if not lines:
                continue
            if context and separated and not files_only:
                yield b"--"
            separated = True
            yield from lines

    def search(self, query: str, limit: int = 10, embedder: str | None = None) -> builtins.list[Hit]:
        return self.search_result(query, limit, embedder).hits

    def search_result(
        self, query: str, limit: int = 10, embedder: str | None = None, mode: str = "hybrid"
    ) -> SearchResult:
        self.check_live()
        return search_view(self, query, limit, embedder, mode)

    @property
    def searcher(self) -> Searcher:
        """What this view's searches keep warm: its vectors and its BM25 index."""
        with self.page_lock:
            if self.warm is None or self.warm.view.site.table is not self.site.table:
                from chromafs_fuse.site.searcher import Searcher

                self.warm = Searcher(self)
            return self.warm

    # -- pages ---------------------------------------------------------------------------

    def load(self, entries: Sequence[PathEntry], missing_ok: bool = False) -> dict[str, bytes]:
        """These files' bytes through the site's page tiers, as a mount reads them (memory,
        Redis, Chroma; lazy files from the blob store), within one --backend-timeout. A file
        that cannot be read fails the call, or is left out with `missing_ok`."""
        source = self.site.source
        with self.page_lock:
            loaded = source.load_cached(entries) if self.memory_cache else source.load_many(entries)
        out: dict[str, bytes] = {}
        for entry in entries:
            data = loaded.get(entry.key)
            if isinstance(data, bytes):
                out[entry.key] = data
            elif not missing_ok:
                raise ViewError(f"{entry.key}: Input/output error")
        return out


def open_view(config: SessionConfig, token: str | None) -> ReaderView:
    """The reader's view: their token verified, the site's tree loaded and pruned for them."""
    from chromafs_fuse.site.loader import SiteLoader, verify_reader

    principal = verify_reader(token, config)
    return ReaderView(SiteLoader(config).load(principal), config, principal)


def search_view(
    view: ReaderView, query: str, limit: int, embedder: str | None = None, mode: str = "hybrid"
) -> SearchResult:
    """The `limit` pages of the reader's view that best match `query`, best first, each with its
    best chunk and that chunk's lines: vectors and BM25 fused (`mode` hybrid), or one of them.
    A ranking that cannot run here (no model for the collection's embedder, a site ingested
    before the lexicon existed) is left out with a note; SearchError when none can. Blocking.
    Chroma is read through the site's own client, the pages through its page tiers; the
    model, the view's vectors and its BM25 index stay in memory for the next query."""
    from chromafs_fuse.chunks import split_page
    from chromafs_fuse.ingest.embedding import page_model
    from chromafs_fuse.lexical import best_passage, ranked
    from chromafs_fuse.search import (
        LEXICAL_WEIGHT,
        MODES,
        RRF_K,
        Hit,
        SearchError,
        SearchResult,
        fuse,
        locate,
        page_fusion,
    )

    if limit < 1:
        raise SearchError("the number of results must be at least 1")
    if mode not in MODES:
        raise SearchError(f"unknown ranking {mode!r} ({', '.join(MODES)})")
    clock = Clock()
    result = SearchResult([], mode, None, timings=clock.laps)
    if not any(e.blob is None for e in view.site.table.entries.values()):
        return result  # nothing the reader may see is searchable
    rankings: dict[str, list[str]] = {}  # chunks (vectors), pages (page vectors), lexical (BM25)
    nearest: dict[str, tuple[float, str]] = {}
    if mode in ("hybrid", "vector"):
        try:
            name, vector = view.searcher.query_vector(query, embedder, clock)
            index = view.searcher.vectors(name, clock)
        except SearchError as exc:
            if mode == "vector":
                raise
            result.notes.append(f"{exc}; ranked by words alone")
        else:
            result.embedder = name
            found = index.rank(vector)
            clock.lap("vector_rank")
            nearest = {path: (distance, record_id) for path, distance, record_id in found}
            rankings["chunks"] = [path for path, _, _ in found]
            try:
                pages_ranking = view.searcher.page_ranking(name, query, clock)
            except SearchError as exc:
                result.notes.append(f"{exc}; pages ranked without their page vectors")
                pages_ranking = None
            if pages_ranking is not None:
                rankings["pages"] = pages_ranking
                wanted = "titles" in page_fusion(page_model(name) or "e5", query, has_titles=True).weights
                titles = view.searcher.title_ranking(query, clock) if mode == "hybrid" and wanted else None
                if titles is not None:
                    rankings["titles"] = titles
    lexical_scores: dict[str, float] = {}
    if mode in ("hybrid", "lexical"):
        lexicon = view.searcher.lexical(clock)
        if lexicon is None:
            note = "the site has no lexicon (it was ingested before chromafs wrote one): re-ingest it"
            if mode == "lexical" or not rankings:
                raise SearchError(note)
            result.notes.append(note + " for word ranking; ranked by meaning alone")
        else:
            lexical_scores = lexicon.scores(query)
            rankings["lexical"] = ranked(lexical_scores)
            clock.lap("lexical_rank")
    if not rankings:
        raise SearchError("no ranking can run for this site")
    both = bool(nearest) and "lexical" in rankings
    result.mode = mode if both or mode != "hybrid" else ("vector" if nearest else "lexical")
    if "pages" in rankings and result.embedder is not None:
        fusion = page_fusion(page_model(result.embedder) or "e5", query, "titles" in rankings)
        kinds = [kind for kind in rankings if fusion.weights.get(kind)]
        top = fuse([rankings[kind] for kind in kinds], k=fusion.k, weights=[fusion.weights[kind] for kind in kinds])
        top = top[:limit]
    elif both:
        top = fuse([rankings["chunks"], rankings["lexical"]], k=RRF_K, weights=[1.0, LEXICAL_WEIGHT])[:limit]
    elif nearest:
        top = [(path, -nearest[path][0]) for path in rankings["chunks"][:limit]]
    else:
        top = [(path, lexical_scores[path]) for path in rankings["lexical"][:limit]]
    if not top:
        return result
    entries = view.site.table.entries
    pages = view.load([entries[path] for path, _ in top], missing_ok=True)
    chunk_text: dict[str, str] = {}
    if nearest:
        chunks = view.site.source.chroma().collection.get(
            ids=[nearest[path][1] for path, _ in top if path in nearest], include=["documents"]
        )
        chunk_text = dict(zip(chunks["ids"], chunks.get("documents") or [], strict=False))
    for path, score in top:
        distance, record_id = nearest.get(path, (None, ""))
        text = chunk_text.get(record_id) or ""
        page = pages.get(path)
        if not text and page is not None:
            text = best_passage(split_page(page.decode("utf-8", "replace"), 2000), query)
        hit = Hit(path, distance, text, score=score)
        result.hits.append(locate(hit, page) if page is not None else hit)
    clock.lap("pages")
    return result


class Clock:
    """Seconds per stage of one search, in the order they ran."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = self.laps.get(stage, 0.0) + now - self._last
        self._last = now
