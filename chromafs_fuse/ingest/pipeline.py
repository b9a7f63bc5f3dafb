"""Ingest: load a folder of docs into a site's Chroma collection.

Re-running updates the site in place and never lets a reader mix versions:
new chunks are added under new ids (tagged with the page's sha256), the tree
record is rewritten, and the old chunks are retired: deleted by a later ingest
once the grace period has passed (retention.py), so mounts that still serve the
old tree can read them meanwhile. With no blob store, binary files are kept in
Chroma itself (chroma_blobs.py), and retired the same way.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from chromafs_fuse.backends.blobstore import BlobStore
from chromafs_fuse.backends.chroma_http import CollectionNotFound, HttpCollection
from chromafs_fuse.backends.chroma_store import ChromaLocation, connect_client
from chromafs_fuse.blob_pieces import blob_fields, is_chroma_url
from chromafs_fuse.chunks import split_page
from chromafs_fuse.config import from_flag
from chromafs_fuse.ingest.access_rules import Access, AclRule
from chromafs_fuse.ingest.chroma_blobs import (
    IN_CHROMA,
    MAX_UPSERT_BYTES,
    PAGE,
    TOO_LARGE,
    BlobWriter,
    chroma_blob_plan,
    delete_blob_pieces,
)
from chromafs_fuse.ingest.chroma_writes import RetryingCollection, WriteFailed, retried
from chromafs_fuse.ingest.embedding import (
    NEW_SITE_EMBEDDER,
    PageEmbedder,
    embed_with_titles,
    make_embedder,
    page_embedder,
    page_summary,
    page_title,
)
from chromafs_fuse.ingest.retention import (
    RetentionPlan,
    RetiredRecord,
    decode_record,
    encode_retired,
    plan_retention,
)
from chromafs_fuse.ingest.scan import KeptFile, Problem, ScanOptions, SiteScan, SourceFile, one_per_file
from chromafs_fuse.ingest.spooled_rows import Row, SpooledRows
from chromafs_fuse.lexical import (
    LEXICON_MANIFEST_FIELD,
    MANIFEST_STUB,
    LexiconManifest,
    LexiconPage,
    LexiconPart,
    bucket_count,
    bucket_parts,
    decode_lexicon,
    encode_row,
    encode_vector,
    keeps_buckets,
    lexicon_part_ids,
    lexicon_preview,
    lexicon_text,
    manifest_of,
    page_bucket,
    page_terms,
    parts_text,
    title_terms,
)
from chromafs_fuse.names import (
    ACCESS_INPUTS_FIELD,
    EMBEDDER_FIELD,
    FORMAT_FIELD,
    FORMAT_VERSION,
    LEXICON_DATA_FIELD,
    LEXICON_RECORD_ID,
    LEXICON_RECORD_KIND,
    PAGE_SHA_FIELD,
    RECORD_KIND_FIELD,
    RETIRED_RECORD_ID,
    RETIRED_RECORD_KIND,
    SCANNED_AT_FIELD,
    TREE_RECORD_ID,
    TREE_RECORD_KIND,
    TREE_VERSION_FIELD,
    chunk_id,
)
from chromafs_fuse.options import INGEST_OPTIONS
from chromafs_fuse.packed import pack
from chromafs_fuse.tree import PathEntry, TreeError, encode_tree_document, parse_tree, tree_version

log = logging.getLogger("chromafs.ingest")
UPSERT_BATCH = 5000  # chunks per upsert (Chroma's own bound may be lower)

# Exit statuses of chromafs-ingest (1 bad input or backend error, 2 usage: see ingest_cli).
EXIT_CLEAN = 0
EXIT_WITH_ERRORS = 3  # the site was written; some files are not served as their source says
EXIT_NOTHING_INGESTED = 4  # no file could be ingested: the collection was left as it was


@dataclass
class IngestOptions:
    source_dir: Path
    site: str
    location: ChromaLocation
    default_access: str = from_flag("--default-access", INGEST_OPTIONS)
    acl_rules: Sequence[AclRule] = ()  # --acl's file, read
    # None: what the collection records, else NEW_SITE_EMBEDDER
    embedder: str | None = from_flag("--embedder", INGEST_OPTIONS)
    max_chunk_chars: int = from_flag("--max-chunk-chars", INGEST_OPTIONS)
    blob_store: BlobStore | None = None
    large_file_threshold: int = from_flag("--large-file-threshold", INGEST_OPTIONS)
    # no blob store: larger binary files are not ingested
    chroma_blob_limit: int = from_flag("--chroma-blob-limit", INGEST_OPTIONS)
    include_hidden: bool = from_flag("--include-hidden", INGEST_OPTIONS)
    page_field: str = from_flag("--page-field", INGEST_OPTIONS)
    chunk_index_field: str = from_flag("--chunk-index-field", INGEST_OPTIONS)
    grace_period_s: float = from_flag("--grace-period", INGEST_OPTIONS)
    timeout_s: float = from_flag("--backend-timeout", INGEST_OPTIONS)  # one call to a Chroma server
    retries: int = from_flag("--retries", INGEST_OPTIONS)  # more tries of a call that timed out or was refused
    checksum: bool = from_flag("--checksum", INGEST_OPTIONS)  # read every file, whatever its size and mtime


@dataclass
class IngestSummary:
    embedder: str = ""
    pages: int = 0
    chunks_written: int = 0
    bytes: int = 0
    lazy_files: int = 0  # in the blob store
    chroma_blobs: int = 0  # binary files kept in Chroma (no blob store)
    blob_pieces_written: int = 0
    unchanged: int = 0
    not_read: int = 0  # unchanged files known by their size and mtime alone
    access_kept: int = 0  # unchanged pages whose access the last ingest decided (frontmatter not read)
    updated: int = 0
    removed: int = 0
    retired_kept: int = 0  # old page versions kept for mounts still on the previous tree
    retired_deleted: int = 0  # old page versions whose grace period had passed: deleted
    retired_blobs_kept: int = 0  # binary files kept in Chroma that the tree no longer has, kept a while
    retired_blobs_deleted: int = 0
    seconds: float = 0.0
    skipped: Counter[str] = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)
    tree_document: str = ""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.is_error]

    @property
    def exit_status(self) -> int:
        if self.pages == 0:
            return EXIT_NOTHING_INGESTED
        return EXIT_WITH_ERRORS if self.errors else EXIT_CLEAN

    def lines(self) -> list[str]:
        rate = f", {self.pages / self.seconds:.0f} pages/s" if self.seconds > 0 else ""
        out = [
            f"pages: {self.pages} ({self.updated} written, {self.unchanged} unchanged, {self.removed} removed)"
            f" in {self.seconds:.1f} s{rate}",
            f"not read: {self.not_read} unchanged files whose size and mtime are the ones the site's tree records"
            " (--checksum reads them)",
            f"chunks written: {self.chunks_written} (embedder: {self.embedder or 'none'})",
            f"access kept from the last ingest: {self.access_kept} unchanged files (their frontmatter not read"
            " again: its problems were reported when they changed)",
            f"old page versions: {self.retired_kept} kept for running mounts, {self.retired_deleted} deleted",
            f"bytes: {self.bytes}",
            f"lazy files (blob store): {self.lazy_files}",
            f"binary files kept in Chroma: {self.chroma_blobs} ({self.blob_pieces_written} pieces written)",
            f"old binary files in Chroma: {self.retired_blobs_kept} kept for running mounts,"
            f" {self.retired_blobs_deleted} deleted",
            f"skipped: {sum(self.skipped.values())}",
        ]
        out += [f"  {count} {reason}" for reason, count in sorted(self.skipped.items())]
        errors = len(self.errors)
        out.append(f"problems: {errors} errors, {len(self.problems) - errors} warnings")
        return out

    def report(self, site: str) -> dict[str, Any]:
        """The machine-readable report (--report FILE)."""
        status = {EXIT_CLEAN: "clean", EXIT_WITH_ERRORS: "finished with errors"}.get(
            self.exit_status, "nothing ingested"
        )
        return {
            "site": site,
            "status": status,
            "exit_status": self.exit_status,
            "pages": self.pages,
            "written": self.updated,
            "unchanged": self.unchanged,
            "not_read": self.not_read,
            "access_kept": self.access_kept,
            "removed": self.removed,
            "chunks_written": self.chunks_written,
            "embedder": self.embedder,
            "retired_kept": self.retired_kept,
            "retired_deleted": self.retired_deleted,
            "bytes": self.bytes,
            "lazy_files": self.lazy_files,
            "chroma_blobs": self.chroma_blobs,
            "blob_pieces_written": self.blob_pieces_written,
            "retired_blobs_kept": self.retired_blobs_kept,
            "retired_blobs_deleted": self.retired_blobs_deleted,
            "seconds": round(self.seconds, 3),
            "skipped": dict(self.skipped),
            "errors": len(self.errors),
            "warnings": len(self.problems) - len(self.errors),
            "problems": [p.as_json() for p in self.problems],
        }


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _progress(total: int, enabled: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="file", leave=False)


def _plan(source: SourceFile, options: IngestOptions, summary: IngestSummary) -> str:
    """What becomes of one file (chroma_blobs.py's PAGE, IN_CHROMA or TOO_LARGE), its problem noted."""
    if options.blob_store is not None:
        return PAGE
    plan, problem = chroma_blob_plan(source, options.chroma_blob_limit)
    if problem is not None:
        summary.problems.append(problem)
    if plan == TOO_LARGE:
        summary.skipped["binary files above --chroma-blob-limit"] += 1
    return plan


class ChunkWriter:
    """Chunks queued for upsert, written in batches never above the server's bound on records
    nor MAX_UPSERT_BYTES of text (whatever a page holds: Chroma refuses a request of more than
    40 MiB). Chunk ids name the page's sha256: a chunk already stored (an ingest that stopped
    half way wrote it) is written again only if its text differs."""

    def __init__(
        self, collection: RetryingCollection, embed: Any, batch_size: int, page_field: str, summary: IngestSummary
    ) -> None:
        self.collection = collection
        self.embed = embed
        self.batch_size = batch_size
        self.page_field = page_field
        self.summary = summary
        self.dimensions: int | None = None
        self._ids: list[str] = []
        self._docs: list[str] = []
        self._titles: list[str] = []
        self._meta: list[dict[str, Any]] = []
        self._bytes = 0

    def add(self, chunk_id: str, document: str, title: str, metadata: dict[str, Any]) -> None:
        size = len(document.encode("utf-8"))
        if self._ids and self._bytes + size > MAX_UPSERT_BYTES:
            self.flush()
        self._ids.append(chunk_id)
        self._docs.append(document)
        self._titles.append(title)
        self._meta.append(metadata)
        self._bytes += size
        if len(self._ids) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        if not self._ids:
            return
        what = f"upsert of {len(self._ids)} chunks ({self._meta[0][self.page_field]} to "
        what += f"{self._meta[-1][self.page_field]})"
        present = self.collection.get(what.replace("upsert", "check", 1), ids=list(self._ids), include=["documents"])
        stored = dict(zip(present["ids"], present["documents"] or [], strict=False))
        todo = [i for i, chunk in enumerate(self._ids) if stored.get(chunk) != self._docs[i]]
        if todo:
            docs = [self._docs[i] for i in todo]
            vectors = embed_with_titles(self.embed, docs, [self._titles[i] for i in todo])
            self.dimensions = self.dimensions or len(vectors[0])
            self.collection.upsert(
                what,
                ids=[self._ids[i] for i in todo],
                documents=docs,
                metadatas=[self._meta[i] for i in todo],
                embeddings=vectors,
            )
        self.summary.chunks_written += len(todo)
        for pending in (self._ids, self._docs, self._titles, self._meta):
            pending.clear()
        self._bytes = 0


class PageVectors:
    """Each new page's vector from the site's page model (embedding.py's `page_embedder`),
    embedded in a worker thread while the main one chunks and writes (e5's engine and wordllama's
    tokenizer release the GIL), in
    batches of BATCH pages. Nothing to do when the embedder gives pages no vector."""

    BATCH = 64

    def __init__(self, model: PageEmbedder | None) -> None:
        self.model = model
        self._keys: list[str] = []
        self._texts: list[str] = []
        self._done: list[tuple[list[str], Future[Any]]] = []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="page-vectors") if model is not None else None

    def add(self, key: str, text: str, title: str) -> None:
        if self.model is None:
            return
        self._keys.append(key)
        self._texts.append(page_summary(text, title))
        if len(self._keys) >= self.BATCH:
            self._submit()

    def _submit(self) -> None:
        if self._keys and self._pool is not None and self.model is not None:
            self._done.append((self._keys, self._pool.submit(self.model.passages, self._texts)))
            self._keys, self._texts = [], []

    def __enter__(self) -> PageVectors:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if error is not None and self._pool is not None:  # a failed ingest waits for no queued batch
            self._pool.shutdown(cancel_futures=True)

    def finished(self) -> Iterator[tuple[str, str]]:
        """(page, its vector as stored) of the batches embedded so far, each once; never waits."""
        while self._done and self._done[0][1].done():
            keys, future = self._done.pop(0)
            for key, vector in zip(keys, future.result(), strict=True):
                yield key, encode_vector(vector)

    def results(self) -> Iterator[tuple[str, str]]:
        """(page, its vector as stored) for every page added and not yet given; waits for the worker."""
        self._submit()
        try:
            for keys, future in self._done:
                for key, vector in zip(keys, future.result(), strict=True):
                    yield key, encode_vector(vector)
            self._done = []
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)


