"""The Redis adapter: the cache every mount of a site shares, across machines.

Blocking calls with short timeouts, run off the trio loop. Redis is an
optimisation only: when it fails, the cache reports a miss, logs one warning
per outage, and is skipped for a few seconds before it is tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import redis

log = logging.getLogger(__name__)
DEFAULT_TTL_S = 24 * 3600
DEFAULT_TREE_TTL_S = 300
RETRY_AFTER_S = 5.0


class RedisCache:
    def __init__(
        self,
        url: str,
        prefix: str = "chromafs",
        ttl_s: int = DEFAULT_TTL_S,
        tree_ttl_s: int = DEFAULT_TREE_TTL_S,
        timeout_s: float = 0.5,
    ) -> None:
        self.client = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False
        )
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.tree_ttl_s = tree_ttl_s
        self._down_until = 0.0
        self._down = False
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.errors = 0

    # -- keys: namespaced by site, pages by their content ---------------------

    def tree_key(self, site: str, collection: str) -> str:
        return f"{self.prefix}:{site}:{collection}:tree"

    def tree_version_key(self, site: str, collection: str) -> str:
        return f"{self.prefix}:{site}:{collection}:tree-version"

    def publish_tree(self, site: str, collection: str, document: bytes, version: str, ttl_s: int) -> None:
        """The tree and its version in one MULTI/EXEC, so a reader never sees one without the
        other, and a mount server checks freshness with a tiny GET of the version."""
        if not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.set(self.tree_key(site, collection), document, ex=ttl_s)
            pipe.set(self.tree_version_key(site, collection), version.encode(), ex=ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(exc)
            return
        self._succeeded()

    def page_key(self, site: str, content_version: str, page: str) -> str:
        """A page's bytes, under its sha256 (a tree's pages without one: the tree version)."""
        return f"{self.prefix}:{site}:{content_version}:page:{page}"

    # -- health ------------------------------------------------------------

    def _usable(self) -> bool:
        return not self._down or time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.errors += 1
            if not self._down:
                log.warning("Redis unavailable, reading from the backend instead: %s", exc)
            self._down = True
            self._down_until = time.monotonic() + RETRY_AFTER_S

    def _succeeded(self) -> None:
        if self._down:
            with self._lock:
                if self._down:
                    log.info("Redis is reachable again")
                self._down = False

    # -- operations --------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        if not self._usable():
            return None
        try:
            value = self.client.get(key)
        except redis.RedisError as exc:
            self._failed(exc)
            return None
        self._succeeded()
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return bytes(value)  # type: ignore[arg-type]

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        if not keys or not self._usable():
            return [None] * len(keys)
        try:
            values = self.client.mget(list(keys))
        except redis.RedisError as exc:
            self._failed(exc)
            return [None] * len(keys)
        self._succeeded()
        out = [None if v is None else bytes(v) for v in values]  # type: ignore[union-attr]
        self.hits += sum(1 for v in out if v is not None)
        self.misses += sum(1 for v in out if v is None)
        return out

    def set(self, key: str, value: bytes, ttl_s: int | None = None) -> None:
        self.set_many({key: value}, ttl_s)

    def set_many(self, items: dict[str, bytes], ttl_s: int | None = None) -> None:
        if not items or not self._usable():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in items.items():
                pipe.set(key, value, ex=ttl_s or self.ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(exc)
            return
        self._succeeded()
