"""The site tree: decoding the `__path_tree__` record into validated entries (pure)."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chromafs_fuse.blob_pieces import check_pointer, is_chroma_url
from chromafs_fuse.errors import Corrupt
from chromafs_fuse.packed import pack, unpack
from chromafs_fuse.pathrules import MAX_NAME_BYTES, InvalidPath, normalize_key

_loads: Callable[[str | bytes], Any]
try:  # a tree of 20,000 pages parses several times faster with orjson (a chromadb dependency)
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads


MAX_CHUNKS = 1 << 31


class TreeError(Corrupt, ValueError):
    """The tree record cannot be used at all: the site is refused."""


@dataclass(frozen=True, slots=True)
class BlobPointer:
    """Where a file's bytes live when they are not stored as chunks."""

    url: str
    size: int
    sha256: str | None = None
    pieces: tuple[str, ...] | None = None  # a `chroma:` file of several pieces: each one's sha256


@dataclass(slots=True)  # not frozen: a frozen init costs a third of a 20,000-page tree's parse time
class PathEntry:
    """One file of the site, as the tree describes it. Treat as immutable."""

    key: str  # canonical path, no leading "/"
    source_key: str  # the key exactly as written in the tree
    is_public: bool
    groups: frozenset[str]
    size: int | None = None  # None: unknown until the page is first read
    sha256: str | None = None
    mtime: float | None = None
    blob: BlobPointer | None = None
    chunks: int | None = None  # how many chunks the ingest wrote: their ids can be computed


@dataclass(slots=True)
class SiteTree:
    entries: dict[str, PathEntry]
    version: str  # changes whenever the tree record changes
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (key, reason)


