"""The pure ranking core of search: BM25 over a set of pages (lexical.py) and the fusion of
rankings (search.py), without Chroma."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import bm25s
import numpy as np
import pytest

from chromafs_fuse import lexical
from chromafs_fuse.lexical import (
    LEXICON_MANIFEST_FIELD,
    PAGES_PER_BUCKET,
    LexicalIndex,
    LexiconManifest,
    LexiconPage,
    best_passage,
    bucket_count,
    bucket_parts,
    decode_lexicon,
    encode_lexicon,
    keeps_buckets,
    lexicon_part_ids,
    lexicon_records,
    lexicon_text,
    page_bucket,
    page_terms,
    path_words,
    ranked,
    reads_as_other_language,
    terms,
    title_terms,
)
from chromafs_fuse.names import LEXICON_DATA_FIELD, LEXICON_RECORD_ID
from chromafs_fuse.search import PAGE_FUSIONS, VectorIndex, fuse, page_fusion

PAGES = {
    "auth/api-keys.md": "Rotate API keys often. Revoke a key that leaked. Keys are secrets.",
    "auth/oauth.md": "OAuth tokens expire; refresh them with the refresh token endpoint.",
    "billing/invoices.md": "Invoices are sent monthly. Download an invoice as PDF.",
    "guides/quickstart.md": "Install the CLI, create an API key, and call the API.",
}


def test_bm25_scores_are_bm25s_scores() -> None:
    """The same corpus, the same tokens: our scores are the reference library's (Lucene BM25)."""
    index = LexicalIndex.build((path, Counter(terms(text))) for path, text in PAGES.items())
    reference = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    reference.index([terms(text) for text in PAGES.values()], show_progress=False)
    for query in ("rotate api keys", "refresh token", "invoice pdf download", "api"):
        expected = reference.get_scores(terms(query))
        got = index.scores(query)
        for path, want in zip(PAGES, expected, strict=True):
            assert got.get(path, 0.0) == pytest.approx(float(want), rel=1e-5), (query, path)


def test_statistics_come_from_the_indexed_pages_only() -> None:
    """A page left out of the index (a hidden one) changes no score: same scores as an index
    that never heard of it, whatever words it holds."""
    visible = [(path, Counter(terms(text))) for path, text in PAGES.items()]
    hidden = ("internal/roadmap.md", Counter(terms("api keys api keys rotate secret roadmap " * 20)))
    alone = LexicalIndex.build(visible)
    assert "internal/roadmap.md" not in alone.scores("api keys roadmap")
    with_it = LexicalIndex.build([*visible, hidden])
    assert with_it.scores("api keys") != {**alone.scores("api keys")}  # it would change them if indexed


def test_titles_and_paths_weigh_more() -> None:
    counts = page_terms("Some text about tokens.", "Rotate keys", "auth/api-keys.mdx")
    assert counts["tokens"] == 1 and counts["rotate"] == 3 and counts["keys"] == 6  # title + path
    assert path_words("functions/strings/Contains.md") == "functions strings Contains"
    assert terms("The API's keys, and a b") == ["api", "keys"]  # stopwords and one-letter words go
    assert terms("Intégrez les clés de votre API") == ["intégrez", "clés", "api"]  # French ones too
    assert terms("Gestiona las claves de tu API y del OS") == ["gestiona", "claves", "api", "del", "os"]