def _open_collection(options: IngestOptions) -> tuple[RetryingCollection, int, str]:
    """The site's collection (made if new), the number of records one upsert may carry, and
    the embedder its chunks are embedded with: the one it records (an existing site keeps it;
    one written before the field existed used `hashing`), else --embedder or the default.
    An existing collection on a server is written through the standard-library REST client
    (a re-ingest need not import chromadb, ~1.2 s); a new one is made by chromadb, with the
    configuration chromadb gives it."""
    existing = _existing_on_server(options)
    if existing is not None:
        collection: Any = existing
        metadata = existing.metadata or {}
        server_bound = retried("read of the batch bound", existing.max_batch_size, options.retries)
    else:
        client = retried(
            "connect to Chroma",
            connect_client,
            options.retries,
            location=options.location,
            timeout_s=options.timeout_s,
        )
        collection = retried(
            "open of the collection",
            client.get_or_create_collection,
            options.retries,
            name=options.location.collection,
            embedding_function=None,
            metadata={
                "hnsw:space": "l2",
                FORMAT_FIELD: FORMAT_VERSION,
                EMBEDDER_FIELD: options.embedder or NEW_SITE_EMBEDDER,
            },
        )
        metadata = collection.metadata or {}
        server_bound = retried(
            "read of the batch bound", getattr(client, "get_max_batch_size", lambda: UPSERT_BATCH), options.retries
        )
    recorded = metadata.get(EMBEDDER_FIELD) or ("hashing" if FORMAT_FIELD in metadata else None)
    embedder = str(recorded or options.embedder or NEW_SITE_EMBEDDER)
    if options.embedder and options.embedder != embedder:
        raise ValueError(
            f"site {options.site!r} was embedded with {embedder!r}, not {options.embedder!r}: "
            f"leave out --embedder, or ingest into a new collection to change it"
        )
    bound = int(server_bound) if int(server_bound) > 0 else UPSERT_BATCH
    return RetryingCollection(collection, options.retries), max(1, min(UPSERT_BATCH, bound)), embedder


