"""SiteLoader against a real redis-server and an embedded Chroma: the tree is published with
its version in one transaction, read back as one snapshot, and a version key that does not
match its document is never trusted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from conftest import SITE

from chromafs_fuse.access import Principal
from chromafs_fuse.backends.chroma_store import ChromaLocation
from chromafs_fuse.config import RedisSettings, SessionConfig
from chromafs_fuse.names import CHUNK_INDEX_FIELD, PAGE_FIELD
from chromafs_fuse.site.loader import SiteLoader

if TYPE_CHECKING:
    from infra import RedisServer


def session(chroma: Path, redis_url: str) -> SessionConfig:
    return SessionConfig(
        site=SITE,
        chroma=ChromaLocation(path=str(chroma), collection=SITE),
        page_field=PAGE_FIELD,
        chunk_index_field=CHUNK_INDEX_FIELD,
        redis=RedisSettings(redis_url, tree_ttl_s=120),
    )


def test_a_tree_read_from_chroma_is_published_with_its_version(
    sample_chroma: Callable[[str], Path], redis_server: RedisServer
) -> None:
    loader = SiteLoader(session(sample_chroma("public"), redis_server.url))
    assert loader.tree_from_redis() is None
    site = loader.load(Principal.anonymous())
    redis = loader.redis
    assert redis is not None
    version_key, tree_key = redis.tree_version_key(SITE, SITE), redis.tree_key(SITE, SITE)
    assert redis_server.cli("GET", version_key) == site.tree.version
    for key in (version_key, tree_key):
        assert 0 < int(redis_server.cli("TTL", key)) <= 120
    other = SiteLoader(session(Path("/nonexistent"), redis_server.url))  # never opens Chroma
    again = other.load(Principal.anonymous())
    assert again.tree.version == site.tree.version
    assert set(again.table.entries) == set(site.table.entries)
    assert other.tree_from_redis() is other.tree_from_redis()  # the held tree, after a GET of the version


@pytest.mark.parametrize("forged", ["version", "document"])
def test_a_version_key_that_does_not_match_its_document_is_not_trusted(
    sample_chroma: Callable[[str], Path], redis_server: RedisServer, forged: str, caplog: pytest.LogCaptureFixture
) -> None:
    chroma = sample_chroma("public")
    SiteLoader(session(chroma, redis_server.url)).load(Principal.anonymous())  # publishes
    loader = SiteLoader(session(chroma, redis_server.url))
    redis = loader.redis
    assert redis is not None
    if forged == "version":
        redis_server.cli("SET", redis.tree_version_key(SITE, SITE), "0" * 16)
    else:
        redis_server.cli("SET", redis.tree_key(SITE, SITE), '{"index.md": {"isPublic": true}}')
    assert loader.tree_from_redis() is None
    assert "ignoring the path tree cached in Redis" in caplog.text
    site = loader.load(Principal.anonymous())  # from Chroma, and published again, consistent
    assert redis_server.cli("GET", redis.tree_version_key(SITE, SITE)) == site.tree.version
    assert loader.tree_from_redis() is not None


def test_an_expired_version_key_is_put_back_from_chroma_and_never_over_a_newer_one(
    sample_chroma: Callable[[str], Path], redis_server: RedisServer
) -> None:
    """Once the published version key expires (--tree-ttl), one follower's check of Chroma puts the
    marker back for --tree-ttl: the next checks of every follower read Redis again, not Chroma. A
    key that is there already (a newer publish) is never overwritten."""
    loader = SiteLoader(session(sample_chroma("public"), redis_server.url))
    site = loader.load(Principal.anonymous())
    redis = loader.redis
    assert redis is not None
    version_key = redis.tree_version_key(SITE, SITE)
    redis_server.cli("DEL", version_key)  # as if its --tree-ttl had passed
    opened: list[object] = []

    def chroma() -> object:
        opened.append(1)
        return loader.open_chroma()

    assert loader.current_version(chroma) == site.tree.version and len(opened) == 1
    assert redis_server.cli("GET", version_key) == site.tree.version
    assert 0 < int(redis_server.cli("TTL", version_key)) <= 120
    assert loader.current_version(chroma) == site.tree.version and len(opened) == 1  # Redis only
    redis_server.cli("SET", version_key, "newer")
    redis.set_if_absent(version_key, site.tree.version.encode(), 120)
    assert redis_server.cli("GET", version_key) == "newer"
