"""`chromafs search`: search restricted to the reader's view before ranking (vectors, BM25 and
both fused), against the sample site in an embedded Chroma written by chromafs-ingest."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import chromadb
import pytest

from chromafs_fuse import lexical
from chromafs_fuse.cli.ingest import main as ingest_main
from chromafs_fuse.lexical import LEXICON_MANIFEST_FIELD
from chromafs_fuse.names import LEXICON_DATA_FIELD, LEXICON_RECORD_ID
from chromafs_fuse.search import SearchError, embedder_name, rank_pages
from infra import BIN, SAMPLE_SITE, ChromaServer, MountServer, expected_visible, ingest, reader_args


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


def search_cli(chroma: Path, query: str, *args: str, site: str = "acme") -> subprocess.CompletedProcess[str]:
    """`chromafs search` in an embedded Chroma as a user runs it: stdout, stderr, exit status."""
    argv = [str(BIN / "chromafs"), "search", query, "--site", site, "--chroma-path", str(chroma), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


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


HIDDEN_PAGE = """---
title: Quarterly zyxquorum roadmap
groups: [admin]
---

# Quarterly zyxquorum roadmap

The zyxquorum project rotates API keys, tokens and webhooks. zyxquorum zyxquorum api keys.
"""


def test_a_hidden_page_changes_no_rank_or_score_the_reader_sees(tmp_path: Path) -> None:
    """Two sites, the same but for one page only admins may read, holding the query's words (one
    of them nowhere else): the anonymous reader gets identical hits and scores from both, in every
    ranking. BM25's statistics come from the visible pages alone (lexical.py)."""
    with_hidden = tmp_path / "with-hidden"
    shutil.copytree(SAMPLE_SITE, with_hidden)
    (with_hidden / "internal-roadmap.md").write_text(HIDDEN_PAGE, encoding="utf-8")
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "plain", "--chroma-path", str(chroma), "--quiet")
    ingest(with_hidden, "--site", "hidden", "--chroma-path", str(chroma), "--quiet")
    for query in ("zyxquorum api keys", "rotate API keys webhooks", "quarterly roadmap tokens"):
        for rank in ("hybrid", "lexical", "vector"):
            plain = search(chroma, query, "-n", "50", "--rank", rank, site="plain")
            hidden = search(chroma, query, "-n", "50", "--rank", rank, site="hidden")
            assert plain and hidden == plain, (query, rank)
            assert all("internal-roadmap" not in hit["path"] for hit in hidden)


def _titled(title: str, body: str, public: bool = True) -> str:
    access = "public: true" if public else "groups: [admin]"
    return f"---\n{access}\ntitle: {title}\n---\n\n# {title}\n\n{body}\n"


def test_hidden_titles_change_no_title_rank_the_reader_sees(tmp_path: Path) -> None:
    """The title terms' BM25 is counted over the visible pages alone: hidden pages whose titles
    make a query word common (a word rare among visible titles) change no fused score."""
    plain, with_hidden = tmp_path / "plain", tmp_path / "with-hidden"
    plain.mkdir()
    filler = "Steps, settings and examples for the deployment pipeline of the service."
    (plain / "zebra.md").write_text(_titled("Zebra guide", filler))
    (plain / "yak.md").write_text(_titled("Yak guide", filler))
    (plain / "yak-notes.md").write_text(_titled("Yak notes", filler))
    (plain / "other.md").write_text(_titled("Other page", filler))
    shutil.copytree(plain, with_hidden)
    for name in ("zebra-plans", "zebra-budget", "zebra-hiring"):
        (with_hidden / f"{name}.md").write_text(_titled(name.replace("-", " ").title(), "Internal.", public=False))
    chroma = tmp_path / "chroma"
    ingest(plain, "--site", "plain", "--chroma-path", str(chroma), "--quiet")
    ingest(with_hidden, "--site", "hidden", "--chroma-path", str(chroma), "--quiet")
    for query in ("zebra yak", "yak zebra guide"):
        seen = search(chroma, query, "-n", "10", site="plain")
        assert seen and search(chroma, query, "-n", "10", site="hidden") == seen, query


def test_search_says_where_its_time_goes_and_which_ranking_ran(sample_chroma: Callable[[str], Path]) -> None:
    done = search_cli(sample_chroma("public"), "rotate API keys", "--timings", "-n", "3")
    assert done.returncode == 0, done.stderr
    assert "hybrid (wordllama+pages)" in done.stderr and "total" in done.stderr and "model" in done.stderr
    assert done.stdout.splitlines()[0].startswith("auth/api-keys.mdx:")


def test_an_old_hashing_site_is_searched_with_hashing(tmp_path: Path) -> None:
    """A site made with the hashing embedder keeps it: a re-ingest without --embedder keeps it,
    one naming another embedder is refused, and its search embeds queries with hashing."""
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--embedder", "hashing", "--quiet")
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    refused = ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--embedder", "wordllama", status=1)
    assert "embedded with 'hashing'" in refused.stderr
    done = search_cli(chroma, "rotate API keys revoke a key", "--timings", "--rank", "vector", "-n", "1")
    assert "vector (hashing)" in done.stderr
    assert done.stdout.startswith("auth/api-keys.mdx:")