def _existing_on_server(options: IngestOptions) -> HttpCollection | None:
    """The site's collection on a Chroma server through the REST client, if it exists."""
    location = options.location
    if not location.url:
        return None
    try:
        return retried(
            "open of the collection",
            HttpCollection.open,
            options.retries,
            url=location.url,
            name=location.collection,
            headers=location.headers,
            tenant=location.tenant,
            database=location.database,
            timeout_s=options.timeout_s,
        )
    except WriteFailed as exc:
        if isinstance(exc.__cause__, CollectionNotFound):
            return None
        raise


def ingest(options: IngestOptions, show_progress: bool = False) -> IngestSummary:
    started, scanned_at = time.monotonic(), time.time()
    summary = IngestSummary()
    # read a window ahead, never the whole site: its size does not set the ingest's memory
    scan = SiteScan(ScanOptions(options.source_dir, options.default_access, options.acl_rules, options.include_hidden))
    summary.problems = scan.problems  # filled as the files are read
    if not scan.total:  # never replace a site with nothing: a wrong or empty folder leaves it as it was
        summary.problems = one_per_file(summary.problems)
        summary.seconds = time.monotonic() - started
        return summary
    collection, batch_size, embedder = _open_collection(options)
    embed, dimensions = make_embedder(embedder)
    zero_vector = [0.0] * (dimensions or len(embed([""])[0]))
    page_vectors = PageVectors(page_embedder(embedder))
    summary.embedder = embedder
    old_tree, old_document, old_metadata = _existing_tree(collection)
    access_inputs = scan.access_inputs()
    same_inputs = old_metadata.get(ACCESS_INPUTS_FIELD) == access_inputs
    if same_inputs:
        scan.known = _known_access(old_tree)
    old_lexicon = _StoredLexicon(collection)
    # a page whose bytes the stored tree holds keeps its lexicon row, unless that lexicon is of
    # an older form (it is then written anew from every page)
    lexicon_kept = old_lexicon.current(with_vectors=page_vectors.model is not None)
    if same_inputs and lexicon_kept and not options.checksum:
        scan.unchanged = _quick_check(old_tree, old_metadata.get(SCANNED_AT_FIELD), options)
    # Only pages stored as chunks count: a page that was a blob must get chunks written.
    old_pages = {key: entry for key, entry in old_tree.items() if entry.blob is None}
    writer = ChunkWriter(collection, embed, batch_size, options.page_field, summary)
    writer.dimensions = dimensions
    stored_blobs = _stored_blobs(old_tree)
    blobs = BlobWriter(collection, batch_size, zero_vector, stored_blobs)

    tree: dict[str, dict[str, Any]] = {}
    tree_changed = False
    new_terms = SpooledRows()  # pages whose terms (lexical.py) were counted now
    kept_terms: dict[str, tuple[str, str]] = {}  # page -> (sha256, path): its stored row is kept
    with _progress(scan.total, show_progress, f"ingest {options.site}") as bar, page_vectors:
        for source in scan:
            bar.update(1)
            if isinstance(source, KeptFile):
                stored = old_tree[source.key]
                tree[source.key] = _tree_fields(stored)
                summary.pages += 1
                summary.unchanged += 1
                summary.not_read += 1
                summary.bytes += source.size
                if stored.blob is None:
                    kept_terms[source.key] = (stored.sha256 or "", source.path)
                elif is_chroma_url(stored.blob.url):
                    summary.chroma_blobs += 1
                else:
                    summary.lazy_files += 1
                continue
            plan = _plan(source, options, summary)
            if plan == TOO_LARGE:
                continue
            sha = source.sha256
            entry: dict[str, Any] = source.access.as_tree_fields()
            entry.update(size=len(source.data), sha256=sha, mtime=round(source.mtime, 3))
            wants_blob = source.text is None or len(source.data) > options.large_file_threshold
            if plan == IN_CHROMA:
                entry["blob"] = blob_fields(source.data, sha)
                blobs.add(source.key, sha, source.data)
                summary.chroma_blobs += 1
            elif wants_blob and options.blob_store is not None:
                url, _ = options.blob_store.put(source.data)
                entry["blob"] = {"url": url, "size": len(source.data), "sha256": sha}
                summary.lazy_files += 1
            tree[source.key] = entry
            summary.pages += 1
            summary.bytes += len(source.data)
            if "blob" in entry:
                tree_changed = tree_changed or _changed(entry, old_tree.get(source.key))
                continue
            assert source.text is not None
            previous = old_pages.get(source.key)
            unchanged = previous is not None and previous.sha256 == sha
            if unchanged and lexicon_kept:
                kept_terms[source.key] = (sha, source.path)
            else:
                row = _terms(source.key, source.text, sha, page_vectors)
                new_terms[source.key] = row if page_vectors.model is not None else encode_row(row)
                for key, vector in page_vectors.finished():
                    _vector_in(new_terms, key, vector)
            if previous is not None and previous.sha256 == sha:
                summary.unchanged += 1
                if previous.chunks is not None:
                    entry["chunks"] = previous.chunks
                tree_changed = tree_changed or _changed(entry, previous)
                continue
            tree_changed = True
            summary.updated += 1
            chunks = split_page(source.text, options.max_chunk_chars)
            entry["chunks"] = len(chunks)
            title = page_title(source.text)
            for index, chunk in enumerate(chunks):
                metadata = {options.page_field: source.key, options.chunk_index_field: index, PAGE_SHA_FIELD: sha}
                writer.add(chunk_id(source.key, sha, index), chunk, title, metadata)
        writer.flush()
        blobs.flush()
        summary.removed = sum(1 for k in old_pages if k not in tree)
        tree_changed = tree_changed or len(tree) != len(old_tree) or any(k not in tree for k in old_tree)
        lexicon: _LexiconChange | None = None
        if new_terms or summary.removed or len(kept_terms) + len(new_terms) != len(old_pages):
            lexicon = _LexiconChange.of(old_lexicon, old_pages, kept_terms, new_terms, page_vectors, lexicon_kept)
    summary.problems = one_per_file(summary.problems)
    summary.blob_pieces_written = blobs.written
    summary.access_kept = scan.reused
    if not tree:  # every file refused (too large): the site stays as it was
        summary.seconds = time.monotonic() - started
        return summary
    final: list[_Record] = []  # the site's records, written together after its chunks and pieces
    stale: list[str] = []
    if lexicon is not None:  # an unchanged site keeps its records
        for key, vector in page_vectors.results():
            _vector_in(lexicon.rows, key, vector)
        spill = functools.partial(_upsert_one, collection, zero_vector)
        final += lexicon.records(page_vectors.model is not None, spill)
        stale = lexicon.stale(final)
    metadata = {
        RECORD_KIND_FIELD: TREE_RECORD_KIND,
        FORMAT_FIELD: FORMAT_VERSION,
        "site": options.site,
        ACCESS_INPUTS_FIELD: access_inputs,
        SCANNED_AT_FIELD: round(scanned_at, 3),
    }
    kept_metadata = {k: v for k, v in old_metadata.items() if k not in (TREE_VERSION_FIELD, SCANNED_AT_FIELD)}
    # an older scan's time stays with the tree it wrote: a file changed since has a later mtime
    same_metadata = SCANNED_AT_FIELD in old_metadata and kept_metadata == {
        k: v for k, v in metadata.items() if k != SCANNED_AT_FIELD
    }
    if not tree_changed and old_document is not None and same_metadata:  # an unchanged site keeps its record
        summary.tree_document = old_document
    else:
        summary.tree_document = encode_tree_document(tree)
        metadata[TREE_VERSION_FIELD] = tree_version(summary.tree_document)
        final.append(_Record("the path tree", TREE_RECORD_ID, summary.tree_document, metadata))
    retirement = _Retirement.of(collection, options, old_tree, tree, summary)
    if retirement.first is not None:
        final.append(retirement.first)
    _upsert_records(collection, final, zero_vector, batch_size)
    if stale:
        collection.delete("delete of the last lexicon's parts", ids=stale)
    retirement.finish(collection, options, zero_vector, batch_size)
    new_terms.close()
    summary.seconds = time.monotonic() - started
    return summary


