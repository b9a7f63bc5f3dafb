"""The Chroma adapter: the only module that talks to Chroma.

A Chroma server is read over its REST API with the standard library
(chroma_http); an embedded Chroma directory is read through its SQLite file
(chroma_sqlite), with chromadb as the fallback; ingest uses chromadb.
Calls here are blocking; the filesystem runs them on worker threads.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from chromafs_fuse.backends.deadline import with_deadline
from chromafs_fuse.config import ChromaLocation
from chromafs_fuse.errors import NotFound, Unavailable
from chromafs_fuse.names import (
    CHUNK_INDEX_FIELD,
    PAGE_FIELD,
    PAGE_SHA_FIELD,
    TREE_RECORD_ID,
    TREE_VERSION_FIELD,
    blob_piece_id,
    chunk_id,
)

if TYPE_CHECKING:
    from chromafs_fuse.tree import PathEntry

log = logging.getLogger(__name__)
PIECES_PER_GET = 8  # blob pieces read in one call: at most ~11 MB of base64 in one answer


class BackendError(Unavailable, RuntimeError):
    """Chroma could not be reached or answered with an error."""


class SiteNotFound(NotFound, RuntimeError):
    """The collection or its tree record does not exist."""


MAX_SITES_SHOWN = 20


def site_not_found(location: ChromaLocation, names: list[str] | None) -> SiteNotFound:
    """A collection that does not exist, named first, then the sites that do (`names`, the
    collections there; None: unknown), and the nearest name when one is close: a typo of --site
    is the usual cause."""
    missing = location.collection
    message = f"no site {missing!r} in Chroma at {location.server()}: no collection {missing!r}"
    if names is None:
        return SiteNotFound(message)
    if not names:
        return SiteNotFound(f"{message}, nor any other: ingest the site with chromafs-ingest")
    shown = ", ".join(names[:MAX_SITES_SHOWN]) + (
        f" and {len(names) - MAX_SITES_SHOWN} more" if len(names) > MAX_SITES_SHOWN else ""
    )
    close = difflib.get_close_matches(missing, names, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SiteNotFound(f"{message}; the sites there: {shown}{hint}")


def site_names(location: ChromaLocation, timeout_s: float) -> list[str] | None:
    """The collections at `location`'s server or directory (the sites, unless --collection names
    them otherwise), or None when they cannot be listed."""
    try:
        if location.url:
            from chromafs_fuse.backends.chroma_http import collection_names

            return collection_names(location.url, location.headers, location.tenant, location.database, timeout_s)
        if location.path:
            from chromafs_fuse.backends import chroma_sqlite

            names = chroma_sqlite.collection_names(
                location.path, location.tenant or "default_tenant", location.database or "default_database", timeout_s
            )
            if names is not None:
                return names
            client = connect_client(location, timeout_s)
            return sorted(str(getattr(c, "name", c)) for c in client.list_collections())
    except Exception as exc:  # only a hint of a message already failing: any failure leaves it out
        log.debug("cannot list the collections at %s: %s", location.server(), exc)
    return None


def _settings() -> Any:
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False, allow_reset=False)


def connect_client(location: ChromaLocation, timeout_s: float = 10.0) -> Any:
    """A chromadb client for the location. Imports chromadb lazily (it is slow)."""
    import chromadb

    try:
        if location.url:
            https, host, port = _server_address(location.url)
            extra: dict[str, str] = {}
            if location.tenant:
                extra["tenant"] = location.tenant
            if location.database:
                extra["database"] = location.database
            make = partial(
                chromadb.HttpClient,
                host=host,
                port=port,
                ssl=https,
                headers=dict(location.headers or {}),
                settings=_settings(),
                **extra,
            )
            try:
                client = with_deadline(make, timeout_s)  # chromadb asks the server with no deadline
            except TimeoutError as exc:
                raise BackendError(f"Chroma at {location.describe()} did not answer within {timeout_s:g}s") from exc
            _bound_http_timeout(client, timeout_s)
            return client
        if not location.path:
            raise BackendError("no Chroma location: give --chroma-path DIR or --chroma-url URL")
        return chromadb.PersistentClient(path=location.path, settings=_settings())
    except BackendError:
        raise
    except Exception as exc:  # chromadb raises many kinds for an unreachable server
        raise BackendError(f"cannot connect to Chroma at {location.describe()}: {exc}") from exc


def _server_address(url: str) -> tuple[bool, str, int]:
    from chromafs_fuse.backends.chroma_http import parse_server_url

    try:
        return parse_server_url(url)
    except ValueError as exc:
        raise BackendError(str(exc)) from None


def _open_http_collection(location: ChromaLocation, timeout_s: float) -> Any:
    """The collection on a Chroma server, through the standard-library REST adapter (no chromadb import)."""
    from chromafs_fuse.backends.chroma_http import CollectionNotFound, HttpCollection

    assert location.url
    _server_address(location.url)
    try:
        return HttpCollection.open(
            location.url,
            location.collection,
            headers=location.headers,
            tenant=location.tenant,
            database=location.database,
            timeout_s=timeout_s,
        )
    except CollectionNotFound as exc:
        raise site_not_found(location, site_names(location, timeout_s)) from exc
    except Exception as exc:  # ChromaHttpError, ChromaUnreachable, a malformed answer
        raise BackendError(
            f"cannot open Chroma at {location.describe()}: {exc} (is the Chroma server up? check --chroma-url)"
        ) from exc


def _bound_http_timeout(client: Any, timeout_s: float) -> None:
    """chromadb's HTTP client waits forever by default; give its httpx session a deadline."""
    try:
        import httpx

        session = client._server._session
        session.timeout = httpx.Timeout(timeout_s)
    except AttributeError:
        log.debug("could not set a timeout on the Chroma HTTP client")


