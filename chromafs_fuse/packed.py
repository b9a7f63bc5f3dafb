"""The text of the site's big records (the path tree, the lexicon): gzip, written as hex (pure).

Chroma indexes every record's document for full-text search (SQLite FTS5, trigrams), and an
upsert of a document pays per distinct trigram: base64 of gzip has up to 64**3 of them, so
rewriting a 2.4 MB lexicon took 5-7 s on `chroma run` (most of a re-ingest after two changed
pages, issue 47), where hex, 16**3 of them at most, takes well under one. The readers take
both: records written before this as base64 are read as they are.
"""

from __future__ import annotations

import base64
import binascii
import gzip

GZIP_MAGIC_HEX = "1f8b"


def pack(data: bytes, level: int = 6) -> str:
    """`data` gzipped (no timestamp: equal data, equal text), as lowercase hex."""
    return gzip.compress(data, compresslevel=level, mtime=0).hex()


def unpack(text: str | bytes) -> bytes:
    """What `pack` (hex) or an older writer (base64) encoded, still compressed if it was:
    the caller checks for gzip. ValueError when it is neither."""
    raw = text.encode("ascii") if isinstance(text, str) else text
    raw = raw.strip()
    if raw[:4] == GZIP_MAGIC_HEX.encode():
        return bytes.fromhex(raw.decode("ascii"))
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("neither hex nor base64") from exc
