"""Embedders for ingest. The default works offline and is deterministic."""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

Embedder = Callable[[Sequence[str]], "np.ndarray | list[list[float]]"]
_TOKEN = re.compile(r"\w+", re.UNICODE)
HASHING_DIMENSIONS = 256


class HashingEmbedder:
    """Feature hashing of lower-cased word unigrams and bigrams, L2-normalised.

    No model, no download: good enough for similarity search over docs and
    always available. Empty text maps to a fixed unit vector.

    A feature's bucket is the first 8 bytes of its BLAKE2b digest (little
    endian): modulo `dimensions` for the bucket, the top bit for the sign.
    Buckets are remembered per feature (docs repeat their words), and a batch
    is summed with numpy; the vectors are exactly those of `embed_one`.
    """

    CACHE_LIMIT = 1 << 21  # words and word pairs remembered; past that the caches start again

    def __init__(self, dimensions: int = HASHING_DIMENSIONS) -> None:
        self.dimensions = dimensions
        self._forget()

    def _forget(self) -> None:
        # A bucket code is bucket + 1, negated for a negative sign.
        self._word_ids: dict[str, int] = {}
        self._word_codes: dict[str, int] = {}
        self._pair_codes: dict[int, int] = {}  # (first word id << 32 | second word id) -> code

    def _features(self, text: str) -> list[str]:
        words = [w.lower() for w in _TOKEN.findall(text)]
        return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]

    def _code(self, feature: str) -> int:
        value = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
        bucket = value % self.dimensions + 1
        return bucket if (value >> 63) & 1 else -bucket

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

    def _ids(self, words: list[str]) -> list[int]:
        ids = self._word_ids
        try:
            return [ids[w] for w in words]
        except KeyError:
            for word in words:
                if word not in ids:
                    ids[word] = len(ids)
                    self._word_codes[word] = self._code(word)
            return [ids[w] for w in words]

    def _pair_code_list(self, pairs: list[int], names: list[str]) -> list[int]:
        codes = self._pair_codes
        try:
            return [codes[p] for p in pairs]
        except KeyError:
            out = []
            for index, pair in enumerate(pairs):
                code = codes.get(pair)
                if code is None:
                    code = codes[pair] = self._code(f"{names[index]} {names[index + 1]}")
                out.append(code)
            return out

    def embed_many(self, texts: Sequence[str]) -> np.ndarray:
        """A (len(texts), dimensions) float64 array, row i equal to embed_one(texts[i])."""
        if len(self._word_ids) + len(self._pair_codes) > self.CACHE_LIMIT:
            self._forget()
        rows: list[np.ndarray] = []
        codes: list[np.ndarray] = []
        for row, text in enumerate(texts):
            words = [w.lower() for w in _TOKEN.findall(text)]
            ids = np.array(self._ids(words), dtype=np.int64)
            word_codes = np.array([self._word_codes[w] for w in words], dtype=np.int64)
            pairs = ((ids[:-1] << 32) | ids[1:]).tolist() if len(ids) > 1 else []
            pair_codes = np.array(self._pair_code_list(pairs, words), dtype=np.int64)
            found = np.concatenate([word_codes, pair_codes])
            codes.append(found)
            rows.append(np.full(len(found), row, dtype=np.int64))
        matrix = np.zeros((len(texts), self.dimensions), dtype=np.float64)
        if codes:
            all_codes = np.concatenate(codes)
            flat = np.concatenate(rows) * self.dimensions + (np.abs(all_codes) - 1)
            np.add.at(matrix.reshape(-1), flat, np.sign(all_codes).astype(np.float64))
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
        empty = norms == 0.0
        matrix[empty, 0] = 1.0
        norms[empty] = 1.0
        matrix /= norms[:, None]
        return matrix

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_many(texts)


_HEADING = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)
TITLE_WEIGHT = 1.0  # a chunk's vector: its text's + this times its page title's, renormalised


def page_title(text: str) -> str:
    """The title a reader searches a page by: its frontmatter `title`, else its first
    `# heading`, else nothing."""
    from chromafs_fuse.ingest.frontmatter import read_frontmatter

    try:
        frontmatter = read_frontmatter(text)
    except Exception:  # a page whose frontmatter cannot be read is still searchable by its text
        frontmatter = None
    title = frontmatter.fields.get("title") if frontmatter is not None else None
    if isinstance(title, str) and title.strip():
        return title.strip()
    heading = _HEADING.search(text[:20000])
    return heading.group(1) if heading else ""


