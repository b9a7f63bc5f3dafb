"""The Redis tier: pages every mount of a site shares, across machines (backends/redis_cache.py).

An optimisation only: a Redis that fails answers with misses (RedisCache logs the outage), and
a copy that does not match the tree's size and sha256 is ignored, never served.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from chromafs_fuse.chunks import CorruptPage, Expected, check_bytes
from chromafs_fuse.site.tiers import content_version
from chromafs_fuse.tree import PathEntry

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache  # imports redis: the caller has one

log = logging.getLogger(__name__)


class RedisTier:
    name = "redis"

    def __init__(self, shared: RedisCache, site: str) -> None:
        self.shared = shared
        self.site = site

    def key_of(self, entry: PathEntry, tree_version: str) -> str:
        return self.shared.page_key(self.site, content_version(entry, tree_version), entry.key)

    def fetch(self, entries: Sequence[PathEntry], tree_version: str) -> dict[str, bytes]:
        values = self.shared.get_many([self.key_of(e, tree_version) for e in entries])
        found: dict[str, bytes] = {}
        for entry, value in zip(entries, values, strict=True):
            if value is None:
                continue
            try:
                check_bytes(value, Expected(entry.size, entry.sha256))
            except CorruptPage as exc:
                log.warning("ignoring the shared cache's copy of %s: %s", entry.key, exc)
                continue
            found[entry.key] = value
        return found

    def fill(self, pages: Sequence[tuple[PathEntry, bytes]], tree_version: str) -> None:
        if pages:
            self.shared.set_many({self.key_of(entry, tree_version): data for entry, data in pages})