class _Record(NamedTuple):
    what: str
    id: str
    document: str
    metadata: dict[str, Any]


FINAL_UPSERT_BYTES = 24 * 1024 * 1024  # the site's records in one request, below a server's 40 MiB bound


def _upsert_one(collection: RetryingCollection, zero_vector: list[float], record: _Record) -> None:
    _upsert_records(collection, [record], zero_vector, 1)


def _upsert_records(
    collection: RetryingCollection, records: Sequence[_Record], zero_vector: list[float], batch_size: int
) -> None:
    """One upsert of them all when they fit in one request (a write to Chroma costs a second or
    more on a big collection, whatever its size: its index is saved), else one each, in order."""
    size = sum(len(r.document) + sum(len(str(v)) for v in r.metadata.values()) for r in records)
    together = [list(records)] if len(records) <= batch_size and size <= FINAL_UPSERT_BYTES else [[r] for r in records]
    for batch in together:
        if not batch:
            continue
        collection.upsert(
            "upsert of " + ", ".join(r.what for r in batch),
            ids=[r.id for r in batch],
            documents=[r.document for r in batch],
            metadatas=[r.metadata for r in batch],
            embeddings=[zero_vector] * len(batch),
        )


def _vector_in(rows: MutableMapping[str, Row], key: str, vector: str) -> None:
    """A page's row made whole with its vector, kept as its text."""
    row = rows[key]
    assert not isinstance(row, str), "a page's vector came twice"
    rows[key] = encode_row(row._replace(vector=vector))


