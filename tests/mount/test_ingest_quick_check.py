"""A re-ingest knows an unchanged file by its size and mtime, as rsync does, and reads it only when
either differs from what the site's tree records, or when its mtime is as recent as the last walk's
start (it may have changed again within the mtime's grain): `--checksum` reads every file. The
lexicon a changed page leaves keeps every other page's row."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import chromadb
import pytest

from chromafs_fuse import lexical
from chromafs_fuse.backends.chroma_store import ChromaLocation
from chromafs_fuse.cli.ingest import main as ingest_main
from chromafs_fuse.ingest import pipeline
from chromafs_fuse.lexical import LexiconManifest, lexicon_text, manifest_of
from chromafs_fuse.names import LEXICON_RECORD_ID, TREE_RECORD_ID
from chromafs_fuse.tree import PathEntry, parse_tree
from infra import INGEST, SAMPLE_SITE, child_env

PAGE = "guides/migration.mdx"
HOUR_AGO = time.time() - 3600


def ingest(source: Path, chroma: Path, report: Path, *more: str) -> dict[str, Any]:
    argv = [INGEST, str(source), "--site", "acme", "--chroma-path", str(chroma), "--report", str(report), "--quiet"]
    done = subprocess.run([*argv, *more], capture_output=True, text=True, timeout=600, env=child_env())
    assert done.returncode in (0, 3), done.stderr  # 3: the sample site's own problems
    return json.loads(report.read_text())


def aged_copy(tmp_path: Path) -> Path:
    """The sample site with every file last changed an hour ago (older than any walk here)."""
    source = Path(shutil.copytree(SAMPLE_SITE, tmp_path / "site"))
    for folder, _, names in os.walk(source):
        for name in names:
            os.utime(Path(folder) / name, (HOUR_AGO, HOUR_AGO))
    return source


WORD, NEW_WORD = b"stricter", b"zqxjvwkp"  # a word of the page, and one of the same size no page holds


def same_size_edit(path: Path) -> None:
    data = path.read_bytes()
    assert WORD in data
    path.write_bytes(data.replace(WORD, NEW_WORD, 1))


def stored(chroma: Path) -> tuple[dict[str, str | None], dict[str, Any]]:
    """(page -> sha256 in the tree, lexicon page -> row)"""
    collection = chromadb.PersistentClient(str(chroma)).get_collection("acme")
    tree = collection.get(ids=[TREE_RECORD_ID], include=["documents"])["documents"][0]
    pages = {k: e.sha256 for k, e in parse_tree(tree).entries.items() if e.blob is None}
    found = collection.get(ids=[LEXICON_RECORD_ID], include=["documents", "metadatas"])
    text = lexicon_text(found, lambda ids: collection.get(ids=ids, include=["metadatas"]))
    assert text is not None
    return pages, {k: [r.sha256, r.counts] for k, r in lexical.decode_lexicon(text).items()}


def test_an_unchanged_re_ingest_reads_no_file_and_an_edit_at_the_same_size_is_still_seen(tmp_path: Path) -> None:
    source, chroma, report = aged_copy(tmp_path), tmp_path / "chroma", tmp_path / "report.json"
    first = ingest(source, chroma, report)
    again = ingest(source, chroma, report)
    assert (again["written"], again["not_read"]) == (0, first["pages"]), again

    same_size_edit(source / PAGE)  # a new mtime, the same size
    edited = ingest(source, chroma, report)
    assert (edited["written"], edited["not_read"]) == (1, first["pages"] - 1), edited
    pages, lexicon = stored(chroma)
    assert pages.keys() == lexicon.keys()
    assert all(lexicon[k][0] == sha for k, sha in pages.items())  # every row is its page's version
    assert NEW_WORD.decode() in lexicon[PAGE][1] and WORD.decode() not in lexicon[PAGE][1]


def test_a_touched_file_is_read_once_and_its_new_mtime_recorded(tmp_path: Path) -> None:
    source, chroma, report = aged_copy(tmp_path), tmp_path / "chroma", tmp_path / "report.json"
    first = ingest(source, chroma, report)
    os.utime(source / PAGE, (HOUR_AGO + 60, HOUR_AGO + 60))  # the bytes stay
    touched = ingest(source, chroma, report)
    assert (touched["written"], touched["not_read"]) == (0, first["pages"] - 1), touched
    assert ingest(source, chroma, report)["not_read"] == first["pages"]


@pytest.mark.parametrize("grain", [0.001, 1.0], ids=["a filesystem of fine mtimes", "one of whole seconds"])
def test_a_file_changed_as_recently_as_the_last_walk_is_read_even_at_its_old_size_and_mtime(
    tmp_path: Path, grain: float
) -> None:
    """A file whose mtime is not older than the last walk's start by its filesystem's grain (here:
    later) may have changed again after it was read without its mtime changing: it is read."""
    source, chroma, report = aged_copy(tmp_path), tmp_path / "chroma", tmp_path / "report.json"
    recent = round(time.time() + 60, 0 if grain == 1.0 else 3)  # no earlier than the walk's start
    os.utime(source / PAGE, (recent, recent))
    first = ingest(source, chroma, report)
    same_size_edit(source / PAGE)
    os.utime(source / PAGE, (recent, recent))  # changed within the same mtime
    racy = ingest(source, chroma, report)
    assert (racy["written"], racy["not_read"]) == (1, first["pages"] - 1), racy


def test_an_edit_hidden_behind_a_restored_mtime_is_read_by_checksum(tmp_path: Path) -> None:
    source, chroma, report = aged_copy(tmp_path), tmp_path / "chroma", tmp_path / "report.json"
    ingest(source, chroma, report)
    same_size_edit(source / PAGE)
    os.utime(source / PAGE, (HOUR_AGO, HOUR_AGO))  # as `rsync -a` or `tar x` would set it
    assert ingest(source, chroma, report)["written"] == 0  # size and mtime are the quick check's whole word
    assert ingest(source, chroma, report, "--checksum")["written"] == 1
    pages, lexicon = stored(chroma)
    assert lexicon[PAGE][0] == pages[PAGE] and NEW_WORD.decode() in lexicon[PAGE][1]


def manifest(chroma: Path) -> LexiconManifest:
    collection = chromadb.PersistentClient(str(chroma)).get_collection("acme")
    head = collection.get(ids=[LEXICON_RECORD_ID], include=["metadatas"])["metadatas"][0]
    found = manifest_of(head)
    assert found is not None
    return found


def test_a_changed_page_rewrites_its_lexicon_bucket_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a site of several buckets (made small here), an edit rewrites the edited page's bucket
    and keeps every other bucket's record; search's rows stay whole."""
    monkeypatch.setattr(lexical, "PAGES_PER_BUCKET", 4)
    source, chroma = aged_copy(tmp_path), tmp_path / "chroma"
    argv = [str(source), "--site", "acme", "--chroma-path", str(chroma), "--quiet"]
    assert ingest_main(argv) in (0, 3)
    before = manifest(chroma)
    assert before.buckets >= 8 and len({part.bucket for part in before.parts}) >= 4, before
    same_size_edit(source / PAGE)
    read: list[str] = []
    reader = pipeline._StoredLexicon._get
    monkeypatch.setattr(pipeline._StoredLexicon, "_get", lambda self, ids: read.extend(ids) or reader(self, ids))
    assert ingest_main(argv) in (0, 3)
    bucket = lexical.page_bucket(PAGE, before.buckets)
    assert read == [part.id for part in before.parts if part.bucket == bucket]  # no other bucket read back
    after = manifest(chroma)
    assert after.buckets == before.buckets
    changed = set(after.parts) - set(before.parts)
    assert {part.bucket for part in changed} == {lexical.page_bucket(PAGE, after.buckets)}, changed
    pages, rows = stored(chroma)
    assert pages.keys() == rows.keys() and all(rows[k][0] == sha for k, sha in pages.items())
    assert NEW_WORD.decode() in rows[PAGE][1]
    gone = {part.id for part in before.parts} - {part.id for part in after.parts}
    assert gone and not chromadb.PersistentClient(str(chroma)).get_collection("acme").get(ids=sorted(gone))["ids"]


