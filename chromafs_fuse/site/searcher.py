"""What a reader's searches keep warm: the query's model, the view's chunk vectors, its BM25 index.

One `Searcher` per `ReaderView` (so per reader class and tree version: a view never changes
its tree). Everything is built on the first search and reused; the MCP server, `chromafs shell`
(through it) and a mount's search directory keep their views, so a warm search reads nothing but
the few chunks and pages it shows.

The BM25 index is built from the site's lexicon record (lexical.py) restricted to this view's
pages, at the versions its tree names: the record is read from Redis when another process has
put it there (under the tree's version), else from Chroma, and then shared through Redis.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from chromafs_fuse.lexical import LexicalIndex, LexiconPage, decode_lexicon, decode_vectors, lexicon_text, ranked
from chromafs_fuse.names import LEXICON_RECORD_ID
from chromafs_fuse.search import PageVectorIndex, SearchError, VectorIndex, embedder_name, view_filter

if TYPE_CHECKING:
    from chromafs_fuse.site.view import Clock, ReaderView

log = logging.getLogger("chromafs.search")
BATCH = 5000  # chunks read per call when the view's vectors are loaded


class Searcher:
    def __init__(self, view: ReaderView) -> None:
        self.view = view
        self._lock = threading.Lock()
        self._metadata: Any = None
        self._vectors: dict[str, VectorIndex] = {}
        self._lexical: LexicalIndex | None = None
        self._page_vectors: PageVectorIndex | None = None
        self._titles: LexicalIndex | None = None  # BM25 over titles, headings and paths
        self._lexical_loaded = False

    def _chroma(self) -> Any:
        return self.view.site.source.chroma()

    def _pages(self) -> list[Any]:
        return [e for e in self.view.site.table.entries.values() if e.blob is None]

    # -- vectors -----------------------------------------------------------------------------

    def query_vector(self, query: str, override: str | None, clock: Clock) -> tuple[str, Sequence[float]]:
        """(the collection's embedder, the query's vector), or SearchError saying why not."""
        from chromafs_fuse.ingest.embedding import make_embedder

        with self._lock:
            if self._metadata is None:
                self._metadata = self._chroma().collection_metadata() or {}
                clock.lap("chroma_open")
        name = embedder_name(self._metadata, override)
        try:
            embed = make_embedder(name)[0]
            clock.lap("model")
            vector = [float(x) for x in embed([query])[0]]
        except Exception as exc:  # an unknown name, or a model that is not on this machine
            raise SearchError(f"cannot embed the query with {name!r}: {exc}") from exc
        clock.lap("embed")
        return name, vector

    def vectors(self, name: str, clock: Clock) -> VectorIndex:
        with self._lock:
            index = self._vectors.get(name)
            if index is None:
                index = self._vectors[name] = self._load_vectors()
                clock.lap("vectors_load")
        return index

    def _load_vectors(self) -> VectorIndex:
        config = self.view.config
        where, by_slug = view_filter(self._pages(), config.page_field)
        collection = self._chroma().collection

        def batches() -> Iterator[tuple[list[str], Any, list[Any]]]:
            offset = 0
            while True:
                found = collection.get(where=where, include=["embeddings", "metadatas"], limit=BATCH, offset=offset)
                ids = list(found.get("ids") or [])
                if not ids:
                    return
                yield ids, found["embeddings"], list(found.get("metadatas") or [None] * len(ids))
                offset += len(ids)

        return VectorIndex.build(batches(), by_slug, config.page_field)

    def page_ranking(self, name: str, query: str, clock: Clock) -> list[str] | None:
        """The view's pages by their page vectors (embedder `name` gives pages one, and the site
        stored them in its lexicon), None when it does not; SearchError when the model is not here."""
        from chromafs_fuse.ingest.embedding import page_embedder

        try:
            model = page_embedder(name)
        except Exception as exc:
            raise SearchError(f"cannot embed the query for page vectors ({name!r}): {exc}") from exc
        if model is None:
            return None
        clock.lap("page_model")
        self.lexical(clock)
        if self._page_vectors is None:
            return None
        vector = model.queries([query])[0]
        clock.lap("page_embed")
        ranking = self._page_vectors.rank(vector)
        clock.lap("page_rank")
        return ranking

    # -- BM25 --------------------------------------------------------------------------------

    def lexical(self, clock: Clock) -> LexicalIndex | None:
        """The BM25 index of this view's pages; None when the site has no lexicon record."""
        with self._lock:
            if not self._lexical_loaded:
                document = self._lexicon_document()
                clock.lap("lexicon_read")
                if document is not None:
                    self._lexical = self._build(document)
                    clock.lap("lexicon_index")
                self._lexical_loaded = True
        return self._lexical

    def _build(self, document: str) -> LexicalIndex | None:
        """The BM25 index of the view's pages, and their page vectors if the site stored any."""
        try:
            pages = decode_lexicon(document)
        except ValueError as exc:
            log.warning("%s", exc)
            return None
        visible: list[tuple[str, LexiconPage]] = []
        for entry in self._pages():  # only the reader's pages, each at the version its tree names
            found = pages.get(entry.key) or pages.get(entry.source_key)
            if found is not None and (entry.sha256 is None or found.sha256 == entry.sha256):
                visible.append((entry.key, found))
        with_vectors = sorted((key, page.vector) for key, page in visible if page.vector is not None)
        if with_vectors:
            try:
                matrix = decode_vectors([vector for _, vector in with_vectors])
                self._page_vectors = PageVectorIndex(tuple(key for key, _ in with_vectors), matrix)
            except ValueError as exc:
                log.warning("the lexicon's page vectors cannot be read: %s", exc)
        if visible and all(page.titles is not None for _, page in visible):
            self._titles = LexicalIndex.build((key, page.titles or {}) for key, page in visible)
        return LexicalIndex.build((key, page.counts) for key, page in visible)

    def title_ranking(self, query: str, clock: Clock) -> list[str] | None:
        """The view's pages by BM25 over their titles, headings and paths (`title_terms`); None
        when the site's lexicon has no title terms (written before chromafs stored them)."""
        self.lexical(clock)
        if self._titles is None:
            return None
        found = ranked(self._titles.scores(query))
        clock.lap("title_rank")
        return found

    def _redis_key(self) -> str | None:
        shared = self.view.site.source.shared
        if shared is None:
            return None
        config = self.view.config
        return f"{shared.tree_key(config.site, config.chroma.collection)}:lexicon:{self.view.site.tree.version}"

    def _lexicon_document(self) -> str | None:
        shared, key = self.view.site.source.shared, self._redis_key()
        if shared is not None and key is not None:
            cached = shared.get(key)
            if cached is not None:
                return cached.decode("ascii")
        collection = self._chroma().collection
        try:
            found = collection.get(ids=[LEXICON_RECORD_ID], include=["documents", "metadatas"])
            document = lexicon_text(found, lambda ids: collection.get(ids=ids, include=["metadatas"]))
        except ValueError as exc:  # its parts: one missing, or written over meanwhile
            log.warning("%s", exc)
            return None
        except Exception as exc:  # chromadb's errors share no base class
            raise SearchError(f"reading the lexicon failed: {exc}") from exc
        if document is not None and shared is not None and key is not None:
            ttl = self.view.config.redis.tree_ttl_s if self.view.config.redis else shared.tree_ttl_s
            shared.set(key, document.encode("ascii"), ttl)
        return document