def _open_chromadb_collection(location: ChromaLocation, timeout_s: float) -> Any:
    client = connect_client(location, timeout_s)
    try:
        return client.get_collection(location.collection, embedding_function=None)
    except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
        message = str(exc)
        if "does not exist" in message or "not found" in message.lower():
            raise site_not_found(location, site_names(location, timeout_s)) from exc
        raise BackendError(f"cannot open collection {location.collection!r}: {exc}") from exc


class ChromaPages:
    """Reads one site's collection: the tree record and the chunks of a page."""

    def __init__(
        self,
        collection: Any,
        page_field: str = PAGE_FIELD,
        chunk_index_field: str = CHUNK_INDEX_FIELD,
    ) -> None:
        self.collection = collection
        self.page_field = page_field
        self.chunk_index_field = chunk_index_field

    @classmethod
    def open(
        cls,
        location: ChromaLocation,
        page_field: str = PAGE_FIELD,
        chunk_index_field: str = CHUNK_INDEX_FIELD,
        timeout_s: float = 10.0,
    ) -> ChromaPages:
        if location.url:
            return cls(_open_http_collection(location, timeout_s), page_field, chunk_index_field)
        if location.path:
            from chromafs_fuse.backends.chroma_sqlite import SqliteCollection

            if not os.path.isfile(os.path.join(location.path, "chroma.sqlite3")):
                # chromadb would create an empty database there: a reader never writes
                raise BackendError(
                    f"no Chroma database at {location.path}: check --chroma-path (chromafs-ingest makes one)"
                )
            direct = SqliteCollection.open(
                location.path,
                location.collection,
                lambda: _open_chromadb_collection(location, timeout_s),
                tenant=location.tenant or "default_tenant",
                database=location.database or "default_database",
                timeout_s=timeout_s,
            )
            if direct is not None:
                return cls(direct, page_field, chunk_index_field)
        return cls(_open_chromadb_collection(location, timeout_s), page_field, chunk_index_field)

    def through_chromadb(self) -> ChromaPages | None:
        """For a collection read from its SQLite file directly: the same collection read by
        chromadb, the second opinion on a page that failed its checks. None otherwise."""
        from chromafs_fuse.backends.chroma_sqlite import SqliteCollection

        if not isinstance(self.collection, SqliteCollection):
            return None
        return ChromaPages(self.collection.chromadb(), self.page_field, self.chunk_index_field)

    def collection_metadata(self) -> Mapping[str, Any] | None:
        """The collection's own metadata (how chromafs-ingest embedded its chunks)."""
        try:
            metadata = self.collection.metadata
        except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
            raise BackendError(f"reading the collection's metadata failed: {exc}") from exc
        return metadata if isinstance(metadata, Mapping) else None

    def load_tree_document(self) -> tuple[str, Mapping[str, Any]]:
        try:
            result = self.collection.get(ids=[TREE_RECORD_ID], include=["documents", "metadatas"])
        except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
            raise BackendError(f"reading the path tree failed: {exc}") from exc
        if not result["ids"]:
            raise SiteNotFound(f"collection {self.collection.name!r} has no {TREE_RECORD_ID} record")
        document = (result.get("documents") or [None])[0]
        metadata = (result.get("metadatas") or [None])[0] or {}
        if not isinstance(document, str):
            raise SiteNotFound(f"{TREE_RECORD_ID} record has no document")
        return document, metadata

    def tree_marker(self) -> str:
        """The version of the tree record, cheaply: the field the ingest writes on it, else
        (a tree written by another tool) the version of its document."""
        try:
            result = self.collection.get(ids=[TREE_RECORD_ID], include=["metadatas"])
        except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
            raise BackendError(f"reading the path tree's version failed: {exc}") from exc
        if not result["ids"]:
            raise SiteNotFound(f"collection {self.collection.name!r} has no {TREE_RECORD_ID} record")
        metadata = (result.get("metadatas") or [None])[0] or {}
        version = metadata.get(TREE_VERSION_FIELD)
        if isinstance(version, str) and version:
            return version
        from chromafs_fuse.tree import tree_version

        return tree_version(self.load_tree_document()[0])

    def fetch_many(self, entries: Sequence[PathEntry]) -> dict[str, list[tuple[object, object]]]:
        """The chunks of several pages, by page key: by id when the tree says how many chunks
        chromafs-ingest wrote (a primary-key lookup of the documents alone: the id names the
        page and the chunk), else (or when an id is missing) by the page field (a metadata
        filter, several times slower on a large collection)."""
        what = repr(entries[0].key) if len(entries) == 1 else f"{len(entries)} pages"
        pages: dict[str, list[tuple[object, object]]] = {}
        by_field = list(entries)
        wanted = {
            chunk_id(entry.key, entry.sha256, index): (entry.key, index)
            for entry in entries
            if entry.chunks and entry.sha256
            for index in range(entry.chunks)
        }
        try:
            if wanted:
                found = self.collection.get(ids=list(wanted), include=["documents"])
                ids: Sequence[str] = found.get("ids") or []
                documents: Sequence[object] = found.get("documents") or [None] * len(ids)
                for record_id, document in zip(ids, documents, strict=False):
                    if record_id in wanted:
                        key, index = wanted[record_id]
                        pages.setdefault(key, []).append((index, document))
                by_field = [e for e in entries if not e.chunks or len(pages.get(e.key, ())) != e.chunks]
                for entry in by_field:
                    pages.pop(entry.key, None)
            if by_field:
                slugs = sorted({slug for entry in by_field for slug in _slug_variants(entry)})
                result = self.collection.get(
                    where={self.page_field: {"$in": slugs}}, include=["documents", "metadatas"]
                )
                pages.update(_pick_chunks(by_field, self.page_field, self.chunk_index_field, result))
        except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
            raise BackendError(f"fetching chunks of {what} failed: {exc}") from exc
        return pages

    def fetch_blob_pieces(self, blob_sha256: str, indexes: Sequence[int]) -> dict[int, Mapping[str, Any] | None]:
        """The metadata of pieces of a binary file kept in Chroma (blob_pieces.py), by index: a
        primary-key lookup, a few pieces per call. A piece not found is left out."""
        wanted = {blob_piece_id(blob_sha256, index): index for index in indexes}
        ids = list(wanted)
        pieces: dict[int, Mapping[str, Any] | None] = {}
        try:
            for start in range(0, len(ids), PIECES_PER_GET):
                found = self.collection.get(ids=ids[start : start + PIECES_PER_GET], include=["metadatas"])
                metadatas = found.get("metadatas") or [None] * len(found["ids"])
                for record_id, metadata in zip(found["ids"], metadatas, strict=False):
                    if record_id in wanted:
                        pieces[wanted[record_id]] = metadata
        except Exception as exc:  # chromadb's errors share no base class: every one becomes a BackendError
            raise BackendError(f"fetching pieces of blob {blob_sha256[:16]} failed: {exc}") from exc
        return pieces