def test_the_lexicon_record_round_trips() -> None:
    pages = {
        "a.md": LexiconPage("sha-a", Counter({"alpha": 2, "été": 1}), None),
        "b/c.md": LexiconPage("sha-b", {}, None),
    }
    expected = {"a.md": ("sha-a", {"alpha": 2, "été": 1}, None, None), "b/c.md": ("sha-b", {}, None, None)}
    assert decode_lexicon(encode_lexicon(pages)) == expected  # format 1: terms alone
    with_vector = {"a.md": LexiconPage("sha-a", {"alpha": 2}, "AAEC"), "b.md": LexiconPage("sha-b", {}, None)}
    assert decode_lexicon(encode_lexicon(with_vector)) == with_vector  # format 2: a vector per page
    with_titles = {
        "a.md": LexiconPage("sha-a", {"alpha": 2}, None, {"guide": 1}),
        "b.md": LexiconPage("sha-b", {}, "AAEC", {}),
    }
    assert decode_lexicon(encode_lexicon(with_titles)) == with_titles  # format 3: a title's terms per page
    with pytest.raises(ValueError, match="lexicon"):
        decode_lexicon("not a record")


def test_a_bucketed_lexicon_reads_as_one_and_keeps_its_buckets_while_the_site_stays_near_its_size() -> None:
    pages = {f"p{n}.md": LexiconPage(f"sha-{n}", {f"w{n}": n}, None, {"t": 1}) for n in range(50)}
    buckets = 8
    by_bucket: dict[int, dict[str, LexiconPage]] = {}
    for key, page in pages.items():
        by_bucket.setdefault(page_bucket(key, buckets), {})[key] = page
    parts = [part for b in sorted(by_bucket) for part in bucket_parts(b, by_bucket[b])]
    assert len(by_bucket) > 1 and decode_lexicon("".join(text for _, text in parts)) == pages  # gzip members
    manifest = LexiconManifest(buckets, 3, False, tuple(part for part, _ in parts))
    assert LexiconManifest.decode(manifest.encode()) == manifest
    store = {part.id: {LEXICON_DATA_FIELD: text} for part, text in parts}
    head = {LEXICON_MANIFEST_FIELD: manifest.encode()}
    found = {"ids": [LEXICON_RECORD_ID], "metadatas": [head], "documents": ["lexicon"]}
    assert decode_lexicon(lexicon_text(found, _getter(store))) == pages
    assert lexicon_part_ids(head) == [part.id for part, _ in parts]
    store[parts[0][0].id] = {LEXICON_DATA_FIELD: parts[1][1]}  # written over
    with pytest.raises(ValueError, match="written over"):
        lexicon_text(found, _getter(store))
    with pytest.raises(ValueError, match="manifest"):
        LexiconManifest.decode('{"buckets": 2}')
    assert bucket_count(1) == 1 and bucket_count(PAGES_PER_BUCKET + 1) == 2 and bucket_count(100_000) == 64
    assert keeps_buckets(64, 100_000) and not keeps_buckets(64, 1_000) and not keeps_buckets(1, 100_000)
    assert keeps_buckets(1, 3) and page_bucket("a.md", 64) == page_bucket("a.md", 64)


def test_a_query_in_french_or_spanish_reads_as_another_language() -> None:
    assert reads_as_other_language("Ajoutez un widget de recherche à votre site pour les lecteurs")
    assert reads_as_other_language("Configura la búsqueda de tu sitio con las claves de la API")
    assert not reads_as_other_language("Add a search widget to your site for the readers")
    assert not reads_as_other_language("API keys")  # no function word at all: read as English
    assert not reads_as_other_language("将文档页面导出为 Markdown")


def test_title_terms_are_the_summary_and_the_path() -> None:
    assert title_terms("Custom 404 page. Setup; Styling", "customize/custom-404-page.mdx") == Counter(
        {"custom": 2, "404": 2, "page": 2, "setup": 1, "styling": 1, "customize": 1}
    )


def test_fusion_rewards_agreement_and_breaks_ties_by_path() -> None:
    fused = fuse([["a", "b", "c"], ["b", "c", "a"]], k=10)
    assert [path for path, _ in fused] == ["b", "a", "c"]
    assert fused[0][1] == pytest.approx(1 / 12 + 1 / 11)
    assert [path for path, _ in fuse([["y"], ["x"]])] == ["x", "y"]  # equal scores: by path
    assert ranked({"b": 1.0, "a": 1.0, "c": 2.0}) == ["c", "a", "b"]


