"""The embedded Chroma directory read through its SQLite file: the same answers as chromadb,
chromadb taken instead whenever the file cannot be trusted, and a mount that never loads it."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import chromadb
import pytest

from chromafs_fuse.backends.chroma_sqlite import SqliteCollection
from chromafs_fuse.backends.chroma_store import ChromaLocation, ChromaPages
from chromafs_fuse.names import TREE_RECORD_ID
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.site.page_source import PageSource, PageUnavailable
from chromafs_fuse.tree import parse_tree
from infra import SAMPLE_SITE, chromadb_libraries_loaded, expected_visible, mounted

SITE = "acme"  # the sample_chroma fixture's site


def _records(result: dict[str, Any]) -> dict[str, tuple[object, object]]:
    return {record_id: (result["documents"][i], result["metadatas"][i]) for i, record_id in enumerate(result["ids"])}


def _chromadb_collection(path: Path) -> Any:
    return chromadb.PersistentClient(path=str(path)).get_collection(SITE, embedding_function=None)


def _refuse() -> Any:
    raise AssertionError("chromadb was opened though the SQLite file answers")


def test_same_answers_as_chromadb(sample_chroma: Callable[[str], Path]) -> None:
    path = sample_chroma("public")
    direct = SqliteCollection.open(str(path), SITE, _refuse)
    assert direct is not None and direct.is_current()
    reference = _chromadb_collection(path)
    tree_query: dict[str, Any] = {"ids": [TREE_RECORD_ID], "include": ["documents", "metadatas"]}
    assert _records(direct.get(**tree_query)) == _records(reference.get(**tree_query))
    tree = parse_tree(direct.get(ids=[TREE_RECORD_ID])["documents"][0])
    slugs = sorted(tree.entries) + ["/" + k for k in tree.entries] + ["no/such/page.md"]
    page_query: dict[str, Any] = {"where": {"page_slug": {"$in": slugs}}, "include": ["documents", "metadatas"]}
    mine, theirs = _records(direct.get(**page_query)), _records(reference.get(**page_query))
    assert mine == theirs and len(mine) > len(tree.entries) // 2
    assert direct.get(ids=["no-such-id"])["ids"] == []


def test_the_page_reader_uses_it_and_pages_match(sample_chroma: Callable[[str], Path]) -> None:
    path = sample_chroma("public")
    pages = ChromaPages.open(ChromaLocation(path=str(path), collection=SITE))
    assert isinstance(pages.collection, SqliteCollection)
    document, metadata = pages.load_tree_document()
    reference = ChromaPages(_chromadb_collection(path))
    assert (document, metadata) == reference.load_tree_document()
    entries = list(parse_tree(document).entries.values())
    assert pages.fetch_many(entries) == reference.fetch_many(entries)


def test_unapplied_writes_in_the_log_go_through_chromadb(sample_chroma: Callable[[str], Path], tmp_path: Path) -> None:
    copy = tmp_path / "chroma"
    shutil.copytree(sample_chroma("public"), copy)
    answered: list[dict[str, Any]] = []

    class Recorder:  # stands in for the chromadb collection the fallback would open
        def get(self, **query: Any) -> dict[str, Any]:
            answered.append(query)
            return {"ids": [], "documents": [], "metadatas": []}

    direct = SqliteCollection.open(str(copy), SITE, Recorder)
    assert direct is not None
    direct.get(ids=[TREE_RECORD_ID])
    assert answered == []
    with sqlite3.connect(copy / "chroma.sqlite3") as db:  # a write the metadata segment has not applied
        (collection_id,) = db.execute("SELECT id FROM collections WHERE name = ?", (SITE,)).fetchone()
        (newest,) = db.execute("SELECT coalesce(max(seq_id), 0) FROM max_seq_id").fetchone()
        db.execute(
            "INSERT INTO embeddings_queue (seq_id, operation, topic, id) VALUES (?, 0, ?, 'pending')",
            (newest + 1000, f"persistent://default/default/{collection_id}"),
        )
    assert not direct.is_current()
    direct.get(ids=[TREE_RECORD_ID])
    assert answered == [{"ids": [TREE_RECORD_ID], "where": None}]
    direct.get(where={"page_slug": {"$eq": "x"}})  # a filter the adapter does not answer itself
    assert len(answered) == 2


@pytest.mark.parametrize("layout", ["no file", "not chroma", "unknown collection"])
def test_a_directory_it_cannot_read_is_left_to_chromadb(
    layout: str, sample_chroma: Callable[[str], Path], tmp_path: Path
) -> None:
    directory = tmp_path / "chroma"
    name = SITE
    if layout == "not chroma":
        directory.mkdir()
        with sqlite3.connect(directory / "chroma.sqlite3") as db:
            db.execute("CREATE TABLE embeddings (id INTEGER PRIMARY KEY)")
    elif layout == "unknown collection":
        directory = sample_chroma("public")
        name = "other-site"
    assert SqliteCollection.open(str(directory), name, _refuse) is None


def test_an_embedded_mount_never_loads_chromadb(
    sample_chroma: Callable[[str], Path], mnt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CHROMAFS_MOUNTD_SOCKET", raising=False)  # a daemon of its own
    path = sample_chroma("public")
    with mounted(mnt, "--site", SITE, "--chroma-path", str(path), "--preload", "off"):
        for rel in sorted(expected_visible(SAMPLE_SITE, "public", None)):
            assert (mnt / rel).read_bytes() == (SAMPLE_SITE / rel).read_bytes(), rel
        loaded = chromadb_libraries_loaded(mnt)
        assert not loaded, f"the daemon loaded chromadb or its dependencies: {loaded}"


def test_a_file_migrated_by_a_newer_chroma_is_left_to_chromadb(
    sample_chroma: Callable[[str], Path], tmp_path: Path
) -> None:
    copy = tmp_path / "chroma"
    shutil.copytree(sample_chroma("public"), copy)
    assert SqliteCollection.open(str(copy), SITE, _refuse) is not None
    with sqlite3.connect(copy / "chroma.sqlite3") as db:
        (newest,) = db.execute("SELECT max(version) FROM migrations WHERE dir = 'sysdb'").fetchone()
        db.execute(
            "INSERT INTO migrations (dir, version, filename, sql, hash) VALUES ('sysdb', ?, 'future.sql', '', '')",
            (newest + 1,),
        )
    assert SqliteCollection.open(str(copy), SITE, _refuse) is None


def test_a_page_that_fails_its_checks_when_read_directly_is_read_through_chromadb(
    sample_chroma: Callable[[str], Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The direct reader's answer is checked like any other; when it fails, chromadb gets a second
    say before the page is given up (here chromadb reads an untouched copy of the same site)."""
    good = sample_chroma("public")
    tampered = tmp_path / "chroma"
    shutil.copytree(good, tampered)
    page = "quickstart.mdx"
    with sqlite3.connect(tampered / "chroma.sqlite3") as db:
        changed = db.execute(
            "UPDATE embedding_metadata SET string_value = string_value || ' (edited)' WHERE key = 'chroma:document'"
            " AND id IN (SELECT id FROM embedding_metadata WHERE key = 'page_slug' AND string_value = ?)",
            (page,),
        ).rowcount
    assert changed > 0
    direct = SqliteCollection.open(str(tampered), SITE, lambda: _chromadb_collection(good))
    assert direct is not None
    pages = ChromaPages(direct)
    tree = parse_tree(pages.load_tree_document()[0])
    source = PageSource(SITE, lambda: pages, PageCache(), tree.version)
    entries = [tree.entries[page], tree.entries["index.mdx"]]
    with caplog.at_level("WARNING"):
        loaded = source.load_many(entries)
    assert loaded[page] == (SAMPLE_SITE / page).read_bytes()
    assert loaded["index.mdx"] == (SAMPLE_SITE / "index.mdx").read_bytes()
    assert f"page {page} failed its checks as read directly" in caplog.text
    # when chromadb cannot be had either, the page is given up: never served wrong
    alone_pages = ChromaPages(SqliteCollection.open(str(tampered), SITE, _refuse))  # type: ignore[arg-type]
    alone = PageSource(SITE, lambda: alone_pages, PageCache(), tree.version)
    assert isinstance(alone.load_many([tree.entries[page]])[page], PageUnavailable)