def decode_tree_document(document: str | bytes) -> object:
    """Decode a tree record's document: plain JSON, or hex or base64 of (gzipped) JSON."""
    raw = document.encode("utf-8") if isinstance(document, str) else document
    text = raw.strip()
    if not text:
        raise TreeError("path tree record is empty")
    if text[:1] in (b"{", b"["):
        payload = text
    else:
        try:
            payload = unpack(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise TreeError("path tree is neither JSON nor base64") from exc
        if payload[:2] == b"\x1f\x8b":
            try:
                payload = gzip.decompress(payload)
            except (OSError, EOFError, zlib.error) as exc:
                raise TreeError(f"path tree gzip data is corrupt: {exc}") from exc
    try:
        return _loads(payload)
    except ValueError:  # strict JSON failed: the standard parser also takes NaN/Infinity, caught per entry
        pass
    try:
        return json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TreeError(f"path tree is not valid JSON: {exc}") from exc


def encode_tree_document(tree: Mapping[str, Mapping[str, object]]) -> str:
    """gzip of compact JSON, as the reference design keeps it, but written as hex, not base64:
    Chroma's full-text index makes an upsert of base64 costly (packed.py)."""
    data = json.dumps(tree, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return pack(data.encode("utf-8"))


MAX_FILE_SIZE = 1 << 53  # far beyond any page; keeps st_size and block counts in range
MAX_ABS_MTIME = 1 << 40  # seconds: about 35,000 years either side of 1970


def _optional_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_FILE_SIZE:
        raise InvalidPath(f"'{name}' is not an integer in [0, 2^53)")
    return value


def _optional_sha256(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64:
        raise InvalidPath("'sha256' is not a 64-digit hex string")
    try:
        bytes.fromhex(value)
    except ValueError as exc:
        raise InvalidPath("'sha256' is not a 64-digit hex string") from exc
    lowered = value.lower()
    return value if lowered == value else lowered  # keep one string, not two


def _parse_entry(source_key: str, raw: object, group_sets: dict[tuple[str, ...], frozenset[str]]) -> PathEntry:
    key = normalize_key(source_key)
    if key == source_key:
        key = source_key  # one string, not two
    if not isinstance(raw, dict):
        raise InvalidPath("entry is not an object")
    is_public = raw.get("isPublic", False)
    if not isinstance(is_public, bool):
        raise InvalidPath("'isPublic' is not a boolean")
    groups = raw.get("groups", [])
    if groups is None:
        groups = []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise InvalidPath("'groups' is not a list of strings")
    mtime = raw.get("mtime")
    if mtime is not None and (
        isinstance(mtime, bool)
        or not isinstance(mtime, int | float)
        or not math.isfinite(mtime)
        or abs(mtime) >= MAX_ABS_MTIME
    ):
        raise InvalidPath("'mtime' is not a finite number of seconds in range")
    blob = None
    raw_blob = raw.get("blob")
    if raw_blob is not None:
        if not isinstance(raw_blob, dict) or not isinstance(raw_blob.get("url"), str):
            raise InvalidPath("'blob' is not an object with a 'url'")
        blob_size = _optional_int(raw_blob.get("size"), "blob.size")
        if blob_size is None:
            raise InvalidPath("'blob' has no size")
        blob = BlobPointer(raw_blob["url"], blob_size, _optional_sha256(raw_blob.get("sha256")))
        if is_chroma_url(blob.url):
            try:
                sha, pieces = check_pointer(blob.url, blob.size, blob.sha256, raw_blob.get("pieces"))
            except ValueError as exc:
                raise InvalidPath(str(exc)) from None
            blob = BlobPointer(blob.url, blob.size, sha, pieces)
    size = _optional_int(raw.get("size"), "size")
    sha256 = _optional_sha256(raw.get("sha256"))
    if blob is not None:
        size = blob.size
        sha256 = blob.sha256 or sha256
    chunks = raw.get("chunks")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or not 0 < chunks < MAX_CHUNKS:
        chunks = None  # only a hint: without it pages are found by the page field
    return PathEntry(
        key=key,
        source_key=source_key,
        is_public=is_public,
        groups=group_sets.setdefault(tuple(groups), frozenset(groups)),
        size=size,
        sha256=sha256,
        mtime=float(mtime) if mtime is not None else None,
        blob=blob,
        chunks=chunks,
    )


# What most keys and entries are: checked with a few comparisons, the rest by _parse_entry
_PLAIN_KEY = re.compile(r"[^\x00-\x1f\x7f/.][^\x00-\x1f\x7f/]*(?:/[^\x00-\x1f\x7f/.][^\x00-\x1f\x7f/]*)*")
_PLAIN_SHA256 = re.compile(r"[0-9a-f]{64}")
_NO_GROUPS: frozenset[str] = frozenset()


_PLAIN_KEYS = re.compile(rf"(?:{_PLAIN_KEY.pattern}\n)*")
_PLAIN_SHA256S = re.compile(r"(?:[0-9a-f]{64}\n)*")


def _all_plain(values: list[str], pattern: re.Pattern[str]) -> bool:
    """Whether every one of these strings (none holding a newline) matches: one scan of them all."""
    text = "\n".join(values) + "\n" if values else ""
    return text.isascii() and text.count("\n") == len(values) and pattern.fullmatch(text) is not None


def _plain_entry(
    key: str, raw: object, group_sets: dict[tuple[str, ...], frozenset[str]], checked: bool = False
) -> PathEntry | None:
    """The entry `_parse_entry` would make of a plain one (an ASCII key of plain names, no
    blob, fields of their plain types), at a fraction of its cost; None for anything else.
    `checked`: the key and its sha256 are known to be plain (`_all_plain`)."""
    if type(raw) is not dict or "blob" in raw or len(key) > MAX_NAME_BYTES:
        return None
    if not checked and (not key.isascii() or not _PLAIN_KEY.fullmatch(key)):
        return None
    is_public = raw.get("isPublic", False)
    size = raw.get("size")
    sha256 = raw.get("sha256")
    mtime = raw.get("mtime")
    groups = raw.get("groups")
    if (
        type(is_public) is not bool
        or (size is not None and (type(size) is not int or not 0 <= size < MAX_FILE_SIZE))
        or (sha256 is not None and not checked and (type(sha256) is not str or not _PLAIN_SHA256.fullmatch(sha256)))
        or (mtime is not None and (type(mtime) not in (float, int) or not -MAX_ABS_MTIME < mtime < MAX_ABS_MTIME))
    ):
        return None
    if not groups:
        group_set = _NO_GROUPS if groups is None or type(groups) is list else None
    else:
        try:
            group_set = group_sets.get(tuple(groups)) if type(groups) is list else None  # seen: checked
        except TypeError:  # an unhashable member
            return None
    if group_set is None:
        return None
    chunks = raw.get("chunks")
    return PathEntry(
        key,
        key,
        is_public,
        group_set,
        size,
        sha256,
        None if mtime is None else float(mtime),
        None,
        chunks if type(chunks) is int and 0 < chunks < MAX_CHUNKS else None,
    )


def parse_tree(document: str | bytes) -> SiteTree:
    """Decode and validate a tree record. Bad entries are skipped with a reason."""
    obj = decode_tree_document(document)
    if not isinstance(obj, Mapping):
        raise TreeError("path tree is not a JSON object of path -> entry")
    entries: dict[str, PathEntry] = {}
    skipped: list[tuple[str, str]] = []
    group_sets: dict[tuple[str, ...], frozenset[str]] = {}  # one shared set per distinct groups list
    shas: list[Any] = [raw.get("sha256") for raw in obj.values() if type(raw) is dict]
    checked = len(shas) == len(obj) and all(type(sha) is str for sha in shas)
    checked = checked and _all_plain(list(obj), _PLAIN_KEYS) and _all_plain(shas, _PLAIN_SHA256S)
    for source_key, raw in obj.items():
        try:
            entry = _plain_entry(source_key, raw, group_sets, checked) or _parse_entry(source_key, raw, group_sets)
        except InvalidPath as exc:
            skipped.append((repr(source_key), str(exc)))
            continue
        if entry.key in entries:
            skipped.append((repr(source_key), "duplicate of another key once '/' is stripped"))
            continue
        entries[entry.key] = entry
    # A key that is also the parent directory of another key cannot be a file.
    directories = {k.rsplit("/", 1)[0] for k in entries if "/" in k}
    prefixes: set[str] = set()
    for d in directories:
        parts = d.split("/")
        prefixes.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    for key in sorted(prefixes & entries.keys()):
        del entries[key]
        skipped.append((repr(key), "is both a file and a directory; the directory wins"))
    return SiteTree(entries=entries, version=tree_version(document), skipped=skipped)


def tree_version(document: str | bytes) -> str:
    """The content version of a tree record: caches key pages by it."""
    raw = document.encode("utf-8") if isinstance(document, str) else document
    return hashlib.sha256(raw).hexdigest()[:16]
