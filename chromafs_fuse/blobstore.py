"""The blob store adapter: whole files kept outside Chroma (binary and large files).

A tree entry points at a blob by URL, so a mount needs no blob-store setting
to read one. Only `file://` is implemented here; blocking calls, run off-loop.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import unquote, urlparse


class BlobError(RuntimeError):
    """A blob could not be read or written."""


class FileBlobStore:
    """Content-addressed files under one directory: <dir>/<sha256>."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()

    @property
    def url(self) -> str:
        return self.directory.as_uri()

    def put(self, data: bytes) -> tuple[str, str]:
        """Store `data`; return (url, sha256)."""
        digest = hashlib.sha256(data).hexdigest()
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / digest
        if not target.exists():
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            tmp.write_bytes(data)
            tmp.replace(target)
        return target.as_uri(), digest


def open_blob_store(url: str) -> FileBlobStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FileBlobStore(unquote(parsed.path))
    if "://" not in url:
        return FileBlobStore(url)
    raise BlobError(f"unsupported blob store {url!r} (supported: file:///dir)")


def read_blob_range(url: str, offset: int, length: int) -> bytes:
    """Read `length` bytes at `offset` of the blob at `url`."""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        raise BlobError(f"unsupported blob URL scheme {parsed.scheme!r}")
    try:
        fd = os.open(unquote(parsed.path), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)
    except OSError as exc:
        raise BlobError(f"cannot read blob {url}: {exc.strerror}") from exc
