"""Publishing a site's tree to Redis, for every mount and front end of the site: the document
and its version in one MULTI/EXEC, announced on the site's channel in the same step
(backends/redis_cache.RedisCache.publish_tree), so a follower switches at once.

The ingest publishes each new tree and waits out a failover; a reader that had to read the
tree from Chroma publishes it for the next one, once, and goes on without it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chromafs_fuse.backends.redis_cache import RedisCache

INGEST_PATIENCE_S = 20.0  # long enough for a Redis failover to finish
RETRY_EVERY_S = 1.0


def publish_tree(
    redis: RedisCache, site: str, collection: str, document: bytes, version: str, ttl_s: int, patience_s: float = 0.0
) -> bool:
    """Put the tree in Redis for `ttl_s`; tried again every second for up to `patience_s` while
    Redis does not take it. False if it never did (mounts then read it from Chroma)."""
    give_up_at = time.monotonic() + patience_s
    while not redis.publish_tree(site, collection, document, version, ttl_s):
        if time.monotonic() >= give_up_at:
            return False
        time.sleep(RETRY_EVERY_S)
    return True