def test_a_model_that_is_not_here_falls_back_to_words_with_a_note(tmp_path: Path) -> None:
    """A collection recording Chroma's default model, which this machine does not have (nothing
    is downloaded): search ranks by BM25 alone and says so; a site without a lexicon (ingested
    before it existed) ranks by meaning alone and says so."""
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    client = chromadb.PersistentClient(path=str(chroma))
    collection = client.get_collection("acme")
    collection.modify(metadata={"chromafs_format": 1, "chromafs_embedder": "chroma-default"})
    done = search_cli(chroma, "rotate API keys")
    assert done.returncode == 0, done.stderr
    assert "note: cannot embed the query with 'chroma-default'" in done.stderr
    assert "ranked by words alone" in done.stderr
    assert done.stdout.startswith("auth/api-keys.mdx:")
    collection.modify(metadata={"chromafs_format": 1, "chromafs_embedder": "wordllama"})
    collection.delete(ids=[LEXICON_RECORD_ID])
    del client
    done = search_cli(chroma, "rotate API keys")
    assert done.returncode == 0, done.stderr
    assert "has no lexicon" in done.stderr and "ranked by meaning alone" in done.stderr
    assert done.stdout.startswith("auth/api-keys.mdx:")


def lexicon_pages(chroma: Path, site: str) -> dict:
    from chromafs_fuse.lexical import decode_lexicon, lexicon_text

    collection = chromadb.PersistentClient(path=str(chroma)).get_collection(site)
    found = collection.get(ids=[LEXICON_RECORD_ID], include=["documents", "metadatas"])
    return decode_lexicon(lexicon_text(found, lambda ids: collection.get(ids=ids, include=["metadatas"])))


def test_a_site_ingested_before_title_terms_is_searched_and_a_re_ingest_adds_them(tmp_path: Path) -> None:
    """A lexicon of format 2 (page vectors, no title terms) is ranked with the fusion of its time;
    an unchanged re-ingest stores the title terms (format 3) and changes nothing else."""
    from chromafs_fuse.lexical import encode_lexicon

    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    pages = lexicon_pages(chroma, "acme")
    older = {path: page._replace(titles=None) for path, page in pages.items()}
    client = chromadb.PersistentClient(path=str(chroma))
    collection = client.get_collection("acme")
    found = collection.get(ids=[LEXICON_RECORD_ID], include=["embeddings", "metadatas"])
    vector, metadata = found["embeddings"][0], found["metadatas"][0]
    del metadata[LEXICON_DATA_FIELD]  # as written then: the lexicon its document, no buckets
    del metadata[LEXICON_MANIFEST_FIELD]
    collection.delete(ids=[LEXICON_RECORD_ID])
    older_record = {"documents": [encode_lexicon(older)], "metadatas": [metadata], "embeddings": [vector]}
    collection.add(ids=[LEXICON_RECORD_ID], **older_record)
    del client
    assert lexicon_pages(chroma, "acme") == older
    done = search_cli(chroma, "rotate API keys", "--timings", "-n", "3")
    assert done.returncode == 0, done.stderr
    assert "title_rank" not in done.stderr and done.stdout.startswith("auth/api-keys.mdx:")
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    assert lexicon_pages(chroma, "acme") == pages
    done = search_cli(chroma, "rotate API keys", "--timings", "-n", "3")
    assert "title_rank" in done.stderr and done.stdout.startswith("auth/api-keys.mdx:")


def test_new_sites_store_a_vector_per_page_and_old_embedders_keep_working(tmp_path: Path) -> None:
    """The default embedder (wordllama+pages) stores each page's vector in the lexicon and fuses
    three rankings; an unchanged re-ingest embeds nothing and rewrites no lexicon; wordllama+e5
    stores multilingual e5 vectors; a wordllama site stores none and is searched as before."""
    chroma = tmp_path / "chroma"
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--quiet")
    pages = lexicon_pages(chroma, "acme")
    assert pages and all(page.vector is not None and page.titles is not None for page in pages.values())
    ingest(SAMPLE_SITE, "--site", "acme", "--chroma-path", str(chroma), "--embedder", "wordllama+pages", "--quiet")
    assert lexicon_pages(chroma, "acme") == pages
    done = search_cli(chroma, "how do I revoke a leaked key", "--timings", "-n", "3")
    assert "hybrid (wordllama+pages)" in done.stderr and "page_embed" in done.stderr, done.stderr
    assert "auth/api-keys.mdx" in done.stdout
    ingest(SAMPLE_SITE, "--site", "multilingual", "--chroma-path", str(chroma), "--embedder", "wordllama+e5", "--quiet")
    assert all(page.vector is not None for page in lexicon_pages(chroma, "multilingual").values())
    vector = search(chroma, "révoquer une clé API", "--rank", "vector", "-n", "3", site="multilingual")
    assert vector[0]["path"] == "auth/api-keys.mdx"  # e5's page vectors are multilingual
    ingest(SAMPLE_SITE, "--site", "old", "--chroma-path", str(chroma), "--embedder", "wordllama", "--quiet")
    assert all(page.vector is None for page in lexicon_pages(chroma, "old").values())
    done = search_cli(chroma, "rotate API keys", "--timings", "-n", "3", site="old")
    assert "hybrid (wordllama)" in done.stderr and "page_embed" not in done.stderr
    assert done.stdout.startswith("auth/api-keys.mdx:")


