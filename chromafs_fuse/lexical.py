"""The lexical half of search: per-page term counts written at ingest, BM25 at query time.

Ingest stores, for every chunked page, how often each term occurs in it (`page_terms`), in one
record of the collection (the lexicon, `encode_lexicon`). A search builds a `LexicalIndex` over
the pages the reader may see, and only those: the number of pages, their mean length and each
term's document frequency are counted over the visible pages alone, so a page the reader cannot
see changes no score the reader gets (a hidden page holding a rare word would otherwise lower
that word's IDF for everyone). The index is cached per view (one per reader class).

Scoring is Okapi BM25 as Lucene computes it: k1 = 1.2, b = 0.75, idf = ln(1 + (N - df + 0.5) /
(df + 0.5)), times tf / (tf + k1 (1 - b + b len / mean len)); bm25s's "lucene" method, and
tests/unit/test_lexical.py checks that it gives bm25s's scores. Pure: no I/O.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from chromafs_fuse.names import LEXICON_DATA_FIELD, LEXICON_RECORD_ID
from chromafs_fuse.packed import pack, unpack

LEXICON_FORMATS = (1, 2, 3)
TITLE_BOOST = 3  # a page's title and path words count this many extra times: they name the page
K1 = 1.2
B = 0.75

_WORD = re.compile(r"(?u)\b\w\w+\b")
_STOPWORDS = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she
should so some such than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with
would you your yours yourself yourselves
"""
# French and Spanish function words (Lucene's analysers leave them out; docs trees carry their
# translations, and a query in French otherwise matches every French page through them). Words
# that name things in technical English (`os`, `del`) are kept.
_STOPWORDS_FR = """
au aux avec ce ces cet cette chaque comme dans de des dont du elle elles en entre est et eux il ils je
la le les leur leurs lors lui ma mais me mes moi mon même ne nos notre nous on ou où par pas peut plus
pour qu que qui sa sans se ses si son sont sous sur ta te tes toi ton tous tout toute toutes tu un une
vers vos votre vous été être afin ainsi aussi
"""
_STOPWORDS_ES = """
al algo algunas algunos ante antes cada como con contra cual cuando de desde donde durante el ella
ellas ellos en entre era es esa esas ese eso esos esta estar estas este esto estos hasta hay la las le
les lo los mi mis muy más nada ni nos nosotros nuestra nuestro otra otras otro otros para pero poco
por porque puede que quien qué se sin sobre son su sus también te ti todo todos tu tus tú una uno unos
ya yo él
"""
STOPWORDS = frozenset((_STOPWORDS + _STOPWORDS_FR + _STOPWORDS_ES).split())  # as bm25s leaves out English ones
_ENGLISH, _FRENCH, _SPANISH = (frozenset(words.split()) for words in (_STOPWORDS, _STOPWORDS_FR, _STOPWORDS_ES))


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")


def terms(text: str) -> list[str]:
    """The words BM25 counts: lower-cased runs of two or more word characters, stopwords (English,
    French, Spanish) left out; Chinese, Japanese and Korean, written without spaces, as overlapping
    pairs of characters (as Lucene's CJK analyser does), so a query matches inside a run."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if word in STOPWORDS:
            continue
        if not _CJK.search(word):
            out.append(word)
            continue
        for part in re.split(f"({_CJK.pattern})", word):
            if not part:
                continue
            if _CJK.fullmatch(part):
                out.extend(part[i : i + 2] for i in range(max(1, len(part) - 1)))
            elif len(part) > 1:
                out.append(part)
    return out


def path_words(path: str) -> str:
    """A page's path as words: `functions/strings/Contains.md` -> `functions strings Contains`."""
    stem = path.rsplit(".", 1)[0] if "." in path.rsplit("/", 1)[-1] else path
    return re.sub(r"[/_\-.]+", " ", stem)


def title_terms(summary: str, path: str) -> Counter[str]:
    """The terms of what names a page: its title and headings (`page_summary`) and its path words.
    BM25 over these short texts is a ranking of its own in hybrid search (search.py): a page whose
    title says what the query asks wins there even when its body is short or says it otherwise."""
    return Counter(terms(f"{summary} {path_words(path)}"))