def _terms(key: str, text: str, sha: str, page_vectors: PageVectors) -> LexiconPage:
    """A page's lexicon row counted from its text (its vector is embedded meanwhile)."""
    title = page_title(text)
    titles = title_terms(page_summary(text, title), key)
    page_vectors.add(key, text, title)
    return LexiconPage(sha, page_terms(text, title, key), None, titles)


@dataclass
class _LexiconChange:
    """The buckets of the lexicon (lexical.py) that a re-ingest rewrites, with their rows; the
    others keep their records."""

    stored: _StoredLexicon
    buckets: int
    dirty: dict[int, list[str]]  # bucket -> its pages
    rows: MutableMapping[str, Row]

    @classmethod
    def of(
        cls,
        stored: _StoredLexicon,
        old_pages: Mapping[str, PathEntry],
        kept: Mapping[str, tuple[str, str]],
        new: MutableMapping[str, Row],
        page_vectors: PageVectors,
        rows_kept: bool,
    ) -> _LexiconChange:
        """`kept`: page -> (sha256, path) of the pages whose stored row stays (read now if it is
        missing: a lexicon written over by hand or by another version); `new`: rows counted now,
        to which the kept rows of the buckets to rewrite are added."""
        total = len(kept) + len(new)
        manifest = stored.manifest if rows_kept else None
        changed: set[int] | None = None
        if manifest is not None and keeps_buckets(manifest.buckets, total):
            buckets = manifest.buckets
            changed = {page_bucket(key, buckets) for key in new}
            changed |= {page_bucket(key, buckets) for key in old_pages if key not in kept and key not in new}
        else:
            buckets = bucket_count(total)
        dirty: dict[int, list[str]] = {}
        for key in itertools.chain(kept, new):
            bucket = page_bucket(key, buckets)
            if changed is None or bucket in changed:
                dirty.setdefault(bucket, []).append(key)
        if changed is not None:
            dirty.update({bucket: [] for bucket in changed if bucket not in dirty})  # emptied
        wanted = [key for keys in dirty.values() for key in keys if key in kept]
        old = stored.decode(None if changed is None else set(dirty)) if wanted and rows_kept else {}
        rows = new
        for key in wanted:
            sha, path = kept[key]
            row = old.get(key)
            vector_ok = row is not None and (page_vectors.model is None or row.vector is not None)
            if row is not None and row.sha256 == sha and row.titles is not None and vector_ok:
                rows[key] = row
                continue
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                log.warning("%s: its search terms could not be counted again: %s", key, exc.strerror)
                continue
            rows[key] = _terms(key, data.decode("utf-8", "replace"), sha, page_vectors)
        return cls(stored, buckets, dirty, rows)

    def records(self, with_vectors: bool, write: Callable[[_Record], None]) -> list[_Record]:
        """The parts of the buckets it rewrites (but those stored already: same text, same id),
        then the head that names every part, to be written in this order. When the parts come to
        more than half of what one request takes, `write` writes them, each as it is made (a big
        site's lexicon is never held whole), and only the head is returned."""
        old = self.stored.manifest
        same_buckets = old is not None and old.buckets == self.buckets
        kept_parts = [p for p in old.parts if p.bucket not in self.dirty] if old is not None and same_buckets else []
        known = {p.id for p in old.parts} if old is not None else set()
        new_parts: list[LexiconPart] = []
        records: list[_Record] = []
        held = 0  # bytes of text in `records`; -1 once they are written as they come
        for bucket in sorted(self.dirty):
            rows = {key: self.rows.pop(key) for key in self.dirty[bucket] if key in self.rows}
            if not rows:
                continue
            for part, text in bucket_parts(bucket, rows):
                new_parts.append(part)
                if part.id in known:
                    continue
                what = f"the lexicon's bucket {bucket} ({len(rows)} pages)"
                record = _Record(what, part.id, LEXICON_RECORD_KIND, _lexicon_metadata({LEXICON_DATA_FIELD: text}))
                if held < 0:
                    write(record)
                    continue
                records.append(record)
                held += len(text)
                if held > FINAL_UPSERT_BYTES // 2:
                    for one in records:
                        write(one)
                    records, held = [], -1
        parts = tuple(sorted([*kept_parts, *new_parts], key=lambda p: p.bucket))
        manifest = LexiconManifest(self.buckets, 3, with_vectors, parts)
        head = {LEXICON_DATA_FIELD: pack(json.dumps(MANIFEST_STUB).encode()), LEXICON_MANIFEST_FIELD: manifest.encode()}
        records.append(_Record("the lexicon's head", LEXICON_RECORD_ID, LEXICON_RECORD_KIND, _lexicon_metadata(head)))
        return records

    def stale(self, records: Sequence[_Record]) -> list[str]:
        """The last lexicon's parts that the new head no longer names: deleted once it is written."""
        head = next(r for r in records if r.id == LEXICON_RECORD_ID)
        named = set(lexicon_part_ids(head.metadata))
        return [i for i in self.stored.part_ids if i not in named]


