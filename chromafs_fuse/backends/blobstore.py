"""The blob store adapter: whole files kept outside Chroma (binary and large files).

A tree entry points at a blob by URL (`file:///dir/<sha256>` or
`s3://bucket/prefix/<sha256>`), so a mount needs no blob-store setting to
read one, only S3 credentials in the usual boto3 places and the endpoint its
reader is given (--s3-endpoint-url, else AWS_ENDPOINT_URL). Blocking calls:
the page tiers run them off the trio loop.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from chromafs_fuse.errors import Unavailable

log = logging.getLogger(__name__)


class BlobError(Unavailable, RuntimeError):
    """A blob could not be read or written."""


class BlobStore(Protocol):
    @property
    def url(self) -> str: ...

    def put(self, data: bytes) -> tuple[str, str]: ...


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


def s3_client(endpoint_url: str | None = None) -> Any:
    """A boto3 S3 client with short timeouts (env credentials, region; the endpoint given, else
    AWS_ENDPOINT_URL, else AWS). Each caller keeps the one it made."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 2, "mode": "standard"})
    endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


class S3BlobStore:
    """Content-addressed objects: s3://bucket/prefix/<sha256>."""

    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = s3_client(endpoint_url)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def put(self, data: bytes) -> tuple[str, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        digest = hashlib.sha256(data).hexdigest()
        key = f"{self.prefix}/{digest}" if self.prefix else digest
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (BotoCoreError, ClientError) as exc:
            raise BlobError(f"cannot write s3://{self.bucket}/{key}: {exc}") from exc
        return f"s3://{self.bucket}/{key}", digest


def open_blob_store(url: str, endpoint_url: str | None = None) -> FileBlobStore | S3BlobStore:
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return FileBlobStore(unquote(parsed.path))
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise BlobError(f"blob store {url!r} has no bucket")
        return S3BlobStore(parsed.netloc, parsed.path, endpoint_url)
    if "://" not in url:
        return FileBlobStore(url)
    raise BlobError(f"unsupported blob store {url!r} (supported: file:///dir, s3://bucket/prefix)")


class BlobReader:
    """Reads ranges of blobs by URL: files directly, S3 objects through one client (made on
    first use) at the endpoint given (--s3-endpoint-url), else AWS_ENDPOINT_URL, else AWS."""

    def __init__(self, s3_endpoint_url: str | None = None) -> None:
        self.s3_endpoint_url = s3_endpoint_url
        self._s3: Any = None
        self._lock = threading.Lock()

    def _s3_client(self) -> Any:
        with self._lock:
            if self._s3 is None:
                self._s3 = s3_client(self.s3_endpoint_url)
            return self._s3

    def read_range(self, url: str, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` of the blob at `url`: one ranged request."""
        parsed = urlparse(url)
        if parsed.scheme == "file":
            try:
                fd = os.open(unquote(parsed.path), os.O_RDONLY | os.O_CLOEXEC)
                try:
                    return os.pread(fd, length, offset)
                finally:
                    os.close(fd)
            except (OSError, ValueError) as exc:
                raise BlobError(f"cannot read blob {url}: {getattr(exc, 'strerror', None) or exc}") from exc
        if parsed.scheme == "s3":
            from botocore.exceptions import BotoCoreError, ClientError

            key = parsed.path.lstrip("/")
            try:
                response = self._s3_client().get_object(
                    Bucket=parsed.netloc, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
                )
                data: bytes = response["Body"].read()
            except (BotoCoreError, ClientError) as exc:
                raise BlobError(f"cannot read {url}: {exc}") from exc
            log.debug("s3 ranged GET %s bytes=%d-%d moved %d bytes", url, offset, offset + length - 1, len(data))
            return data
        raise BlobError(f"unsupported blob URL scheme {parsed.scheme!r}")