def test_a_search_through_the_mount_server_is_answered_warm_with_the_same_hits(
    sample_chroma: Callable[[str], Path],
    start_mount_server: Callable[..., MountServer],
    token_file: Callable[..., Path],
    secret_file: Path,
) -> None:
    """`chromafs search` asks the host's mount server when it answers (here --mountd): the same
    hits as a search of its own, each reader's own, in tens of milliseconds once the site is warm."""
    chroma = sample_chroma("public")
    server = start_mount_server()
    via = ["--mountd", str(server.socket)]
    admin = reader_args(token_file(["admin"]), secret_file)
    for query, reader in (("SAML single sign-on", admin), ("audit log", []), ("rotate API keys", admin)):
        alone = search(chroma, query, "-n", "5", *reader, "--no-mountd")
        assert alone and search(chroma, query, "-n", "5", *reader, *via) == alone, query
    # the reader's view, not the server's: an anonymous reader never gets the admin's page
    assert "admin/sso/saml.mdx" not in {h["path"] for h in search(chroma, "SAML single sign-on", *via)}
    # refusals keep their words: a token of another site, a site that does not exist
    other = search_cli(chroma, "audit", *via, "--token-file", str(token_file(site="mcp")), "--jwt-secret-file",
                       str(secret_file))  # fmt: skip
    assert (other.returncode, other.stderr) == (
        2,
        "chromafs search: token is for site 'mcp', not 'acme': check --site, or use a token of site 'acme'\n",
    )
    typo = search_cli(chroma, "audit", *via, site="acmee")
    assert typo.returncode == 2 and "no site 'acmee'" in typo.stderr and "did you mean 'acme'" in typo.stderr
    # warm: the time from the command line, as a user runs it
    spent = []
    for _ in range(10):
        started = time.perf_counter()
        done = search_cli(chroma, "rotate API keys", "-n", "3", *via)
        spent.append(time.perf_counter() - started)
        assert done.returncode == 0 and done.stdout.startswith("auth/api-keys.mdx:"), done.stderr
    cold = time.perf_counter()
    assert search_cli(chroma, "rotate API keys", "-n", "3", "--no-mountd").returncode == 0
    cold_s = time.perf_counter() - cold
    p90 = sorted(spent)[8]
    print(f"chromafs search through the mount server: p50 {sorted(spent)[4] * 1000:.0f} ms, "
          f"p90 {p90 * 1000:.0f} ms; alone {cold_s * 1000:.0f} ms")  # fmt: skip
    assert p90 < cold_s / 2, (spent, cold_s)


def test_a_lexicon_of_several_records_is_written_read_and_replaced_on_a_chroma_server(
    chroma_server: ChromaServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big site's lexicon (over LEXICON_PART_CHARS, here made small) is cut in records a Chroma
    server takes; `chromafs search` reads it whole (a word only one page holds ranks that page
    first, which only the lexicon's BM25 does), and a re-ingest of a smaller site leaves no part
    of the last lexicon behind."""
    monkeypatch.setattr(lexical, "LEXICON_PART_CHARS", 2048)
    site = shutil.copytree(SAMPLE_SITE, tmp_path / "site")
    page = site / "guides" / "migration.mdx"
    page.write_text(page.read_text() + "\nThe quuxfrobnicator setting is new in v2.\n")
    assert ingest_main([str(site), "--site", "parts", "--chroma-url", chroma_server.url, "--quiet"]) == 0
    collection = chromadb.HttpClient(host="127.0.0.1", port=chroma_server.port).get_collection("parts")

    def part_ids() -> list[str]:
        head = collection.get(ids=[LEXICON_RECORD_ID], include=["metadatas"])["metadatas"][0]
        return lexical.lexicon_part_ids(head)

    first = part_ids()
    assert len(first) >= 2, "the lexicon was not cut in parts"
    assert len(collection.get(ids=first)["ids"]) == len(first)
    hits = search(chroma_server.url, "quuxfrobnicator", "--rank", "lexical", site="parts")
    assert hits and hits[0]["path"] == "guides/migration.mdx", hits
    for extra in sorted(site.rglob("*.md*"))[len(list(site.rglob("*.md*"))) // 2 :]:
        if extra != page:
            extra.unlink()
    assert ingest_main([str(site), "--site", "parts", "--chroma-url", chroma_server.url, "--quiet"]) == 0
    second = part_ids()
    assert second != first and collection.get(ids=first)["ids"] == [], "the last lexicon's parts were left"
    hits = search(chroma_server.url, "quuxfrobnicator", "--rank", "lexical", site="parts")
    assert hits and hits[0]["path"] == "guides/migration.mdx", hits