def _lexicon_metadata(fields: dict[str, Any]) -> dict[str, Any]:
    return {RECORD_KIND_FIELD: LEXICON_RECORD_KIND, FORMAT_FIELD: FORMAT_VERSION, **fields}


# A file whose mtime is this close to the last walk's start may have changed again within its
# mtime's grain after it was read: whole seconds on a filesystem that keeps seconds (FAT keeps two),
# a kernel tick (a few ms) on the others, whose mtimes have a fraction.
RACY_SECONDS = 2.0
FINE_RACY_SECONDS = 0.1


def _quick_check(
    old_tree: Mapping[str, PathEntry], scanned_at: object, options: IngestOptions
) -> Callable[[str, int, float], bool] | None:
    """Whether a walked file is the one the stored tree holds, by its size and mtime alone: the
    tree must say when its walk began (a file changed since has a later mtime, unless one is set
    by hand: --checksum), and the file must keep the shape it had (a page, or a binary file kept
    where these options keep it)."""
    if isinstance(scanned_at, bool) or not isinstance(scanned_at, int | float):
        return None
    walked = float(scanned_at)

    def unchanged(key: str, size: int, mtime: float) -> bool:
        entry = old_tree.get(key)
        if entry is None or entry.size != size or entry.mtime != round(mtime, 3) or entry.source_key != key:
            return False
        grain = RACY_SECONDS if entry.mtime == int(entry.mtime) else FINE_RACY_SECONDS
        if entry.sha256 is None or entry.mtime >= walked - grain:
            return False
        if entry.blob is None:
            return options.blob_store is None or size <= options.large_file_threshold
        if is_chroma_url(entry.blob.url):
            return options.blob_store is None and size <= options.chroma_blob_limit
        return options.blob_store is not None

    return unchanged


