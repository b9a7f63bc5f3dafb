"""The one error hierarchy (issue 41): every named error of every layer is a ChromafsError of the
kind it is, and the FUSE adapter answers each with its errno, logged at its level; a bug is EIO
with its traceback. In-process: no mount."""

from __future__ import annotations

import errno
import logging
from typing import Any

import pyfuse3
import pytest
import trio

from chromafs_fuse.backends.blobstore import BlobError
from chromafs_fuse.backends.chroma_http import ChromaHttpError, ChromaUnreachable, CollectionNotFound
from chromafs_fuse.backends.chroma_store import BackendError, SiteNotFound
from chromafs_fuse.backends.redis_topology import RedisURLError
from chromafs_fuse.chunks import CorruptPage
from chromafs_fuse.cli.mount_helper import HelperError
from chromafs_fuse.errors import ChromafsError, FsError, errno_of, kind_of, unexpected, user_message
from chromafs_fuse.filesystem import PageTimedOut, PageUnavailable
from chromafs_fuse.ingest.access_rules import AccessSpecError
from chromafs_fuse.ingest.chroma_writes import WriteFailed
from chromafs_fuse.search import SearchError
from chromafs_fuse.serving.fuse_adapter import FuseAdapter
from chromafs_fuse.serving.server.forker import ForkerGone
from chromafs_fuse.serving.server.session_keeper import SessionError
from chromafs_fuse.serving.serving_process.sites import ServeError
from chromafs_fuse.serving_views import InodeClash
from chromafs_fuse.site.view import ViewError
from chromafs_fuse.tokens import TokenError
from chromafs_fuse.tree import TreeError

KINDS: list[tuple[ChromafsError, str, int]] = [
    (RedisURLError("x"), "usage", errno.EINVAL),
    (AccessSpecError("x"), "usage", errno.EINVAL),
    (HelperError("x"), "usage", errno.EINVAL),
    (TokenError("token has expired"), "denied", errno.EACCES),
    (SiteNotFound("x"), "not_found", errno.ENOENT),
    (CollectionNotFound(404, "NotFoundError", "gone"), "not_found", errno.ENOENT),
    (BackendError("x"), "unavailable", errno.EIO),
    (ChromaHttpError(500, "InternalError", "x"), "unavailable", errno.EIO),
    (ChromaUnreachable("x"), "unavailable", errno.EIO),
    (BlobError("x"), "unavailable", errno.EIO),
    (PageUnavailable("x"), "unavailable", errno.EIO),
    (PageTimedOut("x"), "unavailable", errno.EIO),
    (WriteFailed("x"), "unavailable", errno.EIO),
    (ForkerGone("x"), "unavailable", errno.EIO),
    (CorruptPage("x"), "corrupt", errno.EIO),
    (TreeError("x"), "corrupt", errno.EIO),
    (InodeClash("x"), "corrupt", errno.EIO),
    (SessionError("x"), "refused", errno.EIO),
    (ServeError("x"), "refused", errno.EIO),
    (ViewError("x"), "refused", errno.EIO),
    (SearchError("x"), "refused", errno.EIO),
    (FsError(errno.EROFS), "internal", errno.EROFS),
]


@pytest.mark.parametrize(
    ("error", "kind", "code"), KINDS, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v)
)
def test_each_named_error_is_its_kind(error: ChromafsError, kind: str, code: int) -> None:
    assert isinstance(error, ChromafsError)
    assert kind_of(error) == kind and errno_of(error) == code
    assert user_message(error) == str(error)


def test_anything_else_is_a_bug_worded_without_its_class() -> None:
    assert kind_of(KeyError("k")) == "internal" and errno_of(KeyError("k")) == errno.EIO
    assert user_message(KeyError("page")) == unexpected(KeyError("page"))
    assert "KeyError" not in user_message(KeyError("page"))


class Raising:
    """A filesystem whose lookup raises what it is given."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def lookup(self, parent_inode: int, name: bytes) -> Any:
        raise self.error


def _lookup_errno(error: BaseException) -> int:
    adapter = FuseAdapter(Raising(error))  # type: ignore[type-var]  # only lookup is asked for
    with pytest.raises(pyfuse3.FUSEError) as answered:
        trio.run(adapter.lookup, 1, b"name", None)
    return answered.value.errno


def test_the_fuse_adapter_answers_each_kind_with_its_errno(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="chromafs_fuse.serving.fuse_adapter")
    assert _lookup_errno(FsError(errno.ENOENT)) == errno.ENOENT
    assert _lookup_errno(TokenError("token has expired")) == errno.EACCES
    assert _lookup_errno(CorruptPage("chunk 3 of guide.md is missing")) == errno.EIO
    assert any(
        r.levelno == logging.ERROR and "chunk 3 of guide.md is missing" in r.getMessage() for r in caplog.records
    )
    assert not any(r.exc_info for r in caplog.records), "a named error is logged without a traceback"
    caplog.clear()
    assert _lookup_errno(KeyError("a bug")) == errno.EIO
    assert any(r.exc_info for r in caplog.records), "a bug is logged with its traceback"
