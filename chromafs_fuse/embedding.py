"""Embedders for ingest. The default works offline and is deterministic."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Sequence

Embedder = Callable[[Sequence[str]], list[list[float]]]
_TOKEN = re.compile(r"\w+", re.UNICODE)
DEFAULT_DIMENSIONS = 256


class HashingEmbedder:
    """Feature hashing of lower-cased word unigrams and bigrams, L2-normalised.

    No model, no download: good enough for similarity search over docs and
    always available. Empty text maps to a fixed unit vector.
    """

    def __init__(self, dimensions: int = DEFAULT_DIMENSIONS) -> None:
        self.dimensions = dimensions

    def _features(self, text: str) -> list[str]:
        words = [w.lower() for w in _TOKEN.findall(text)]
        return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]

    def embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for feature in self._features(text):
            digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            vector[value % self.dimensions] += 1.0 if (value >> 63) & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vector))
        if norm == 0.0:
            vector[0] = 1.0
            return vector
        return [v / norm for v in vector]

    def __call__(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.embed_one(t) for t in texts]


def make_embedder(name: str) -> tuple[Embedder, int | None]:
    """(embedder, dimensions if fixed). 'hashing' (default) or 'chroma-default'."""
    if name == "hashing":
        embedder = HashingEmbedder()
        return embedder, embedder.dimensions
    if name == "chroma-default":  # downloads a model: needs internet on first use
        from chromadb.utils.embedding_functions import DefaultEmbeddingFunction

        function = DefaultEmbeddingFunction()

        def embed(texts: Sequence[str]) -> list[list[float]]:
            return [[float(x) for x in v] for v in function(list(texts))]

        return embed, None
    raise ValueError(f"unknown embedder {name!r} (hashing, chroma-default)")
