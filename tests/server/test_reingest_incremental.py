"""A re-ingest costs what changed (issue 47): on `chroma run` with no blob store (binary files kept
in Chroma), a re-ingest after two pages changed writes those two pages' chunks, the changed binary
file's pieces and the site's records, and reads no unchanged page or binary file back; a page
deleted disappears, an access rule changed for a page whose bytes did not change is applied, and a
mount serves the source's bytes."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench_lib.counting_proxy import CountingProxy
from chromafs_fuse.blob_pieces import PIECE_BYTES, piece_count
from chromafs_fuse.names import (
    BLOB_PIECE_PREFIX,
    LEXICON_RECORD_ID,
    RETIRED_RECORD_ID,
    TREE_RECORD_ID,
    blob_piece_id,
)
from infra import INGEST, ChromaServer, child_env, copy_subset, mounted, run

SITE = "inc"
PAGES = [f"docs/page-{n:02d}.md" for n in range(40)]
IMAGES = [f"images/figure-{n:02d}.png" for n in range(12)]
CHANGED = ["docs/page-01.md", "docs/page-02.md"]
DELETED = "docs/page-03.md"
RESTRICTED = "docs/page-04.md"  # its bytes stay; the --acl file makes it admin-only
CHANGED_IMAGE = "images/figure-05.png"
RECORDS = {TREE_RECORD_ID, LEXICON_RECORD_ID, RETIRED_RECORD_ID}


def page_text(n: int, edit: str = "") -> str:
    body = "\n\n".join(f"Paragraph {p} of page {n}: the gateway routes request {n * 100 + p}." for p in range(30))
    return f"# Page {n}\n\n{body}\n{edit}"


def make_site(root: Path) -> Path:
    for n, rel in enumerate(PAGES):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(page_text(n))
    for rel in IMAGES:  # two pieces each
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(PIECE_BYTES + 1000))
    return root


def acl(path: Path, restricted: bool) -> Path:
    access = "groups: [admin]" if restricted else "public: true"
    path.write_text(f"- glob: {RESTRICTED}\n  {access}\n")
    return path


def ingest(source: Path, url: str, acl_file: Path) -> None:
    argv = [INGEST, str(source), "--site", SITE, "--chroma-url", url, "--acl", str(acl_file), "--quiet"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=child_env())
    assert done.returncode == 0, done.stderr


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pieces(path: Path) -> set[str]:
    return {blob_piece_id(sha(path), i) for i in range(piece_count(path.stat().st_size))}


def test_a_re_ingest_after_two_changed_pages_writes_only_what_changed(
    fresh_chroma_server: Callable[..., ChromaServer], tmp_path: Path
) -> None:
    chroma = fresh_chroma_server("chroma")
    proxy = CountingProxy(chroma.url).start()
    try:
        source = make_site(tmp_path / "site")
        ingest(source, proxy.url, acl(tmp_path / "acl.yaml", restricted=False))
        first = {i for kind, ids in proxy.take_requests() if kind == "upsert" for i in ids}
        assert set().union(*(pieces(source / rel) for rel in IMAGES)) <= first

        for rel in CHANGED:
            (source / rel).write_text(page_text(PAGES.index(rel), edit="Edited: the gateway retries.\n"))
        (source / DELETED).unlink()
        (source / CHANGED_IMAGE).write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(PIECE_BYTES + 2000))
        ingest(source, proxy.url, acl(tmp_path / "acl.yaml", restricted=True))
        requests = proxy.take_requests()
    finally:
        proxy.stop()

    written = {i for kind, ids in requests if kind in ("upsert", "add") for i in ids}
    changed_chunks = {i for i in written if i.split("#")[0] in CHANGED}
    assert {i.split("#")[0] for i in changed_chunks} == set(CHANGED)
    for rel in CHANGED:  # the new version's chunks
        assert all(f"#{sha(source / rel)[:16]}#" in i for i in changed_chunks if i.startswith(rel))
    lexicon_parts = {i for i in written if i.startswith(f"{LEXICON_RECORD_ID}.")}  # the changed pages' bucket
    assert len(lexicon_parts) == 1, lexicon_parts
    assert written == changed_chunks | pieces(source / CHANGED_IMAGE) | RECORDS | lexicon_parts
    read = {i for kind, ids in requests if kind == "get" for i in ids}
    old_parts = {i for i in read if i.startswith(f"{LEXICON_RECORD_ID}.")}  # the bucket's rows before
    # no unchanged page's chunk nor unchanged binary file's piece is read back one by one
    assert read <= written | RECORDS | old_parts, sorted(read - written - RECORDS)[:5]
    assert not any(i.startswith(BLOB_PIECE_PREFIX) for i in read - pieces(source / CHANGED_IMAGE))

    visible = {*PAGES, *IMAGES} - {DELETED, RESTRICTED}
    expected = copy_subset(source, visible, tmp_path / "expected")
    served = tmp_path / "served"
    with mounted(served, "--site", SITE, "--collection", SITE, "--chroma-url", chroma.url, "--no-mountd"):
        done = run(["diff", "-r", str(expected), str(served)])
        assert done.returncode == 0, done.stdout + done.stderr