def test_vector_index_ranks_every_page_by_its_nearest_chunk() -> None:
    batches = [
        (["a#0", "b#0"], [[1.0, 0.0], [0.0, 1.0]], [{"p": "a.md"}, {"p": "b.md"}]),
        (["a#1", "x#0"], [[0.6, 0.8], [0.0, 0.99]], [{"p": "a.md"}, {"p": "hidden.md"}]),
    ]
    index = VectorIndex.build(batches, {"a.md": "a.md", "b.md": "b.md"}, "p")
    found = index.rank([0.0, 1.0])
    assert [(path, chunk) for path, _, chunk in found] == [("b.md", "b#0"), ("a.md", "a#1")]
    assert found[1][1] == pytest.approx(float(np.sum((np.array([0.6, 0.8]) - [0.0, 1.0]) ** 2)))


def test_the_best_passage_holds_the_most_query_words() -> None:
    chunks = ["intro text", "rotate keys here; rotate often", "keys"]
    assert best_passage(chunks, "rotate keys") == chunks[1]
    assert best_passage(["x", "y"], "nothing") == "x"


def test_the_fusion_follows_the_page_model_the_query_language_and_the_lexicon_format() -> None:
    english = page_fusion("wordllama", "Add a search widget to your site", has_titles=True)
    french = page_fusion("wordllama", "Ajoutez un widget de recherche à votre site", has_titles=True)
    assert english.weights["chunks"] > french.weights["chunks"] and not french.weights.get("pages")
    assert english.weights["titles"] and "titles" not in page_fusion("wordllama", "x", has_titles=False).weights
    assert page_fusion("e5", "Ajoutez un widget de recherche à votre site", has_titles=True) == PAGE_FUSIONS["e5"]


def _store(records: list) -> dict[str, dict]:
    return {record.id: record.metadata for record in records}


def _head(store: dict[str, dict]) -> dict:
    return {"ids": [LEXICON_RECORD_ID], "metadatas": [store[LEXICON_RECORD_ID]], "documents": ["lexicon"]}


def _getter(store: dict[str, dict]) -> Callable[[list[str]], dict]:
    def get(ids: list[str]) -> dict:
        found = [i for i in ids if i in store]
        return {"ids": found, "metadatas": [store[i] for i in found]}

    return get


def test_a_big_lexicon_takes_several_records_and_reads_back_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut in parts (a Chroma server refuses a request over 40 MiB), named by the whole's digest,
    the head written last; read back whole, checked against the digest; a part missing or written
    over is an error, never a lexicon of the wrong pages."""
    monkeypatch.setattr(lexical, "LEXICON_PART_CHARS", 100)
    text = "1f8b" + "ab" * 240
    records = lexicon_records(text)
    assert len(records) == 5 and records[-1].id == LEXICON_RECORD_ID
    store = _store(records)
    assert lexicon_text(_head(store), _getter(store)) == text
    assert lexicon_part_ids(store[LEXICON_RECORD_ID]) == [r.id for r in records[:-1]]
    with pytest.raises(ValueError, match="several records"):
        lexicon_text(_head(store))
    missing = dict(store)
    del missing[records[1].id]
    with pytest.raises(ValueError, match="missing parts"):
        lexicon_text(_head(missing), _getter(missing))
    over = dict(store)
    over[records[2].id] = {**over[records[2].id], LEXICON_DATA_FIELD: "cd" * 50}
    with pytest.raises(ValueError, match="do not match"):
        lexicon_text(_head(over), _getter(over))
    small = lexicon_records("1f8b00")  # one record: no parts named
    assert [r.id for r in small] == [LEXICON_RECORD_ID] and lexicon_part_ids(small[0].metadata) == []
    assert lexicon_text(_head(_store(small))) == "1f8b00"