def test_a_lexicon_too_big_for_one_request_is_written_a_bucket_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Buckets whose parts come to more than half a request (made small here) are each written as
    they are made, then the head and the tree together: the lexicon reads back whole."""
    monkeypatch.setattr(lexical, "PAGES_PER_BUCKET", 4)
    monkeypatch.setattr(pipeline, "FINAL_UPSERT_BYTES", 4096)
    written: list[list[str]] = []
    upsert = pipeline.RetryingCollection.upsert

    def counted(self: Any, what: str, **records: Any) -> None:
        written.append(records["ids"])
        upsert(self, what, **records)

    monkeypatch.setattr(pipeline.RetryingCollection, "upsert", counted)
    source, chroma = aged_copy(tmp_path), tmp_path / "chroma"
    assert ingest_main([str(source), "--site", "acme", "--chroma-path", str(chroma), "--quiet"]) in (0, 3)
    parts = [ids for ids in written if any(i.startswith(f"{LEXICON_RECORD_ID}.") for i in ids)]
    assert len(parts) == len({part.bucket for part in manifest(chroma).parts}) and all(len(i) == 1 for i in parts)
    pages, rows = stored(chroma)
    assert pages.keys() == rows.keys() and all(rows[k][0] == sha for k, sha in pages.items())


def test_the_racy_window_is_the_mtimes_grain() -> None:
    """A whole-second mtime may come from a filesystem that keeps seconds: within 2 s of the walk
    it is read; a finer one is read within 0.1 s only."""
    walked = 1_800_000_000.0

    def entry(mtime: float) -> PathEntry:
        return PathEntry("a.md", "a.md", True, frozenset(), size=5, sha256="a" * 64, mtime=mtime)

    def unread(mtime: float) -> bool:
        options = pipeline.IngestOptions(Path("."), "acme", ChromaLocation(path="."))
        unchanged = pipeline._quick_check({"a.md": entry(mtime)}, walked, options)
        assert unchanged is not None
        return unchanged("a.md", 5, mtime)

    assert not unread(walked - 1) and unread(walked - 3)  # whole seconds
    assert not unread(walked - 0.05) and unread(walked - 0.5)
    assert pipeline._quick_check({}, None, pipeline.IngestOptions(Path("."), "acme", ChromaLocation(path="."))) is None