def _tree_fields(entry: PathEntry) -> dict[str, Any]:
    """The tree entry an ingest writes for a file as `entry` holds it."""
    fields: dict[str, Any] = {"isPublic": entry.is_public, "groups": sorted(entry.groups)}
    fields.update(size=entry.size, sha256=entry.sha256, mtime=entry.mtime)
    if entry.blob is not None:
        blob: dict[str, Any] = {"url": entry.blob.url, "size": entry.blob.size, "sha256": entry.blob.sha256}
        if entry.blob.pieces:
            blob["pieces"] = list(entry.blob.pieces)
        fields["blob"] = blob
    elif entry.chunks is not None:
        fields["chunks"] = entry.chunks
    return fields


def _changed(entry: dict[str, Any], previous: PathEntry | None) -> bool:
    return previous is None or previous.source_key != previous.key or _tree_fields(previous) != entry


@dataclass
class _Retirement:
    """The page versions and the binary files kept in Chroma that this ingest replaced, recorded
    (`first`: written with the site's other records, before anything is deleted), and those
    retired longer ago than the grace period, deleted by `finish`, which then writes the record
    again without them; a crash in between leaves nothing untracked."""

    first: _Record | None
    pages: RetentionPlan
    blobs: RetentionPlan
    live: dict[str, str]

    @classmethod
    def of(
        cls,
        collection: RetryingCollection,
        options: IngestOptions,
        old_tree: dict[str, PathEntry],
        tree: dict[str, dict[str, Any]],
        summary: IngestSummary,
    ) -> _Retirement:
        live = {k: e["sha256"] for k, e in tree.items() if "blob" not in e}
        # A page of a tree written by another tool has no sha256: its chunks are retired as "".
        replaced = {
            k: old.sha256 or "" for k, old in old_tree.items() if old.blob is None and live.get(k) != old.sha256
        }
        live_blobs = {sha: sha for sha in _chroma_blobs(tree.values())}
        replaced_blobs = {sha: sha for sha in _stored_blobs(old_tree) if sha not in live_blobs}
        record, now, grace = _read_retired(collection), time.time(), options.grace_period_s
        plan = plan_retention(record.pages, replaced, live, now, grace)
        blob_plan = plan_retention(record.blobs, replaced_blobs, live_blobs, now, grace)
        summary.retired_kept, summary.retired_deleted = len(plan.keep), len(plan.expired)
        summary.retired_blobs_kept, summary.retired_blobs_deleted = len(blob_plan.keep), len(blob_plan.expired)
        first = None
        if plan.keep or plan.expired or replaced or blob_plan.keep or blob_plan.expired or replaced_blobs:
            first = _retired_record([*plan.keep, *plan.expired], [*blob_plan.keep, *blob_plan.expired])
        return cls(first, plan, blob_plan, live)

    def finish(
        self, collection: RetryingCollection, options: IngestOptions, zero_vector: list[float], batch_size: int
    ) -> None:
        if self.pages.expired:
            _delete_expired_chunks(collection, options.page_field, self.pages, self.live, batch_size)
        if self.blobs.expired:
            delete_blob_pieces(collection, [v.sha256 for v in self.blobs.expired], batch_size)
        if self.pages.expired or self.blobs.expired:
            _upsert_records(collection, [_retired_record(self.pages.keep, self.blobs.keep)], zero_vector, 1)


def _chroma_blobs(entries: Iterable[dict[str, Any]]) -> set[str]:
    """The sha256s of the binary files kept in Chroma among these tree entries."""
    return {e["blob"]["sha256"] for e in entries if "blob" in e and is_chroma_url(e["blob"]["url"])}


def _stored_blobs(tree: dict[str, PathEntry]) -> set[str]:
    """The sha256s of the binary files kept in Chroma that a stored tree points at."""
    return {e.blob.sha256 for e in tree.values() if e.blob and e.blob.sha256 and is_chroma_url(e.blob.url)}


def _read_retired(collection: RetryingCollection) -> RetiredRecord:
    result = collection.get("read of the retired versions", ids=[RETIRED_RECORD_ID], include=["documents"])
    if not result["ids"]:
        return RetiredRecord([], [])
    document = (result["documents"] or [None])[0]
    record = decode_record(document if isinstance(document, str) else None)
    if record is None:
        log.warning("the record of retired page versions is unreadable; their chunks and pieces are left in place")
        return RetiredRecord([], [])
    return record