def reads_as_other_language(query: str) -> bool:
    """Whether the query holds more French or Spanish function words than English ones: an
    English-centred model's vectors of it are noise, and hybrid search weighs them less."""
    words = _WORD.findall(query.lower())
    english = sum(1 for word in words if word in _ENGLISH)
    return max(sum(1 for word in words if word in _FRENCH), sum(1 for word in words if word in _SPANISH)) > english


def page_terms(text: str, title: str, path: str) -> Counter[str]:
    """How often each term occurs in a page, its title and path words counted TITLE_BOOST more times."""
    counts = Counter(terms(text))
    for word in terms(f"{title} {path_words(path)}"):
        counts[word] += TITLE_BOOST
    return counts


# -- the record ------------------------------------------------------------------------------
# {"format": 1, "pages": {path: [sha256, {term: count}]}} as compact JSON, gzip, hex (packed.py); format 2
# (a site whose embedder gives pages a vector, embedding.py's `page_embedder`) adds each page's
# vector: [sha256, {term: count}, vector], the vector as `encode_vector`'s string; format 3 adds
# the terms of its title, headings and path (`title_terms`): [sha256, {term: count}, vector or
# null, {term: count}].


class LexiconPage(NamedTuple):
    sha256: str
    counts: Mapping[str, int]  # the page's terms (`page_terms`)
    vector: str | None  # its page vector (`encode_vector`), None when the embedder gives none
    titles: Mapping[str, int] | None = None  # its title's terms (`title_terms`), None before format 3


