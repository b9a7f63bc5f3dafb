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
from typing import TYPE_CHECKING, Any

from chromafs_fuse.access import Principal
from chromafs_fuse.errors import Refused
from chromafs_fuse.grep import GrepQuery, candidate_pages, grep_page
from chromafs_fuse.inodes import Node
from chromafs_fuse.tree import PathEntry

if TYPE_CHECKING:
    from chromafs_fuse.config import SessionConfig
    from chromafs_fuse.search import Hit
    from chromafs_fuse.site.loader import LoadedSite

BATCH = 5000  # chunks read per call of a semantic search


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
        self.check_live()
        return search_view(self, query, limit, embedder)

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


def search_view(view: ReaderView, query: str, limit: int, embedder: str | None = None) -> list[Hit]:
    """The `limit` pages of the reader's view nearest `query`, best first, each with its best
    chunk and that chunk's lines. Blocking. Chroma is read through the site's own client (each
    call within --backend-timeout), the pages through its page tiers."""
    from chromafs_fuse.ingest.embedding import make_embedder
    from chromafs_fuse.search import Hit, SearchError, embedder_name, locate, rank_pages, view_filter

    if limit < 1:
        raise SearchError("the number of results must be at least 1")
    config = view.config
    entries = list(view.site.table.entries.values())
    if not any(e.blob is None for e in entries):
        return []  # nothing the reader may see is searchable
    where, by_slug = view_filter(entries, config.page_field)
    chroma = view.site.source.chroma()
    collection = chroma.collection
    name = embedder_name(chroma.collection_metadata(), embedder)
    try:
        embed = make_embedder(name)[0]
        vector = [float(x) for x in embed([query])[0]]
    except Exception as exc:  # an unknown name, or a function whose model or key is absent
        raise SearchError(f"cannot embed the query with {name!r}: {exc}") from exc

    def batches() -> Iterator[tuple[list[str], list[list[float]], list[Any]]]:
        offset = 0
        while True:
            found = collection.get(where=where, include=["embeddings", "metadatas"], limit=BATCH, offset=offset)
            ids = list(found.get("ids") or [])
            if not ids:
                return
            yield ids, found["embeddings"], list(found.get("metadatas") or [None] * len(ids))
            offset += len(ids)

    ranked = rank_pages(batches(), vector, by_slug, config.page_field, limit)
    if not ranked:
        return []
    chunks = collection.get(ids=[record_id for _, _, record_id in ranked], include=["documents"])
    text = dict(zip(chunks["ids"], chunks.get("documents") or [], strict=False))
    pages = view.load([view.site.table.entries[path] for path, _, _ in ranked], missing_ok=True)
    hits = []
    for path, distance, record_id in ranked:
        hit, page = Hit(path, distance, text.get(record_id) or ""), pages.get(path)
        hits.append(locate(hit, page) if page is not None else hit)
    return hits
