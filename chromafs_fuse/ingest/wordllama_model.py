"""The `wordllama` embedder: static token embeddings shipped inside the `wordllama` wheel.

WordLlama (MIT licence, github.com/dleemiller/WordLlama) is a table of 32,000 token vectors
(256 dimensions, float16) taken from a large language model's input embeddings and trained for
sentence similarity. The 0.4.0 wheel on PyPI carries the weights
(`wordllama/weights/l2_supercat_256.safetensors`) and the tokenizer
(`wordllama/tokenizers/l2_supercat_tokenizer_config.json`): nothing is downloaded, ever. This
module reads those two files directly (the weights memory-mapped, the tokenizer with
`tokenizers`; the `wordllama` package's own loader would fall back to downloading from the
Hugging Face hub), and embeds a text as wordllama does: the mean of its tokens' vectors,
L2-normalised.

One model per process (`load`): the MCP server and `chromafs shell` keep it warm; its table is
memory-mapped (16 MiB, shared by every process on the host). Imported only when a search or an ingest needs it.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

NAME = "wordllama"
WEIGHTS = "weights/l2_supercat_256.safetensors"
TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"
DIMENSIONS = 256

_lock = threading.Lock()
_loaded: WordLlamaEmbedder | None = None


class ModelUnavailable(Exception):
    """The model's files are not installed; the message says what to install."""


def _package_file(relative: str) -> Path:
    """A file of the installed wordllama package, found without importing it (its own
    `__init__` imports pydantic and requests: half a second)."""
    spec = importlib.util.find_spec("wordllama")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable("the wordllama package is not installed (pip install wordllama==0.4.0.post1)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise ModelUnavailable(f"the wordllama package has no {relative}: install wordllama 0.4.0.post1")
    return path


class WordLlamaEmbedder:
    """Texts to (n, 256) float32 unit vectors. Thread-safe (the tokenizer is)."""

    dimensions = DIMENSIONS

    def __init__(self, weights: Path, tokenizer: Path) -> None:
        from tokenizers import Tokenizer

        self.table = read_tensor(weights, "embedding.weight")
        self.tokenizer = Tokenizer.from_file(str(tokenizer))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        if not texts:
            return out
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        last = self.table.shape[0] - 1
        for row, encoding in enumerate(encoded):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            if len(ids):
                out[row] = self.table[np.clip(ids, 0, last)].mean(axis=0, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        empty = norms[:, 0] == 0.0
        out[empty, 0] = 1.0  # an empty text: a fixed unit vector, as the hashing embedder gives
        norms[empty] = 1.0
        return out / norms


_DTYPES = {"F16": np.float16, "F32": np.float32}


def read_tensor(path: Path, name: str) -> np.ndarray:
    """One tensor of a safetensors file, memory-mapped (read-only; pages are read as rows are
    used). The format: an 8-byte little-endian header length, a JSON header giving each
    tensor's dtype, shape and byte offsets, then the data."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    info = header.get(name)
    if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
        raise ModelUnavailable(f"{path} has no {name} tensor of a known type")
    start, end = info["data_offsets"]
    dtype = np.dtype(_DTYPES[info["dtype"]])
    shape = tuple(info["shape"])
    if end - start != dtype.itemsize * int(np.prod(shape)):
        raise ModelUnavailable(f"{path}: the {name} tensor's size does not match its shape")
    return np.memmap(path, dtype=dtype, mode="r", offset=8 + length + start, shape=shape)


def load() -> WordLlamaEmbedder:
    """The process's one model, read on first use (about 0.1 s)."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = WordLlamaEmbedder(_package_file(WEIGHTS), _package_file(TOKENIZER))
        return _loaded
