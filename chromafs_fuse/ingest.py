"""Ingest: load a folder of docs into a site's Chroma collection.

Re-running updates the site in place and never lets a reader mix versions:
new chunks are added under new ids (tagged with the page's sha256), the tree
record is rewritten, and only then are the old chunks deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .blobstore import BlobStore
from .chroma_store import ChromaLocation, connect_client
from .chunks import DEFAULT_MAX_CHUNK_CHARS, split_page
from .embedding import make_embedder
from .ingest_access import (
    MARKDOWN_SUFFIXES,
    Access,
    AccessSpecError,
    AclRule,
    access_from_fields,
    default_access,
    match_acl,
    navigation_ref,
    parse_frontmatter,
    public_pages_from_navigation,
)
from .names import (
    DEFAULT_CHUNK_INDEX_FIELD,
    DEFAULT_PAGE_FIELD,
    FORMAT_FIELD,
    FORMAT_VERSION,
    PAGE_SHA_FIELD,
    RECORD_KIND_FIELD,
    TREE_RECORD_ID,
    TREE_RECORD_KIND,
    chunk_id,
)
from .pathrules import InvalidPath, normalize_key
from .tree import PathEntry, TreeError, encode_tree_document, parse_tree

log = logging.getLogger("chromafs.ingest")
DEFAULT_LARGE_FILE_THRESHOLD = 1024 * 1024


@dataclass
class IngestOptions:
    source_dir: Path
    site: str
    location: ChromaLocation
    default_access: str = "public"
    acl_rules: Sequence[AclRule] = ()
    embedder: str = "hashing"
    max_chunk_chars: int = DEFAULT_MAX_CHUNK_CHARS
    blob_store: BlobStore | None = None
    large_file_threshold: int = DEFAULT_LARGE_FILE_THRESHOLD
    include_hidden: bool = False
    page_field: str = DEFAULT_PAGE_FIELD
    chunk_index_field: str = DEFAULT_CHUNK_INDEX_FIELD


@dataclass
class SourceFile:
    key: str
    data: bytes
    text: str | None  # None for binary files
    access: Access
    mtime: float

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class IngestSummary:
    pages: int = 0
    chunks_written: int = 0
    bytes: int = 0
    lazy_files: int = 0
    unchanged: int = 0
    updated: int = 0
    removed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    tree_document: str = ""

    def lines(self) -> list[str]:
        out = [
            f"pages: {self.pages} ({self.updated} written, {self.unchanged} unchanged, {self.removed} removed)",
            f"chunks written: {self.chunks_written}",
            f"bytes: {self.bytes}",
            f"lazy files (blob store): {self.lazy_files}",
            f"skipped: {sum(self.skipped.values())}",
        ]
        out += [f"  {count} {reason}" for reason, count in sorted(self.skipped.items())]
        return out


def _walk(root: Path, include_hidden: bool, summary: IngestSummary) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if include_hidden or not d.startswith("."))
        for name in sorted(filenames):
            if not include_hidden and name.startswith("."):
                continue
            path = Path(dirpath) / name
            if path.is_symlink():
                summary.skipped["symbolic links"] += 1
                log.info("skipped %s: symbolic link", path)
                continue
            yield path


def scan_site(options: IngestOptions, summary: IngestSummary) -> list[SourceFile]:
    """Read every file of the source folder and decide its access."""
    root = options.source_dir
    navigation_public: set[str] = set()
    for name in ("docs.json", "mint.json"):
        nav_file = root / name
        if nav_file.is_file():
            navigation_public |= public_pages_from_navigation(nav_file.read_text("utf-8"))
    fallback = default_access(options.default_access)
    files: list[SourceFile] = []
    for path in _walk(root, options.include_hidden, summary):
        relative = path.relative_to(root).as_posix()
        try:
            key = normalize_key(relative)
        except InvalidPath as exc:
            summary.skipped["paths that cannot be served"] += 1
            log.warning("skipped %r: %s", relative, exc)
            continue
        data = path.read_bytes()
        text: str | None
        try:
            text = None if b"\x00" in data else data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        access: Access | None = None
        if text is not None and key.lower().endswith(MARKDOWN_SUFFIXES):
            try:
                fields = parse_frontmatter(text)
                access = access_from_fields(fields, key) if fields is not None else None
            except AccessSpecError as exc:
                # Fail closed: a page whose access we cannot read is not published.
                summary.skipped["pages with unreadable access frontmatter"] += 1
                log.warning("skipped %s: %s", key, exc)
                continue
        if access is None:
            access = match_acl(options.acl_rules, key)
        if access is None and navigation_ref(key) in navigation_public:
            access = Access(True)
        files.append(SourceFile(key, data, text, access or fallback, path.stat().st_mtime))
    return files


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _progress(total: int, enabled: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="file", leave=False)


def ingest(options: IngestOptions, show_progress: bool = False) -> IngestSummary:
    summary = IngestSummary()
    files = scan_site(options, summary)
    embed, dimensions = make_embedder(options.embedder)

    client = connect_client(options.location)
    collection = client.get_or_create_collection(
        options.location.collection,
        embedding_function=None,
        metadata={"hnsw:space": "l2", FORMAT_FIELD: FORMAT_VERSION},
    )
    batch_size = min(1000, int(getattr(client, "get_max_batch_size", lambda: 1000)()))
    old_pages = _existing_pages(collection)

    tree: dict[str, dict[str, Any]] = {}
    pending_ids: list[str] = []
    pending_docs: list[str] = []
    pending_meta: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal dimensions
        if not pending_ids:
            return
        vectors = embed(pending_docs)
        dimensions = dimensions or len(vectors[0])
        collection.upsert(
            ids=list(pending_ids), documents=list(pending_docs), metadatas=list(pending_meta), embeddings=vectors
        )
        summary.chunks_written += len(pending_ids)
        pending_ids.clear()
        pending_docs.clear()
        pending_meta.clear()

    with _progress(len(files), show_progress, f"ingest {options.site}") as bar:
        for source in files:
            bar.update(1)
            sha = source.sha256
            entry: dict[str, Any] = source.access.as_tree_fields()
            entry.update(size=len(source.data), sha256=sha, mtime=round(source.mtime, 3))
            wants_blob = source.text is None or len(source.data) > options.large_file_threshold
            if wants_blob:
                if options.blob_store is None:
                    if source.text is None:
                        summary.skipped["binary files (no --blob-store)"] += 1
                        log.info("skipped %s: binary file and no blob store", source.key)
                        continue
                else:
                    url, _ = options.blob_store.put(source.data)
                    entry["blob"] = {"url": url, "size": len(source.data), "sha256": sha}
                    summary.lazy_files += 1
            tree[source.key] = entry
            summary.pages += 1
            summary.bytes += len(source.data)
            if "blob" in entry:
                continue
            previous = old_pages.get(source.key)
            if previous is not None and previous.sha256 == sha:
                summary.unchanged += 1
                if previous.chunks is not None:
                    entry["chunks"] = previous.chunks
                continue
            summary.updated += 1
            assert source.text is not None
            chunks = split_page(source.text, options.max_chunk_chars)
            entry["chunks"] = len(chunks)
            for index, chunk in enumerate(chunks):
                pending_ids.append(chunk_id(source.key, sha, index))
                pending_docs.append(chunk)
                pending_meta.append(
                    {options.page_field: source.key, options.chunk_index_field: index, PAGE_SHA_FIELD: sha}
                )
                if len(pending_ids) >= batch_size:
                    flush()
        flush()

    summary.tree_document = encode_tree_document(tree)
    collection.upsert(
        ids=[TREE_RECORD_ID],
        documents=[summary.tree_document],
        metadatas=[{RECORD_KIND_FIELD: TREE_RECORD_KIND, FORMAT_FIELD: FORMAT_VERSION, "site": options.site}],
        embeddings=[[0.0] * (dimensions or len(embed([""])[0]))],
    )
    stale_pages = [
        k for k, old in old_pages.items() if old.sha256 != tree.get(k, {}).get("sha256") or "blob" in tree.get(k, {})
    ]
    summary.removed = sum(1 for k in old_pages if k not in tree)
    _delete_stale_chunks(collection, options.page_field, stale_pages, tree, batch_size)
    return summary


def _existing_pages(collection: Any) -> dict[str, PathEntry]:
    result = collection.get(ids=[TREE_RECORD_ID], include=["documents"])
    if not result["ids"] or not result["documents"] or not isinstance(result["documents"][0], str):
        return {}
    try:
        tree = parse_tree(result["documents"][0])
    except TreeError:
        log.warning("the existing path tree is unreadable; every page is rewritten")
        return {}
    # Only pages stored as chunks count: a page that was a blob must get chunks written.
    return {key: entry for key, entry in tree.entries.items() if entry.blob is None}


def _delete_stale_chunks(
    collection: Any, page_field: str, pages: Sequence[str], tree: dict[str, dict[str, Any]], batch_size: int
) -> None:
    for batch in _batches(list(pages), 200):
        found = collection.get(where={page_field: {"$in": list(batch)}}, include=["metadatas"])
        doomed = []
        for record_id, metadata in zip(found["ids"], found["metadatas"] or [], strict=False):
            if record_id == TREE_RECORD_ID:
                continue
            current = tree.get(str((metadata or {}).get(page_field)), {})
            if "blob" in current or (metadata or {}).get(PAGE_SHA_FIELD) != current.get("sha256"):
                doomed.append(record_id)
        for ids in _batches(doomed, batch_size):
            collection.delete(ids=list(ids))
