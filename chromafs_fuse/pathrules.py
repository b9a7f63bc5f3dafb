"""Rules for the paths a site tree may hold (pure, no I/O).

A tree key names one file, relative to the mount root, components joined by
"/". Keys written by other tools may carry one leading "/"; everything else
that could make two keys name the same file, or a name the kernel refuses,
is rejected so that the entry is skipped with a reason.
"""

from __future__ import annotations

import re

from chromafs_fuse.errors import Corrupt

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_DOT_PART = re.compile(r"(?:^|/)\.\.?(?:/|$)")


class InvalidPath(Corrupt, ValueError):
    """A tree key that cannot name a file on the mount."""


def normalize_key(raw: object) -> str:
    """Return the canonical form of a tree key (no leading "/"), or raise InvalidPath."""
    if not isinstance(raw, str):
        raise InvalidPath(f"path is not a string: {type(raw).__name__}")
    key = raw[1:] if raw.startswith("/") else raw
    if not key:
        raise InvalidPath("empty path")
    if key.endswith("/"):
        raise InvalidPath("path ends with '/'")
    if _CONTROL.search(key):
        raise InvalidPath("path contains a NUL or control character")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from non-UTF-8 sources
        raise InvalidPath("path is not valid UTF-8") from exc
    if len(encoded) > MAX_PATH_BYTES:
        raise InvalidPath(f"path longer than {MAX_PATH_BYTES} bytes")
    if "//" in key:
        raise InvalidPath("path has an empty component ('//')")
    if _DOT_PART.search(key):
        part = ".." if "/../" in f"/{key}/" else "."
        raise InvalidPath(f"path has a '{part}' component")
    if len(encoded) > MAX_NAME_BYTES:  # only then can one component be too long
        for component in encoded.split(b"/"):
            if len(component) > MAX_NAME_BYTES:
                raise InvalidPath(f"a path component is longer than {MAX_NAME_BYTES} bytes")
    return key
