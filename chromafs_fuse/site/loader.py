"""Loading a site for readers: its tree from Redis or Chroma, pruned per reader.

One `SiteLoader` serves the daemon (one mount) and the mount server (many mounts,
one tree kept between requests) alike:
- the tree comes from Redis when it is there, read as one snapshot of its version key and
  document (published together in one MULTI/EXEC), checked against each other;
- else from Chroma, validated, then published to Redis for the next mount (site/publisher.py);
- a reader's table is the tree pruned by `access.visible_entries`, and readers whose
  `access.visibility_key` is equal may share it (site/tables.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from chromafs_fuse.access import Principal
from chromafs_fuse.backends.chroma_store import ChromaPages, SiteNotFound, site_names, site_not_found
from chromafs_fuse.backends.deadline import with_deadline
from chromafs_fuse.config import SessionConfig
from chromafs_fuse.errors import UsageError
from chromafs_fuse.inodes import InodeTable
from chromafs_fuse.page_cache import PageCache
from chromafs_fuse.site.page_source import PageSource
from chromafs_fuse.site.publisher import publish_tree
from chromafs_fuse.site.tables import prune
from chromafs_fuse.token_source import load_token_key
from chromafs_fuse.tokens import TokenNotForSite, TokenRules, principal_from_token
from chromafs_fuse.tree import SiteTree, TreeError, parse_tree

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache, TreeAnnouncements  # imports redis: only when configured

log = logging.getLogger("chromafs.site")
T = TypeVar("T")
CHROMA_OPEN_GRACE_S = 20.0  # opening an embedded Chroma reads its whole SQLite file first


def verify_reader(token: str | None, config: SessionConfig) -> Principal:
    """The reader a token names for this site; TokenError with a printable reason otherwise.
    Blocking with --jwks-url (a fetch of the provider's keys, within --backend-timeout): a trio
    loop calls it in a worker thread."""
    keys = config.keys
    key = load_token_key(keys, config.backend_timeout_s)  # a JWKS is fetched only for a token
    try:
        principal = principal_from_token(token, key, config.site, TokenRules(keys.issuer, keys.audience))
    except TokenNotForSite:
        missing = missing_site(config)
        if missing is not None:  # `--site mcpp` with a token of `mcp`: the typo is the problem
            raise missing from None
        raise
    check_not_revoked(config, principal)
    return principal


def check_not_revoked(config: SessionConfig, principal: Principal) -> None:
    """TokenRevoked when the site's Redis holds a revocation of the reader's token. Blocking."""
    if principal.authenticated and config.redis is not None:
        from chromafs_fuse.backends.redis_revocations import find_many
        from chromafs_fuse.revocation import refusal

        (revoked,) = find_many(config.redis, [reader_of(config.site, principal)])
        if revoked is not None:
            raise refusal(revoked)


def reader_of(site: str, principal: Principal) -> tuple[str, str | None, str | None, float | None]:
    """What a revocation is checked against (backends/redis_revocations.py's Reader)."""
    return (site, principal.subject, principal.token_id, principal.issued_at)


def missing_site(config: SessionConfig) -> SiteNotFound | None:
    """Why the site does not exist (the sites that do, listed), or None when it does or its Chroma
    cannot say. Blocking: one listing of the collections, within --backend-timeout."""
    names = site_names(config.chroma, config.backend_timeout_s)
    if names is None or config.chroma.collection in names:
        return None
    return site_not_found(config.chroma, names)


def within(fn: Callable[[], T], seconds: float, what: str) -> T:
    """A blocking call that may hang (a dead server), before the mount serves (no trio loop yet)."""
    try:
        return with_deadline(fn, seconds)
    except TimeoutError:
        raise UsageError(f"{what}: no answer within {seconds:.0f}s") from None


@dataclass
class LoadedSite:
    tree: SiteTree
    table: InodeTable
    source: PageSource


class SiteLoader:
    def __init__(self, config: SessionConfig, redis: RedisCache | None = None) -> None:
        self.config = config
        if redis is None and config.redis is not None:
            from chromafs_fuse.backends.redis_cache import RedisCache

            redis = RedisCache.from_settings(config.redis)
        self.redis = redis
        self._tree: SiteTree | None = None  # the last tree read from Redis

    def open_chroma(self) -> ChromaPages:
        config = self.config
        return ChromaPages.open(config.chroma, config.page_field, config.chunk_index_field, config.backend_timeout_s)

    # -- the tree ------------------------------------------------------------------------

    def tree_from_redis(self) -> SiteTree | None:
        """The published tree, or None when Redis has none (or a bad one, or is down).
        Costs one small GET when the version is the one already held."""
        redis = self.redis
        if redis is None:
            return None
        site, collection = self.config.site, self.config.chroma.collection
        version_key, tree_key = redis.tree_version_key(site, collection), redis.tree_key(site, collection)
        version = redis.get(version_key)
        if version is None:
            return None
        held = self._tree
        if held is not None and held.version == version.decode():
            return held
        version, document = redis.get_many([version_key, tree_key])  # one snapshot of both
        if version is None or document is None:
            return None
        try:
            tree = parse_tree(document)
        except TreeError as exc:
            log.warning("ignoring the path tree cached in Redis: %s", exc)
            return None
        if tree.version != version.decode():
            log.warning("ignoring the path tree cached in Redis: its version key says %s", version.decode())
            return None
        self._log_skipped(tree)
        self._tree = tree
        return tree

    def tree_from_chroma(self) -> tuple[SiteTree, ChromaPages]:
        """Read, validate and publish the tree; also returns the opened Chroma client."""
        pages = self.open_chroma()
        return self._tree_in(pages), pages

    def _tree_in(self, pages: ChromaPages) -> SiteTree:
        """The tree record in Chroma, validated, and published to Redis for the next reader."""
        document = pages.load_tree_document()[0]
        tree = parse_tree(document)
        self._log_skipped(tree)
        if self.redis is not None:
            site, collection = self.config.site, self.config.chroma.collection
            publish_tree(self.redis, site, collection, document.encode("utf-8"), tree.version, self._tree_ttl_s())
        return tree

    def _tree_ttl_s(self) -> int:
        assert self.redis is not None
        return self.config.redis.tree_ttl_s if self.config.redis else self.redis.tree_ttl_s

    def current_version(self, chroma: Callable[[], ChromaPages]) -> str:
        """The version of the tree published now: Redis's version key (a few bytes), else the
        marker on Chroma's tree record. Blocking: run it off the loop.

        A marker read from Chroma is put back in Redis for --tree-ttl when the key has expired
        (never over a newer one a publish put there), as the ingest's publish does: else every
        follower of every site would ask Chroma every few seconds from the moment the key
        expires, until the next re-ingest."""
        if self.redis is None:
            return chroma().tree_marker()
        key = self.redis.tree_version_key(self.config.site, self.config.chroma.collection)
        version = self.redis.get(key)
        if version is not None:
            return version.decode()
        marker = chroma().tree_marker()
        self.redis.set_if_absent(key, marker.encode(), self._tree_ttl_s())
        return marker

    def announcements(self) -> TreeAnnouncements | None:
        """New versions announced through Redis (None without it): a refresher waits on them."""
        if self.redis is None:
            return None
        return self.redis.listen_for_trees(self.config.site, self.config.chroma.collection)

    def version_key_and_channel(self) -> tuple[str, str] | None:
        """Where Redis holds the published version and announces new ones (None without Redis)."""
        if self.redis is None:
            return None
        site, collection = self.config.site, self.config.chroma.collection
        return self.redis.tree_version_key(site, collection), self.redis.tree_channel(site, collection)

    def reload_tree(self, chroma: Callable[[], ChromaPages]) -> SiteTree:
        """The tree published now, through an already open Chroma client. Blocking."""
        return self.tree_from_redis() or self._tree_in(chroma())

    @staticmethod
    def _log_skipped(tree: SiteTree) -> None:
        for key, reason in tree.skipped:
            log.warning("tree entry %s skipped: %s", key, reason)

    # -- a reader's view -------------------------------------------------------------------

    prune = staticmethod(prune)  # site/tables.prune, by its old name

    def open_site(self, cache: PageCache) -> tuple[SiteTree, PageSource]:
        """The site's tree (Redis, else Chroma, within --backend-timeout; Chroma gets a grace for
        opening, and is opened only if the tree or a page needs it) and its page source, its
        pages kept in `cache`: what a standalone mount and a serving process each serve from."""
        config = self.config
        timeout_s = config.backend_timeout_s
        opened: ChromaPages | None = None
        tree = within(self.tree_from_redis, timeout_s, "Redis") if self.redis else None
        if tree is not None:
            log.info("path tree %s loaded from Redis", tree.version)
        else:
            tree, opened = within(
                self.tree_from_chroma, timeout_s + CHROMA_OPEN_GRACE_S, f"Chroma at {config.chroma.describe()}"
            )
        source = PageSource(
            config.site,
            self.open_chroma,
            cache,
            tree.version,
            config.chunk_joiner,
            timeout_s,
            self.redis,
            s3_endpoint_url=config.s3_endpoint_url,
        )
        if opened is not None:
            source.use_chroma(opened)
        return tree, source

    def load(self, principal: Principal) -> LoadedSite:
        """Everything one reader's mount needs: the site opened, its tree pruned for `principal`."""
        config = self.config
        tree, source = self.open_site(PageCache(config.cache_bytes))
        table = self.prune(tree, principal)
        log.info(
            "site %s (tree %s): %d of %d files visible to %s",
            config.site,
            tree.version,
            table.file_count,
            len(tree.entries),
            principal.describe(),
        )
        return LoadedSite(tree, table, source)
