"""The offline embedder: the batched path gives exactly the vectors of the one-by-one definition."""

from __future__ import annotations

from chromafs_fuse.ingest.embedding import HashingEmbedder
from helpers import SAMPLE_SITE

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