def _slug_variants(entry: PathEntry) -> list[str]:
    variants = [entry.key, "/" + entry.key]
    if entry.source_key not in variants:
        variants.append(entry.source_key)
    return variants


def _pick_chunks(
    entries: Sequence[PathEntry], page_field: str, index_field: str, result: Mapping[str, Any]
) -> dict[str, list[tuple[object, object]]]:
    ids: Sequence[str] = result.get("ids") or []
    documents: Sequence[object] = result.get("documents") or [None] * len(ids)
    metadatas: Sequence[Mapping[str, Any] | None] = result.get("metadatas") or [None] * len(ids)
    by_slug: dict[str, list[tuple[object, object, object]]] = {}
    for record_id, document, metadata in zip(ids, documents, metadatas, strict=False):
        if record_id == TREE_RECORD_ID or metadata is None:
            continue
        by_slug.setdefault(str(metadata.get(page_field)), []).append(
            (metadata.get(index_field), document, metadata.get(PAGE_SHA_FIELD))
        )
    pages: dict[str, list[tuple[object, object]]] = {}
    for entry in entries:
        spellings = [s for s in _slug_variants(entry) if s in by_slug]
        # The same page under two slug spellings: trust the tree's own spelling.
        chosen = entry.source_key if entry.source_key in spellings else (spellings[0] if spellings else None)
        records = by_slug.get(chosen, []) if chosen is not None else []
        if entry.sha256 is not None and any(sha is not None for _, _, sha in records):
            # During a re-ingest old and new chunks coexist: keep this tree's version only.
            records = [r for r in records if r[2] == entry.sha256]
        pages[entry.key] = [(index, document) for index, document, _ in records]
    return pages