def _retired_record(versions: Sequence[Any], blobs: Sequence[Any]) -> _Record:
    metadata = {RECORD_KIND_FIELD: RETIRED_RECORD_KIND, FORMAT_FIELD: FORMAT_VERSION}
    return _Record("the retired versions", RETIRED_RECORD_ID, encode_retired(versions, blobs), metadata)


class _StoredLexicon:
    """The lexicon the last ingest wrote: its head record; its rows are read only when a re-ingest
    rewrites them, and of a bucketed one only the buckets it rewrites."""

    def __init__(self, collection: RetryingCollection) -> None:
        self.collection = collection
        self.found = collection.get("read of the lexicon", ids=[LEXICON_RECORD_ID], include=["documents", "metadatas"])
        head = (self.found.get("metadatas") or [None])[0]
        self.manifest: LexiconManifest | None = None
        try:
            self.manifest = manifest_of(head)
        except ValueError as exc:
            log.warning("%s: the lexicon is written anew", exc)
            head = None
        self.head: Mapping[str, Any] = head or {}
        self.part_ids = lexicon_part_ids(head)

    def current(self, with_vectors: bool) -> bool:
        """Whether its rows are of the form this ingest writes (format 3; page vectors when the
        site's embedder makes them), judged by its manifest or its first row."""
        if self.manifest is not None:
            return self.manifest.rows == 3 and (self.manifest.vectors or not with_vectors)
        text = self.head.get(LEXICON_DATA_FIELD)
        if not isinstance(text, str):
            return False
        preview = lexicon_preview(text)
        if preview is None or preview[0] != 3 or preview[1] is None:
            return False
        row = preview[1]
        return len(row) > 3 and isinstance(row[3], dict) and (not with_vectors or isinstance(row[2], str))

    def _get(self, ids: list[str]) -> Any:
        return self.collection.get("read of the lexicon's parts", ids=ids, include=["metadatas"])

    def decode(self, buckets: set[int] | None = None) -> dict[str, LexiconPage]:
        """Its pages, or those of these buckets of a bucketed one (none when it cannot be read)."""
        try:
            if self.manifest is not None:
                parts = [p for p in self.manifest.parts if buckets is None or p.bucket in buckets]
                text = parts_text(parts, self._get)
                return decode_lexicon(text) if text else {}
            document = lexicon_text(self.found, self._get)
            return {} if document is None else decode_lexicon(document)
        except ValueError as exc:
            log.warning("%s: the pages' search terms are counted again", exc)
            return {}


def _existing_tree(collection: RetryingCollection) -> tuple[dict[str, PathEntry], str | None, dict[str, Any]]:
    """The current tree's entries, its document and its metadata (nothing for none, or one
    that cannot be read)."""
    result = collection.get("read of the path tree", ids=[TREE_RECORD_ID], include=["documents", "metadatas"])
    if not result["ids"] or not result["documents"] or not isinstance(result["documents"][0], str):
        return {}, None, {}
    document = result["documents"][0]
    metadata = (result.get("metadatas") or [None])[0]
    try:
        parsed = parse_tree(document)
    except TreeError:
        log.warning("the existing path tree is unreadable; every page is rewritten")
        return {}, None, {}
    # a tree with entries that were skipped is written anew even when nothing else changed
    return parsed.entries, None if parsed.skipped else document, dict(metadata) if isinstance(metadata, Mapping) else {}


def _known_access(old_tree: dict[str, PathEntry]) -> Callable[[str, str], Access | None]:
    """The access the current tree gives a page's bytes, when they are the bytes it was decided
    for (the tree's sha256 of the key); the caller checked the access inputs are the same."""

    def known(key: str, sha: str) -> Access | None:
        entry = old_tree.get(key)
        if entry is None or entry.sha256 != sha or entry.source_key != key:
            return None
        return Access(entry.is_public, tuple(sorted(entry.groups)))

    return known


def _delete_expired_chunks(
    collection: RetryingCollection, page_field: str, plan: RetentionPlan, live: dict[str, str], batch_size: int
) -> None:
    """Delete the chunks of the pages named by expired versions that belong neither to the
    live tree nor to a version still within its grace period (leftovers of an ingest that
    stopped half way go too)."""
    kept = plan.kept_pairs()
    keys = sorted({r.key for r in plan.expired})
    for batch in _batches(keys, 200):
        found = collection.get(
            f"read of old chunks ({batch[0]} to {batch[-1]})",
            where={page_field: {"$in": list(batch)}},
            include=["metadatas"],
        )
        doomed = []
        for record_id, metadata in zip(found["ids"], found["metadatas"] or [], strict=False):
            if record_id in (TREE_RECORD_ID, RETIRED_RECORD_ID, LEXICON_RECORD_ID):
                continue
            key = str((metadata or {}).get(page_field))
            sha = str((metadata or {}).get(PAGE_SHA_FIELD) or "")
            if live.get(key) != sha and (key, sha) not in kept:
                doomed.append(record_id)
        for ids in _batches(doomed, batch_size):
            collection.delete(f"delete of {len(ids)} old chunks", ids=list(ids))
