"""Pages fetched by chunk id: the ingest records each page's chunk count in the tree, and a
reader asks for those ids (a primary-key lookup) instead of filtering on the page field, with
the page field as the fallback whenever an id is not there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import chromadb

from chromafs_fuse.backends.chroma_store import ChromaLocation, ChromaPages
from chromafs_fuse.names import PAGE_FIELD
from chromafs_fuse.tree import parse_tree
from infra import SAMPLE_SITE, ingest

SITE = "by-id"


def _pages(chroma: Path) -> tuple[ChromaPages, list]:  # type: ignore[type-arg]
    pages = ChromaPages.open(ChromaLocation(path=str(chroma), collection=SITE))
    tree = parse_tree(pages.load_tree_document()[0])
    return pages, [e for e in tree.entries.values() if e.blob is None]


def test_ingest_records_chunk_counts_and_keeps_them_when_pages_are_unchanged(tmp_path: Path) -> None:
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", SITE, "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    _, entries = _pages(chroma)
    collection = chromadb.PersistentClient(path=str(chroma)).get_collection(SITE, embedding_function=None)
    for entry in entries:
        stored = collection.get(where={PAGE_FIELD: entry.key}, include=[])["ids"]
        assert entry.chunks == len(stored) > 0, entry.key
    ingest(SAMPLE_SITE, "--site", SITE, "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    _, again = _pages(chroma)
    assert {e.key: e.chunks for e in again} == {e.key: e.chunks for e in entries}


def test_by_id_and_by_page_field_give_the_same_chunks(tmp_path: Path) -> None:
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", SITE, "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    pages, entries = _pages(chroma)
    by_field = [dataclasses.replace(e, chunks=None) for e in entries]
    one_too_many = [dataclasses.replace(e, chunks=(e.chunks or 0) + 1) for e in entries]  # an id is missing
    expected = pages.fetch_many(by_field)
    assert all(expected[e.key] for e in entries)
    assert pages.fetch_many(entries) == expected
    assert pages.fetch_many(one_too_many) == expected
    mixed = entries[::2] + one_too_many[1::2]
    assert pages.fetch_many(mixed) == expected


def test_with_chunk_counts_no_page_field_query_is_made(tmp_path: Path) -> None:
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", SITE, "--chroma-path", str(chroma), "--default-access", "public", "--quiet")
    pages, entries = _pages(chroma)
    queries: list[str] = []
    real = pages.collection

    class Counting:  # the real collection, with each query's kind written down
        name = real.name

        def get(self, **query: object) -> dict[str, object]:
            queries.append("where" if query.get("where") else "ids")
            return dict(real.get(**query))

    counted = ChromaPages(Counting())
    counted.fetch_many(entries)
    assert queries == ["ids"]
    queries.clear()
    counted.fetch_many([dataclasses.replace(entries[0], chunks=(entries[0].chunks or 0) + 1), *entries[1:]])
    assert queries == ["ids", "where"]