def embed_with_titles(embed: Embedder, chunks: Sequence[str], titles: Sequence[str]) -> np.ndarray:
    """Each chunk's vector with its page title's added: every chunk of a page answers a query
    for the page's title, however long the chunk. Queries are embedded plainly."""
    vectors = np.asarray(embed(chunks), dtype=np.float64)
    titled = [at for at, title in enumerate(titles) if title]
    if titled:
        title_vectors = np.asarray(embed([titles[at] for at in titled]), dtype=np.float64)
        vectors[titled] += TITLE_WEIGHT * title_vectors
        norms = np.linalg.norm(vectors[titled], axis=1, keepdims=True)
        vectors[titled] /= np.where(norms == 0.0, 1.0, norms)
    return vectors


_ANY_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
SUMMARY_CHARS = 400  # about 100 tokens: a page's cost in a transformer stays small and bounded


def page_summary(text: str, title: str) -> str:
    """What a page is about, for its page vector: its title, then its headings (front matter left
    out), at most SUMMARY_CHARS characters."""
    body = text
    if body.startswith("---"):
        end = body.find("\n---", 3)
        if end > 0:
            body = body[end + 4 :]
    return (title + ". " + "; ".join(_ANY_HEADING.findall(body)))[:SUMMARY_CHARS]


EMBEDDERS = ("wordllama+pages", "wordllama+e5", "wordllama", "hashing", "chroma-default")
NEW_SITE_EMBEDDER = "wordllama+pages"  # new sites; a collection keeps the one it records
# An embedder `wordllama+X` embeds chunks by wordllama and gives each page one more vector, of its
# `page_summary`, stored in the lexicon and ranked as a third ranking (search.py): X names the model.
PAGE_MODELS = {"+pages": "wordllama", "+e5": "e5"}


class EmbedderUnavailable(Exception):
    """An embedder that cannot run here (its model is not installed); the message says why."""


class PageEmbedder(Protocol):
    dimensions: int

    def passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def queries(self, texts: Sequence[str]) -> np.ndarray: ...


def page_model(name: str) -> str | None:
    """The model of embedder `name`'s page vectors (`wordllama`, `e5`), None if it has none."""
    return next((model for suffix, model in PAGE_MODELS.items() if name.endswith(suffix)), None)


def make_embedder(name: str) -> tuple[Embedder, int | None]:
    """The chunks' (embedder, dimensions if fixed). `wordllama+pages` (the default for new
    sites: chunks and pages by wordllama), `wordllama+e5` (chunks by wordllama, pages by
    multilingual-e5-small: better ranking, a slower ingest), `wordllama` (static embeddings
    shipped in the wordllama wheel, chunks only), `hashing` (no model), or `chroma-default`
    (Chroma's MiniLM, only where its model files are already on disk: nothing is ever downloaded)."""
    if page_model(name) is not None and name.startswith("wordllama+"):
        name = "wordllama"
    if name == "hashing":
        embedder = HashingEmbedder()
        return embedder, embedder.dimensions
    if name == "wordllama":
        from chromafs_fuse.ingest import wordllama_model

        try:
            model = wordllama_model.load()
        except wordllama_model.ModelUnavailable as exc:
            raise EmbedderUnavailable(str(exc)) from exc
        return model, model.dimensions
    if name == "chroma-default":
        return _chroma_default(), None
    raise ValueError(f"unknown embedder {name!r} ({', '.join(EMBEDDERS)})")


class WordLlamaPages:
    """wordllama as a page model: queries and pages embedded alike."""

    def __init__(self, model: Embedder, dimensions: int) -> None:
        self.model = model
        self.dimensions = dimensions

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return np.asarray(self.model(texts), dtype=np.float32)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.passages(texts)


def page_embedder(name: str) -> PageEmbedder | None:
    """The model that gives each page one vector under embedder `name`, None if it has none."""
    model = page_model(name)
    if model == "wordllama":
        embed, dimensions = make_embedder("wordllama")
        return WordLlamaPages(embed, dimensions or 256)
    if model != "e5":
        return None
    from chromafs_fuse.ingest import e5_model

    try:
        return e5_model.load()
    except e5_model.ModelUnavailable as exc:
        raise EmbedderUnavailable(str(exc)) from exc


def _chroma_default() -> Embedder:
    """Chroma's default function (all-MiniLM-L6-v2 in ONNX) if its files are already in
    Chroma's cache; it would download them otherwise, which chromafs never does."""
    from chromadb.utils.embedding_functions import ONNXMiniLM_L6_V2

    function = ONNXMiniLM_L6_V2()
    folder = Path(function.DOWNLOAD_PATH) / function.EXTRACTED_FOLDER_NAME
    if not (folder / "model.onnx").is_file():
        raise EmbedderUnavailable(
            f"Chroma's default model is not on this machine ({folder}) and chromafs downloads nothing"
        )

    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [[float(x) for x in v] for v in function(list(texts))]

    return embed
