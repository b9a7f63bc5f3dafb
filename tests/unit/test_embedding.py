"""The offline embedder: the batched path gives exactly the vectors of the one-by-one definition."""

from __future__ import annotations

from chromafs_fuse.ingest.embedding import HashingEmbedder
from infra import SAMPLE_SITE

TEXTS = [
    "",
    "   \n\t",
    "a",
    "Rotate the API key; rotate the API key again.",
    "ÄÖÜ Straße İstanbul 日本語のテキスト 123_abc",
    "word " * 3000,
]


def test_batch_equals_definition() -> None:
    pages = [p.read_text("utf-8") for p in sorted(SAMPLE_SITE.rglob("*.md*"))]
    texts = TEXTS + pages
    embedder = HashingEmbedder()
    batch = embedder(texts)
    assert batch.shape == (len(texts), embedder.dimensions)
    assert batch.tolist() == [embedder.embed_one(t) for t in texts]
    # a second batch reuses the remembered buckets and still agrees
    assert embedder(list(reversed(texts))).tolist() == [embedder.embed_one(t) for t in reversed(texts)]


def test_caches_start_again_past_their_limit() -> None:
    embedder = HashingEmbedder()
    embedder.CACHE_LIMIT = 10
    first = embedder(TEXTS).tolist()
    assert embedder(TEXTS).tolist() == first == [embedder.embed_one(t) for t in TEXTS]


def test_a_page_title_is_its_frontmatter_title_else_its_first_heading() -> None:
    from chromafs_fuse.ingest.embedding import page_title

    assert page_title("---\ntitle: Rotate signing keys\n---\n# Something else\n") == "Rotate signing keys"
    assert page_title("intro\n\n# Webhooks #\n\n## Retries\n") == "Webhooks"
    assert page_title("---\ntitle: [broken\n---\nno heading\n") == ""
    assert page_title('{"title": 3}\n') == ""


def test_every_chunk_of_a_titled_page_answers_a_query_for_its_title() -> None:
    from chromafs_fuse.ingest.embedding import HashingEmbedder, embed_with_titles

    embed = HashingEmbedder()
    chunks = ["Billing runs nightly and retries failed charges.", "Invoices list every line item.", "A note."]
    titles = ["Rotate signing keys", "Rotate signing keys", ""]
    plain = embed(chunks)
    titled = embed_with_titles(embed, chunks, titles)
    query = embed(["Rotate signing keys"])[0]
    for at in (0, 1):
        assert abs(float(titled[at] @ titled[at]) - 1.0) < 1e-9  # still unit vectors
        assert float(titled[at] @ query) > 0.6 > float(plain[at] @ query)
    assert titled[2].tolist() == plain[2].tolist()  # an untitled page's chunks are their text's alone
