"""`chromafs search`: semantic search restricted to the reader's view before ranking, against
the sample site in an embedded Chroma written by chromafs-ingest (hashing embedder)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from chromafs_fuse.search import SearchError, embedder_name, rank_pages
from infra import BIN, SAMPLE_SITE, ChromaServer, expected_visible, ingest, reader_args


def search(chroma: Path | str, query: str, *args: str, site: str = "acme") -> list[dict]:
    """`chromafs search` in an embedded Chroma (a directory) or a Chroma server (a URL)."""
    where = ["--chroma-url", chroma] if isinstance(chroma, str) else ["--chroma-path", str(chroma)]
    done = subprocess.run(
        [str(BIN / "chromafs"), "search", query, "--site", site, *where, "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_only_pages_the_reader_may_see_are_ranked(
    sample_chroma: Callable[[str], Path], token_file: Callable[..., Path], secret_file: Path
) -> None:
    chroma = sample_chroma("public")
    admin = reader_args(token_file(["admin"]), secret_file)
    # the title of a page only admins may read: it is the admin's best hit, and never anyone else's
    hits = search(chroma, "SAML single sign-on", "-n", "3", *admin)
    assert hits[0]["path"] == "admin/sso/saml.mdx"
    assert hits[0]["lines"][0] == 1 and hits[0]["snippet"]
    visible = expected_visible(SAMPLE_SITE, "public", None)
    hidden = expected_visible(SAMPLE_SITE, "public", {"admin"}) - visible
    for query in ("SAML single sign-on", "audit log", "secret project roadmap"):
        shown = {hit["path"] for hit in search(chroma, query, "-n", "50")}
        assert shown and shown <= visible  # as many as there are, and no hidden one among them
        assert not shown & hidden


def test_a_page_is_found_by_its_own_words(sample_chroma: Callable[[str], Path]) -> None:
    [hit] = search(sample_chroma("public"), "rotate API keys revoke a key", "-n", "1")
    page = (SAMPLE_SITE / hit["path"]).read_text(encoding="utf-8").splitlines()
    first, last = hit["lines"]
    assert 1 <= first <= last <= len(page)
    assert page[first - 1].strip().startswith(hit["snippet"].strip()[:40])


def test_a_chroma_server_gives_the_hits_an_embedded_chroma_gives(
    sample_chroma: Callable[[str], Path], chroma_server: ChromaServer
) -> None:
    """The search reads a server through the site's own client (its REST adapter, within
    --backend-timeout): the collection's embedder, every vector, the best chunks."""
    ingest(SAMPLE_SITE, "--site", "search-acme", "--chroma-url", chroma_server.url, "--quiet")
    for query in ("audit log", "rotate API keys revoke a key"):
        served = search(chroma_server.url, query, "-n", "5", site="search-acme")
        assert served and served == search(sample_chroma("public"), query, "-n", "5")


def test_ranking_is_exact_and_by_each_pages_nearest_chunk() -> None:
    by_slug = {"a.md": "a.md", "b.md": "b.md"}
    batches = [
        (["a#0", "b#0"], [[1.0, 0.0], [0.0, 1.0]], [{"p": "a.md"}, {"p": "b.md"}]),
        (["a#1", "x#0"], [[0.6, 0.8], [0.0, 0.99]], [{"p": "a.md"}, {"p": "hidden.md"}]),
    ]
    ranked = rank_pages(batches, [0.0, 1.0], by_slug, "p", 5)
    assert [(path, chunk) for path, _, chunk in ranked] == [("b.md", "b#0"), ("a.md", "a#1")]
    assert rank_pages(batches, [0.0, 1.0], by_slug, "p", 1)[0][0] == "b.md"


def test_the_query_is_embedded_as_the_collection_was() -> None:
    assert embedder_name({"chromafs_embedder": "chroma-default"}) == "chroma-default"
    assert embedder_name({"chromafs_format": 1}) == "hashing"  # written before the field existed
    assert embedder_name({}, override="hashing") == "hashing"
    with pytest.raises(SearchError, match="--embedder"):
        embedder_name({"hnsw:space": "cosine"})  # a collection of another tool