def encode_lexicon(pages: Mapping[str, LexiconPage]) -> str:
    with_titles = any(page.titles is not None for page in pages.values())
    with_vectors = any(page.vector is not None for page in pages.values())
    rows: dict[str, list[Any]] = {}
    for path, page in pages.items():
        row: list[Any] = [page.sha256, dict(page.counts)]
        if with_vectors or with_titles:
            row.append(page.vector)
        if with_titles:
            row.append(dict(page.titles or {}))
        rows[path] = row
    body = {"format": 3 if with_titles else 2 if with_vectors else 1, "pages": rows}
    data = json.dumps(body, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")
    return pack(data, level=1)  # rewritten by every re-ingest: speed over size


def encode_row(page: LexiconPage) -> str:
    """A page's row of format 3 as compact JSON: an ingest keeps its new rows so, a few times
    smaller than their term counts as dicts."""
    row = [page.sha256, dict(page.counts), page.vector, dict(page.titles or {})]
    return json.dumps(row, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def encode_rows(rows: Mapping[str, str | LexiconPage]) -> str:
    """A lexicon of format 3 of these rows (`encode_row`'s text, or pages), in key order."""
    body = ",".join(
        f"{json.dumps(key, ensure_ascii=False)}:{row if isinstance(row, str) else encode_row(row)}"
        for key, row in sorted(rows.items())
    )
    return pack(f'{{"format":3,"pages":{{{body}}}}}'.encode(), level=1)


def encode_vector(vector: np.ndarray) -> str:
    """A page vector as stored: scaled so its largest component is 127, int8, base64."""
    peak = float(np.abs(vector).max()) or 1.0
    return base64.b64encode(np.round(np.asarray(vector) * (127.0 / peak)).astype(np.int8).tobytes()).decode("ascii")


def decode_vectors(encoded: list[str]) -> np.ndarray:
    """(n, dimensions) float32 unit vectors from `encode_vector`'s strings, all of one size;
    ValueError otherwise."""
    rows = [base64.b64decode(one) for one in encoded]
    if not rows or len({len(row) for row in rows}) != 1 or not rows[0]:
        raise ValueError("the stored page vectors are not all of one size")
    matrix = np.frombuffer(b"".join(rows), dtype=np.int8).reshape(len(rows), -1).astype(np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0.0, 1.0, norms)


LEXICON_PARTS_FIELD = "chromafs_lexicon_parts"  # the head's: how many records the lexicon takes
LEXICON_DIGEST_FIELD = "chromafs_lexicon_sha256"  # the head's: the whole text's sha256, naming the parts
LEXICON_PART_CHARS = 8 << 20  # per record: each upsert far below a Chroma server's 40 MiB request bound


class LexiconRecord(NamedTuple):
    id: str
    metadata: dict[str, Any]  # RECORD_KIND_FIELD and FORMAT_FIELD are the writer's to add


def lexicon_records(text: str) -> list[LexiconRecord]:
    """The records that hold the lexicon `text`: the head (`LEXICON_RECORD_ID`) with its first
    part, then, for a big site, the others, named by the text's digest so that writing them
    never touches the parts the head a reader holds names. Write the others first, the head last."""
    parts = [text[i : i + LEXICON_PART_CHARS] for i in range(0, len(text), LEXICON_PART_CHARS)] or [""]
    head: dict[str, Any] = {LEXICON_DATA_FIELD: parts[0]}
    if len(parts) == 1:
        return [LexiconRecord(LEXICON_RECORD_ID, head)]
    digest = hashlib.sha256(text.encode("ascii")).hexdigest()
    head.update({LEXICON_PARTS_FIELD: len(parts), LEXICON_DIGEST_FIELD: digest})
    others = [LexiconRecord(_part_id(digest, n), {LEXICON_DATA_FIELD: part}) for n, part in enumerate(parts) if n]
    return [*others, LexiconRecord(LEXICON_RECORD_ID, head)]


def _part_id(digest: str, n: int) -> str:
    return f"{LEXICON_RECORD_ID}.{digest[:16]}.{n}"


def lexicon_part_ids(head: Mapping[str, Any] | None) -> list[str]:
    """The ids of the records besides the head that the head record's metadata names (the parts
    after the first, or a bucketed lexicon's parts)."""
    try:
        manifest = manifest_of(head)
    except ValueError:
        return []
    if manifest is not None:
        return [part.id for part in manifest.parts]
    head = head or {}
    count, digest = head.get(LEXICON_PARTS_FIELD), head.get(LEXICON_DIGEST_FIELD)
    if not isinstance(count, int) or count < 2 or not isinstance(digest, str):
        return []
    return [_part_id(digest, n) for n in range(1, count)]


# -- the bucketed lexicon ----------------------------------------------------------------------
# A big site's lexicon is kept in buckets: a page's bucket is a hash of its key, each bucket a
# lexicon of its own (one gzip member of `{"format": 3, "pages": {...}}`) in one or more part
# records named by their text's sha256, and the head record names them all (its manifest). A
# re-ingest rewrites only the buckets of the pages that changed.

LEXICON_MANIFEST_FIELD = "chromafs_lexicon_manifest"  # the head's, as JSON: see LexiconManifest
PAGES_PER_BUCKET = 2000
MANIFEST_STUB = {"format": 4}  # the head's own text: a reader that knows no manifest finds no pages


class LexiconPart(NamedTuple):
    bucket: int
    id: str
    sha256: str  # of its text


class LexiconManifest(NamedTuple):
    buckets: int
    rows: int  # the row format of its buckets (3)
    vectors: bool  # whether its rows hold page vectors
    parts: tuple[LexiconPart, ...]  # in order: a bucket's parts one after another

    def encode(self) -> str:
        body = {"buckets": self.buckets, "rows": self.rows, "vectors": self.vectors, "parts": self.parts}
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def decode(cls, text: object) -> LexiconManifest:
        """ValueError for anything that is not one."""
        try:
            body: Any = json.loads(text) if isinstance(text, str) else None
            parts = tuple(LexiconPart(int(b), str(i), str(h)) for b, i, h in body["parts"])
            return cls(int(body["buckets"]), int(body["rows"]), bool(body["vectors"]), parts)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"the lexicon's manifest cannot be read: {exc}") from exc


def bucket_count(pages: int) -> int:
    """Buckets for a site of `pages` pages: a power of two, about PAGES_PER_BUCKET pages each."""
    count = 1
    while count * PAGES_PER_BUCKET < pages:
        count *= 2
    return count


def keeps_buckets(buckets: int, pages: int) -> bool:
    """Whether a site of `pages` pages stays in `buckets` buckets (else it is bucketed anew)."""
    if buckets < 1:
        return False
    fewest = PAGES_PER_BUCKET // 4 if buckets > 1 else 0
    return fewest <= pages / buckets <= PAGES_PER_BUCKET * 4


def page_bucket(key: str, buckets: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "big") % buckets


def bucket_parts(bucket: int, pages: Mapping[str, str | LexiconPage]) -> list[tuple[LexiconPart, str]]:
    """A bucket's part records (each with its text): its lexicon, cut at LEXICON_PART_CHARS."""
    text = encode_rows(pages)
    cuts = [text[i : i + LEXICON_PART_CHARS] for i in range(0, len(text), LEXICON_PART_CHARS)] or [""]
    out = []
    for n, cut in enumerate(cuts):
        digest = hashlib.sha256(cut.encode("ascii")).hexdigest()
        out.append((LexiconPart(bucket, f"{LEXICON_RECORD_ID}.{digest[:32]}.{n}", digest), cut))
    return out


def manifest_of(head: Mapping[str, Any] | None) -> LexiconManifest | None:
    """The manifest a head record's metadata holds; None when it holds none (one lexicon text);
    ValueError when it cannot be read."""
    text = (head or {}).get(LEXICON_MANIFEST_FIELD)
    return None if text is None else LexiconManifest.decode(text)


def parts_text(parts: list[LexiconPart], get: Callable[[list[str]], Mapping[str, Any]]) -> str:
    """The texts of these part records one after another, each checked against its sha256."""
    if not parts:
        return ""
    answer = get([part.id for part in parts])
    by_id = dict(zip(answer.get("ids") or [], answer.get("metadatas") or [], strict=False))
    texts = []
    for part in parts:
        text = (by_id.get(part.id) or {}).get(LEXICON_DATA_FIELD)
        if not isinstance(text, str) or hashlib.sha256(text.encode("ascii")).hexdigest() != part.sha256:
            raise ValueError(f"the lexicon's part {part.id} is missing or written over")
        texts.append(text)
    return "".join(texts)


def lexicon_text(found: Mapping[str, Any], get: Callable[[list[str]], Mapping[str, Any]] | None = None) -> str | None:
    """The lexicon in a get of its head record (`include` documents and metadatas): the metadata
    field where it is kept, else (written before it was) the document; None when there is none.
    A lexicon of several records has its other parts read with `get` (ids -> a get's answer,
    metadatas included); ValueError when one is missing or the whole is not what the head says."""
    metadatas = found.get("metadatas") or []
    head = metadatas[0] if metadatas else None
    manifest = manifest_of(head)
    if manifest is not None:
        if get is None:
            raise ValueError("the lexicon takes several records and this reader reads one")
        return parts_text(list(manifest.parts), get)
    data = (head or {}).get(LEXICON_DATA_FIELD)
    if not isinstance(data, str):
        documents = found.get("documents") or []
        return documents[0] if documents and isinstance(documents[0], str) else None
    others = lexicon_part_ids(head)
    if not others:
        return data
    if get is None:
        raise ValueError("the lexicon takes several records and this reader reads one")
    answer = get(others)
    by_id = dict(zip(answer.get("ids") or [], answer.get("metadatas") or [], strict=False))
    texts = [t for i in others if isinstance(t := (by_id.get(i) or {}).get(LEXICON_DATA_FIELD), str)]
    if len(texts) != len(others):
        raise ValueError(f"the lexicon record is missing parts ({len(others) + 1} expected)")
    text = data + "".join(texts)
    if hashlib.sha256(text.encode("ascii")).hexdigest() != (head or {}).get(LEXICON_DIGEST_FIELD):
        raise ValueError("the lexicon's parts do not match its head (written over meanwhile)")
    return text


PREVIEW_CHARS = 1 << 20


def lexicon_preview(document: str) -> tuple[int, list[Any] | None] | None:
    """A lexicon's format and its first page's row, read from the start of its text (the head
    record's part) without decoding the rest; the row is None when it holds no page, the whole
    is None when the start cannot be read (a first row longer than PREVIEW_CHARS included)."""
    try:
        start = unpack(document[:PREVIEW_CHARS])
        text = zlib.decompressobj(31).decompress(start, PREVIEW_CHARS).decode("utf-8", "ignore")
    except (ValueError, zlib.error):
        return None
    head = re.match(r'\{"format":(\d+),"pages":\{\s*', text)
    if head is None:
        return None
    if text[head.end() : head.end() + 1] == "}":
        return int(head.group(1)), None
    decoder = json.JSONDecoder()
    try:
        key, at = decoder.raw_decode(text, head.end())
        if not isinstance(key, str) or text[at : at + 1] != ":":
            return None
        row, _ = decoder.raw_decode(text, at + 1)
    except ValueError:
        return None
    return int(head.group(1)), row if isinstance(row, list) else None


def decode_lexicon(document: str) -> dict[str, LexiconPage]:
    """The pages of a lexicon record, or of a bucketed lexicon's parts one after another (gzip
    members, each a body of its own); ValueError for anything that is not one."""
    try:
        text = gzip.decompress(unpack(document)).decode("utf-8")
    except (ValueError, TypeError, OSError, EOFError) as exc:  # hex, base64, gzip, UTF-8
        raise ValueError(f"the lexicon record cannot be read: {exc}") from exc
    decoder = json.JSONDecoder()
    out: dict[str, LexiconPage] = {}
    at = 0
    while True:
        try:
            body, at = decoder.raw_decode(text, at)
        except ValueError as exc:
            raise ValueError(f"the lexicon record cannot be read: {exc}") from exc
        known = isinstance(body, dict) and body.get("format") in LEXICON_FORMATS
        if not known or not isinstance(body.get("pages"), dict):
            raise ValueError("the lexicon record has an unknown format")
        for path, page in body["pages"].items():
            vector = page[2] if len(page) > 2 and isinstance(page[2], str) else None
            titles = dict(page[3]) if len(page) > 3 and isinstance(page[3], dict) else None
            out[str(path)] = LexiconPage(str(page[0]), dict(page[1]), vector, titles)
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out


# -- the index -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LexicalIndex:
    """BM25 over one set of pages (a reader's visible ones). Build once, score many queries."""

    paths: tuple[str, ...]
    postings: Mapping[str, tuple[np.ndarray, np.ndarray]]  # term -> (page numbers, counts)
    lengths: np.ndarray

    @classmethod
    def build(cls, pages: Iterable[tuple[str, Mapping[str, int]]]) -> LexicalIndex:
        paths: list[str] = []
        lengths: list[int] = []
        rows: dict[str, tuple[list[int], list[int]]] = {}
        for number, (path, counts) in enumerate(pages):
            paths.append(path)
            lengths.append(sum(counts.values()))
            for term, count in counts.items():
                at, how_many = rows.setdefault(term, ([], []))
                at.append(number)
                how_many.append(count)
        postings = {
            term: (np.asarray(at, dtype=np.int64), np.asarray(how_many, dtype=np.float64))
            for term, (at, how_many) in rows.items()
        }
        return cls(tuple(paths), postings, np.asarray(lengths, dtype=np.float64))

    def scores(self, query: str) -> dict[str, float]:
        """Every page holding a query term, with its BM25 score (higher is better)."""
        count = len(self.paths)
        if not count:
            return {}
        mean_length = float(self.lengths.mean()) or 1.0
        totals = np.zeros(count, dtype=np.float64)
        for term in set(terms(query)):
            found = self.postings.get(term)
            if found is None:
                continue
            at, tf = found
            idf = math.log(1.0 + (count - len(at) + 0.5) / (len(at) + 0.5))
            norm = K1 * (1.0 - B + B * self.lengths[at] / mean_length)
            totals[at] += idf * tf / (tf + norm)  # Lucene's form: without the constant (k1 + 1)
        hit = np.flatnonzero(totals)
        return {self.paths[i]: float(totals[i]) for i in hit}


def ranked(scores: Mapping[str, float]) -> list[str]:
    """Paths best first; ties by path, so a ranking never depends on dict order."""
    return sorted(scores, key=lambda path: (-scores[path], path))


def best_passage(chunks: Iterable[str], query: str) -> str:
    """The chunk holding the most occurrences of the query's terms (the first of equals)."""
    wanted = set(terms(query))
    best, best_count = "", -1
    for chunk in chunks:
        count = sum(1 for word in terms(chunk) if word in wanted)
        if count > best_count:
            best, best_count = chunk, count
    return best
